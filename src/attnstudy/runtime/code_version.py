"""The version of the attnstudy code a process runs: a digest of the installed package's source
files and the git commit of its checkout, when it is one.

Every model and ablation run records both (tags ``attnstudy.code_digest`` and
``attnstudy.code_commit``), and every Ray task compares its node's digest with the driver's before
it does anything (:func:`check_same_code`): a node with another checkout or another installed
version would otherwise train different code under the same model key.

The digest is SHA-256 over the sorted relative paths and contents of the package's ``.py`` files
and templates (``*.html``, ``*.j2``, ``*.css``, ``*.js``, ``*.md``, ``*.toml``, ``*.json`` beside
the code), read from where the package is installed (``attnstudy.__file__``), so an editable
install and a wheel of the same sources give the same digest. It is computed once per process.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""Where the running attnstudy package is installed."""

SOURCE_SUFFIXES = (".py", ".j2", ".toml")
"""The files whose contents make up the code digest: the sources and the report's templates (the
package data a wheel ships: pyproject.toml's ``[tool.setuptools.package-data]``)."""

UNKNOWN = "unknown"


class CodeVersionError(RuntimeError):
    """A node runs other attnstudy code than the driver (the message names both versions)."""


@dataclass(frozen=True)
class CodeVersion:
    """One process's attnstudy code.

    Attributes:
        digest: hex SHA-256 of the package's source files (:func:`code_digest`).
        commit: the git commit of the package's checkout, or ``"unknown"`` (an installed wheel,
            no git).
    """

    digest: str
    commit: str = UNKNOWN

    def describe(self) -> str:
        """``code 1a2b3c4d5e6f, commit 0123456789ab``: the digest's and the commit's prefixes."""
        commit = f"commit {self.commit[:12]}" if self.commit != UNKNOWN else "no git commit"
        return f"code {self.digest[:12]}, {commit}"


def package_folders() -> dict[str, Path]:
    """The running package's source folders by their place in the package: ``""`` for
    ``attnstudy`` and ``"analysis/"`` for ``attnstudy.analysis``, which an editable install maps
    to the checkout's top-level ``analysis/`` folder and a wheel keeps inside ``attnstudy/``
    (found without importing it, so without torch)."""
    import importlib.util

    folders = {"": PACKAGE_DIR}
    spec = importlib.util.find_spec("attnstudy.analysis")
    if spec is not None and spec.submodule_search_locations:
        folders["analysis/"] = Path(next(iter(spec.submodule_search_locations))).resolve()
    return folders


def digest_of(folders: dict[str, Path]) -> str:
    """SHA-256 (hex) over the sorted relative paths and contents of the source files
    (:data:`SOURCE_SUFFIXES`, ``__pycache__`` left out) of a package's folders
    (:func:`package_folders`: place in the package → folder).

    Each file contributes its path in the package, a NUL, its byte length, a NUL and its bytes,
    so moving bytes from one file to the next changes the digest. A folder that lies inside
    another is counted once, under its own place (a wheel's ``attnstudy/analysis``).
    """
    files: dict[str, Path] = {}
    others = {f for f in folders.values()}
    for place, folder in folders.items():
        for path in folder.rglob("*"):
            if path.suffix not in SOURCE_SUFFIXES or "__pycache__" in path.parts:
                continue
            if any(o != folder and o in path.parents for o in others if folder in o.parents):
                continue  # inside a nested package folder: counted there
            if path.is_file():
                files[place + path.relative_to(folder).as_posix()] = path
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        h.update(name.encode())
        h.update(b"\0%d\0" % len(data))
        h.update(data)
    return h.hexdigest()


@functools.cache
def code_digest() -> str:
    """The digest of the running package's sources (:func:`digest_of`), computed once per
    process."""
    return digest_of(package_folders())


