"""What listens on a port: the tracking server and its app, the UI and its guard, and the pyfunc
that ``mlflow models serve`` runs."""
