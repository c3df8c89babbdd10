"""What a person reads in MLflow: the pages logged with each run (figures, tables, the example
browser) and the templates they and the report are written with."""
