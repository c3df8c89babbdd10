"""Folders the tool writes, and the rule that it never removes or overwrites what it did not make.

Every folder attnstudy writes carries a marker, ``.attnstudy-output``: a small JSON file naming the
kind of output, every file the tool wrote there with its SHA-256 and every sub-folder it made. Two
ways of writing rest on it:

- :func:`replace_folder` (``report --out``, ``run``'s ``reports/<experiment>/``, ``python -m
  attnstudy.models.hf_tiny DIR``) builds the new folder beside the old one and swaps it in whole.
  It replaces a folder only when the marker says the tool made it *and* the folder holds nothing
  the marker does not list *and* every listed file still has the digest the marker records (a
  file the user changed is theirs); an empty or missing folder is fine; anything else is refused
  before a byte is written.
- :func:`write_files` (``report --results``) writes files into a folder that may hold other files:
  it deletes nothing, and overwrites a file only when the marker lists it with the digest it still
  has (the tool wrote it and nobody has changed it since).

Before either, :func:`check_output` refuses an output that is, contains or lies inside the
tracking store's folder or the checkpoints folder, or that is or contains the current directory,
the project root or ``$HOME``.

A replace leaves two kinds of hidden sibling while it runs: ``.NAME.tmp-PID-…`` (the folder being
built) and ``.NAME.old-PID-…`` (the folder being swapped out). Both carry the marker; a later
replace of the same folder removes them only when process PID is gone (an interrupted run), never
while it may still be working, and only when the marker vouches for what they hold (every file
listed with its digest, or a folder still being built). Several processes replacing one folder at
once: each swap either succeeds or, where another process's folder came in between, ends in
:class:`ReplacedMeanwhileError` (one line, exit 1) with nothing of it left behind; the folder is
always one writer's, whole. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

MARKER = ".attnstudy-output"
"""The marker file's name, inside every folder the tool writes."""
TOOL = "attnstudy"
REPORT_KIND = "report"
"""A report folder (``report --out``, ``reports/<experiment>/``)."""
HF_MODEL_KIND = "hf-model"
"""A tiny Hugging Face model folder (``python -m attnstudy.models.hf_tiny DIR``)."""
RESULTS_KIND = "results"
"""A folder of result tables (``report --results``)."""


class OutputError(ValueError):
    """An output folder the tool may not write (exit code 2): one line naming it and what to do."""


class ReplacedMeanwhileError(RuntimeError):
    """Another process replaced the output folder while this one was replacing it (exit code 1:
    not bad input; running again writes it). Nothing of this process is left behind.

    Attributes:
        folder: the output folder.
    """

    def __init__(self, folder: Path, kept: Path | None = None):
        self.folder = folder
        text = f"another attnstudy process replaced {folder} meanwhile; run again once it is done"
        if kept is not None:  # what this process swapped out could not be shown to be the tool's
            text += f" (what {folder} held before is kept in {kept})"
        super().__init__(text)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_marker(folder: Path) -> dict | None:
    """The marker of ``folder`` as ``{"tool", "kind", "files": {relative path: sha256},
    "folders": [relative path, …]}`` (``"folders"`` absent in a marker written before it was
    recorded), or None when the folder has none (or one that is not the tool's: not a regular
    file, not our JSON).
    """
    path = folder / MARKER
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 16 << 20:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not (
        isinstance(doc, dict)
        and doc.get("tool") == TOOL
        and isinstance(doc.get("kind"), str)
        and isinstance(doc.get("files"), dict)
        and isinstance(doc.get("folders", []), list)
    ):
        return None
    return doc


