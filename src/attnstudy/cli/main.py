"""The ``attnstudy`` command (docs/design.md §6).

Arguments and the experiment config are validated before torch or mlflow are imported, so a usage
error answers at once. Errors are one line on stderr. Exit codes, on every verb: 0 ok; 2 what the
user named does not exist or is malformed (an argument, a config value, a file, a run, a model URI,
a store, data that cannot be read with certainty); 1 a run failed (training diverged, a server did
not answer, variants of a study failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import unicodedata
from pathlib import Path

from pydantic import ValidationError

from attnstudy.analysis.catalogue import AblationConfig, list_ablations
from attnstudy.cli.args import EXIT_CODES_HELP as EXIT_CODES_HELP
from attnstudy.cli.args import UsageError, build_parser
from attnstudy.config import (
    ConfigError,
    check_model_uri,
    check_tracking_uri,
    describe_error,
    sqlite_database,
)
from attnstudy.experiment import ExperimentConfig, load_experiment

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _ablation_config(args, base: AblationConfig | None = None) -> AblationConfig:
    """The ablation settings of ``ablate``: the flags over ``base`` (an experiment's
    ``[ablation]``) or over the defaults."""
    values: dict = base.model_dump() if base is not None else {}
    if args.ablations is not None:
        names = [a.strip() for a in args.ablations.split(",") if a.strip()]
        if not names:
            raise UsageError(
                f"--ablations {args.ablations!r} names no ablation; valid: {', '.join(list_ablations())}"
            )
        unknown = [a for a in names if a not in list_ablations()]
        if unknown:
            raise UsageError(
                f"unknown ablation {unknown[0]!r}; valid: {', '.join(list_ablations())}"
            )
        values["ablations"] = names
    if args.n_examples is not None:
        if args.n_examples < 1:
            raise UsageError(f"--n-examples must be at least 1, got {args.n_examples}")
        values["n_examples"] = args.n_examples
    if args.prefix:
        values["prefix"] = args.prefix
    if args.seed is not None:
        if not 0 <= args.seed < 2**63:
            raise UsageError(f"--seed must be in [0, 2^63), got {args.seed}")
        values["seed"] = args.seed
    try:
        return AblationConfig(**values)
    except ValidationError as err:
        raise UsageError(describe_error(err)) from None


def _threads(cfg: ExperimentConfig | None) -> int:
    if cfg is not None:
        return cfg.runs()[0].training.threads
    env = os.environ.get("ATTNSTUDY_THREADS", "1")
    if not env.isdigit() or not 1 <= int(env) <= 256:
        raise UsageError(f"ATTNSTUDY_THREADS={env!r} is not a thread count in 1..256")
    return int(env)


def _tracking_overrides(args, cfg: ExperimentConfig | None) -> ExperimentConfig | None:
    """Apply --tracking-uri / --tracking-timeout to the experiment (they win over its file)."""
    uri, timeout = getattr(args, "tracking_uri", None), getattr(args, "tracking_timeout", None)
    if timeout is not None and not 0 < timeout <= 3600:
        raise UsageError(f"--tracking-timeout must be in (0, 3600] seconds, got {timeout:g}")
    if uri is not None:
        try:
            check_tracking_uri(uri)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if cfg is None or (uri is None and timeout is None):
        return cfg
    meta = cfg.experiment.model_copy(
        update={
            k: v for k, v in (("tracking_uri", uri), ("tracking_timeout", timeout)) if v is not None
        }
    )
    return cfg.model_copy(update={"experiment": meta})


def _validate(args) -> tuple[ExperimentConfig | None, AblationConfig | None]:
    """Everything that can be checked without torch or mlflow."""
    cfg = abl = None
    if args.command in ("train", "run"):
        cfg = load_experiment(args.experiment, args.overrides)
    if args.command == "server":
        from attnstudy.serving import server  # standard library only

        try:
            server.check_args(
                args.backend_store_uri, args.artifacts, args.host, args.port, workers=args.workers
            )
        except ValueError as err:
            raise UsageError(str(err)) from None
    if args.command == "ablate" and getattr(args, "data", None):
        cfg = load_experiment(args.data)
        abl = _ablation_config(args, cfg.ablation)
    elif args.command == "ablate":
        abl = _ablation_config(args)
    if args.command in ("predict", "ablate"):
        _validate_model_verb(args)
    if args.command == "ui":
        if not 0 < args.port < 65536:
            raise UsageError(f"--port must be between 1 and 65535, got {args.port}")
        from attnstudy.serving import ui  # standard library only

        try:
            ui.check_host(args.host)
        except ValueError as err:
            raise UsageError(str(err)) from None
        if args.tracking_uri is not None:
            try:
                check_tracking_uri(args.tracking_uri)
            except ValueError as err:
                raise UsageError(str(err)) from None
    if args.command == "report":
        args.verdict = verdict_overrides(args.verdict)
        if args.ui_url is not None and not re.match(r"^https?://[^\s/]+", args.ui_url):
            raise UsageError(
                f"--ui-url {args.ui_url!r} is not an http(s) URL; give the address the MLflow UI "
                "answers at, e.g. http://127.0.0.1:5000"
            )
        if args.experiment is not None and not args.experiment.strip():
            raise UsageError("--experiment is empty")
        if args.study is not None and not args.study.strip():
            raise UsageError(
                "--study is empty; give a study run id, or leave it out for the latest study"
            )
        _check_report_outputs(args)
    cfg = _tracking_overrides(args, cfg)
    if args.command == "run":
        _validate_executor(args, cfg)
    if args.command == "job":
        from attnstudy.executors import ray_jobs  # standard library only

        if args.follow and args.action != "logs":
            raise UsageError("--follow is for 'attnstudy job logs'")
        args.ray_address = ray_jobs.check_job_address(args.ray_address)
    return cfg, abl


def _validate_model_verb(args) -> None:
    """``predict`` and ``ablate``: the model URI, the examples given and how (no model loaded)."""
    uri = args.model_uri
    if args.command == "predict" and args.beam < 1:
        raise UsageError(f"--beam must be at least 1, got {args.beam}")
    if args.command == "ablate" and args.tsv and args.data:
        raise UsageError("give the examples once: --tsv FILE or --data EXPERIMENT.toml")
    if args.command == "ablate" and args.data and not uri.startswith("hf:"):
        raise UsageError(
            f"--data applies to a pretrained model (hf:FOLDER); {uri} already names its data"
        )
    if args.command == "ablate" and args.tsv and not Path(args.tsv).is_file():
        what = "is a folder" if Path(args.tsv).is_dir() else "no such file"
        raise UsageError(f"--tsv {args.tsv}: {what}; pass a TSV of source<TAB>target lines (UTF-8)")
    if args.command == "ablate" and args.record and not (uri.startswith("hf:") and args.tsv):
        raise UsageError(
            "--record applies to ablate hf:FOLDER --tsv FILE (a stored model's ablation, and one "
            "with --data, is always recorded): drop --record"
        )
    if args.command == "ablate" and args.tsv and uri.startswith("models:/"):
        raise UsageError(
            f"--tsv applies to a pretrained model (hf:FOLDER or its runs:/ID); {uri} already "
            "names its data: drop --tsv"
        )
    if args.command == "ablate" and uri.startswith("hf:"):
        if not (args.tsv or args.data):
            raise UsageError(
                f"{uri}: a pretrained model needs its examples: add --tsv FILE or "
                "--data EXPERIMENT.toml"
            )
        from attnstudy.data.hf_folder import HFError, check_folder  # standard library only

        try:
            check_folder(Path(uri.removeprefix("hf:")).expanduser().resolve())
        except HFError as err:
            raise UsageError(str(err)) from None
    else:
        check_model_uri(uri, args.command)  # ConfigError: exit 2
    if args.command == "predict":
        if args.input_file is not None:
            args.inputs = [*args.inputs, *_read_inputs(args.input_file)]
        if not args.inputs:
            raise UsageError("give inputs as arguments or with --input FILE (- for stdin)")
        if any(not s.strip() for s in args.inputs):
            raise UsageError("an input is empty: give at least one token per input")


def _validate_executor(args, cfg: ExperimentConfig) -> None:
    """``--executor ray`` (and ``--submit``): a server store, a Ray address of the right kind,
    and (submitting) files that travel with the experiment's folder."""
    if args.ray_address is not None and args.executor != "ray":
        raise UsageError("--ray-address is for --executor ray")
    if args.submit and args.executor != "ray":
        raise UsageError("--submit is for --executor ray: add --executor ray")
    if args.executor != "ray":
        return
    from attnstudy.executors import distributed  # standard library only
    from attnstudy.runtime.paths import default_tracking_uri

    distributed.require_server_uri(cfg.experiment.tracking_uri or default_tracking_uri())
    if not args.submit:
        given, env = args.ray_address, os.environ.get("RAY_ADDRESS") or None
        distributed.check_ray_address(given or env, "--ray-address" if given else "$RAY_ADDRESS")
        return
    from attnstudy.executors import ray_jobs

    args.ray_address = ray_jobs.check_job_address(args.ray_address)
    experiment = Path(args.experiment)
    ray_jobs.check_files_travel(cfg, experiment)
    # the job runs in a copy of the experiment's folder: a --set path relative to this working
    # directory would name another file there
    absolute = experiment.resolve()  # before the folder changes: a relative path is this one's
    try:
        with contextlib.chdir(absolute.parent):
            there = load_experiment(absolute, args.overrides).model_dump()
    except ConfigError:  # a file the job would not find
        there = None
    if there != _cfg_here(experiment, args.overrides):
        raise UsageError(
            "a --set path is relative to this working directory, but the submitted job runs in "
            f"the experiment's folder ({experiment.resolve().parent}): give it relative to that "
            "folder"
        )


