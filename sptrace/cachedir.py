"""Where sptrace's caches live, how large they may grow, and the digest of the code that fills
them. Standard library only: a replayed result (sptrace.result_cache) is found and printed before
pandas or pyarrow is imported."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Collection
from pathlib import Path

from sptrace.vocab.errors import UsageError

DEFAULT_MAX_BYTES = 2 * 2**30
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_LIBRARIES = ("numpy", "pandas", "pyarrow")
_SOURCES = ("*.py", "*.c")
"""What the package's behaviour is written in: Python, and the C of the native decoder (the
built extension follows its source)."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "sptrace"


def max_bytes() -> int:
    """The cap: SPTRACE_CACHE_MAX (bytes, or with a K/M/G/T suffix), else 2 GiB."""
    text = os.environ.get("SPTRACE_CACHE_MAX", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"SPTRACE_CACHE_MAX={text!r}: give bytes, or a size such as 500M or 4G")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


_DIGESTS: dict[tuple[str, frozenset[str]], str | None] = {}


def sources_digest(salt: str, exclude: Collection[str] = ()) -> str | None:
    """A SHA-256 of the package's sources (but the top-level parts in ``exclude``) and of the
    Python, numpy, pandas and pyarrow they run on (the size and mtime of each one's
    ``__init__.py``, located without importing it); None when the sources are not there to read.
    Taken once per process: about 6 ms for the whole package on 2 cores."""
    known = (salt, frozenset(exclude))
    if known not in _DIGESTS:
        _DIGESTS[known] = _digest(salt, known[1])
    return _DIGESTS[known]


def _digest(salt: str, exclude: frozenset[str]) -> str | None:
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256(f"{salt}|{sys.version}".encode())
    sources = sorted(
        p for pattern in _SOURCES for p in root.rglob(pattern) if p.relative_to(root).parts[0] not in exclude
    )  # fmt: skip
    if not sources:
        return None
    try:
        for p in sources:
            digest.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
        for name in _LIBRARIES:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
            st = os.stat(origin) if origin else None
            digest.update(f"{name}|{origin}|{st and st.st_size}|{st and st.st_mtime_ns}".encode())
    except OSError:
        return None
    return digest.hexdigest()


def write_entry(directory: Path, data: bytes, name: Callable[[str], str]) -> Path:
    """Write a cache entry atomically (a temporary file, then a rename, so no reader sees half of
    it) under ``name(crc)``, ``crc`` being the 8 hex digits of its bytes' CRC-32, which readers
    check before trusting it; the entry's path. OSError when the directory is not writable."""
    directory.mkdir(parents=True, exist_ok=True)
    entry = directory / name(f"{zlib.crc32(data):08x}")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=entry.suffix)
    try:
        with os.fdopen(fd, "wb") as sink:
            sink.write(data)
        os.replace(tmp, entry)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return entry


def sweep_temporaries(directory: Path, max_age_s: float = 3600) -> None:
    """Delete the temporary files a process killed mid-write left, ``max_age_s`` ago or more
    (a younger one may still be being written)."""
    for tmp in directory.glob(".tmp-*"):
        try:
            if time.time() - tmp.stat().st_mtime > max_age_s:
                tmp.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
