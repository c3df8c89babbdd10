"""Shared fixtures: an isolated tracking store per test session."""

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """One intra-op thread, as the CLI defaults to: the test models are tiny, and on a busy
    2-core machine two threads made a (4, 2, 1, 6) softmax take ~14 ms instead of 5 µs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _one_worker():
    """Studies run their models one after another in the test process (``$ATTNSTUDY_WORKERS``,
    the default of ``experiment.workers``): many tests patch functions that a worker process of
    the local executor would not see; tests/study/test_local_workers.py sets its own."""
    before = os.environ.get("ATTNSTUDY_WORKERS")
    os.environ.setdefault("ATTNSTUDY_WORKERS", "1")
    yield
    if before is None:
        os.environ.pop("ATTNSTUDY_WORKERS", None)


@pytest.fixture(scope="session", autouse=True)
def _no_system_metrics():
    """No ``system/*`` sampler thread per run (``$ATTNSTUDY_SYSTEM_METRICS``): the suite's runs
    last a second; tests/tracking/test_system_metrics.py turns it on."""
    before = os.environ.get("ATTNSTUDY_SYSTEM_METRICS")
    os.environ.setdefault("ATTNSTUDY_SYSTEM_METRICS", "0")
    yield
    if before is None:
        os.environ.pop("ATTNSTUDY_SYSTEM_METRICS", None)


_DECLARED_OUTPUTS = frozenset({".pytest_cache", "test-output"})
"""What the suite may create in the repository root: pytest's cache and the browser tests'
screenshots (tests/ui/test_browser.py, git-ignored)."""


def _store_entries(mlruns: Path) -> set[str]:
    """What attnstudy or MLflow would create in a working directory's ``mlruns/``: files (a
    database, its lock), the artifact, checkpoint and trash folders, MLflow's default experiment
    folders (numbers). Other folders are stores of people working in the tree
    (``mlruns/<name>/``), left out."""
    if not mlruns.is_dir():
        return set()
    return {
        f"mlruns/{p.name}"
        for p in mlruns.iterdir()
        if not p.is_dir() or p.name in ("artifacts", "checkpoints", ".trash") or p.name.isdigit()
    }


def _entries(folder: Path) -> set[str]:
    names = {p.name for p in folder.iterdir()} - _DECLARED_OUTPUTS
    return names | _store_entries(folder / "mlruns")


@pytest.fixture(scope="session", autouse=True)
def _nothing_written_into_the_working_directory():
    """Fails the run if the suite created anything in the repository root or the working
    directory (a ``file:`` tree, ``mlruns/mlflow.db``, ``mlruns/artifacts``…): every test writes
    under its temporary folders. Checked in each test process at its end;
    tests/tracking/test_store_location.py holds the product code to the same."""
    folders = {ROOT.resolve(), Path.cwd().resolve()}
    before = {folder: _entries(folder) for folder in folders}
    yield
    created = sorted(
        f"{folder / name}" for folder in folders for name in _entries(folder) - before[folder]
    )
    if created:
        pytest.fail(
            "the test run wrote into the repository root or the working directory: "
            + ", ".join(created),
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _signal_handlers():
    """Every test starts with the SIGINT/SIGTERM handlers the session had: ``cli.main`` installs
    its own (a deferred interrupt) and keeps them, so a later test's real SIGINT was held, then
    raised outside its ``pytest.raises`` and stopped the whole run (exit 130)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


_LIBRARY_OUTPUT_VARIABLES = (
    "PYTHONWARNINGS",
    "TRANSFORMERS_VERBOSITY",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",
    "ATTNSTUDY_VERBOSE",
)


@pytest.fixture(autouse=True)
def _library_output_variables():
    """Every test starts with the session's library-output variables: ``cli.main`` sets them for
    its child processes (notices.set_library_output) and keeps them, so a later test's subprocess
    inherited the earlier test's ``--verbose`` choice."""
    saved = {name: os.environ.get(name) for name in _LIBRARY_OUTPUT_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def store_root(tmp_path_factory):
    """A fresh project root with its own mlruns/ (SQLite store), used by every tracking test."""
    root = tmp_path_factory.mktemp("store")
    (root / "mlruns").mkdir()
    old = {k: os.environ.get(k) for k in ("ATTNSTUDY_ROOT", "MLFLOW_TRACKING_URI")}
    os.environ["ATTNSTUDY_ROOT"] = str(root)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def fresh_root(tmp_path, monkeypatch):
    """A project root of this test alone, with an empty mlruns/ (the store is created on first
    use); no tracking URI from the environment."""
    root = tmp_path / "root"
    (root / "mlruns").mkdir(parents=True)
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return root


@pytest.fixture(scope="session")
def tiny_config():
    from attnstudy.experiment import load_experiment

    return load_experiment(ROOT / "experiments" / "tiny.toml")


@pytest.fixture(scope="session")
def tiny_models(store_root, tiny_config):
    """The tiny experiment trained once into the session store: list of ModelRun."""
    from attnstudy import api

    return api.train_experiment(tiny_config, progress=False)


@pytest.fixture(scope="session")
def tiny_study(store_root, tiny_config, tiny_models):
    """The tiny experiment run end to end once (train reused, ablate, report): api.run's result."""
    from attnstudy import api

    text = (ROOT / "experiments" / "tiny.toml").read_text(encoding="utf-8")
    return api.run(tiny_config, progress=False, config_text=text)


def copy_store(source: Path, root: Path) -> Path:
    """Copy the store of the project root ``source`` (its ``mlruns/``) into the project root
    ``root``, with every path under ``source`` in the database (experiments' artifact locations,
    runs' artifact URIs, model versions' sources…) rewritten to ``root``: the copy reads and
    writes its own files (files in ``mlruns/`` are copied as they are). Returns ``root``.

    Raises:
        FileExistsError: ``root/mlruns`` exists.
    """
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location(
        "golden_build", Path(__file__).parent / "fixtures" / "golden" / "build.py"
    )
    golden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden)
    shutil.copytree(source / "mlruns", root / "mlruns")
    golden.rewrite_store_paths(
        root / "mlruns" / "mlflow.db", {str(source), str(source.resolve())}, str(root)
    )
    return root


@pytest.fixture
def tiny_study_root(tiny_study, store_root, tmp_path, monkeypatch):
    """A project root of this test alone (as :func:`fresh_root`) whose store is a copy of the
    session store, :func:`tiny_study` included (its ``reports/`` folder is not copied): a test
    that writes reads the tiny study without running it again."""
    root = copy_store(store_root, tmp_path / "root")
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return root


@pytest.fixture(scope="session")
def stub_study_template(tmp_path_factory):
    """A study of 2,000 stub models and their ablation runs in a SQLite store of its own
    (tests/fixtures/stub_store.py: no training, one transaction), built once per session; read
    it, or take :func:`stub_study` to write."""
    from tests.fixtures import stub_store

    return stub_store.build(tmp_path_factory.mktemp("stub2000"), 2000)


@pytest.fixture
def stub_study(stub_study_template, tmp_path):
    """A copy of :func:`stub_study_template` for this test alone (it may write to it)."""
    import shutil

    shutil.copytree(stub_study_template.root / "mlruns", tmp_path / "stub" / "mlruns")
    return stub_study_template.moved(tmp_path / "stub")


@pytest.fixture
def figures_not_drawn():
    """:func:`figures.figures_undrawn` for the whole test: for a test of the tiny experiment that
    checks nothing drawn; the same kinds of figure on its data are drawn in full by
    :func:`tiny_study` (which builds its report) and by the report and figure tests."""
    from figures import figures_undrawn

    with figures_undrawn():
        yield
