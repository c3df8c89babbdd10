"""The verdict's rules: the findings drawn from the battery's statistics and the roles a statistic
plays in them."""
