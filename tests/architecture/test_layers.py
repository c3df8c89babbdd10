"""The architecture as tests: one import namespace, layers that import only downward, no cycles,
the study side never reaching the report, mlflow only where it belongs, and the store's schema
named in one place.

Layers, bottom to top (a module may import its own layer and those below); each folder of
src/attnstudy sits in one layer:

    base      attnstudy (the package), config/, runtime/ (paths, notices, signals, progress,
              outputs, env, failure causes, the store check, the code's version), verdict/
    core      data/, models/ (with training, inference, devices), scoring/
    analysis  analysis/  (the catalogue, the ablations, the suite, figures)
    tracking  tracking/  (client, schema, store, models)
    serving   serving/ (the tracking server, the UI, their guard, the pyfunc)
    pages     pages/ (run pages, the example browser, templates)
    study     study/, experiment
    executors executors/ (local workers, Ray)
    report    report/
    app       api, cli/
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SOURCES = {"attnstudy": ROOT / "src" / "attnstudy", "attnstudy.analysis": ROOT / "analysis"}


def _folder(name: str) -> list[str]:
    return [f"attnstudy.{name}", f"attnstudy.{name}.*"]


LAYERS = [
    ("base", ["attnstudy", *_folder("config"), *_folder("runtime"), *_folder("verdict")]),
    # attnstudy.inference: the old name kept for pyfuncs logged before the folders
    ("core", [*_folder("data"), *_folder("models"), *_folder("scoring"), "attnstudy.inference"]),
    ("analysis", _folder("analysis")),
    ("tracking", _folder("tracking")),
    ("serving", _folder("serving")),
    ("pages", _folder("pages")),
    ("study", ["attnstudy.experiment", *_folder("study")]),
    ("executors", _folder("executors")),
    ("report", _folder("report")),
    ("app", ["attnstudy.api", *_folder("cli")]),
]
# serving wraps MLflow's model server, server_app MLflow's tracking server app
MLFLOW_ALLOWED = [
    "attnstudy.tracking",
    "attnstudy.tracking.*",
    "attnstudy.serving.pyfunc",
    "attnstudy.serving.server_app",
]


def modules() -> dict[str, Path]:
    """Every library module: dotted name → file (the analysis folder mapped onto attnstudy.analysis)."""
    out: dict[str, Path] = {}
    for base, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([base, *parts])
            if base == "attnstudy" and parts[:1] == ["analysis"]:
                continue  # not a folder of src/
            out[name] = path
    return out


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Project modules imported by ``name`` at module level or in functions (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if _is_package(name, mods) else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(project edges, all imported names) per module; edges to one's own parent package are left out."""
    mods = modules()
    edges, raw = {}, {}
    for name, path in mods.items():
        targets = imports(name, path, mods)
        raw[name] = targets
        edges[name] = {
            t for t in targets if t in mods and t != name and not name.startswith(t + ".")
        }
    return edges, raw


def layer_of(name: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch(name, p) for p in patterns):
            return i
    raise AssertionError(f"module {name} is in no layer: add it to LAYERS (and to docs/design.md)")


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_every_project_import_names_an_existing_module():
    """Also imports inside functions: a relative import that points nowhere fails only when it runs."""
    mods = modules()
    _, raw = graph()
    missing = []
    for name, targets in raw.items():
        for t in targets:
            if t.startswith("attnstudy") and t not in mods and t.rsplit(".", 1)[0] not in mods:
                missing.append(f"{name} imports {t}")
    assert not missing, missing


