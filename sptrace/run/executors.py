"""Where the per-rank map runs: this process, local worker processes, or a Dask cluster.

``map_ranks(fn, items, ...)`` calls ``fn(item, *args)`` for every item (one rank's trace file)
and yields ``(item, result)`` as each finishes, ``result`` being the TraceError the item raised
when it is an unusable file (the caller decides whether that stops the run). Every executor
shows one progress bar over ranks. The engines are the standard library's ProcessPoolExecutor
and dask.distributed's futures: sptrace schedules nothing of its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TextIO, TypeVar

from sptrace.vocab.errors import TraceError, UsageError

Item = TypeVar("Item")
Result = TypeVar("Result")

EXECUTORS = ("local", "dask")
PARALLEL_MIN_BYTES = 32 * 2**20
"""Below this much trace data, local worker processes cost more than they save."""
BATCH_ITEMS = 8
"""Ranks handed to a local worker process in one task: a task's round trip (the driver's thread
waking, the call and its arguments pickled) costs as much as a small rank's map, and a batch pays
it once (a fifth of the driver's time at 1024 ranks: docs/performance.md)."""
BATCHES_PER_WORKER = 4
PROGRESS_LINES_PAST = 64
"""A map over more ranks than this says how far it is (a line per 10%) even off a terminal: a CI
log or a batch job's shows a long run moving."""


@dataclass(frozen=True)
class Executor:
    """How to run the map: ``kind`` local or dask; ``workers`` local processes (or the
    LocalCluster's workers); ``scheduler`` a running Dask scheduler's address."""

    kind: str = "local"
    workers: int | None = None
    scheduler: str | None = None
    progress: bool | None = None
    """The map's progress on stderr: None (default) a bar on a terminal and, past
    PROGRESS_LINES_PAST ranks, a line per 10% otherwise; True the bar or the lines always;
    False nothing."""

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, not {self.kind!r}")
        if self.workers is not None and self.workers < 1:
            raise UsageError("--workers must be >= 1")
        if self.scheduler is not None and self.kind != "dask":
            raise UsageError("--scheduler needs --executor dask")


def map_ranks(
    fn: Callable[..., Result],
    items: Sequence[Item],
    args: tuple[object, ...] = (),
    *,
    executor: Executor | None = None,
    total_bytes: int = 0,
    desc: str = "analysing ranks",
) -> Iterator[tuple[Item, Result | TraceError]]:
    """``(item, fn(item, *args) or the TraceError it raised)`` for every item, as they finish."""
    executor = executor or Executor()
    bar = _progress(len(items), executor.progress, desc)
    try:
        if executor.kind == "dask":
            yield from _dask(fn, items, args, executor, bar)
            return
        workers = executor.workers
        if workers is None:
            workers = min(len(items), os.cpu_count() or 1) if total_bytes >= PARALLEL_MIN_BYTES else 1
        if workers <= 1 or len(items) <= 1:
            for item in items:
                yield item, _call(item, fn, args)
                bar.update(1)
            return
        yield from _processes(fn, items, args, workers, bar)
    finally:
        bar.close()


def _call(item: Item, fn: Callable[..., Result], args: tuple[object, ...]) -> Result | TraceError:
    try:
        return fn(item, *args)
    except TraceError as exc:
        return exc


def _processes(
    fn: Callable[..., Result], items: Sequence[Item], args: tuple[object, ...], workers: int, bar: Progress
) -> Iterator[tuple[Item, Result | TraceError]]:
    """The map on ``workers`` processes, this one among them: ``workers - 1`` spawned ones take
    batches from the standard library's pool, and this process maps the other batches a rank at a
    time, handing the pool more between ranks (each spawned one has one running, one queued).
    One interpreter fewer holding pandas and Arrow (160 MB of the machine's memory), and the
    results made here are never pickled."""
    import multiprocessing
    from collections import deque
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    # spawn: forking a process whose Arrow thread pool is running can deadlock
    ctx = multiprocessing.get_context("spawn")
    size = batch_size(len(items), workers)
    waiting = deque(items[i : i + size] for i in range(0, len(items), size))
    helpers = min(workers, len(waiting)) - 1  # (counting this process's batch, still waiting)
    in_flight: dict[Future, Sequence[Item]] = {}
    # this process's batch, mapped a rank at a time (the pool is fed between ranks): the first
    # one, which sptrace.cli may have begun reading (sptrace.load.native.read_ahead)
    here: deque[Item] = deque(waiting.popleft())
    with ProcessPoolExecutor(max_workers=max(helpers, 1), mp_context=ctx) as pool:
        while waiting or in_flight or here:
            while helpers and waiting and len(in_flight) < 2 * helpers:  # (one running, one queued, each)
                batch = waiting.popleft()
                in_flight[pool.submit(_call_each, batch, fn, args)] = batch
            for fut in [f for f in in_flight if f.done()]:
                batch = in_flight.pop(fut)  # (a finished future holds its results: let them go with the yields)
                yield from zip(batch, fut.result())
                bar.update(len(batch))
            if not here and waiting:
                here.extend(waiting.popleft())
            if here:
                item = here.popleft()
                yield item, _call(item, fn, args)
                bar.update(1)
            elif in_flight:
                wait(in_flight, return_when=FIRST_COMPLETED)


def batch_size(items: int, workers: int) -> int:
    """Items a worker process is handed at once: up to BATCH_ITEMS, and at least BATCHES_PER_WORKER
    batches a worker, so that the last ones still spread over every worker."""
    return max(1, min(BATCH_ITEMS, items // (workers * BATCHES_PER_WORKER)))


def _call_each(batch: Sequence[Item], fn: Callable[..., Result], args: tuple[object, ...]) -> list[Result | TraceError]:
    return [_call(item, fn, args) for item in batch]


def _dask(
    fn: Callable[..., Result], items: Sequence[Item], args: tuple[object, ...], executor: Executor, bar: Progress
) -> Iterator[tuple[Item, Result | TraceError]]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise UsageError("--executor dask needs dask.distributed: pip install 'sptrace[dask]'") from None
    import logging

    cluster = None
    try:
        if executor.scheduler is not None:
            client = Client(executor.scheduler, timeout="20s")
        else:  # one single-threaded worker process per core: parsing holds the GIL
            cluster = LocalCluster(
                n_workers=executor.workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                dashboard_address=None, silence_logs=logging.ERROR,
            )  # fmt: skip
            client = Client(cluster)
    except (OSError, TimeoutError) as exc:
        where = executor.scheduler or "a LocalCluster"
        raise UsageError(f"cannot reach the Dask scheduler at {where}: {exc}") from None
    try:
        futures = client.map(_call, items, fn=fn, args=args, pure=False)
        where = dict(zip((f.key for f in futures), items))
        for fut in as_completed(futures):
            yield where[fut.key], fut.result()
            bar.update(1)
            fut.release()  # the result lives here now, not on the worker too
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


class Progress(Protocol):
    """A progress bar over ranks (tqdm's, or none)."""

    def update(self, n: int) -> object: ...

    def close(self) -> object: ...


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class TenthLines:
    """A line at each tenth of the ranks done (what a log shows for a bar), on the process's own
    stderr: progress is not output, so a kept result (sptrace.cli.result_cache) never replays it."""

    def __init__(self, total: int, desc: str, stream: TextIO | None = None) -> None:
        import time

        self.total, self.desc, self.done, self.said, self.t0 = total, desc, 0, 0, time.perf_counter()
        self.stream = stream or sys.__stderr__ or sys.stderr

    def update(self, n: int) -> None:
        import time

        self.done += n
        tenth = self.done * 10 // self.total
        if tenth > self.said:
            self.said = tenth
            elapsed = time.perf_counter() - self.t0
            self.stream.write(f"{self.desc}: {tenth * 10}% ({self.done} of {self.total} ranks, {elapsed:.0f} s)\n")
            self.stream.flush()

    def close(self) -> None:
        pass


def _progress(total: int, show: bool | None, desc: str) -> Progress:
    terminal = sys.stderr.isatty()
    if show is False or total < 2 or (show is None and not terminal and total <= PROGRESS_LINES_PAST):
        return _NoBar()
    if not terminal:
        return TenthLines(total, desc)
    from tqdm import tqdm

    return tqdm(total=total, unit="rank", desc=desc, file=sys.stderr, leave=False)
