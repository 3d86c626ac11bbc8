"""A function over every rank file of a run, on an executor (sptrace.run.executors): ``map_files``,
which sptrace.run.map.map_run shares, and ``load_run``, every rank of a run loaded, tables and all."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

from sptrace.load.files import RunFiles, RunSource
from sptrace.load.trace import RankTrace, RunTrace, TraceWarning, assemble_run, load_trace
from sptrace.run.executors import Executor, Result, map_ranks
from sptrace.vocab.errors import TraceError


def map_files(
    found: RunFiles,
    fn: Callable[..., Result],
    args: tuple[object, ...],
    *,
    executor: Executor | None,
    skip_bad: bool,
    trace_of: Callable[[Result], RankTrace],
    desc: str = "analysing ranks",
    keep_results: bool = True,
) -> tuple[RunTrace, list[Result]]:
    """``fn(file, *args)`` for every trace file of a run on ``executor``, and the run their
    traces (``trace_of(result)``, called on each result as it arrives) make: what load_run and
    sptrace.run.map share. A bad file raises, or with ``skip_bad`` is left out with a note; no
    usable file raises. ``keep_results=False``: the results are not kept (the list is empty),
    ``trace_of`` having taken what it needs of each (sptrace.run.gather)."""
    root, files, skipped = found.root, found.files, list(found.skipped)
    total = sum(p.stat().st_size for p in files)
    results: list[Result] = []
    traces: list[RankTrace] = []
    bad: list[tuple[Path, str]] = []
    for p, got in map_ranks(fn, files, args, executor=executor, total_bytes=total, desc=desc):
        if isinstance(got, TraceError):
            if not skip_bad:
                raise got
            bad.append((p, got.problem))
            continue
        traces.append(trace_of(got))
        if keep_results:
            results.append(got)
    notes = [*found.notes, *(f"skipped {p}: {why}" for p, why in skipped + bad)]
    if not traces:
        raise TraceError(root or files[0], "no usable trace among " + ", ".join(str(p) for p, _ in bad))
    run = assemble_run(root, traces, notes, found.run_info)
    run.skipped = skipped + bad
    return run, results


def _load_in_worker(path: Path, cache: bool, cache_dir: Path | None, alone: bool) -> RankTrace:
    """Runs in a worker process. With the cache on, the table stays there: only the metadata
    travels back, and the driver maps the cached table."""
    trace = load_trace(path, cache=cache, cache_dir=cache_dir, alone=alone)
    return trace.release() if cache else trace


def _itself(trace: RankTrace) -> RankTrace:
    return trace


def load_run(
    path_or_files: RunSource,
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
        trace_of=_itself,
        desc="loading traces",
    )
    for trace in traces:
        if trace.loaded is None:  # left in the cache by a worker: map it here
            trace.table  # noqa: B018 - reads the table back
    for note in run.warnings:
        warnings.warn(note, TraceWarning, stacklevel=2)
    return run