def test_imports_point_only_downward():
    edges, _ = graph()
    upward = [
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, targets in edges.items()
        for b in targets
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "\n".join(upward)


STUDY_SIDE = [*_folder("study"), *_folder("executors")]
"""What runs at study time. The report reads the study from the store and sits above it: the
study side reaches no report module, at module level or in a function (the report is passed to
:func:`attnstudy.study.driver.run_study` by :func:`attnstudy.api.run`)."""
NEVER_REACHES = [(STUDY_SIDE, ["attnstudy.report", "attnstudy.report.*"])]
"""Permissions beyond the layer order: (modules, what none of them may import, directly or
through other modules)."""


def reachable(start: str, edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Every module ``start`` imports directly or through others → one import path to it."""
    paths, todo = {start: [start]}, [start]
    while todo:
        here = todo.pop()
        for there in sorted(edges.get(here, ())):
            if there not in paths:
                paths[there] = [*paths[here], there]
                todo.append(there)
    return paths


def test_the_study_side_imports_no_report_module():
    edges, _ = graph()
    bad = []
    for sources, forbidden in NEVER_REACHES:
        for src in sources:
            starts = [m for m in edges if fnmatch(m, src)]
            assert starts, f"{src} names no module (update NEVER_REACHES)"
            for name, path in (p for s in starts for p in reachable(s, edges).items()):
                if any(fnmatch(name, p) for p in forbidden):
                    bad.append(" → ".join(path))
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    edges, _ = graph()
    index, low, stack, on_stack, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            strong(v)
    assert not sccs, f"import cycles: {sccs}"


def test_mlflow_only_in_tracking_and_serving():
    _, raw = graph()
    bad = [
        n
        for n, targets in raw.items()
        if any(t == "mlflow" or t.startswith("mlflow.") for t in targets)
        and not any(fnmatch(n, p) for p in MLFLOW_ALLOWED)
    ]
    assert not bad, f"mlflow imported outside tracking/serving: {bad}"


RAY_ALLOWED = (
    "attnstudy.executors.distributed",
    "attnstudy.executors.loopback_cluster",
    "attnstudy.executors.ray_jobs",
)
"""The Ray executor, the one-machine recipe's nodes and the job client of ``run --submit``
(docs/cluster.md)."""


def test_ray_only_in_the_ray_modules_and_only_inside_functions():
    """The default install has no Ray: importing any module must not need it."""
    offenders = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if not any(n == "ray" or n.startswith("ray.") for n in names):
                continue
            if name not in RAY_ALLOWED:
                offenders.append(f"{name} imports ray")
            elif id(node) in top:
                offenders.append(f"{name} imports ray at module level")
    assert not offenders, offenders


def test_no_module_imports_a_top_level_analysis_package():
    _, raw = graph()
    bad = [
        n
        for n, targets in raw.items()
        if any(t == "analysis" or t.startswith("analysis.") for t in targets)
    ]
    assert not bad, bad
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(
                    a.name == "analysis" or a.name.startswith("analysis.") for a in node.names
                ), path
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert not (node.module or "").split(".")[0] == "analysis", path


def test_outside_tracking_nothing_reaches_into_mlflow_entities():
    offenders = []
    for name, path in modules().items():
        if fnmatch(name, "attnstudy.tracking*"):
            continue
        text = path.read_text(encoding="utf-8")
        for needle in (
            ".data.tags",
            ".data.metrics",
            ".data.params",
            ".info.",
            "tracker.client",
            "MlflowClient",
        ):
            if needle in text:
                offenders.append(f"{name}: {needle}")
    assert not offenders, offenders


def test_artifact_paths_and_store_tags_are_named_once():
    from attnstudy.tracking.schema import Artifact

    paths = [
        v
        for k, v in vars(Artifact).items()
        if not k.startswith("_") and "/" in v or k.endswith("_JSON")
    ]
    offenders = []
    for name, path in modules().items():
        if name == "attnstudy.tracking.schema":
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{name}: {p!r}" for p in paths if f'"{p}"' in text]
        for tag in (
            "model_run_ids",
            "ablation_run_ids",
            "failed_run_ids",
            "source_run_id",
            "model_key",
            "study_key",
        ):
            if f'"{tag}"' in text:
                offenders.append(f"{name}: tag {tag!r}")
    assert not offenders, offenders


def test_a_users_own_analysis_module_does_not_shadow_the_library(tmp_path):
    """With a user's analysis.py in the working directory, the library still imports (it used to be a
    top-level package `analysis` that such a file shadowed)."""
    (tmp_path / "analysis.py").write_text("SHADOW = True\n")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-c", "import attnstudy.analysis.suite, analysis; print(analysis.SHADOW)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def test_the_analysis_folder_refuses_to_import_as_a_second_package():
    out = subprocess.run(
        [sys.executable, "-c", "import analysis"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "must be imported as attnstudy.analysis" in out.stderr


@pytest.mark.parametrize("package", ["attnstudy.analysis.ablations"])
def test_packaging_lists_every_package(package):
    """pyproject.toml names every package folder (a wheel would miss an unlisted one)."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {n for n, p in modules().items() if p.name == "__init__.py"}
    assert folders <= listed, folders - listed
