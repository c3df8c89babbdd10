"""The ``attnstudy`` command's arguments, one verb a function (train, run, predict, ablate,
report, server, ui, job), and :func:`build_parser` that puts them together; :mod:`attnstudy.cli.main`
runs
the verbs. Standard library, pydantic and the catalogue only: the arguments are parsed before
torch or mlflow load.
"""

from __future__ import annotations

import argparse

from attnstudy.analysis.catalogue import list_ablations
from attnstudy.serving import server_app  # standard library only: the database check's bound

EXIT_CODES_HELP = """exit codes (every verb):
  0  done
  2  what you named does not exist or is malformed: an argument, a config value, a file, a run,
     a model URI, a store, data that cannot be read with certainty (nothing was written)
  1  a run failed: a training diverged, a tracking server did not answer, variants of a study
     failed (the others ran; the report says what failed)
ATTNSTUDY_DEBUG=1 shows tracebacks."""


class UsageError(Exception):
    """Bad arguments (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, instead of argparse's usage dump
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _add_tracking(sp) -> None:
    """``--tracking-uri`` and ``--tracking-timeout`` of a verb that reads the store."""
    sp.add_argument(
        "--tracking-uri",
        metavar="URI",
        default=None,
        help="tracking store: sqlite:///PATH/mlflow.db or http(s)://server (default: the "
        "experiment's, else $MLFLOW_TRACKING_URI, else <project>/mlruns/mlflow.db)",
    )
    sp.add_argument(
        "--tracking-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds to wait for a tracking server (default: the experiment's, else 10)",
    )


def _add_common(sp, experiment: bool = True) -> None:
    """The experiment file and its ``--set`` (with ``experiment``), ``--quiet`` and the store."""
    if experiment:
        sp.add_argument("experiment", help="experiment TOML file (see experiments/)")
        sp.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value, e.g. --set training.epochs=3 (repeatable)",
        )
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_tracking(sp)


def _train_verb(sub) -> None:
    """``attnstudy train``: train every model of an experiment."""
    sp = sub.add_parser("train", help="train every model of an experiment (reusing finished runs)")
    _add_common(sp)
    sp.add_argument(
        "--retrain", action="store_true", help="train even if a finished run has the same model key"
    )
    sp.add_argument(
        "--resume", action="store_true", help="continue from the last complete checkpoint"
    )


def _run_verb(sub) -> None:
    """``attnstudy run``: the main job, and where it runs (``--executor``)."""
    sp = sub.add_parser(
        "run", help="the main job: train what is missing, ablate every model, report"
    )
    _add_common(sp)
    sp.add_argument(
        "--retrain", action="store_true", help="train even if a finished run has the same model key"
    )
    sp.add_argument(
        "--resume",
        action="store_true",
        help="continue the newest interrupted study of this experiment: finished models and "
        "ablations are reused, an interrupted training resumes from its checkpoint",
    )
    sp.add_argument("--no-report", action="store_true", help="skip building the report")
    sp.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where the trainings and ablations run: local (the default: worker processes on this "
        "machine, side by side, one per core unless experiment.workers says otherwise; "
        "experiment.workers = 1: this process, one model after another) or ray (one task per "
        "variant and seed on a Ray cluster; needs an http(s) tracking server and the "
        "[distributed] extra)",
    )
    sp.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        default=None,
        help="the Ray head for --executor ray (default: $RAY_ADDRESS, else a private Ray head on "
        "this machine's loopback for the run); with --submit, the head's job server "
        "http://HEAD:8265",
    )
    sp.add_argument(
        "--submit",
        action="store_true",
        help="with --executor ray: hand the study to the head's job server as a Ray job and "
        "return; its driver runs on the head, so this machine may disconnect (the job verb "
        "follows it; needs the dashboard on the head: ray[default])",
    )


def _job_verb(sub) -> None:
    """``attnstudy job``: a study submitted with ``run --submit``: its status, log, or stop."""
    sp = sub.add_parser(
        "job", help="a study submitted with 'run --submit': its status, its log, or stop it"
    )
    sp.add_argument("action", choices=["status", "logs", "stop"], help="what to do")
    sp.add_argument("job_id", metavar="ID", help="the job's id ('run --submit' prints it)")
    sp.add_argument(
        "--follow",
        action="store_true",
        help="logs: print the log as it grows until the job ends; the exit code is the job's "
        "(0 succeeded, 1 failed or stopped); Ctrl-C stops following, not the job",
    )
    sp.add_argument(
        "--ray-address",
        metavar="URL",
        default=None,
        help="the head's job server, http://HEAD:8265 (default: $RAY_ADDRESS)",
    )


def _predict_verb(sub) -> None:
    """``attnstudy predict``: decode inputs with a stored model."""
    sp = sub.add_parser("predict", help="decode inputs with a stored model")
    sp.add_argument(
        "model_uri",
        help="runs:/<run_id>, models:/<name>/<version>, models:/<name>/latest, models:/<name>@<alias> "
        "or a model folder",
    )
    sp.add_argument("inputs", nargs="*", help="input strings (a G2P word, a token sequence, …)")
    sp.add_argument(
        "--input",
        dest="input_file",
        metavar="FILE",
        default=None,
        help="read inputs from FILE, one per line (UTF-8; '-' reads standard input); the model is "
        "loaded once for all of them",
    )
    sp.add_argument("--attention", action="store_true", help="also print the attention matrix")
    sp.add_argument("--beam", type=int, default=1, help="beam size (default 1: greedy)")
    sp.add_argument("--json", action="store_true", help="print JSON lines")
    sp.add_argument(
        "--force", action="store_true", help="also use the model of a run that is not FINISHED"
    )
    _add_tracking(sp)


def _ablate_verb(sub) -> None:
    """``attnstudy ablate``: the battery on a stored or pretrained model."""
    sp = sub.add_parser("ablate", help="run the ablation battery on a stored or pretrained model")
    sp.add_argument(
        "model_uri",
        help="runs:/<run_id>, models:/<name>/<version>, models:/<name>@<alias>, or hf:FOLDER (a "
        "Hugging Face encoder-decoder saved with save_pretrained; needs --tsv or --data)",
    )
    sp.add_argument(
        "--tsv",
        default=None,
        metavar="FILE",
        help="examples for a pretrained model: UTF-8 lines source<TAB>target[<TAB>links]",
    )
    sp.add_argument(
        "--data",
        default=None,
        metavar="EXPERIMENT.toml",
        help="for a pretrained model (hf:FOLDER): the task data of this experiment file's [data] "
        "(its test split), its [ablation] settings (the flags below win) and its store",
    )
    sp.add_argument(
        "--ablations",
        default=None,
        help=f"comma-separated subset of: {', '.join(list_ablations())} (default: the default battery, "
        f"{', '.join(list_ablations(default_only=True))})",
    )
    sp.add_argument(
        "--n-examples", type=int, default=None, help="test examples to analyse (default 200)"
    )
    sp.add_argument(
        "--prefix",
        choices=["greedy", "reference"],
        default=None,
        help="prefix policy (default greedy)",
    )
    sp.add_argument("--seed", type=int, default=None, help="ablation seed (default 0)")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sp.add_argument(
        "--force", action="store_true", help="also ablate the model of a run that is not FINISHED"
    )
    sp.add_argument(
        "--record",
        action="store_true",
        help="with hf:FOLDER and --tsv: record the battery in the tracking store (the model run, "
        "the ablation run, its pages and example browser; --tracking-uri implies it); without "
        "it only the statistics and the verdict are printed and no store is opened",
    )
    _add_tracking(sp)


def _report_verb(sub) -> None:
    """``attnstudy report``: a study's report (and its result tables)."""
    sp = sub.add_parser(
        "report", help="build the HTML + Markdown report of a study from the tracking store"
    )
    g = sp.add_mutually_exclusive_group()
    g.add_argument(
        "--study", metavar="RUN_ID", help="the study run (default: the latest of the experiment)"
    )
    g.add_argument("--experiment", metavar="NAME", help="experiment name (default: quickstart)")
    sp.add_argument("--out", metavar="DIR", help="output folder (default: reports/<experiment>/)")
    sp.add_argument(
        "--results",
        metavar="DIR",
        help="also write the summary tables as DIR/<experiment>.csv, <experiment>-models.csv, "
        "-adversaries.csv, -seed-variance.csv and -timing.csv (the repository keeps them in "
        "experiments/results/)",
    )
    sp.add_argument(
        "--ui-url",
        metavar="URL",
        help="the MLflow UI the report links to (default: $ATTNSTUDY_UI_URL, else the "
        "--tracking-uri when it is an http(s) server, else the address `attnstudy ui` last "
        "served the store at, its --port included, else http://127.0.0.1:5000)",
    )
    sp.add_argument(
        "--verdict",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a verdict threshold over the experiment's [report.verdict] (repeatable), e.g. "
        "used_flip=0.2; the report lists them all",
    )
    _add_tracking(sp)