def _check_report_outputs(args) -> None:
    """``report --out``/``--results``: refused at once when protected or (``--out``) not
    replaceable; the same checks run again when the report is written."""
    from attnstudy.runtime.outputs import (
        REPORT_KIND,
        OutputError,
        check_output,
        check_replace,
        store_folders_of,
    )
    from attnstudy.runtime.paths import default_tracking_uri

    stores = store_folders_of(args.tracking_uri or default_tracking_uri())
    try:
        if args.out is not None:
            check_replace(args.out, kind=REPORT_KIND, option="--out", store_folders=stores)
        if args.results is not None:
            check_output(args.results, "--results", stores)
    except OutputError as err:
        raise UsageError(str(err)) from None


def _read_inputs(path: str) -> list[str]:
    """The inputs of ``--input``: one per line of a UTF-8 file (``-``: standard input).

    Raises:
        UsageError: a missing or unreadable file, non-UTF-8 text, a blank line (named by line).
    """
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"--input {path}: file not found") from None
    except OSError as err:
        raise UsageError(f"--input {path}: cannot read it ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UsageError(f"{name}:{line}: not UTF-8 text; save the inputs as UTF-8") from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    out = []
    for i, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            raise UsageError(f"{name}:{i}: blank line; give one input per line")
        out.append(line)
    if not out:
        raise UsageError(f"{name}: no inputs (one input per line)")
    return out


def _store(args, create: bool = False):
    """The store a verb names: never created, except by a verb that records a new model."""
    from attnstudy.tracking import Tracker

    return Tracker(args.tracking_uri, args.tracking_timeout, create=create)


def _execute(args, cfg: ExperimentConfig | None, abl: AblationConfig | None) -> int:
    if args.command == "ui":  # needs neither torch nor the models
        return _ui(args)
    if args.command == "job":  # needs neither torch nor the store
        return _job(args)
    if args.command == "run" and args.submit:
        return _submit(args, cfg)
    if args.command == "server":
        from attnstudy.serving import server

        return server.serve(
            args.backend_store_uri,
            args.artifacts,
            host=args.host,
            port=args.port,
            app_name=args.app_name,
            workers=args.workers,
        )
    if args.command == "ablate" and not records(args):  # no store: neither opened nor checked
        return _ablate_unrecorded(args, abl)
    refused = _check_store(args, cfg)  # before torch and mlflow load: a refusal in a second
    if refused is not None:
        return refused
    threads = _threads(cfg)
    import torch

    from attnstudy import api  # noqa: F401 (the verbs use it: loaded here, before the threads are set)

    # one intra-op thread unless configured (training.threads): the per-step kernels are small
    torch.set_num_threads(threads)

    progress = not getattr(args, "quiet", False)
    from attnstudy.runtime.progress import check_intervals

    check_intervals()  # a malformed progress interval, before anything runs
    verbs = {"train": _train_cmd, "run": _run_cmd, "predict": _predict_cmd}
    verbs |= {"ablate": _ablate_cmd, "report": _report_cmd}
    if args.command not in verbs:
        raise UsageError(f"unknown command {args.command!r}")
    return verbs[args.command](args, cfg, abl, progress=progress)


def _train_cmd(args, cfg, abl, *, progress: bool) -> int:
    """``attnstudy train``: every model of the experiment, each printed."""
    from attnstudy import api

    runs = api.train_experiment(cfg, retrain=args.retrain, resume=args.resume, progress=progress)
    for r in runs:
        _print_model(r)
    return EXIT_OK


def _run_cmd(args, cfg, abl, *, progress: bool) -> int:
    """``attnstudy run``: the study (locally or on Ray), its summary printed."""
    from attnstudy import api

    text = Path(args.experiment).read_text(encoding="utf-8")
    executor = None
    if args.executor == "ray":
        from attnstudy.executors.distributed import RayExecutor

        executor = RayExecutor(args.ray_address)
        if args.resume and executor.address is not None:  # a private head: one node
            from attnstudy.runtime.notices import notice
            from attnstudy.study.checkpoint_store import resume_note

            notice(resume_note())
    try:
        out = api.run(
            cfg,
            retrain=args.retrain,
            progress=progress,
            config_text=text,
            report=not args.no_report,
            resume=args.resume,
            executor=executor,
        )
    except api.StudyFailedError as err:
        _print_study(err.result)
        return _error_exit(str(err), EXIT_FAILED)
    _print_study(out)
    return EXIT_OK


def _cfg_here(experiment: Path, overrides: list[str]) -> dict:
    """The experiment as this working directory reads it (every path absolute)."""
    return load_experiment(experiment, overrides).model_dump()


def _submit(args, cfg: ExperimentConfig) -> int:
    """``attnstudy run --executor ray --submit``: the study sent to the head's job server as a Ray
    job (:mod:`attnstudy.executors.ray_jobs`), its id and how to follow it printed."""
    import shutil
    import tempfile

    from attnstudy.executors import ray_jobs
    from attnstudy.executors.distributed import stage_checked
    from attnstudy.runtime.paths import default_tracking_uri

    job_client = ray_jobs.client(args.ray_address)
    flags = [
        flag
        for flag, given in (
            ("--retrain", args.retrain),
            ("--resume", args.resume),
            ("--no-report", args.no_report),
            ("--quiet", args.quiet),
        )
        if given
    ]
    if args.tracking_timeout is not None:
        flags += ["--tracking-timeout", str(args.tracking_timeout)]
    folder = tempfile.mkdtemp(prefix="attnstudy-submitted-code-")
    try:
        code, _ = stage_checked(Path(folder))
        job = ray_jobs.study_job(
            Path(args.experiment),
            args.overrides,
            tracking_uri=cfg.experiment.tracking_uri or default_tracking_uri(),
            flags=flags,
            code=code,
        )
        job_id = ray_jobs.submit(job_client, job)  # uploads the copy before it returns
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the temporary folder made here
    print(f"job: {job_id}")
    print(f"follow it: attnstudy job logs {job_id} --follow --ray-address {args.ray_address}")
    return EXIT_OK


def _job(args) -> int:
    """``attnstudy job status|logs|stop ID``: a submitted study on the head's job server."""
    from attnstudy.executors import ray_jobs

    job_client = ray_jobs.client(args.ray_address)
    if args.action == "status":
        info = ray_jobs.status(job_client, args.job_id)
        said = f" ({_printable(info.message)})" if info.message else ""
        print(f"{args.job_id}: {info.status.value}{said}")
        return EXIT_OK
    if args.action == "stop":
        stopped = ray_jobs.stop(job_client, args.job_id)
        print(f"{args.job_id}: {'stopping' if stopped else 'not running'}")
        return EXIT_OK
    if not args.follow:
        sys.stdout.write(ray_jobs.logs(job_client, args.job_id))
        return EXIT_OK
    try:
        state = ray_jobs.follow_job(job_client, args.job_id)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(
            f"stopped following; job {args.job_id} goes on ('attnstudy job stop "
            f"{args.job_id}' stops it)"
        ) from None
    print(f"job {args.job_id}: {state}", file=sys.stderr)
    return EXIT_OK if state == "SUCCEEDED" else EXIT_FAILED


def _predict_cmd(args, cfg, abl, *, progress: bool) -> int:
    """``attnstudy predict``: each input decoded (and its attention), as text or JSON lines."""
    from attnstudy import api

    if Path(args.model_uri).is_dir():
        results = api.predict(
            args.model_uri, args.inputs, beam_size=args.beam, with_attention=args.attention
        )
    else:
        results = api.predict(
            args.model_uri,
            args.inputs,
            beam_size=args.beam,
            with_attention=args.attention,
            tracker=_store(args),
            force=args.force,
        )
    for r in results:
        if args.json:
            print(json.dumps(r, ensure_ascii=False))
            continue
        note = f"  ({r['n_unknown']} unknown token(s) mapped to <unk>)" if r["n_unknown"] else ""
        print(f"{_printable(r['input'])}\t{_printable(r['output'])}{note}")
        if args.attention and r.get("attention") is not None:
            src = r["source_tokens"]
            print("\t" + "\t".join(map(_printable, src)))
            for tok, row in zip(r["tokens"] + ["<eos>"], r["attention"]):
                print(_printable(tok) + "\t" + "\t".join(f"{v:.2f}" for v in row))
        elif args.attention:
            print("\t(this model has no attention)")
    return EXIT_OK


def _ablate_cmd(args, cfg, abl, *, progress: bool) -> int:
    """``attnstudy ablate``: the battery on a stored or pretrained model, its summary printed."""
    from attnstudy import api

    if args.data:
        model_run_id, run_id, result = api.ablate_pretrained_on_experiment(
            args.model_uri, cfg, abl, progress=progress
        )
        print(f"model run: runs:/{model_run_id}")
    elif args.tsv or args.model_uri.startswith("hf:"):
        from attnstudy.study import pretrained

        tracker = _store(args, create=args.model_uri.startswith("hf:"))
        model_run_id, run_id, result = pretrained.ablate_pretrained(
            args.model_uri, args.tsv, abl, tracker, progress=progress
        )
        print(f"model run: runs:/{model_run_id}")
    else:
        run_id, result = api.ablate(
            args.model_uri, abl, tracker=_store(args), progress=progress, force=args.force
        )
    from attnstudy.report import (
        ablate_summary,  # the statistics with intervals, verdict, browser, run
    )
    from attnstudy.tracking import Tracker

    store = cfg.experiment if args.data else args  # where the ablation run was logged
    tracker = Tracker(store.tracking_uri, store.tracking_timeout, create=False)
    verdict = cfg.report.verdict if args.data else None
    return ablate_summary.print_summary(tracker, run_id, skipped=result.skipped, thresholds=verdict)


def records(args) -> bool:
    """Whether ``attnstudy ablate`` records its battery in a store: always for a stored model and
    for a pretrained model with an experiment's data (``--data``: the experiment names its
    store); for ``hf:FOLDER --tsv FILE`` only when a store is asked for, with ``--record`` or
    ``--tracking-uri`` (a quick look by default, as inseq's ``attribute`` command gives one)."""
    if not (args.model_uri.startswith("hf:") and args.tsv):
        return True
    return args.record or args.tracking_uri is not None


NOTHING_RECORDED = (
    "nothing recorded: add --record to keep it as a run, with its pages and example browser"
)
"""The last line of an unrecorded ``ablate`` (:func:`records`)."""


def _ablate_unrecorded(args, abl) -> int:
    """``attnstudy ablate hf:FOLDER --tsv FILE`` without ``--record``: the battery's statistics and
    verdict printed, nothing recorded (:mod:`attnstudy.study.unrecorded`; MLflow never
    imported)."""
    import torch

    from attnstudy.runtime.progress import check_intervals
    from attnstudy.study.unrecorded import ablate_unrecorded

    torch.set_num_threads(_threads(None))
    check_intervals()
    lines = ablate_unrecorded(args.model_uri, args.tsv, abl, progress=not args.quiet)
    print("\n".join([*lines, NOTHING_RECORDED]))
    return EXIT_OK


def _report_cmd(args, cfg, abl, *, progress: bool) -> int:
    """``attnstudy report``: the report (or the result tables) of a study."""
    from attnstudy import api

    path = api.report(
        study_id=args.study,
        experiment=args.experiment,
        out_dir=args.out,
        tracker=_store(args),
        ui_url=args.ui_url,
        verdict=args.verdict,
        results_dir=args.results,
    )
    print(f"{'results' if path.suffix == '.csv' else 'report'}: {path}")
    return EXIT_OK


def _store_of(args, cfg: ExperimentConfig | None) -> tuple[str | None, float | None, bool] | None:
    """(tracking URI, timeout, whether the verb may create a SQLite store) of the store a verb
    opens, as it opens it (None: the default); None when it opens none (``predict`` of a model
    folder)."""
    if args.command in ("train", "run") or (args.command == "ablate" and args.data):
        return cfg.experiment.tracking_uri, cfg.experiment.tracking_timeout, True
    if args.command == "predict" and Path(args.model_uri).is_dir():
        return None
    if args.command in ("predict", "ablate", "report"):
        create = args.command == "ablate" and args.model_uri.startswith("hf:")
        return args.tracking_uri, args.tracking_timeout, create
    return None


def _check_store(args, cfg: ExperimentConfig | None) -> int | None:
    """The verb's store checked without MLflow (:func:`attnstudy.runtime.store_check.check_store`):
    the exit code of a refusal (its line printed: 2 a malformed URI or no store where a reading
    verb looks, 1 a server that refuses or does not answer), None when it passes."""
    from attnstudy.runtime.failure_causes import command_line  # standard library only
    from attnstudy.runtime.store_check import StoreNotFoundError, TrackingError, check_store

    store = _store_of(args, cfg)
    if store is None:
        return None
    uri, timeout, create = store
    try:
        check_store(uri, timeout, create=create)
    except (ConfigError, StoreNotFoundError) as err:
        return _error_exit(str(err), EXIT_USAGE)
    except TrackingError as err:
        return _error_exit(command_line(err), EXIT_FAILED)
    return None


def verdict_overrides(items: list[str]) -> dict[str, float]:
    """``--verdict KEY=VALUE`` items as threshold overrides, each checked against
    :class:`attnstudy.verdict.findings.VerdictThresholds` (key known, value a number in its range).

    Raises:
        UsageError: one line naming the item and what is allowed.
    """
    from pydantic import ValidationError

    from attnstudy.verdict.findings import VerdictThresholds

    fields = VerdictThresholds.model_fields
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise UsageError(
                f"--verdict {item!r}: give KEY=VALUE with KEY one of {', '.join(fields)}"
            )
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"--verdict {item!r}: the value is not a number") from None
        try:
            VerdictThresholds(**{key: number})
        except ValidationError as err:
            reason = err.errors()[0]["msg"]
            raise UsageError(f"--verdict {item!r}: {reason}") from None
        out[key] = number
    return out


