"""A cache of parsed event tables: Arrow IPC files, memory-mapped on read.

Keyed by the trace's absolute path, size, mtime and SCHEMA_VERSION, so an edited or replaced
trace, or a new table layout, is parsed again. Entries live in the user's cache directory
(traces are often on read-only storage) and are written to a temporary file and renamed, so a
reader never sees half an entry and two processes loading the same run race harmlessly (the
last rename wins, both entries are whole).

Every entry's name carries the CRC-32 of its bytes, checked on read: a damaged or truncated
entry is a miss, deleted and rebuilt, never trusted. The cache is bounded: past
``SPTRACE_CACHE_MAX`` bytes (default 2 GiB; ``500M``, ``4G`` and plain bytes are understood),
the least recently used entries go, and entries whose trace is gone are dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from sptrace.errors import UsageError
from sptrace.load.schema import SCHEMA_VERSION

_META_KEY = b"sptrace.metadata"
_SOURCE_KEY = b"sptrace.source"
DEFAULT_MAX_BYTES = 2 * 2**30
_ENTRY = re.compile(r"^(?P<prefix>[0-9a-f]{20})-\d+-\d+-v\d+-(?P<crc>[0-9a-f]{8})\.arrow$")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


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


def _key(path: Path) -> tuple[str, str]:
    """(prefix for this trace, prefix for this version of it)."""
    resolved = path.resolve()
    st = resolved.stat()
    prefix = hashlib.sha1(str(resolved).encode()).hexdigest()[:20]
    return prefix, f"{prefix}-{st.st_size}-{st.st_mtime_ns}-v{SCHEMA_VERSION}-"


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _candidates(cache_dir: Path, path: Path) -> list[Path]:
    """The entries written for the current version of ``path`` (usually one)."""
    try:
        _, version = _key(path)
        return sorted(cache_dir.glob(f"{version}*.arrow")) if cache_dir.is_dir() else []
    except OSError:
        return []


def _intact(entry: Path) -> bool:
    """Whether the entry's bytes still have the CRC-32 its name carries."""
    match = _ENTRY.match(entry.name)
    return match is not None and _crc(entry) == int(match.group("crc"), 16)


def read_cached(cache_dir: Path, path: Path) -> tuple[dict[str, Any], pa.Table] | None:
    for entry in _candidates(cache_dir, path):
        try:
            if not _intact(entry):
                raise ValueError("damaged")
            with pa.memory_map(str(entry), "r") as source:
                table = ipc.open_file(source).read_all()
            raw = (table.schema.metadata or {}).get(_META_KEY)
            metadata = json.loads(raw) if raw else {}
            os.utime(entry)  # used now: the least recently used entries are evicted first
            return metadata, table.replace_schema_metadata(None)
        except FileNotFoundError:
            continue  # evicted or replaced by another process meanwhile
        except (OSError, pa.ArrowException, ValueError):
            entry.unlink(missing_ok=True)  # damaged or truncated: never trusted, rebuilt by the caller
    return None


_VERIFIED: dict[tuple[str, int, int], bool] = {}


def cached_entry(cache_dir: Path, path: Path) -> Path | None:
    """The checked entry of ``path``'s current version, for readers that query it in place
    (sptrace.load.window); None when there is none. Its CRC is checked once per process."""
    for entry in _candidates(cache_dir, path):
        try:
            st = entry.stat()
            key = (str(entry), st.st_size, st.st_mtime_ns)
            if key not in _VERIFIED:
                _VERIFIED[key] = _intact(entry)
            if _VERIFIED[key]:
                return entry
            entry.unlink(missing_ok=True)  # damaged: never trusted
        except OSError:
            continue
    return None


def write_cached(cache_dir: Path, path: Path, metadata: dict[str, Any], table: pa.Table) -> Path | None:
    """Write the entry atomically, then keep the cache under its cap; returns the entry's path,
    or None when the cache is not writable."""
    try:
        prefix, version = _key(path)
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".arrow")
        try:
            with os.fdopen(fd, "wb") as sink:
                meta = {_META_KEY: json.dumps(metadata).encode(), _SOURCE_KEY: str(path.resolve()).encode()}
                schema = table.schema.with_metadata(meta)
                with ipc.new_file(sink, schema) as writer:
                    writer.write_table(table.replace_schema_metadata(schema.metadata))
            entry = cache_dir / f"{version}{_crc(Path(tmp)):08x}.arrow"
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        for stale in cache_dir.glob(f"{prefix}-*.arrow"):  # older versions of the same trace
            if stale != entry:
                stale.unlink(missing_ok=True)
        prune(cache_dir, keep=entry)
        return entry
    except OSError:
        return None


@dataclass(frozen=True)
class Entry:
    path: Path
    bytes: int
    used: float
    """When it was last read or written (its mtime)."""
    source: str | None
    """The trace it was parsed from (None when unreadable)."""

    @property
    def source_gone(self) -> bool:
        return self.source is None or not Path(self.source).exists()


def entries(cache_dir: Path | None = None) -> list[Entry]:
    """The cache's entries, least recently used first."""
    directory = cache_dir or default_cache_dir()
    out = []
    for p in directory.glob("*.arrow") if directory.is_dir() else []:
        if not _ENTRY.match(p.name):
            continue
        try:
            st = p.stat()
            source = None
            with pa.memory_map(str(p), "r") as f:
                raw = (ipc.open_file(f).schema.metadata or {}).get(_SOURCE_KEY)
            source = raw.decode() if raw else None
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowException, UnicodeDecodeError):
            pass
        out.append(Entry(p, st.st_size, st.st_mtime, source))
    return sorted(out, key=lambda e: e.used)


def prune(cache_dir: Path, *, keep: Path | None = None, limit: int | None = None) -> list[Path]:
    """Drop entries whose trace is gone, then the least recently used until the cache fits
    ``limit`` (default: the cap). ``keep`` is never dropped (the entry just written)."""
    limit = max_bytes() if limit is None else limit
    removed = []
    alive = []
    for e in entries(cache_dir):
        if e.path != keep and e.source_gone:
            e.path.unlink(missing_ok=True)
            removed.append(e.path)
        else:
            alive.append(e)
    total = sum(e.bytes for e in alive)
    for e in alive:
        if total <= limit:
            break
        if e.path == keep:
            continue
        e.path.unlink(missing_ok=True)
        removed.append(e.path)
        total -= e.bytes
    for tmp in cache_dir.glob(".tmp-*.arrow"):  # left by a process killed mid-write, an hour ago or more
        try:
            if time.time() - tmp.stat().st_mtime > 3600:
                tmp.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
    return removed


def clear(cache_dir: Path | None = None) -> int:
    """Delete every entry; returns how many bytes were freed."""
    freed = 0
    for e in entries(cache_dir):
        freed += e.bytes
        e.path.unlink(missing_ok=True)
    return freed
