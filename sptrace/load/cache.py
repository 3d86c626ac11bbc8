"""The trace cache: parsed event tables (Arrow IPC files, memory-mapped on read) and per-rank
summaries (sptrace.summary_cache: what the map made of a rank, so that a warm run skips detection
too).

Both kinds are keyed by the trace's absolute path, size, mtime and SCHEMA_VERSION, so an edited
or replaced trace, or a new table layout, is parsed again; a summary's key adds what else
changes it (sptrace.summary_cache). Entries live in the user's cache directory (traces are
often on read-only storage) and are written to a temporary file and renamed, so a reader never
sees half an entry and two processes loading the same run race harmlessly (the last rename
wins, both entries are whole).

Every entry's name carries the CRC-32 of its bytes, checked on read: a damaged or truncated
entry is a miss, deleted and rebuilt, never trusted. The cache is bounded, both kinds together:
past ``SPTRACE_CACHE_MAX`` bytes (default 2 GiB; ``500M``, ``4G`` and plain bytes are
understood), the least recently used entries go, and entries whose trace is gone are dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from sptrace.cachedir import default_cache_dir, max_bytes, sweep_temporaries, write_entry
from sptrace.load.schema import SCHEMA_VERSION
from sptrace.vocab.jsontypes import JSONObject

_META_KEY = b"sptrace.metadata"
_SOURCE_KEY = b"sptrace.source"
_ENTRY = re.compile(r"^(?P<prefix>[0-9a-f]{20})-\d+-\d+-v\d+-(?P<crc>[0-9a-f]{8})\.arrow$")
_SUMMARY = re.compile(r"^(?P<prefix>[0-9a-f]{20})-\d+-\d+-v\d+-(?P<key>[0-9a-f]{16})-(?P<crc>[0-9a-f]{8})\.summary$")
_SUMMARY_MAGIC = b"sptrace-summary\n"
"""A summary entry: this, the length of a JSON header (4 bytes, little-endian), the header
({"source": the trace, and what the writer adds}), then the payload."""


def _key(path: Path) -> tuple[str, str]:
    """(prefix for this trace, prefix for this version of it)."""
    resolved = path.resolve()
    st = resolved.stat()
    prefix = hashlib.sha1(str(resolved).encode()).hexdigest()[:20]
    return prefix, f"{prefix}-{st.st_size}-{st.st_mtime_ns}-v{SCHEMA_VERSION}-"


def trace_version(path: Path) -> str:
    """The name prefix of every entry made from the current version of ``path`` (its resolved
    path, size, mtime and SCHEMA_VERSION); OSError when it cannot be read."""
    return _key(path)[1]


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


def read_cached(cache_dir: Path, path: Path) -> tuple[JSONObject, pa.Table] | None:
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


def write_cached(cache_dir: Path, path: Path, metadata: JSONObject, table: pa.Table) -> Path | None:
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


def write_summary(cache_dir: Path, version: str, key: str, header: JSONObject, payload: bytes) -> Path | None:
    """Write a summary entry atomically for the trace version ``version`` (trace_version's
    answer, taken before the trace was read) and ``key`` (16 hex digits: what else the summary
    depends on), then keep the cache under its cap; returns the entry's path, or None when the
    cache is not writable. ``header`` must name the trace as ``source``."""
    head = json.dumps(header).encode()
    data = _SUMMARY_MAGIC + len(head).to_bytes(4, "little") + head + payload
    try:
        entry = write_entry(cache_dir, data, lambda crc: f"{version}{key}-{crc}.summary")
        prefix = version.split("-", 1)[0]
        for stale in cache_dir.glob(f"{prefix}-*.summary"):  # made from older versions of the trace
            if not stale.name.startswith(version):
                stale.unlink(missing_ok=True)
        prune(cache_dir, keep=entry)
        return entry
    except OSError:
        return None


def read_summary(cache_dir: Path, version: str, key: str) -> tuple[Path, bytes] | None:
    """The checked payload of the summary entry for ``version`` and ``key``, and the entry's
    path (for discard_summary, when the payload turns out unusable); None when there is none."""
    for entry in sorted(cache_dir.glob(f"{version}{key}-*.summary")) if cache_dir.is_dir() else []:
        try:
            data = entry.read_bytes()
            match = _SUMMARY.match(entry.name)
            if match is None or zlib.crc32(data) != int(match.group("crc"), 16):
                raise ValueError("damaged")
            _, start = _summary_header(data)
            os.utime(entry)  # used now: the least recently used entries are evicted first
            return entry, data[start:]
        except FileNotFoundError:
            continue  # evicted or replaced by another process meanwhile
        except (OSError, ValueError):
            entry.unlink(missing_ok=True)  # damaged or truncated: never trusted, rebuilt by the caller
    return None


def discard_summary(entry: Path) -> None:
    """Delete an entry whose payload could not be used (written by other code): a miss."""
    entry.unlink(missing_ok=True)


def _summary_header(data: bytes) -> tuple[JSONObject, int]:
    """(a summary entry's header, where its payload starts); ValueError when it is no entry."""
    n = len(_SUMMARY_MAGIC)
    if data[:n] != _SUMMARY_MAGIC or len(data) < n + 4:
        raise ValueError("not a summary entry")
    length = int.from_bytes(data[n : n + 4], "little")
    if len(data) < n + 4 + length:
        raise ValueError("truncated")
    header = json.loads(data[n + 4 : n + 4 + length])  # a JSONDecodeError is a ValueError
    if not isinstance(header, dict):
        raise ValueError("not a summary entry")
    return header, n + 4 + length


@dataclass(frozen=True)
class Entry:
    path: Path
    bytes: int
    used: float
    """When it was last read or written (its mtime)."""
    source: str | None
    """The trace it was parsed from (None when unreadable)."""
    kind: str = "table"
    """'table' (a parsed trace) or 'summary' (a rank's summary, sptrace.summary_cache)."""
    header: JSONObject = field(default_factory=dict, compare=False)
    """A summary's header: ``source``, and what its writer adds (sptrace.summary_cache: ``about``,
    what the summary is of; ``code``, the digest of the code that wrote it)."""

    @property
    def source_gone(self) -> bool:
        return self.source is None or not Path(self.source).exists()


_HEADERS: dict[tuple[str, int], tuple[str | None, JSONObject]] = {}
"""(entry path, size) -> (source, summary header), read once per process: an entry's bytes never
change under its name (the name carries their CRC), and every write prunes, so a run of many
ranks would otherwise open every entry again for each rank it writes."""


def entries(cache_dir: Path | None = None) -> list[Entry]:
    """The cache's entries, both kinds, least recently used first."""
    directory = cache_dir or default_cache_dir()
    out = []
    for p in directory.iterdir() if directory.is_dir() else []:
        kind = "table" if _ENTRY.match(p.name) else "summary" if _SUMMARY.match(p.name) else None
        if kind is None:
            continue
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        known = _HEADERS.get((str(p), st.st_size))
        if known is None:
            known = _read_source(p, kind)
            if known[0] is not None:
                _HEADERS[(str(p), st.st_size)] = known
        out.append(Entry(p, st.st_size, st.st_mtime, known[0], kind, known[1]))
    return sorted(out, key=lambda e: e.used)


def _read_source(entry: Path, kind: str) -> tuple[str | None, JSONObject]:
    """(the trace an entry was made from, its summary header); None and {} when unreadable."""
    try:
        if kind == "table":
            with pa.memory_map(str(entry), "r") as f:
                raw = (ipc.open_file(f).schema.metadata or {}).get(_SOURCE_KEY)
            return (raw.decode() if raw else None), {}
        with open(entry, "rb") as f:
            head = f.read(len(_SUMMARY_MAGIC) + 4)
            length = int.from_bytes(head[len(_SUMMARY_MAGIC) :], "little")
            header, _ = _summary_header(head + f.read(length))
        source = header.get("source")
        return (source if isinstance(source, str) else None), header
    except (OSError, pa.ArrowException, UnicodeDecodeError, ValueError):
        return None, {}


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
    sweep_temporaries(cache_dir)
    return removed


def clear(cache_dir: Path | None = None) -> int:
    """Delete every entry, tables and summaries; returns how many bytes were freed."""
    freed = 0
    for e in entries(cache_dir):
        freed += e.bytes
        e.path.unlink(missing_ok=True)
    return freed
