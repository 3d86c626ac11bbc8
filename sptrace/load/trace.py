"""Loading traces: ``load_trace`` for one rank's file, ``load_run`` for every rank of a step.

A run is a directory (or a list) of per-rank Kineto traces, ``.json`` or ``.json.gz``. Each
rank's rank and world size come from its ``distributedInfo``; traces without it (older
PyTorch, single GPU) get them from the file name (``rank3``, ``rank-3``, ``worker3``). Ranks load
in parallel processes when the run is large, each through the table cache.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa

from sptrace.executors import Executor, map_ranks
from sptrace.load import cache as table_cache
from sptrace.load.arrow import compute, to_numpy, value_counts
from sptrace.load.decode import decode_trace
from sptrace.vocab.errors import TraceError
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import count, rank_ranges

TRACE_SUFFIXES = (".json", ".json.gz")
RUN_FILE = "run.json"
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
MAX_WORLD_SIZE = 2**20
"""No job has more ranks than this; a larger world_size is a damaged trace."""


class TraceWarning(UserWarning):
    """Something about a run that limits the analyses but does not stop them."""


@dataclass(eq=False)
class RankTrace:
    """One rank's trace: its event table and the trace's top-level metadata.

    A trace that went through the per-rank map (sptrace.run.map) has been *released*: its
    table is gone and only its counts stay, so that a driver holding a thousand ranks holds no
    event table; ``table`` / ``events`` then read it again (from the cache) on demand."""

    path: Path
    rank: int | None
    world_size: int | None
    metadata: JSONObject
    """Top-level keys of the trace (distributedInfo, deviceProperties, baseTimeNanoseconds ...)."""
    loaded: pa.Table | None = field(repr=False)
    """The event table while it is held (None once released)."""
    rank_source: str = "distributedInfo"
    """Where rank came from: 'distributedInfo', 'file name' or 'single file'."""
    stats: tuple[int, dict[str, int], tuple[int, int] | None] | None = field(default=None, repr=False)
    """(events, category counts, time span), kept when the table is released."""
    reload: tuple[bool, Path | None] = (True, None)
    """(cache, cache_dir) to read the table again with."""

    @property
    def table(self) -> pa.Table:
        """One row per event, columns as in sptrace.load.schema.SCHEMA (read again if released)."""
        if self.loaded is None:
            cache, cache_dir = self.reload
            self.loaded = load_trace(self.path, cache=cache, cache_dir=cache_dir).table
        return self.loaded

    @cached_property
    def events(self):  # -> pandas.DataFrame; typed lazily so that importing sptrace stays light
        """The event table as a pandas DataFrame (string columns categorical, ints nullable)."""
        import pandas as pd

        return self.table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)

    def release(self) -> RankTrace:
        """Let the table go, keeping its counts: what a rank's summary carries back to the driver."""
        if self.loaded is not None:
            self.stats = (self.num_events, self.category_counts(), self.time_span_ns())
        self.loaded = None
        self.__dict__.pop("events", None)
        return self

    def __getstate__(self) -> dict[str, object]:  # a released trace travels without its table
        state = dict(self.__dict__)
        state.pop("events", None)
        return state

    @property
    def distributed_info(self) -> JSONObject:
        info = self.metadata.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    @property
    def backend(self) -> str | None:
        return self.distributed_info.get("backend")

    @property
    def process_groups(self) -> list[JSONObject]:
        groups = self.distributed_info.get("pg_config")
        return groups if isinstance(groups, list) else []

    @property
    def num_events(self) -> int:
        return self.stats[0] if self.loaded is None and self.stats else self.table.num_rows

    def category_counts(self) -> dict[str, int]:
        if self.loaded is None and self.stats:
            return dict(self.stats[1])
        return value_counts(self.table["cat"])

    def time_span_ns(self) -> tuple[int, int] | None:
        if self.loaded is None and self.stats:
            return self.stats[2]
        timed = to_numpy(compute("is_valid", self.table["ts_ns"]))
        if not timed.any():
            return None
        start = to_numpy(self.table["ts_ns"])[timed]
        return int(start.min()), int((start + to_numpy(self.table["dur_ns"])[timed]).max())


