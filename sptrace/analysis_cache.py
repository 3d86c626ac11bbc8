"""Whole analyses kept on disk, so that a dashboard started again over a run it has shown draws
its first page at once: a warm analysis of 8 ranks of 500 MB still runs the cross-rank reduce
over every rank's summary (tens of seconds), where reading back the RunAnalysis it made takes a
fraction of a second (docs/performance.md, "The dashboard").

A kept analysis is a cached answer, and a stale one is a wrong answer, so it is used only when
everything that made it is unchanged:

- the run: the name, size, mtime_ns and inode of every entry of its folder (the traces,
  ``run.json``, a file added or removed), or of the trace file and the ``run.json`` beside it;
- what analyse_run was asked: the parts, the declarations (flags and a ``--config`` file's values,
  each with its source), ``skip_bad`` and every other option but those that only choose where the
  work runs or where the caches live (the executor, ``cache``, ``cache_dir``);
- the code: a SHA-256 of all of the package's sources and the libraries they run on
  (sptrace.cachedir.sources_digest), so that any edit of sptrace is a miss.

``load_options`` with ``cache=False`` (``--no-cache``) neither reads nor keeps one. Entries live in
``analyses/`` of the cache directory (a sptrace.cachedir.Store: written atomically, their bytes'
CRC-32 in their name, checked before anything is unpickled), one per run and options (a newer
version of the run or the code replaces the older), within a quarter of the cache's cap
(SPTRACE_CACHE_MAX), least recently used first. Unpickling runs code: the cache directory is the
user's own, trusted as the tables and summaries in it are.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

from sptrace.analysis import RunAnalysis, analyse_run
from sptrace.cachedir import (
    EntryHeader,
    Store,
    frame,
    keyed_answers,
    run_fingerprint,
    sources_digest,
    unframe,
)
from sptrace.run.options import LoadOptions, LoadOptionValues
from sptrace.vocab.shape import Declarations, ShapeValues

ANALYSIS_VERSION = 1
"""Bump when what a kept analysis holds changes in a way the code digest cannot see."""
SUBDIR = "analyses"
SHARE = 4
"""The analyses may hold a quarter of the cache's cap."""
_MAGIC = b"sptrace-analysis\n"
ANALYSES = keyed_answers("analysis", _MAGIC)
NOT_KEYED = frozenset({"executor", "cache", "cache_dir"})
"""Load options that choose where the work runs or where caches live, never what it finds."""


def store(cache_root: Path) -> Store:
    return Store(cache_root / SUBDIR, (ANALYSES,), share=SHARE)


def key_of(path: Path, options: LoadOptions, asked: dict[str, object]) -> str | None:
    """``slot-version`` for this run and these options; None when the run or the code cannot be
    read (then nothing is kept)."""
    code = sources_digest(f"analysis {ANALYSIS_VERSION}")
    if code is None:
        return None
    try:
        fingerprint = run_fingerprint(path)
        resolved = str(path.resolve())
    except (OSError, ValueError):
        return None
    loaded = sorted((k, repr(v)) for k, v in vars(options).items() if k not in NOT_KEYED)
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("SPTRACE_") and k != "SPTRACE_CACHE_MAX")
    slot = json.dumps([str(path), resolved, sorted((k, repr(v)) for k, v in asked.items()), loaded, env])
    version = json.dumps([code, fingerprint])
    return f"{_hex(slot)}-{_hex(version)}"


def _declared(flags: ShapeValues | Declarations | None) -> list[object]:
    """What was declared, each layer with its source: no declaration (None, a command's empty
    flags) is one key, as analyse_run reads them alike."""

    def given(values: ShapeValues) -> list[tuple[str, object]]:  # a flag left out is None: not passed
        return sorted((k, v) for k, v in values.items() if v is not None)

    if isinstance(flags, Declarations):
        return [[source, given(values)] for source, values in flags.layers if given(values)] + [
            ["production", source, given(values)] for source, values in flags.production
        ]
    return [["flags", given(flags)]] if flags and given(flags) else []


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _unpickled(data: bytes) -> RunAnalysis:
    _, start = unframe(_MAGIC, data)
    try:
        analysis = pickle.loads(memoryview(data)[start:])
    except Exception as exc:  # a class renamed since, a truncated stream: a miss, deleted by the store
        raise ValueError(f"unusable kept analysis: {exc}") from exc
    if not isinstance(analysis, RunAnalysis):
        raise TypeError("not a RunAnalysis")
    return analysis


def analyse(
    path: Path | str,
    *,
    load_options: LoadOptions | LoadOptionValues | None = None,
    flags: ShapeValues | Declarations | None = None,
    parts: tuple[str, ...] | None = None,
) -> RunAnalysis:
    """analyse_run(path, ...), read back from the cache where this run, these options and this
    code made one before; kept there otherwise. Raises what analyse_run raises."""
    path = Path(path)
    options = LoadOptions.of(load_options)
    asked: dict[str, object] = {"flags": _declared(flags), "parts": parts}
    key = key_of(path, options, asked) if options.cache else None
    kept = store(options.cache_root)
    if key is not None:
        found = kept.read(f"{key}-", ANALYSES, _unpickled)
        if found is not None:
            return found[1]
    extra = {"parts": parts} if parts is not None else {}
    analysis = analyse_run(path, flags=flags, load_options=options, **extra)  # type: ignore[arg-type]
    if key is not None:
        try:
            payload = pickle.dumps(analysis, 5)
        except Exception:  # something in it does not pickle: serve it, keep nothing
            return analysis
        head = EntryHeader(source=str(path.resolve()), about=f"analysis of {path.name}")
        kept.put(f"{key}-", ANALYSES, frame(_MAGIC, head, payload), replaces=f"{key.split('-')[0]}-")
    return analysis
