"""Map per rank: each rank's trace becomes a small ``RankResult`` where it is parsed.

A rank's event table (tens of MB to GB) lives only inside the map: in the process (the driver or
a worker) or Dask worker that parsed it, until its summary is made. What comes back to the
driver is what the cross-rank reduce needs (sptrace.analysis): the rank's collectives, step and
transfer times, compute intervals, phases, a thinned memory series, its retained tensors, and its
trace's metadata and counts.
The driver never holds two tables at once (it maps ranks of its own beside its local workers;
none on Dask), so its memory does not grow with the event count of the run, only with these
summaries.

With the cache on, each summary is kept beside the rank's parsed table (sptrace.run.summaries):
a rank whose trace, MapSpec and code are unchanged is read back instead of parsed and
detected again, and a run whose every rank is kept starts no worker.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sptrace.cachedir import default_cache_dir
from sptrace.load.files import RunFiles, RunSource
from sptrace.load.trace import RankTrace, RunTrace, load_trace
from sptrace.run.executors import Executor
from sptrace.run.gather import MEMORY_COLUMNS, PHASE_COLUMNS, GatheredRanks
from sptrace.run.ranks import map_files
from sptrace.run.summaries import Slot, read_summary, slot_of, write_summary

if TYPE_CHECKING:
    import pandas as pd

    from sptrace.detect.allocations import Retention
    from sptrace.detect.index import RankIndex
    from sptrace.detect.timing import RankTiming
    from sptrace.load.describe import RankDescription


@dataclass(frozen=True)
class MapSpec:
    """What each rank computes: ``parts`` of collectives, sharding, modules, path (the work lane
    the critical path walks; with collectives) (none: only the trace's description, for
    ``sptrace info``); ``element_size`` the declared activation element size
    for shape inference of retained tensors."""

    parts: tuple[str, ...] = ("collectives", "sharding")
    element_size: int | None = None
    cache: bool = True
    cache_dir: Path | None = None
    single_file: bool = False
    """The run is one file: a trace with no rank anywhere is rank 0 of 1."""
    hidden: int | None = None
    """The declared H: tells column- from row-parallel matmuls in a retained tensor's origin."""


@dataclass(eq=False)
class RankResult:
    """One rank, summarized where its trace was parsed."""

    trace: RankTrace
    """Released: metadata and counts, no table (``trace.table`` reads it again on demand)."""
    description: RankDescription | None = None
    """sptrace.load.describe.describe_rank's counts (what ``sptrace info`` shows): made only for
    a spec with no parts (``info``'s; the other commands never read it, and it costs a rank's
    map 3%)."""
    collectives: pd.DataFrame | None = None
    timing: RankTiming | None = None
    compute: pd.DataFrame | None = None
    work: pd.DataFrame | None = None
    """The rank's work lane, labelled by module (sptrace.detect.work): the critical path's input."""
    step_work: pd.DataFrame | None = None
    """The work lane's time per profiled step, module and phase (sptrace.detect.step_work)."""
    flops: pd.DataFrame | None = None
    """The FLOPs of its matrix products per module and phase (sptrace.detect.flops), with the work lane."""
    module_times: pd.DataFrame | None = None
    """Each module's own forward and backward time (sptrace.detect.timing.detect_module_times)."""
    phases: pd.DataFrame | None = None
    memory: pd.DataFrame | None = None
    peak_allocated: int | None = None
    """The largest Total Allocated a [memory] event recorded (bytes)."""
    retained: Retention | None = None
    """When the sharding part ran."""