def _server_verb(sub) -> None:
    """``attnstudy server``: a team's tracking server."""
    sp = sub.add_parser(
        "server",
        help="run a team's MLflow tracking server: a database store, artifacts served through it",
    )
    sp.add_argument(
        "--backend-store-uri",
        metavar="URI",
        default=None,
        help="the database, e.g. postgresql+psycopg://USER@HOST:5432/DB (password from PGPASSWORD "
        "or ~/.pgpass, never the command line); default: $MLFLOW_BACKEND_STORE_URI. It is checked "
        f"first: one that does not answer within {server_app.CHECK_BOUND_S} s stops the command "
        "in one line (exit 1), and "
        "the server's /health answers 503 while it does not answer",
    )
    sp.add_argument(
        "--artifacts",
        metavar="DIR",
        required=True,
        help="where the server keeps artifacts (clients reach them only through the server)",
    )
    sp.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; the server has no "
        "authentication unless --app-name basic-auth)",
    )
    sp.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    sp.add_argument(
        "--app-name",
        choices=["basic-auth"],
        default=None,
        help="MLflow's basic-auth app: users and permissions (docs/cluster.md)",
    )
    sp.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="the server's worker processes (default 1: that one creates or migrates the "
        "database schema); more than one only once `mlflow db upgrade URI` has run (refused "
        "in one line otherwise)",
    )


