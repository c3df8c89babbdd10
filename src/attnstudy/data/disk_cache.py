"""Parsed data kept on disk between processes: gzip'd JSON (data, never code), written atomically,
under :func:`attnstudy.data.g2p_align.cache_dir` (``$ATTNSTUDY_CACHE``, else
``$XDG_CACHE_HOME/attnstudy``, else ``~/.cache/attnstudy``).

A file is named by a key that must name everything its content depends on (the input files'
bytes, the settings, the version of the code that made it); a file that cannot be read or does not
have the expected shape is rebuilt with a note naming it, and a cache that cannot be written only
costs the next process the parse again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from attnstudy.runtime.notices import notice

T = TypeVar("T")

MAX_BYTES = 512 * 2**20
"""The most a cache file may decompress to (the Greek–English corpus is about 30 MB of JSON); a
file that decompresses to more (a gzip bomb) is rebuilt, never read whole."""

READ_ERRORS = (
    OSError,
    EOFError,
    zlib.error,
    RecursionError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
)
"""What reading or decoding a damaged cache file may raise: it is then rebuilt."""


def file_digest(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def sources_digest(paths: Iterable[Path]) -> str:
    """SHA-256 (hex) over the names and bytes of source files: the version of the code that
    makes a cached file (its loader's modules).

    Raises:
        OSError: a file cannot be read.
    """
    h = hashlib.sha256()
    for p in paths:
        data = Path(p).read_bytes()
        h.update(f"{Path(p).name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def read_json_gz(path: Path, max_bytes: int = MAX_BYTES) -> object:
    """The JSON value of a gzip'd cache file.

    Raises:
        ValueError: not UTF-8 JSON, or more than ``max_bytes`` once decompressed.
        RecursionError: JSON nested deeper than Python's recursion limit.
        OSError, EOFError, zlib.error: not a whole gzip file.
    """
    with gzip.open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"it decompresses to more than {max_bytes // 2**20} MiB")
    return json.loads(data.decode("utf-8"))


def write_json_gz(path: Path, value: object) -> None:
    """Write ``value`` as gzip'd JSON at ``path`` atomically (a temporary file beside it, then
    :func:`os.replace`): a reader sees the old file or the new one, never half of one.

    Raises:
        OSError: the folder cannot be made or written.
    """
    data = gzip.compress(
        json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
        compresslevel=6,
        mtime=0,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_or_build(
    path: Path,
    what: str,
    *,
    decode: Callable[[object], T],
    build: Callable[[], T],
    encode: Callable[[T], object],
) -> T:
    """The value cached at ``path``, or ``build()`` written there.

    Args:
        path: the cache file (its name holds the key).
        what: what it holds, for the notes (``"Greek–English corpus"``).
        decode: JSON value → the value; raises one of :data:`READ_ERRORS` on a wrong shape.
        build: makes the value when the cache has none (its errors propagate, nothing is written).
        encode: the value → a JSON value that ``decode`` turns back into an equal value.

    A file that cannot be read or decoded is rebuilt with a note naming it and why; a file that
    cannot be written is noted and the value returned all the same.
    """
    if path.exists():
        try:
            return decode(read_json_gz(path))
        except READ_ERRORS as err:
            reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
            reason = " ".join(reason.split())[:120]
            notice(
                f"the {what} cache {path} is unreadable ({type(err).__name__}"
                f"{': ' + reason if reason else ''}); rebuilding it"
            )
    value = build()
    try:
        write_json_gz(path, encode(value))
    except OSError as err:
        notice(f"the {what} cache {path} cannot be written ({err}); it is parsed again next time")
    return value