def summarize(trace: RankTrace, spec: MapSpec) -> RankResult:
    """One loaded rank's summary (its table is left as it is: the caller owns the trace)."""
    if not spec.parts:  # sptrace info: the Arrow counts alone, no pandas table
        from sptrace.load.describe import describe_rank

        return RankResult(trace=trace, description=describe_rank(trace))
    result = RankResult(trace=trace)
    from sptrace.detect.collectives import detect_collectives
    from sptrace.detect.index import RankIndex

    index = RankIndex(trace)
    result.phases = rank_phases(trace, index)
    result.memory, result.peak_allocated = rank_memory(trace, index)
    if "collectives" in spec.parts:
        from sptrace.detect.flops import detect_flops
        from sptrace.detect.module_clock import module_clock
        from sptrace.detect.step_work import work_by_step
        from sptrace.detect.timing import detect_compute, detect_timing
        from sptrace.detect.work import detect_work

        result.collectives = detect_collectives(trace, index, for_reduce=True)
        result.timing = detect_timing(trace, result.collectives, index)
        result.compute = detect_compute(trace, index)
        if "path" in spec.parts or "whatif" in spec.parts:  # (what the critical path and replays walk: not check)
            clock = module_clock(index)  # (the lane's labels, and the FLOPs')
            result.work = detect_work(trace, index, result.collectives, clock=clock)
        if "path" in spec.parts:  # analyze's compute balance: the lane per step, and the work handed
            result.step_work = work_by_step(result.work, result.timing)
            result.flops = detect_flops(index, clock, int(trace.rank) if trace.rank is not None else 0)
    if "modules" in spec.parts:  # (what sptrace diff compares: a few ms a rank that analyze need not pay)
        from sptrace.detect.timing import detect_module_times

        result.module_times = detect_module_times(trace, index)
    if "sharding" in spec.parts:
        from sptrace.detect.allocations import detect_retained

        result.retained = detect_retained(trace, element_size=spec.element_size, index=index, hidden=spec.hidden)
    return result


def map_one(path: Path, spec: MapSpec) -> RankResult:
    """The map: the rank's summary from the cache (sptrace.run.summaries) when its trace and
    the code are unchanged; else parse its file (through the table cache), summarize it, keep
    the summary, let the table go."""
    slot = summary_slot(path, spec)
    if slot is not None:
        cached = read_result(slot)
        if cached is not None:
            return cached
    trace = load_trace(path, cache=spec.cache, cache_dir=spec.cache_dir, alone=spec.single_file)
    result = summarize(trace, spec)
    trace.release()
    if slot is not None:
        write_summary(slot, result)
    return result


_NOT_IN_RESULT = ("cache", "cache_dir")
"""MapSpec fields that change where a result is kept, not what it is (every other field is in
its summary's key)."""


def summary_slot(path: Path, spec: MapSpec) -> Slot | None:
    """Where ``path``'s summary for ``spec`` is kept; None with the cache off."""
    if not spec.cache:
        return None
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in _NOT_IN_RESULT}
    about = "+".join(spec.parts) or "description"
    return slot_of(path, fields, spec.cache_dir or default_cache_dir(), about)


def read_result(slot: Slot) -> RankResult | None:
    """A kept summary, its trace set to re-read its table from ``slot``'s cache (or the file)."""
    result = read_summary(slot, RankResult)
    if result is None:
        return None
    result.trace.path, result.trace.reload = slot.source, (True, slot.cache_dir)
    return result


def _reuse(path: Path, results: dict[Path, RankResult]) -> RankResult:
    return results[path]


def map_run(
    source: RunFiles | RunSource,
    spec: MapSpec | None = None,
    *,
    skip_bad: bool = False,
    executor: Executor | None = None,
) -> tuple[RunTrace, dict[int, RankResult]]:
    """Every rank of a run (its RunFiles, else a folder, a trace file or a list of them) through
    ``map_one`` on ``executor``: the run (its traces released) and each rank's result. Errors as
    sptrace.run.ranks.load_run's; its warnings are in ``run.warnings`` (not raised)."""
    found = source if isinstance(source, RunFiles) else RunFiles.scan(source)
    spec = dataclasses.replace(spec or MapSpec(), single_file=found.single_file)
    fn, args = map_one, (spec,)
    kept = kept_results(list(found.files), spec)
    if kept is not None:  # every rank summarized already: no worker to start, nothing to parse
        fn, args = _reuse, (kept,)
        executor = Executor(workers=1, progress=executor.progress if executor else None)
    run, results = map_files(found, fn, args, executor=executor, skip_bad=skip_bad, trace_of=lambda r: r.trace)
    return run, {r.trace.rank: r for r in results}