@dataclass(eq=False)
class RunTrace:
    """Every rank of one profiled step."""

    ranks: dict[int, RankTrace]
    """By rank, in rank order."""
    world_size: int
    root: Path | None = None
    run_info: JSONObject | None = None
    """The run's run.json (written by sptrace.profile_step), when present."""
    missing_ranks: list[int] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Files left out: (path, why)."""
    warnings: list[str] = field(default_factory=list)

    def __iter__(self):
        return iter(self.ranks.values())

    def __len__(self) -> int:
        return len(self.ranks)

    @property
    def backend(self) -> str | None:
        return next((r.backend for r in self.ranks.values() if r.backend), None)


def load_trace(
    path: str | os.PathLike[str],
    *,
    cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    alone: bool = False,
) -> RankTrace:
    """Parse one rank's trace (through the table cache unless ``cache=False``). ``alone``: the
    trace is the run's only file (RunFiles.single_file), so one that names no rank anywhere is
    rank 0 of 1 (the single-file rule, here only)."""
    p = Path(path)
    if not p.exists():
        raise TraceError(p, "no such file")
    if p.is_dir():
        raise TraceError(p, "is a directory: use load_run for a run's folder")
    directory = Path(cache_dir) if cache_dir is not None else table_cache.default_cache_dir()
    loaded = table_cache.read_cached(directory, p) if cache else None
    if loaded is None:
        metadata, table = decode_trace(p)
        if cache:
            table_cache.write_cached(directory, p, metadata, table)
    else:
        metadata, table = loaded
    found_rank, world_size, source = _identify(p, metadata)
    if found_rank is None and alone:
        found_rank, world_size, source = 0, 1, "single file"
    if rank is not None:
        found_rank, source = rank, source if found_rank == rank else "caller"
    return RankTrace(p, found_rank, world_size, metadata, table, source, reload=(cache, directory))


def _identify(path: Path, metadata: JSONObject) -> tuple[int | None, int | None, str]:
    info = metadata.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        world = info.get("world_size")
        return info["rank"], world if isinstance(world, int) else None, "distributedInfo"
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1)), None, "file name"
    return None, None, "none"


_SNIFF = 64 * 1024
# keys a Kineto trace starts with (the profiler writes schemaVersion, deviceProperties and
# distributedInfo before traceEvents; a trace written by other tools may open on traceEvents)
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')


def _named_like_a_trace(name: str) -> bool:
    """A name that says rank or trace (rank3.json, worker_0.pt.trace.json): read as a trace
    whatever it holds, so that a broken trace is an error, never skipped."""
    return bool(_RANK_IN_NAME.search(name)) or "trace" in name.lower()


def _starts_like_a_trace(path: Path) -> bool:
    """Another .json beside the traces (a config, metrics, a truth file) is no trace: read its
    first bytes (inflated for .gz) for a trace's top-level keys."""
    import gzip

    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                head = f.read(_SNIFF)
        else:
            with open(path, "rb") as f:
                head = f.read(_SNIFF)
    except (OSError, EOFError, gzip.BadGzipFile):
        return True  # unreadable: loading it says why
    return any(key in head for key in _TRACE_KEYS)


def holds_any(path: Path, needles: tuple[bytes, ...], chunk: int = 1 << 20) -> set[bytes]:
    """Which of ``needles`` the file's text holds, read as a stream (inflated when gzip, by its
    magic number) and stopped once all are found: a probe before the parse, for what a check
    needs (``[memory]`` events), where no header says whether the profiler recorded them.
    Unreadable files answer every needle: loading them says what is wrong."""
    import gzip
    import zlib

    found: set[bytes] = set()
    keep = max(len(n) for n in needles) - 1
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gz else open(path, "rb") as f:
            tail = b""
            while len(found) < len(needles):
                block = f.read(chunk)
                if not block:
                    break
                data = tail + block
                found.update(n for n in needles if n in data)
                tail = data[-keep:] if keep else b""
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return set(needles)
    return found