def _printable(text: str) -> str:
    """Control characters (ANSI escapes, tabs, newlines) escaped, so they neither reach the terminal
    nor break the tab-separated output; every other character is kept."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) == "Cc" else ch
        for ch in text
    )


def _print_model(r) -> None:
    shown = ("test/per", "test/token_error_rate", "test/wer", "test/exact_match")
    keys = [k for k in shown if k in r.metrics]
    summary = ", ".join(f"{k} {r.metrics[k]:.4f}" for k in keys)
    print(f"{_verb(r)} {r.spec.name}: runs:/{r.run_id}" + (f" ({summary})" if summary else ""))
    if r.reused:
        print(f"  reused because the {r.reason}")


def _verb(m) -> str:
    """What happened to a study's model: reused, trained, or (a pretrained one) evaluated."""
    if m.reused:
        return "reused"
    return "evaluated" if m.spec.model.pretrained else "trained"


def _print_study(out) -> None:
    for m in out.models:
        abl = out.ablations.get(m.run_id)
        print(
            f"{_verb(m)} {m.spec.name}: runs:/{m.run_id}"
            + (f", ablations runs:/{abl}" if abl else ", no ablations")
        )
    for f in out.failures:
        print(f"failed {f}" + (f": runs:/{f.run_id}" if f.run_id else ""))
    print(f"study: runs:/{out.study_run_id}" + (" (resumed)" if out.resumed else ""))
    if out.report:
        from attnstudy.executors.distributed import submitted_job_env

        if submitted_job_env() is None:
            print(f"report: {out.report}")
        else:  # a submitted job's folder on the head goes when the job ends: say where it stays
            print(
                f"report: in the study run's artifacts (report/); 'attnstudy report --study "
                f"{out.study_run_id}' writes it where you run it"
            )