@functools.cache
def code_commit() -> str:
    """The git commit of the checkout the running package lives in, or ``"unknown"``: an
    installed wheel, no git, or a package folder that git does not track (a ``site-packages``
    inside some other repository is not that repository's code). A copy made by
    :func:`stage_code` (the code a Ray driver ships to its tasks) names the commit it was copied
    from in its :data:`SHIPPED_COMMIT` file."""
    shipped = PACKAGE_DIR / SHIPPED_COMMIT
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8").strip() or UNKNOWN
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", "__init__.py"],
            cwd=PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=5,
        )
        if tracked.returncode != 0:
            return UNKNOWN
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else UNKNOWN
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN


SHIPPED_COMMIT = "SHIPPED_COMMIT"
"""The file in a :func:`stage_code` copy that names the commit it was copied from (not a source
file: it does not enter the digest)."""


def stage_code(dest: Path, folders: dict[str, Path] | None = None) -> Path:
    """Copy the running package into ``dest/attnstudy`` as one importable folder: the package's
    files with ``attnstudy.analysis`` inside it (an editable install maps it to the checkout's
    top-level ``analysis/``), ``__pycache__`` left out, and a :data:`SHIPPED_COMMIT` file naming
    the commit. This is what a Ray driver ships to its tasks (``runtime_env={"py_modules": …}``,
    :mod:`attnstudy.executors.distributed`): the copy is taken once, so a file edited after the
    study started cannot reach a later task, and :func:`digest_of` the copy's folders equals the
    running package's digest when nothing was edited since the process started.

    Args:
        dest: an existing, empty folder (the caller's; the copy is made inside it).
        folders: the package's folders (default: :func:`package_folders`, the running package).

    Returns:
        ``dest/attnstudy``.

    Raises:
        FileExistsError: ``dest/attnstudy`` exists.
    """
    import shutil

    folders = package_folders() if folders is None else folders
    target = Path(dest) / "attnstudy"
    if target.exists():
        raise FileExistsError(f"{target} exists: stage the code into an empty folder")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(folders[""], target, ignore=skip)
    for place, folder in folders.items():
        inside = target / place.rstrip("/")
        if place and not inside.exists():  # a wheel keeps analysis/ inside already: copied
            shutil.copytree(folder, inside, ignore=skip)
    commit = code_commit() if folders.get("") == PACKAGE_DIR else UNKNOWN
    (target / SHIPPED_COMMIT).write_text(commit + "\n", encoding="utf-8")
    return target


def staged_folders(staged: Path) -> dict[str, Path]:
    """The folders of a :func:`stage_code` copy as :func:`digest_of` reads them."""
    return {"": staged, "analysis/": staged / "analysis"}


def this_code() -> CodeVersion:
    """The running process's :class:`CodeVersion` (cached)."""
    return CodeVersion(code_digest(), code_commit())


INSTALL_REMEDY = (
    "; install the same attnstudy on every node (pip install -e . at the driver's commit), "
    "restart its Ray worker, then run again with --resume"
)
"""What :func:`check_same_code` says to do, by default: the node runs its own installed code."""


def check_same_code(
    driver: CodeVersion, node: CodeVersion, where: str, *, remedy: str | None = None
) -> None:
    """Refuse to work on a node whose code differs from the driver's.

    Only the digests are compared: two checkouts at different commits with the same sources run
    the same code, and a wheel has no commit.

    Args:
        driver: the driver's code version (sent with the task).
        node: this node's (:func:`this_code`).
        where: the node, for the message (its host name).
        remedy: the end of the message, from its separator on: what went wrong and what to do
            (default :data:`INSTALL_REMEDY`; a driver that ships its code says that it did not
            reach the worker).

    Raises:
        CodeVersionError: one line naming both versions and what to do.
    """
    if driver.digest != node.digest:
        raise CodeVersionError(
            f"the attnstudy code on node {where} ({node.describe()}) differs from the driver's "
            f"({driver.describe()}){INSTALL_REMEDY if remedy is None else remedy}"
        )