def find_traces(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Trace files in a run folder, and the files skipped (HTA's outputs)."""
    if not root.exists():
        raise TraceError(root, "no such file or directory")
    files, skipped = [], []
    for p in sorted(root.iterdir()):
        if not p.is_file() or p.name == RUN_FILE or p.name.startswith("."):
            continue
        if not p.name.endswith(TRACE_SUFFIXES):
            continue
        if "_with_counters" in p.name:
            skipped.append((p, "written by HTA's generate_trace_with_counters, not a profiler trace"))
            continue
        if not _named_like_a_trace(p.name) and not _starts_like_a_trace(p):
            skipped.append((p, f"not a profiler trace (no trace key among its first {_SNIFF // 1024} KiB)"))
            continue
        files.append(p)
    if not files:
        raise TraceError(root, "no trace files (*.json, *.json.gz) in this directory")
    return files, skipped


def _load_in_worker(path: Path, cache: bool, cache_dir: Path | None, alone: bool) -> RankTrace:
    """Runs in a worker process. With the cache on, the table stays there: only the metadata
    travels back, and the driver maps the cached table."""
    trace = load_trace(path, cache=cache, cache_dir=cache_dir, alone=alone)
    return trace.release() if cache else trace


def load_run(
    path_or_files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    skip_bad: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    executor: Executor | None = None,
) -> RunTrace:
    """Load every rank of a run, tables and all: a directory of per-rank traces, a single
    trace, or a list. (sptrace.run.map.map_run summarizes each rank where it is parsed instead,
    for runs too large to hold.)

    Raises TraceError for an unusable run (no traces, two files claiming one rank, ranks from
    different runs or worlds). A rank missing from 0..world_size-1 is a warning (the run is
    analysed over the ranks present). ``skip_bad`` turns a bad rank file into a warning too.
    """
    directory = Path(cache_dir) if cache_dir is not None else None
    executor = executor or Executor(workers=workers, progress=progress)
    found = RunFiles.scan(path_or_files)
    run, traces = map_files(
        found,
        _load_in_worker,
        (cache, directory, found.single_file),
        executor=executor,
        skip_bad=skip_bad,
        desc="loading traces",
    )
    for trace in traces:
        if trace.loaded is None:  # left in the cache by a worker: map it here
            trace.table  # noqa: B018 - reads the table back
    for note in run.warnings:
        warnings.warn(note, TraceWarning, stacklevel=2)
    return run


def map_files(
    found: RunFiles,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    executor: Executor | None,
    skip_bad: bool,
    desc: str = "analysing ranks",
    trace_of: Callable[[Any], RankTrace] = lambda result: result,
) -> tuple[RunTrace, list[Any]]:
    """``fn(file, *args)`` for every trace file of a run on ``executor``, and the run their
    traces (``trace_of(result)``) make: what load_run and sptrace.run.map.map_run share. A bad
    file raises, or with ``skip_bad`` is left out with a note; no usable file raises."""
    root, files, skipped = found.root, found.files, list(found.skipped)
    total = sum(p.stat().st_size for p in files)
    results: list[Any] = []
    bad: list[tuple[Path, str]] = []
    for p, got in map_ranks(fn, files, args, executor=executor, total_bytes=total, desc=desc):
        if isinstance(got, TraceError):
            if not skip_bad:
                raise got
            bad.append((p, got.problem))
            continue
        results.append(got)
    notes = [*found.notes, *(f"skipped {p}: {why}" for p, why in skipped + bad)]
    if not results:
        raise TraceError(root or files[0], "no usable trace among " + ", ".join(str(p) for p, _ in bad))
    run = assemble_run(root, [trace_of(r) for r in results], notes, found.run_info)
    run.skipped = skipped + bad
    return run, results


@dataclass(frozen=True)
class RunFiles:
    """A run's files, found once: the trace files of a folder (else the one file, else the list
    given), those skipped and why, and the run.json beside them, read (its problems in
    ``notes``)."""

    root: Path | None
    """The run's folder (a single file's own folder; None for a list of files)."""
    files: tuple[Path, ...]
    skipped: tuple[tuple[Path, str], ...]
    run_info: JSONObject | None
    notes: tuple[str, ...]

    @property
    def single_file(self) -> bool:
        """The run is one file: a trace that names no rank is rank 0 of 1 (load_trace's ``alone``)."""
        return len(self.files) == 1

    @classmethod
    def scan(cls, path_or_files: Any) -> RunFiles:
        """A folder, one trace file, or a list of trace files (TraceError when there is no trace)."""
        root, files, skipped = files_of(path_or_files)
        notes: list[str] = []
        run_info = read_run_info(root, notes)
        return cls(root, tuple(files), tuple(skipped), run_info, tuple(notes))


def files_of(path_or_files: Any) -> tuple[Path | None, list[Path], list[tuple[Path, str]]]:
    if isinstance(path_or_files, (str, os.PathLike)):
        root = Path(path_or_files)
        if root.is_dir():
            files, skipped = find_traces(root)
            return root, files, skipped
        if not root.exists():
            raise TraceError(root, "no such file or directory")
        return root.parent, [root], []
    files = [Path(p) for p in path_or_files]
    if not files:
        raise TraceError("<run>", "no trace files given")
    for p in files:
        if not p.is_file():
            raise TraceError(p, "no such file")
    return None, files, []


def read_run_info(root: Path | None, notes: list[str]) -> JSONObject | None:
    """The run's run.json (written by sptrace.profile_step), when there is one; a broken one is
    a note, not an error."""
    if root is None or not (root / RUN_FILE).is_file():
        return None
    try:
        info = json.loads((root / RUN_FILE).read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"ignored {root / RUN_FILE}: {exc}")
        return None
    if not isinstance(info, dict):
        notes.append(f"ignored {root / RUN_FILE}: not a JSON object")
        return None
    unread = _unread_keys(info)
    if unread:  # a misspelt size must not be silently unknown
        notes.append(f"{root / RUN_FILE}: {', '.join(unread)} {'is' if len(unread) == 1 else 'are'} no model field "
                     "sptrace reads (ignored); the fields are those of --config (README: run.json)")  # fmt: skip
    return info


# what sptrace.profile_step writes beside the model's fields, at the top and under config
_RUN_KEYS = frozenset({"backend", "config", "created", "device", "host", "profiled_step", "profiler", "schema",
                       "sptrace_version", "torch_version", "traces", "world_size"})  # fmt: skip
_CONFIG_KEYS = frozenset({"fault", "fault_layer", "fault_modules", "instrumented", "layout", "reference_model", "seed"})


def _unread_keys(info: JSONObject) -> list[str]:
    """The keys of a run.json that name no model field: under ``config`` (as profile_step writes
    it), or at the top of a flat one."""
    from sptrace.vocab.shape import ALIASES, FIELDS

    def field(key: str) -> bool:
        name = str(key).replace("-", "_")
        return ALIASES.get(name, name) in FIELDS

    config = info.get("config")
    if isinstance(config, dict):
        return sorted(str(k) for k in config if not field(k) and k not in _CONFIG_KEYS)
    return sorted(str(k) for k in info if not field(k) and k not in _RUN_KEYS and k not in _CONFIG_KEYS)


def assemble_run(root: Path | None, traces: list[RankTrace], notes: list[str], run_info: JSONObject | None) -> RunTrace:
    """The run the traces make (``run_info``: its run.json, as RunFiles.scan read it)."""
    unknown = [t.path for t in traces if t.rank is None]
    if unknown:
        raise TraceError(
            unknown[0],
            "cannot tell which rank this trace is: no distributedInfo and no rank in the file name "
            "(rename it rank<N>.json, or load it alone)",
        )
    by_rank: dict[int, RankTrace] = {}
    for t in sorted(traces, key=lambda t: (t.rank, str(t.path))):
        assert t.rank is not None
        if t.rank in by_rank:
            raise TraceError(t.path, f"claims rank {t.rank}, as does {by_rank[t.rank].path}")
        by_rank[t.rank] = t
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1:
        detail = ", ".join(f"{t.path.name}: {t.world_size}" for t in traces if t.world_size is not None)
        raise TraceError(root or traces[0].path, f"ranks come from different runs: world sizes differ ({detail})")
    backends = {t.backend for t in traces if t.backend}
    if len(backends) > 1:
        raise TraceError(root or traces[0].path, f"ranks come from different runs: backends {sorted(backends)}")
    world = worlds.pop() if worlds else max(by_rank) + 1
    if not 0 < world <= MAX_WORLD_SIZE:
        culprit = next((t.path for t in traces if t.world_size == world), traces[0].path)
        raise TraceError(culprit, f"world_size {world} is not a number of ranks (1 to {MAX_WORLD_SIZE})")
    outside = [r for r in by_rank if not 0 <= r < world]
    if outside:
        raise TraceError(by_rank[outside[0]].path, f"rank {outside[0]} is outside the world of {world} ranks")
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        notes.append(
            f"{len(missing)} of {world} ranks {'has' if len(missing) == 1 else 'have'} no trace "
            f"({rank_ranges(missing)}): cross-rank matching, "
            f"skew and straggler analysis cover the {count(len(by_rank), 'rank')} present, and the per-rank "
            "checks say nothing about the missing ones"
        )
    return RunTrace(dict(sorted(by_rank.items())), world, root, run_info, missing, [], notes)
