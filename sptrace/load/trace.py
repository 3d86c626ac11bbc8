"""One rank's trace (RankTrace, read by ``load_trace`` through the table cache) and the run its
ranks make (RunTrace, checked by ``assemble_run``).

A run is a directory (or a list) of per-rank Kineto traces, ``.json`` or ``.json.gz``
(sptrace.load.files finds them). Each rank's rank and world size come from its
``distributedInfo``; traces without it (older PyTorch, single GPU) get them from the file name
(``rank3``, ``rank-3``, ``worker3``). Mapping over a run's ranks (in this process, worker
processes or Dask) is sptrace.run's: ``sptrace.run.ranks.load_run`` loads them all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import pyarrow as pa

from sptrace.cachedir import default_cache_dir
from sptrace.load import cache as table_cache
from sptrace.load.arrow import compute, to_numpy, value_counts
from sptrace.load.decode import decode_trace
from sptrace.load.files import RANK_IN_NAME, RunInfo
from sptrace.vocab.errors import TraceError
from sptrace.vocab.units import count, rank_ranges

if TYPE_CHECKING:
    import pandas as pd

MAX_WORLD_SIZE = 2**20
"""No job has more ranks than this; a larger world_size is a damaged trace."""


class TraceWarning(UserWarning):
    """Something about a run that limits the analyses but does not stop them."""


class ProcessGroupConfig(TypedDict, total=False):
    """One process group as ``distributedInfo.pg_config`` lists it."""

    pg_name: str
    pg_desc: str
    pg_size: int
    ranks: list[int]


class DistributedInfo(TypedDict, total=False):
    """A trace's ``distributedInfo``: the fields sptrace reads."""

    backend: str
    rank: int
    world_size: int
    pg_config: list[ProcessGroupConfig]


class TraceMetadata(TypedDict, total=False):
    """A trace's top-level keys but traceEvents, as Kineto wrote them (kept whole: the JSON edge);
    those sptrace reads are named here."""

    distributedInfo: DistributedInfo
    baseTimeNanoseconds: int
    schemaVersion: int


@dataclass(eq=False)
class RankTrace:
    """One rank's trace: its event table and the trace's top-level metadata.

    A trace that went through the per-rank map (sptrace.run.map) has been *released*: its
    table is gone and only its counts stay, so that a driver holding a thousand ranks holds no
    event table; ``table`` / ``events`` then read it again (from the cache) on demand."""

    path: Path
    rank: int | None
    world_size: int | None
    metadata: TraceMetadata
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
    def events(self) -> pd.DataFrame:  # pandas is imported here only: importing sptrace stays light
        """The event table as a pandas DataFrame (string columns categorical, ints nullable)."""
        from sptrace.load.frame import events_frame

        return events_frame(self.table)

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
    def distributed_info(self) -> DistributedInfo:
        info = self.metadata.get("distributedInfo")
        return info if isinstance(info, dict) else DistributedInfo()

    @property
    def backend(self) -> str | None:
        return self.distributed_info.get("backend")

    @property
    def process_groups(self) -> list[ProcessGroupConfig]:
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
    run_info: RunInfo | None = None
    """The run's run.json (written by sptrace.profile_step), when present."""
    missing_ranks: list[int] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Files left out: (path, why)."""
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[RankTrace]:
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
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    loaded = table_cache.read_cached(directory, p) if cache else None
    if loaded is None:
        decoded, table = decode_trace(p)
        metadata = cast(TraceMetadata, decoded)  # the JSON edge: the keys as Kineto wrote them
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


def _identify(path: Path, metadata: TraceMetadata) -> tuple[int | None, int | None, str]:
    info = metadata.get("distributedInfo")
    if isinstance(info, dict) and is_json_count(info.get("rank")):
        world = info.get("world_size")
        return info["rank"], world if is_json_count(world) else None, "distributedInfo"
    match = RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1)), None, "file name"
    return None, None, "none"


def is_json_count(value: object) -> bool:
    """A JSON integer: ``true`` and ``false`` are Python ints too, but no rank or world size."""
    return isinstance(value, int) and not isinstance(value, bool)


def assemble_run(root: Path | None, traces: list[RankTrace], notes: list[str], run_info: RunInfo | None) -> RunTrace:
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
