"""The process's surroundings: paths and input files, environment variables, notices, signals,
progress lines, output folders, the code's version, failure causes and the store's health check."""