def _ui(args) -> int:
    from attnstudy.serving import ui

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"attnstudy: warning: binding {args.host}: the UI (with write access to the store) is "
            "reachable from other machines",
            file=sys.stderr,
            flush=True,
        )
    proc = None
    try:  # Ctrl-C at any point (imports and store creation included) stops cleanly, the server too
        from attnstudy.runtime.paths import default_tracking_uri

        if ui.port_in_use("127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host, args.port):
            raise UsageError(f"port {args.port} is in use; choose another with --port")
        uri = args.tracking_uri or default_tracking_uri()
        if not uri.startswith("sqlite:"):
            raise UsageError(f"the UI serves a local SQLite store; the tracking URI is {uri}")
        from attnstudy.runtime.store_check import StoreNotFoundError, check_store

        try:
            check_store(uri, create=False)  # before mlflow loads
        except (ConfigError, StoreNotFoundError) as err:
            raise UsageError(str(err)) from None
        from attnstudy.tracking import Tracker

        tracker = Tracker(uri, create=False)  # an existing store, checked before the server starts
        exp_id = ui.experiment_link_id(tracker, args.experiment)
        proc = ui.start_server(uri, tracker.artifact_root, host=args.host, port=args.port)
        base = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
        ui.record_address(sqlite_database(uri), base)  # where the report's links point
        print(f"MLflow UI: {ui.runs_view_url(base, exp_id)}", flush=True)  # before it answers
        print(f"press Ctrl-C to stop; {ui.STARTING}", flush=True)
        ui.wait_healthy(base, 90, proc)
        print(ui.READY, flush=True)
        proc.wait()
        return EXIT_OK if proc.returncode == 0 else EXIT_FAILED
    except KeyboardInterrupt:
        _interrupt_handled()
        print("stopping the MLflow UI", file=sys.stderr)
        return EXIT_OK
    finally:
        if proc is not None:
            ui.stop_server(proc)


def _interrupt_handled() -> None:
    """Make a caught KeyboardInterrupt count as handled.

    CPython (3.11) flags a KeyboardInterrupt raised inside code run by ``exec(<string>)`` —
    dataclass and namedtuple creation during a lazy import, say — as unhandled even once it is
    caught, and under ``python -m attnstudy.cli`` then ends the process by SIGINT (exit -2/130)
    instead of with our exit code. Every exec of a string clears that flag.
    """
    exec("")


def _error_exit(message: str, code: int) -> int:
    print(f"attnstudy: error: {message}", file=sys.stderr)
    return code


def _install_notices() -> None:
    """Print the ``attnstudy`` logger's notices as ``attnstudy: note: …`` lines on stderr."""
    from attnstudy.runtime.notices import install_note_lines

    install_note_lines()


def main(argv: list[str] | None = None) -> int:
    """Entry point. Returns the exit code (0 ok, 1 failed, 2 bad usage)."""
    from attnstudy.runtime.notices import set_library_output, verbose_from_env
    from attnstudy.runtime.signals import (
        acknowledge_interrupt,
        quiet_dropped_interrupts,
        request_interrupt,
    )

    if threading.current_thread() is threading.main_thread():
        sys.unraisablehook = quiet_dropped_interrupts
        signal.signal(signal.SIGTERM, request_interrupt)
        if (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):  # not when the shell ignores it
            signal.signal(signal.SIGINT, request_interrupt)
    _install_notices()
    try:
        args = build_parser().parse_args(argv)
        set_library_output(args.verbose or verbose_from_env())  # D23: no library noise by default
        cfg, abl = _validate(args)
    except (UsageError, ConfigError) as err:
        return _error_exit(str(err), EXIT_USAGE)
    except SystemExit as err:  # --help
        return int(err.code or 0)
    try:
        return _execute(args, cfg, abl)
    except KeyboardInterrupt as err:
        acknowledge_interrupt()
        try:
            _interrupt_handled()
            again = "resume with --resume" if "resume" in vars(args) else "run the command again"
            # an interrupt that took effect after its run ended says itself what it left behind
            what = str(err) or f"finished runs are kept, the current run is marked KILLED ({again})"
            return _error_exit(f"interrupted; {what}", EXIT_FAILED)
        except KeyboardInterrupt:  # a second Ctrl-C while the first is reported: still exit 1
            _interrupt_handled()
            return EXIT_FAILED
    except (UsageError, ConfigError) as err:
        return _error_exit(str(err), EXIT_USAGE)
    except Exception as err:  # one line, never a traceback; ATTNSTUDY_DEBUG=1 shows it
        if os.environ.get("ATTNSTUDY_DEBUG"):
            raise
        from attnstudy.data.types import DataError
        from attnstudy.executors.distributed import ClusterNotFoundError
        from attnstudy.executors.ray_jobs import JobServerError
        from attnstudy.models.io import ModelLoadError
        from attnstudy.runtime.outputs import OutputError
        from attnstudy.tracking.client import StoreDamagedError

        # what the user named does not exist or is malformed: 2; a run that failed: 1
        named = (
            DataError
            | LookupError
            | ModelLoadError
            | ClusterNotFoundError
            | StoreDamagedError
            | OutputError
        )
        code = EXIT_USAGE if isinstance(err, named) else EXIT_FAILED
        if isinstance(err, JobServerError):  # says itself what happened and what to do
            return _error_exit(str(err).strip().splitlines()[0], code)
        from attnstudy.runtime.failure_causes import (
            command_line,  # a cluster cause first, with what to do
        )

        return _error_exit(command_line(err), code)


def entry() -> None:
    """The console script: :func:`main`, then an exit that no late Ctrl-C turns into a traceback
    (MLflow's exit hooks run after ``main`` returns)."""
    code = EXIT_FAILED
    try:
        code = main()
    except KeyboardInterrupt:  # a second signal between main's own handling and its return
        _interrupt_handled()
    while True:  # one more arriving while the handlers are switched off is ignored, not raised
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            break
        except KeyboardInterrupt:
            _interrupt_handled()
            code = code or EXIT_FAILED
    sys.exit(code)


if __name__ == "__main__":
    entry()