def write_marker(
    folder: Path,
    kind: str,
    files: dict[str, str],
    *,
    folders: Iterable[str] | None = None,
    building: bool = False,
) -> None:
    """Write ``folder``'s marker: ``kind``, ``files`` (relative POSIX path → sha256), unless None
    ``folders`` (the sub-folders the tool made, relative POSIX paths), and whether the folder is
    still being built (:func:`replace_folder`'s ``.NAME.tmp-…`` before its files are listed)."""
    doc: dict = {"tool": TOOL, "kind": kind, "files": dict(sorted(files.items()))}
    if folders is not None:
        doc["folders"] = sorted(folders)
    if building:
        doc["building"] = True
    (folder / MARKER).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _walk(folder: Path, prefix: str = "") -> Iterator[tuple[str, os.DirEntry]]:
    """Everything under ``folder`` but its marker, as (relative POSIX path, entry), sorted, each
    folder before its contents; a symbolic link is listed, never followed."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        rel = prefix + e.name
        if rel == MARKER:
            continue
        yield rel, e
        if e.is_dir(follow_symlinks=False):
            yield from _walk(Path(e.path), rel + "/")


def _listing(folder: Path) -> tuple[dict[str, str], list[str]]:
    """Every regular file under ``folder`` except the marker → sha256, and every sub-folder
    (relative POSIX paths): what the marker of a folder the tool has just built lists."""
    files, folders = {}, []
    for rel, e in _walk(folder):
        if e.is_dir(follow_symlinks=False):
            folders.append(rel)
        elif e.is_file(follow_symlinks=False):
            files[rel] = _digest(Path(e.path))
    return files, folders


def _is_within(path: Path, other: Path) -> bool:
    return path == other or other in path.parents


def protected_places(store_folders: Iterable[Path] = ()) -> list[tuple[Path, str, bool]]:
    """The places no output may touch: ``(folder, what it is, whether lying inside it counts)``.

    The tracking store's folders (the project's ``mlruns/``, with its ``checkpoints/``, and any
    folder in ``store_folders``) may be neither the output, inside it, nor inside the output; a
    database file in ``store_folders`` (a SQLite store elsewhere) may be neither the output nor
    inside it; the current directory, the project root and ``$HOME`` may be neither the output
    nor inside it (a folder below them is where outputs normally go).
    """
    from attnstudy.runtime.paths import project_root, store_dir

    places = [(store_dir().resolve(), "the tracking store's folder", True)]
    places.append(((store_dir() / "checkpoints").resolve(), "the checkpoints folder", True))
    for f in map(Path, store_folders):  # a database file: neither it nor a folder holding it
        database = f.suffix == ".db" or f.is_file()
        what = "the tracking store's database" if database else "the tracking store's folder"
        places.append((f.resolve(), what, not database))
    places.append((Path.cwd().resolve(), "the current directory", False))
    places.append((project_root().resolve(), "the project root", False))
    home = os.environ.get("HOME")
    if home:
        places.append((Path(home).resolve(), "your home folder ($HOME)", False))
    return places


def check_output(path: str | Path, option: str, store_folders: Iterable[Path] = ()) -> Path:
    """``path`` resolved, after refusing it if it is, contains or lies inside a protected place.

    Args:
        path: the output folder as the user gave it.
        option: how the user named it, for the message (``"--out"``, ``"--results"``, …).
        store_folders: folders of the tracking store in use beyond the project's ``mlruns/``.

    Returns:
        The resolved path.

    Raises:
        OutputError: one line naming the output, the protected place and what to do.
    """
    out = Path(path).expanduser().resolve()
    for place, what, inside_counts in protected_places(store_folders):
        if _is_within(place, out) or (inside_counts and _is_within(out, place)):
            relation = (
                "is" if out == place else ("contains" if _is_within(place, out) else "lies inside")
            )
            raise OutputError(
                f"{option} {out} {relation} {what} ({place}); attnstudy never writes its output "
                "there: give a folder of its own, e.g. a new folder under reports/"
            )
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _leftover_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(name)}\.(?P<what>tmp|old)-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def clean_leftovers(out: Path) -> list[Path]:
    """Remove the hidden siblings an interrupted replace of ``out`` left (``.NAME.tmp-PID-…``,
    ``.NAME.old-PID-…``) whose process PID is gone and which the tool provably made: an empty
    folder, one whose marker lists everything it holds with the digests it has (as
    :func:`check_replaceable` requires), or a ``.NAME.tmp-…`` whose marker says it was still being
    built. Anything else of that name is left alone.

    Returns:
        The folders removed.
    """
    removed = []
    pattern = _leftover_re(out.name)
    if not out.parent.is_dir():
        return removed
    for sib in out.parent.iterdir():
        m = pattern.match(sib.name)
        if not m or sib.is_symlink() or not sib.is_dir() or _pid_alive(int(m["pid"])):
            continue
        try:  # another process cleaning up at the same time may remove it first
            if not any(sib.iterdir()):
                sib.rmdir()
                removed.append(sib)
                continue
            marker = read_marker(sib)
            if marker is None:
                continue
            building = m["what"] == "tmp" and marker.get("building") is True
            if building or not _not_ours(sib, marker):
                shutil.rmtree(sib, ignore_errors=True)
                removed.append(sib)
        except OSError:
            continue
    return removed


def _looks_like_old_report(folder: Path) -> bool:
    return (folder / "report.html").is_file() and (folder / "report.md").is_file()


def _not_ours(folder: Path, marker: dict) -> list[tuple[str, str]]:
    """What in ``folder`` its ``marker`` does not vouch for, as ``(relative path, why)`` with why
    ``"foreign"`` (a file or link the marker does not list), ``"folder"`` (a sub-folder it does not
    list) or ``"changed"`` (a listed file whose digest is not one the marker accepts, or that is no
    longer a regular file). Each listed file is read once."""
    files = marker["files"]
    folders = marker.get("folders")
    if folders is None:  # a marker of before folders were recorded: those holding a listed file
        folders = {p.as_posix() for f in files for p in Path(f).parents}
    folders = {f for f in folders if isinstance(f, str)}
    found: list[tuple[str, str]] = []
    unlisted: tuple[str, ...] = ()  # what lies inside an unlisted folder is counted with it
    for rel, e in _walk(folder):
        if rel.startswith(unlisted):
            continue
        if e.is_dir(follow_symlinks=False):
            if rel not in folders:
                found.append((rel, "folder"))
                unlisted += (rel + "/",)
        elif rel not in files:
            found.append((rel, "foreign"))
        elif not e.is_file(follow_symlinks=False) or _digest(Path(e.path)) not in _accepted(
            files, rel
        ):
            found.append((rel, "changed"))
    return found


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path`` itself, or None when it is missing."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def check_replaceable(out: Path, option: str, kind: str) -> None:
    """Refuse to replace ``out`` unless it is missing, empty, or a folder the tool made: its marker,
    of this ``kind``, lists every file and sub-folder it holds, and every listed file still has a
    digest the marker accepts (so a file the user changed is never replaced).

    Every file is read once (SHA-256) on each check; report and model folders are small. A folder
    that another process swaps for a new one during the check (another attnstudy writing the same
    output) is checked again, the new one whole.

    Raises:
        OutputError: one line naming the folder, the first file or folder that is not the tool's,
            and what to do.
        ReplacedMeanwhileError: the folder was swapped during each of three checks.
    """
    for _ in range(3):
        seen = _identity(out)
        try:
            return _check_replaceable_once(out, option, kind)
        except (OutputError, FileNotFoundError, NotADirectoryError):
            if _identity(out) == seen and seen is not None:  # the same folder throughout
                raise
    raise ReplacedMeanwhileError(out)


def _check_replaceable_once(out: Path, option: str, kind: str) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputError(
            f"{option} {out} exists and is not a folder; give the name of a new folder"
        )
    if not out.exists() or not any(out.iterdir()):
        return
    marker = read_marker(out)
    if marker is None:
        if kind == REPORT_KIND and _looks_like_old_report(out):
            raise OutputError(
                f"{option} {out} holds a report from an older attnstudy (no {MARKER} marker), so "
                f"it is not replaced; remove it with `rm -r {shlex.quote(str(out))}` and run "
                "again, or give another folder"
            )
        raise OutputError(
            f"{option} {out} is not empty and was not made by attnstudy (no {MARKER} marker); "
            "nothing was written: give a new or empty folder"
        )
    if marker["kind"] != kind:
        raise OutputError(
            f"{option} {out} holds attnstudy's {marker['kind']} output, not a {kind}; give "
            "another folder"
        )
    found = _not_ours(out, marker)
    if not found:
        return
    rel, why = found[0]
    more = f" (and {len(found) - 1} more not attnstudy's)" if len(found) > 1 else ""
    if why == "changed":
        raise OutputError(
            f"{option} {out}: {rel} was changed after attnstudy wrote it{more}, so the folder is "
            "not replaced; to keep it, move it out of the folder (or rename the folder) and run "
            "again, or give another folder (nothing was written)"
        )
    if why == "folder":
        raise OutputError(
            f"{option} {out} holds the folder {rel}/{more}, which attnstudy did not make; move "
            "it out of the folder (the folder is replaced whole) or give another folder"
        )
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    raise OutputError(
        f"{option} {out} holds {rel}{more}, which attnstudy did not write; move "
        "it out of the folder (the folder is replaced whole) or give another folder"
    )


def check_replace(
    out: str | Path, *, kind: str, option: str, store_folders: Iterable[Path] = ()
) -> Path:
    """:func:`check_output`, then :func:`check_replaceable`: what :func:`replace_folder` checks
    before it writes, for a caller that wants to know before a long job (``run``).

    Returns:
        ``out`` resolved.

    Raises:
        OutputError: as the two checks.
    """
    resolved = check_output(out, option, store_folders)
    check_replaceable(resolved, option, kind)
    return resolved


def replace_folder(
    out: str | Path,
    build: Callable[[Path], None],
    *,
    kind: str,
    option: str,
    store_folders: Iterable[Path] = (),
) -> Path:
    """Build a folder with ``build(tmp)`` beside ``out`` and swap it in whole.

    The new folder is built as ``.NAME.tmp-PID-…`` beside ``out`` (the marker first, so an
    interrupted build is recognisably the tool's), then the old ``out`` (checked by
    :func:`check_replaceable`) is renamed to ``.NAME.old-PID-…``, the new one renamed to ``out``,
    and the old one removed. An interrupt leaves ``out`` either old or new, never mixed; the
    hidden leftovers are removed by the next replace once this process is gone.

    Args:
        out: the folder to (re)create.
        build: writes the folder's contents into the folder it is given.
        kind: what the folder is (``"report"``, ``"hf-model"``): a folder of another kind is never
            replaced.
        option: how the user named ``out``, for messages.
        store_folders: see :func:`check_output`.

    Returns:
        ``out`` resolved.

    Raises:
        OutputError: ``out`` is protected or holds what the tool did not write (nothing written).
        ReplacedMeanwhileError: another process replaced ``out`` while this one was building or
            swapping (its folder stays; nothing of this call is left behind).
    """
    out = check_replace(out, kind=kind, option=option, store_folders=store_folders)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    old = None
    try:
        tmp.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would otherwise become the folder's mode
        write_marker(tmp, kind, {}, folders=(), building=True)
        build(tmp)
        files, folders = _listing(tmp)
        write_marker(tmp, kind, files, folders=folders)
        check_replaceable(out, option, kind)  # again: nothing arrived while building
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
            try:
                os.replace(out, old)  # an empty folder made just now: replaced, not merged
            except FileNotFoundError:  # another writer swapped it out after the check
                raise ReplacedMeanwhileError(out) from None
        try:
            os.replace(tmp, out)
        except OSError as err:  # another writer swapped its folder in since: it stays
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise ReplacedMeanwhileError(out, _drop_swapped_out(old, out)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists():
            _drop_swapped_out(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _drop_swapped_out(old: Path | None, out: Path) -> Path | None:
    """After a replace of ``out`` failed past the point where ``old`` was made: the empty
    placeholder is removed; the folder swapped out into it goes back to ``out`` when ``out`` is
    missing (an interrupt between the two renames), else is removed when its marker still vouches
    for everything in it (another writer's folder is in place). Returns ``old`` when it had to be
    kept (it holds what the tool cannot show it made), else None."""
    if old is None:
        return None
    with contextlib.suppress(OSError):
        old.rmdir()  # the placeholder, never filled
        return None
    if not out.exists():
        with contextlib.suppress(OSError):
            os.replace(old, out)
            return None
    with contextlib.suppress(OSError):
        marker = read_marker(old)
        if marker is not None and not _not_ours(old, marker):
            shutil.rmtree(old, ignore_errors=True)
            return None
    return old if old.exists() else None


def check_files(
    folder: str | Path,
    names: Iterable[str],
    *,
    option: str,
    store_folders: Iterable[Path] = (),
) -> tuple[Path, dict | None]:
    """Refuse writing ``names`` into ``folder`` unless each is new or provably the tool's (the
    folder's marker lists it with the digest it has now).

    Returns:
        The resolved folder and its marker (None when it has none yet).

    Raises:
        OutputError: the folder is protected, is not a folder, has a marker that is not the tool's,
            or holds one of ``names`` that the tool cannot show it wrote.
    """
    out = check_output(folder, option, store_folders)
    if out.exists() and (out.is_symlink() or not out.is_dir()):
        raise OutputError(f"{option} {out} exists and is not a folder; give a folder")
    marker = read_marker(out) if out.exists() else None
    if marker is None and ((out / MARKER).exists() or (out / MARKER).is_symlink()):
        raise OutputError(
            f"{option} {out / MARKER} is not attnstudy's marker; move it away or give another "
            "folder"
        )
    known = marker["files"] if marker else {}
    for name in names:
        path = out / name
        if not (path.exists() or path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file() or _digest(path) not in _accepted(known, name):
            why = (
                "was changed after attnstudy wrote it"
                if name in known
                else "was not written by attnstudy"
            )
            raise OutputError(
                f"{option}: {path} {why}, so it is not overwritten; move it away and run again, "
                "or give another folder (nothing was written)"
            )
    return out, marker


def write_files(
    folder: str | Path,
    files: dict[str, bytes],
    *,
    option: str,
    store_folders: Iterable[Path] = (),
) -> list[Path]:
    """Write ``files`` (name → content) into ``folder`` without removing anything there.

    A file that already exists is overwritten only when the folder's marker lists it with the
    digest it has now (attnstudy wrote it and nobody changed it since); every file is checked
    (:func:`check_files`) before the first is written. The marker then lists the new digests
    beside its other entries.

    Args:
        folder: the folder (created if missing).
        files: file name (no folders) → bytes.
        option: how the user named ``folder``, for messages.
        store_folders: see :func:`check_output`.

    Returns:
        The files written.

    Raises:
        OutputError: as :func:`check_files` (nothing written).
    """
    out, marker = check_files(folder, files, option=option, store_folders=store_folders)
    known = marker["files"] if marker else {}
    out.mkdir(parents=True, exist_ok=True)
    kind = marker["kind"] if marker else RESULTS_KIND
    folders = marker.get("folders") if marker else None  # kept as they are
    digests = {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
    # while writing, the marker accepts a file's old and new digest: an interrupt leaves every
    # file either old or new (each is replaced atomically), and each still provably the tool's
    accepted = known | {n: [*_accepted(known, n), d] for n, d in digests.items()}
    write_marker(out, kind, accepted, folders=folders)
    written = []
    for name, content in files.items():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=out)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, out / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)  # made just now by mkstemp: the tool's own
            raise
        written.append(out / name)
    write_marker(out, kind, known | digests, folders=folders)
    return written


def _accepted(known: dict, name: str) -> list[str]:
    """The digests the marker accepts for ``name``: one, or two while a write was under way."""
    value = known.get(name)
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, str)]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def store_folders_of(uri: str | None) -> list[Path]:
    """What a tracking URI's store keeps on this machine: a SQLite database file, a ``file:``
    store's folder; nothing for a server."""
    if not uri:
        return []
    if uri.startswith("sqlite:///"):  # sqlite:///relative.db, sqlite:////absolute.db
        return [Path(uri[len("sqlite:///") :].split("?", 1)[0]).resolve()]
    if uri.startswith("file://"):
        return [Path(uri[len("file://") :]).resolve()]
    if "://" not in uri:
        return [Path(uri).resolve()]
    return []
