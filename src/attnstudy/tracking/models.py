"""Model packaging: the plain model files and the "models from code" pyfunc of a model run, their
registration, and resolving a model URI back to the files (``runs:/``, ``models:/NAME/VERSION``,
``models:/NAME/latest``, ``models:/NAME@ALIAS``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from attnstudy.runtime.signals import deferred_signals

from ..config import ConfigError, split_runs_uri
from ..models.io import MODEL_FILES
from .client import (
    ModelNotFoundError,
    Tracker,
    TrackingError,
    UnfinishedRunError,
    _first_line,
    _process_uri,
    deleted_run_error,
)
from .schema import Artifact, RunRecord
from .store import owner_note


def log_model_dir(
    tracker: Tracker,
    run_id: str,
    model_dir: str | Path,
    code_path: str | Path,
    package_dir: str | Path,
    name: str = "model",
) -> str:
    """Log the plain model files under ``model/`` and a "models from code" pyfunc logged model.

    The pyfunc (``attnstudy.serving.pyfunc``, listed in the Models tab, servable with ``mlflow
    models
    serve``) carries the same four files, the attnstudy package it was logged with (``code/``)
    and pip requirements pinned to the versions installed when it was logged; its ``MLmodel``
    records no path of this machine. Loading it with ``mlflow.pyfunc.load_model`` runs that
    stored code (attnstudy's own loader never does: it reads only the plain files). The model
    is not registered here: :func:`register_model` does that once the run is FINISHED.

    Args:
        run_id: the (running) model run.
        model_dir: folder holding the four model files.
        code_path: the pyfunc's code (``attnstudy/serving/pyfunc.py``; passed in by the app layer,
        which
            owns it, so tracking never imports the app).
        package_dir: the attnstudy package folder, logged as the model's ``code/``.
        name: the logged model's name (e.g. the variant, ``copy-additive-bahdanau``).

    Returns:
        The logged model's id (``m-…``).
    """
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    tracker.log_artifacts(run_id, model_dir, Artifact.MODEL_DIR)
    with tempfile.TemporaryDirectory(prefix="attnstudy-pyfunc-") as tmp:
        files = Path(tmp) / "files"
        shutil.copytree(model_dir, files)
        local = Path(tmp) / "pyfunc"
        with deferred_signals():
            mlflow.pyfunc.save_model(
                path=str(local),
                python_model=str(code_path),
                artifacts={p.stem: str(p) for p in sorted(files.iterdir()) if p.is_file()},
                code_paths=[str(package_dir)],
                pip_requirements=pinned_requirements(),
            )
        _strip_machine_paths(local / "MLmodel")
        exp_id = tracker.get_run(run_id).experiment_id
        model = tracker._call(
            tracker.client.create_logged_model,
            exp_id,
            name=name,
            source_run_id=run_id,
            tags={"attnstudy.kind": "model"},
        )
        try:
            tracker._call(tracker.client.log_model_artifacts, model.model_id, str(local))
            tracker._call(
                tracker.client.finalize_logged_model, model.model_id, LoggedModelStatus.READY
            )
        except BaseException:
            with deferred_signals():
                try:
                    tracker.client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
                except MlflowException:
                    pass
            raise
    tracker._call(tracker.client.log_outputs, run_id, [LoggedModelOutput(model.model_id, 0)])
    return model.model_id


def register_model(
    tracker: Tracker,
    run_id: str,
    model_id: str,
    name: str,
    tags: dict[str, str] | None = None,
    description: str | None = None,
) -> str:
    """Register a FINISHED run's logged model as a new version of ``name``.

    Called only after the run has ended FINISHED, so a version never points at a killed run.
    Signals are held for the whole registration, and a registered model this call created is
    deleted again if its first version could not be created (no empty registered model).

    Returns:
        The new version.

    Raises:
        TrackingError: the run is not FINISHED, or the store failed.
    """
    status = tracker.get_run(run_id).status
    if status != "FINISHED":
        raise TrackingError(f"run {run_id} is {status}; only a FINISHED run's model is registered")
    with deferred_signals():
        created = False
        try:
            tracker.client.create_registered_model(name)
            created = True
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise TrackingError(
                    f"could not register model {name!r}: {_first_line(err)}"
                ) from None
        try:
            # MLflow resolves a models:/<id> source through the process-wide URI: point it here
            with _process_uri(tracker.uri):
                mv = tracker.client.create_model_version(
                    name,
                    source=f"models:/{model_id}",
                    run_id=run_id,
                    model_id=model_id,
                    tags=tags,
                    description=description,
                )
        except BaseException as err:
            if created:
                try:
                    if not tracker.client.search_model_versions(f"name = '{name}'"):
                        tracker.client.delete_registered_model(name)
                except MlflowException:
                    pass
            if isinstance(err, MlflowException):
                raise TrackingError(
                    f"could not register model {name!r}: {_first_line(err)}"
                ) from None
            raise
    return str(mv.version)


def registered_aliases(tracker: Tracker, name: str) -> dict[str, str]:
    """Alias → version of registered model ``name``.

    Raises:
        TrackingError: the store failed (or there is no such registered model).
    """
    model = tracker._call(tracker.client.get_registered_model, name)
    return {alias: str(version) for alias, version in model.aliases.items()}


def logged_model_ids(tracker: Tracker, run_id: str) -> list[str]:
    """The logged models (``m-…``) a run has as outputs, oldest first.

    Raises:
        TrackingError: the store failed.
    """
    outputs = tracker._call(tracker.client.get_run, run_id).outputs
    return [o.model_id for o in (outputs.model_outputs if outputs else [])]


def unregister_version(tracker: Tracker, name: str, version: str, run_id: str) -> None:
    """Undo a registration, as far as the store still answers: the run's ``registered_model``
    tag, the version (MLflow drops its aliases with it) and the registered model if no version
    is left. Never raises a store error (it runs while another error travels on)."""
    from .schema import Tag

    steps = (
        lambda: tracker.client.delete_tag(run_id, Tag.REGISTERED_MODEL),
        lambda: tracker.client.delete_model_version(name, version),
        lambda: tracker.model_versions(name) or tracker.client.delete_registered_model(name),
    )
    with deferred_signals():
        for step in steps:
            try:
                step()
            except (MlflowException, TrackingError):
                pass


def download_model_dir(
    tracker: Tracker, uri: str, dst: str | Path, allow_unfinished: bool = False
) -> tuple[str, Path]:
    """Resolve ``runs:/<id>[/path]``, ``models:/<name>/<version>``, ``models:/<name>/latest`` or
    ``models:/<name>@<alias>`` and download only the weight, config and vocabulary files.

    Returns:
        (run_id, local directory).

    Raises:
        ModelNotFoundError: missing run/model/version/alias (a registered model without
            versions says so), a path leaving the run, or no model files.
        DeletedError: the run (or the version's run) or its experiment is deleted, even with ``allow_unfinished``.
        UnfinishedRunError: the run is not FINISHED (unless ``allow_unfinished``).
        TrackingError: the store failed (the message gives the server's answer).
    """
    run_id, sub = resolve_model_uri(tracker, uri, allow_unfinished)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    local = dst
    for f in MODEL_FILES:
        try:
            local = Path(tracker.client.download_artifacts(run_id, f"{sub}/{f}", str(dst))).parent
        except (MlflowException, OSError):
            raise ModelNotFoundError(
                f"{uri}: run {run_id} has no model file {sub}/{f}; is it a trained-model run?"
            ) from None
    return run_id, local


def resolve_model_uri(
    tracker: Tracker, uri: str, allow_unfinished: bool = False
) -> tuple[str, str]:
    """(run_id, artifact sub-path holding the model files) for a model URI.

    Raises:
        ModelNotFoundError, DeletedError, UnfinishedRunError, TrackingError: as
            :meth:`download_model_dir`.
        ConfigError: a malformed URI (unknown scheme, ``models:/NAME`` without version, a
            ``runs:/`` path that could leave its run: :func:`attnstudy.config.split_runs_uri`).
    """
    if uri.startswith("runs:/"):
        run_id, sub = split_runs_uri(uri)  # decoded as MLflow decodes it, and kept inside the run
        sub = sub or Artifact.MODEL_DIR
        run = RunRecord.of(
            tracker._lookup(
                tracker.client.get_run, run_id, what=f"{uri}: no run with id {run_id!r}"
            )
        )
    elif uri.startswith("models:/"):
        rest = uri[len("models:/") :].strip("/")
        if "@" in rest:
            name, alias = rest.split("@", 1)
            lookup = (tracker.client.get_model_version_by_alias, name, alias)
            missing = f"no alias {alias!r}"
        else:
            name, _, version = rest.partition("/")
            if not name or not version:
                raise ConfigError(
                    f"{uri}: give a version, 'latest' or an alias "
                    "(models:/NAME/1, models:/NAME/latest or models:/NAME@ALIAS)"
                )
            lookup = (tracker.client.get_model_version, name, version)
            missing = f"no version {version!r}"
        try:
            if rest.partition("/")[2] == "latest" and "@" not in rest:
                versions = tracker._lookup(
                    tracker.client.search_model_versions,
                    f"name = '{name}'",
                    what=f"{uri}: no registered model {name!r}",
                )
                if not versions:
                    raise ModelNotFoundError(uri)
                mv = max(versions, key=lambda v: int(v.version))
            else:
                mv = tracker._lookup(*lookup, what=uri)
        except ModelNotFoundError:
            raise ModelNotFoundError(_missing_version(tracker, uri, name, missing)) from None
        if not mv.run_id:
            raise ModelNotFoundError(f"{uri}: the model version has no source run")
        run_id, sub = mv.run_id, Artifact.MODEL_DIR
        run = RunRecord.of(
            tracker._lookup(
                tracker.client.get_run, run_id, what=f"{uri}: its run {run_id!r} is gone"
            )
        )
        if deleted := deleted_run_error(tracker, f"{uri} (version {mv.version})", run):
            raise deleted
    else:
        raise ConfigError(
            f"unknown model URI {uri!r}; use runs:/<run_id>, models:/<name>/<version> "
            "or models:/<name>@<alias>"
        )
    if deleted := deleted_run_error(tracker, uri, run):  # whatever --force says: restore it
        raise deleted
    if run.status != "FINISHED" and not allow_unfinished:
        raise UnfinishedRunError(
            f"{uri}: run {run_id} is {run.status}{owner_note(run)}: its "
            "model may be incomplete; use --force to use it anyway"
        )
    return run_id, sub


def _missing_version(tracker: Tracker, uri: str, name: str, missing: str) -> str:
    """Why ``uri`` names no model version, in one line: there is no registered model ``name``,
    it exists but has no version left (its versions were deleted), or it has versions but not
    the one or the alias asked for (``missing``: "no version '3'", "no alias 'best'")."""
    try:
        with deferred_signals():
            tracker.client.get_registered_model(name)
    except MlflowException:
        return (
            f"{uri}: no registered model {name!r} in {tracker.uri}; {_registered_models(tracker)}"
        )
    versions = sorted(int(v.version) for v in tracker.model_versions(name))
    if not versions:
        return (
            f"{uri}: registered model {name!r} exists but has no versions (they were deleted); "
            "train the model again to register a new version"
        )
    listed = ", ".join(map(str, versions[-5:]))
    return f"{uri}: registered model {name!r} has {missing} (its versions: {listed})"


LISTED_MODELS = 5
"""Registered models named when a ``models:/`` URI names none of them."""


def _registered_models(tracker: Tracker) -> str:
    """The way out of a missing registered model: the first :data:`LISTED_MODELS` names there
    are, alphabetically (and where to see them all), or that the store has none."""
    try:
        with deferred_signals():
            found = tracker.client.search_registered_models(
                max_results=LISTED_MODELS + 1, order_by=["name ASC"]
            )
    except MlflowException:
        return "attnstudy ui lists the registered models"
    names = [m.name for m in found]
    if not names:
        return "the store has no registered model (attnstudy train registers each model it trains)"
    more = ", … (attnstudy ui lists them all)" if len(names) > LISTED_MODELS else ""
    return f"the registered models are: {', '.join(names[:LISTED_MODELS])}{more}"


# --- owners of running runs --------------------------------------------------------------


def pinned_requirements() -> list[str]:
    """attnstudy's own requirements, each pinned to the version installed now (the pyfunc's
    ``requirements.txt``): the attnstudy code itself travels with the model (``code/``), so nothing
    is resolved from a public index by name alone."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement
    from packaging.version import Version

    out = []
    for text in requires("attnstudy") or []:
        req = Requirement(text)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        try:
            out.append(
                f"{req.name}=={Version(version(req.name)).public}"
            )  # torch 2.13.0+cpu → 2.13.0
        except PackageNotFoundError:
            out.append(str(req))
    return out


def _strip_machine_paths(mlmodel: Path) -> None:
    """Drop the absolute source paths MLflow records in an ``MLmodel`` file (the artifacts'
    ``uri`` and the model code's full path; the loader needs only the file name)."""
    import yaml

    doc = yaml.safe_load(mlmodel.read_text(encoding="utf-8"))
    pyfunc = doc.get("flavors", {}).get("python_function", {})
    for art in (pyfunc.get("artifacts") or {}).values():
        if isinstance(art, dict):
            art.pop("uri", None)
    if pyfunc.get("model_code_path"):
        pyfunc["model_code_path"] = Path(pyfunc["model_code_path"]).name
    mlmodel.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