def gather_run(
    source: RunFiles | RunSource,
    spec: MapSpec | None = None,
    *,
    skip_bad: bool = False,
    executor: Executor | None = None,
    keep_descriptions: bool = False,
) -> tuple[RunTrace, GatheredRanks]:
    """map_run whose results are gathered as they arrive (sptrace.run.gather), none held whole:
    what the reduce and every command over a whole run read, in memory that hardly grows with
    the ranks. ``keep_descriptions``: keep each rank's description (``sptrace info``)."""
    found = source if isinstance(source, RunFiles) else RunFiles.scan(source)
    spec = dataclasses.replace(spec or MapSpec(), single_file=found.single_file)
    if all_kept(list(found.files), spec):  # every rank summarized already: no worker to start
        executor = Executor(workers=1, progress=executor.progress if executor else None)
    gathered = GatheredRanks(keep_descriptions=keep_descriptions)
    run, _ = map_files(found, map_one, (spec,), executor=executor, skip_bad=skip_bad, trace_of=gathered.take,
                       keep_results=False)  # fmt: skip
    return run, gathered


def all_kept(files: list[Path], spec: MapSpec) -> bool:
    """Whether every file's summary is kept (each read and checked, then let go)."""
    for path in files:
        slot = summary_slot(path, spec)
        if slot is None or read_result(slot) is None:
            return False
    return True


def kept_results(files: list[Path], spec: MapSpec) -> dict[Path, RankResult] | None:
    """Every file's kept summary, read here; None at the first one missing (then the map runs,
    on the executor, and reads the kept ones again where it runs)."""
    kept = {}
    for path in files:
        slot = summary_slot(path, spec)
        result = read_result(slot) if slot is not None else None
        if result is None:
            return None
        kept[path] = result
    return kept


def rank_phases(trace: RankTrace, index: RankIndex) -> pd.DataFrame:
    """The rank's phase ranges (sptrace.phase markers, else its ProfilerStep), in us, found with
    the tests of its index (``index``)."""
    import numpy as np
    import pandas as pd

    from sptrace.detect.columns import empty_frame
    from sptrace.vocab import markers

    ev, names = trace.events, index.by_name
    rows = names.prefix(markers.PHASE) & index.is_x
    if not rows.any():
        rows = names.prefix("ProfilerStep#")
    if not rows.any():
        return empty_frame(PHASE_COLUMNS)
    at = np.flatnonzero(rows)  # (read off the columns' arrays: a taken frame costs more than the rest)
    marked = [str(names.values[c]) for c in names.codes[at].tolist()]
    starts = ev["ts_ns"].to_numpy(dtype=np.int64, na_value=0)[at].tolist()
    durations = ev["dur_ns"].to_numpy(dtype=np.int64, na_value=0)[at].tolist()
    # (PHASE_COLUMNS in order: a columns= would cost pandas a reindex, 4x the frame's making)
    return pd.DataFrame({
        "rank": [trace.rank] * len(marked),
        "phase": [n[len(markers.PHASE) :] if n.startswith(markers.PHASE) else "step" for n in marked],
        "start_us": [ts / 1e3 for ts in starts],
        "dur_us": [dur / 1e3 for dur in durations],
    })  # fmt: skip


def rank_memory(trace: RankTrace, index: RankIndex, max_points: int = 1500) -> tuple[pd.DataFrame, int | None]:
    """Allocated bytes over the step from [memory] events' Total Allocated (at most
    ``max_points``: the page needs the shape, not every event), and the peak; the events found
    with the name test of the rank's index (``index``)."""
    import pandas as pd

    from sptrace.detect.columns import empty_frame, notna_rows, take_columns

    ev = trace.events
    is_memory = index.by_name.one_of(["[memory]"]) & notna_rows(ev["mem_total_allocated"])
    mem = take_columns(ev, is_memory, ["ts_ns", "mem_total_allocated"])
    if mem.empty:
        return empty_frame(MEMORY_COLUMNS), None
    mem = mem.sort_values("ts_ns", kind="stable")
    part = mem.iloc[:: max(len(mem) // max_points, 1)]
    series = pd.DataFrame({
        "rank": trace.rank, "ts_us": part["ts_ns"].astype("int64") / 1e3,
        "allocated_bytes": part["mem_total_allocated"].astype("int64"),
    })  # fmt: skip
    return series, int(mem["mem_total_allocated"].max())
