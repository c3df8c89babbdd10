"""Where a study's tasks run: local worker processes or a Ray cluster (a local head, the loopback
recipe)."""
