"""Per-rank summaries in the trace cache: what the map (sptrace.run.map) made of a rank, kept
beside its parsed table (sptrace.load.cache: one sptrace.cachedir.Store holds both), so that a
warm run of an unchanged trace skips detection as well as parsing.

A summary is a cached answer, and a stale one is a wrong answer, so it is reused only when
everything that made it is unchanged:

- the trace: its version as the table cache keys it (resolved path, size, mtime_ns,
  SCHEMA_VERSION) and its path as given (a rank read from a symlink's name, the file a report
  names);
- what the map computed: every MapSpec field but ``cache`` and ``cache_dir`` (a new field
  counts unless it is listed there);
- the code that computed it: SUMMARY_VERSION, a SHA-256 of the sptrace sources summarize can
  run (every ``.py`` file of the package, and the native decoder's C, but those in
  ``NOT_SUMMARIZED``;
  ``tests/load/test_summary_cache.py`` checks that a summarize imports none of those), and the
  Python, numpy, pandas and pyarrow it ran on (the size and mtime of each one's
  ``__init__.py``). The digest is taken once per process: about 6 ms for the 42 files (340 KB)
  it reads on 2 cores, against the ~1 s a warm summary saves the 8-rank DLRM corpus run.

An entry is a pickle of the RankResult with its trace released (no table: ``trace.table`` reads
it again from the table cache, or the trace, on demand). The CRC-32 in its name is checked
before anything is unpickled, and a payload that does not unpickle is a miss, deleted and
rebuilt. Unpickling runs code: the cache directory is the user's own, trusted as the tables in
it are.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sptrace.cachedir import Entry, EntryHeader, sources_digest
from sptrace.load import cache as trace_cache

SUMMARY_VERSION = 1
"""Bump whenever summarize's output changes in a way the sources' digest cannot see (a change in
how a dependency behaves, say); code changes in the digested sources invalidate by themselves."""

NOT_SUMMARIZED = frozenset({"cli", "report", "checks", "analysis.py", "sweep.py", "launch.py", "profiling.py",
                            "instrumentation.py", "fileio.py", "__main__.py", "lane_window.py",
                            "analysis_cache.py"})  # fmt: skip
"""Top-level parts of the package a rank's summary never runs (the reduce, the renderers, the
launchers): their edits keep the summaries."""

T = TypeVar("T")


def code_digest() -> str | None:
    """A digest of the code a summary depends on (sptrace.cachedir.sources_digest: the sources
    but NOT_SUMMARIZED, and the libraries they run on); None when the package's sources are not
    there to read (then no summary is cached: there is nothing to tell stale ones by)."""
    return sources_digest(f"summary {SUMMARY_VERSION}", NOT_SUMMARIZED)


@dataclass(frozen=True)
class Slot:
    """Where one rank's summary for one spec is kept."""

    cache_dir: Path
    version: str
    """sptrace.load.cache.trace_version of the trace, taken before it is read: a trace that
    changes while it is summarized leaves its summary under the old version, never read again."""
    key: str
    """16 hex digits: the spec, the path as given and the code (code_digest)."""
    source: Path
    about: str
    """What the summary holds, for ``sptrace cache info``."""


def slot_of(path: Path, spec_fields: Mapping[str, object], cache_dir: Path, about: str) -> Slot | None:
    """The slot of ``path``'s summary for a map whose result depends on ``spec_fields`` (only
    their repr goes into the key); None
    when summaries cannot be kept (no sources to digest, or the trace cannot be read: then
    loading it says why)."""
    code = code_digest()
    if code is None:
        return None
    try:
        version = trace_cache.trace_version(path)
    except OSError:
        return None
    fields = repr(sorted(spec_fields.items()))
    key = hashlib.sha256(f"{code}|{path}|{fields}".encode()).hexdigest()[:16]
    return Slot(cache_dir, version, key, path, about)


def read_summary(slot: Slot, kind: type[T]) -> T | None:
    """The ``kind`` kept in ``slot``, or None (a miss: nothing kept, or damaged and deleted)."""
    found = trace_cache.read_summary(slot.cache_dir, slot.version, slot.key)
    if found is None:
        return None
    entry, payload = found
    try:
        result = pickle.loads(payload)
        if isinstance(result, kind):
            return result
    except Exception:  # written by code that is gone (a class renamed): whatever it raises, a miss
        pass
    trace_cache.discard_summary(entry)
    return None


def write_summary(slot: Slot, result: object) -> Path | None:
    """Keep ``result`` (pickled) in ``slot`` (atomically, within the cache's cap); the entry, or
    None when the cache is not writable."""
    header = EntryHeader(source=str(slot.source.resolve()), about=slot.about, code=code_digest())
    return trace_cache.write_summary(slot.cache_dir, slot.version, slot.key, header, pickle.dumps(result, 5))


def is_current(entry: Entry) -> bool:
    """Whether a summary entry was written by this code (another sptrace's never match, and go
    with the least recently used)."""
    return entry.header.get("code") == code_digest()