def _ui_verb(sub) -> None:
    """``attnstudy ui``: the MLflow UI for the project's store."""
    sp = sub.add_parser("ui", help="start the MLflow UI for the project's store")
    sp.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    sp.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    sp.add_argument("--experiment", default="quickstart", help="experiment whose runs view to open")
    sp.add_argument(
        "--tracking-uri",
        metavar="URI",
        default=None,
        help="the SQLite store to serve: sqlite:///PATH/mlflow.db (default: $MLFLOW_TRACKING_URI, "
        "else <project>/mlruns/mlflow.db)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``attnstudy`` argument parser: one subcommand per job (train, run, predict, ablate,
    report, server, ui, job), each with its own ``--help``; usage errors exit with code 2
    (``EXIT_CODES_HELP``)."""
    p = _Parser(
        prog="attnstudy",
        description="Train seq2seq attention models and test whether their "
        "attention explains their output (Jain & Wallace 2019 style ablations, tracked in MLflow).",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _train_verb(sub)
    _run_verb(sub)
    _predict_verb(sub)
    _ablate_verb(sub)
    _report_verb(sub)
    _server_verb(sub)
    _ui_verb(sub)
    _job_verb(sub)
    verbose = (
        "also show what libraries print themselves: MLflow's 'View run' lines and INFO logs, "
        "warnings (or ATTNSTUDY_VERBOSE=1)"
    )
    p.add_argument("--verbose", action="store_true", help=verbose)
    for sp in sub.choices.values():  # after the verb too; given once is enough
        sp.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose)
    return p
