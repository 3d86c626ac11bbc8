"""The trace cache: parsed event tables (Arrow IPC files, memory-mapped on read) and per-rank
summaries (sptrace.run.summaries: what the map made of a rank, so that a warm run skips detection
too), kept in one sptrace.cachedir.Store.

Both kinds are keyed by the trace's absolute path, size, mtime and SCHEMA_VERSION, so an edited
or replaced trace, or a new table layout, is parsed again; a summary's key adds what else
changes it (sptrace.run.summaries). Entries live in the user's cache directory (traces are
often on read-only storage) and are written atomically, their bytes' CRC-32 in their name,
checked on read: a damaged or truncated entry is a miss, deleted and rebuilt, never trusted. The
cache is bounded, both kinds together: past ``SPTRACE_CACHE_MAX`` bytes (default 2 GiB; ``500M``,
``4G`` and plain bytes are understood), the least recently used entries go, and entries whose
trace is gone are dropped.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import pyarrow as pa
import pyarrow.ipc as ipc

from sptrace.cachedir import (
    Entry,
    EntryFormat,
    EntryHeader,
    Store,
    default_cache_dir,
    frame,
    framed_header,
    trace_prefix,
    unframe,
)
from sptrace.load.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from sptrace.load.trace import TraceMetadata

_META_KEY = b"sptrace.metadata"
_SOURCE_KEY = b"sptrace.source"
_SUMMARY_MAGIC = b"sptrace-summary\n"


def _table_header(entry: Path) -> EntryHeader:
    """A table entry's header: the trace it was parsed from, kept in the Arrow schema's metadata."""
    try:
        with pa.memory_map(str(entry), "r") as f:
            raw = (ipc.open_file(f).schema.metadata or {}).get(_SOURCE_KEY)
    except pa.ArrowException as exc:
        raise ValueError(str(exc)) from None
    return EntryHeader(source=raw.decode()) if raw else EntryHeader()


TABLES = EntryFormat(
    "table", ".arrow", re.compile(r"^(?P<prefix>[0-9a-f]{20})-\d+-\d+-v\d+-(?P<crc>[0-9a-f]{8})\.arrow$"), _table_header
)
SUMMARIES = EntryFormat(
    "summary",
    ".summary",
    re.compile(r"^(?P<prefix>[0-9a-f]{20})-\d+-\d+-v\d+-(?P<key>[0-9a-f]{16})-(?P<crc>[0-9a-f]{8})\.summary$"),
    framed_header(_SUMMARY_MAGIC),
)
"""A summary entry is framed (sptrace.cachedir.frame): its header names the trace as ``source``,
and what the writer adds."""


def store(cache_dir: Path | None = None) -> Store:
    """The trace cache in ``cache_dir`` (default: the user's), tables and summaries in one budget."""
    return Store(cache_dir or default_cache_dir(), (TABLES, SUMMARIES))


def _key(path: Path) -> tuple[str, str]:
    """(prefix for this trace, prefix for this version of it)."""
    st = path.resolve().stat()
    prefix = trace_prefix(path)
    return prefix, f"{prefix}-{st.st_size}-{st.st_mtime_ns}-v{SCHEMA_VERSION}-"


def trace_version(path: Path) -> str:
    """The name prefix of every entry made from the current version of ``path`` (its resolved
    path, size, mtime and SCHEMA_VERSION); OSError when it cannot be read."""
    return _key(path)[1]


def _candidates(tables: Store, path: Path) -> list[Path]:
    """The table entries written for the current version of ``path`` (usually one)."""
    try:
        return tables.candidates(trace_version(path), TABLES)
    except OSError:
        return []


def read_cached(cache_dir: Path, path: Path) -> tuple[TraceMetadata, pa.Table] | None:
    """The trace's metadata and table from its checked entry, memory-mapped; None on a miss."""
    tables = store(cache_dir)
    for entry in _candidates(tables, path):
        try:
            if not tables.intact(entry, TABLES):
                raise ValueError("damaged")
            with pa.memory_map(str(entry), "r") as source:
                table = ipc.open_file(source).read_all()
            raw = (table.schema.metadata or {}).get(_META_KEY)
            metadata = json.loads(raw) if raw else {}
            os.utime(entry)  # used now: the least recently used entries are evicted first
            return cast("TraceMetadata", metadata), table.replace_schema_metadata(None)
        except FileNotFoundError:
            continue  # evicted or replaced by another process meanwhile
        except (OSError, pa.ArrowException, ValueError):
            entry.unlink(missing_ok=True)  # damaged or truncated: never trusted, rebuilt by the caller
    return None


def cached_entry(cache_dir: Path, path: Path) -> Path | None:
    """The checked entry of ``path``'s current version, for readers that query it in place
    (sptrace.load.window); None when there is none. Its CRC is checked once per process."""
    tables = store(cache_dir)
    for entry in _candidates(tables, path):
        try:
            if tables.intact(entry, TABLES, remember=True):
                return entry
            entry.unlink(missing_ok=True)  # damaged: never trusted
        except OSError:
            continue
    return None


def write_cached(cache_dir: Path, path: Path, metadata: TraceMetadata, table: pa.Table) -> Path | None:
    """Write the entry atomically (older versions of the trace's go), then keep the cache under
    its cap; returns the entry's path, or None when the cache is not writable."""
    try:
        prefix, version = _key(path)
    except OSError:
        return None

    def fill(sink: BinaryIO) -> None:
        meta = {_META_KEY: json.dumps(metadata).encode(), _SOURCE_KEY: str(path.resolve()).encode()}
        schema = table.schema.with_metadata(meta)
        with ipc.new_file(sink, schema) as writer:
            writer.write_table(table.replace_schema_metadata(schema.metadata))

    return store(cache_dir).put(version, TABLES, fill, replaces=f"{prefix}-")


def write_summary(cache_dir: Path, version: str, key: str, header: EntryHeader, payload: bytes) -> Path | None:
    """Write a summary entry atomically for the trace version ``version`` (trace_version's
    answer, taken before the trace was read) and ``key`` (16 hex digits: what else the summary
    depends on); summaries of the trace's older versions go, then the cache is kept under its cap.
    Returns the entry's path, or None when the cache is not writable. ``header`` must name the
    trace as ``source``."""
    prefix = version.split("-", 1)[0]
    data = frame(_SUMMARY_MAGIC, header, payload)
    return store(cache_dir).put(f"{version}{key}-", SUMMARIES, data, replaces=f"{prefix}-", sharing=version)


def read_summary(cache_dir: Path, version: str, key: str) -> tuple[Path, bytes] | None:
    """The checked payload of the summary entry for ``version`` and ``key``, and the entry's
    path (for discard_summary, when the payload turns out unusable); None when there is none."""
    return store(cache_dir).read(f"{version}{key}-", SUMMARIES, _summary_payload)


def _summary_payload(data: bytes) -> bytes:
    _, start = unframe(_SUMMARY_MAGIC, data)
    return data[start:]


def discard_summary(entry: Path) -> None:
    """Delete an entry whose payload could not be used (written by other code): a miss."""
    entry.unlink(missing_ok=True)


def entries(cache_dir: Path | None = None) -> list[Entry]:
    """The cache's entries, both kinds, least recently used first."""
    return store(cache_dir).entries()


def prune(cache_dir: Path, *, keep: Path | None = None, limit: int | None = None) -> list[Path]:
    """Drop entries whose trace is gone, then the least recently used until the cache fits
    ``limit`` (default: the cap). ``keep`` is never dropped (the entry just written)."""
    return store(cache_dir).prune(keep=keep, limit=limit)


def clear(cache_dir: Path | None = None) -> int:
    """Delete every entry, tables and summaries; returns how many bytes were freed."""
    return store(cache_dir).clear()
