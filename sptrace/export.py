"""``sptrace export``: every rank of a run in one trace, on clocks aligned across ranks, with
sptrace's own tracks on top (issue 24).

Perfetto cannot align the clocks of separate traces (perfetto#1018), so the ranks are merged here:
each rank becomes one process (pid = rank, named "rank R") whose threads and streams keep their
tids, every timestamp moved onto the aligned clock (the rank's offset from matching:
sptrace.reduce.timebase.aligned). Above them, per rank: phases, layers, modules, collectives
(linked across ranks by flow events) and allocated bytes; the critical path as a process of its
own (sptrace.export_tracks). The recorded events come from each rank's event table, one rank and
one batch at a time (sptrace.export_events), so memory does not grow with the run.

The output is the Trace Event Format's JSON object, which ui.perfetto.dev and chrome://tracing
open: ``{"displayTimeUnit": "ms", "traceEvents": [...], "otherData": {...}}``, in that order
(Perfetto reads displayTimeUnit only before the events, and stops at a top-level key it does not
know); gzip when the file name ends in .gz. ``ts`` is in us from ``otherData.ts_zero_us``, a whole
millisecond of the aligned clock: a Kineto timestamp (us since the epoch) is too large for a
double to hold its nanoseconds, and 0 near the step keeps every one exact.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from sptrace.export_events import Threads, event_batches, flow_numbers, kept_rows, module_ranges
from sptrace.export_tracks import Clock, Window, collective_slices, critical_path_events, own_rank_events
from sptrace.fileio import write_atomic_chunks
from sptrace.vocab.errors import UsageError
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import count, human_bytes, rank_ranges

if TYPE_CHECKING:
    import pandas as pd

    from sptrace.analysis import RunAnalysis
    from sptrace.reduce.critical import CriticalPath

MAX_RANKS = 64
"""Ranks exported when none are chosen: past this the trace is too large for a browser to open."""
GZIP_LEVEL = 6
_ENCODE = msgspec.json.Encoder().encode


def parse_window(text: str) -> tuple[float | None, float | None]:
    """'START:END' in ms from the step start (either side may be left open: '5:', ':20')."""
    lo, colon, hi = text.partition(":")
    try:
        start = float(lo) if lo.strip() else None
        end = float(hi) if hi.strip() else None
    except ValueError:
        start = end = float("nan")
    if not colon or start != start or end != end or (start is None and end is None):
        raise UsageError(f"--window {text!r}: give START:END in ms from the step start, such as 10:25.5")
    if start is not None and end is not None and end <= start:
        raise UsageError(f"--window {text!r}: the end must come after the start")
    return start, end


def process_groups(collectives: pd.DataFrame) -> dict[str, set[int]]:
    """Each process group the run's collectives name -> its ranks (the trace's Process Group
    Ranks, and every rank that issued a collective in it)."""
    out: dict[str, set[int]] = {}
    if collectives.empty:
        return out
    named = collectives[collectives["group"].notna()]
    for group, rows in named.groupby(named["group"].astype(str), sort=True):
        ranks = set(rows["rank"].astype(int))
        for listed in rows["group_ranks"].dropna():
            if isinstance(listed, (list, tuple)):
                ranks.update(int(r) for r in listed)
        out[str(group)] = ranks
    return out


def choose_ranks(
    a: RunAnalysis, ranks: Iterable[int] | None = None, group: str | None = None, limit: int = MAX_RANKS
) -> tuple[tuple[int, ...], str | None]:
    """(the ranks to export, a note when sptrace chose them): ``ranks``, else the ranks of the
    process group ``group``, else every rank up to ``limit``; past that the group of the rank that
    kept its groups waiting longest (sptrace.reduce.matching.top_stragglers), else the first ones."""
    present = sorted(a.run.ranks)
    if ranks is not None:
        wanted = sorted(set(ranks))
        absent = [r for r in wanted if r not in a.run.ranks]
        if absent:
            raise UsageError(f"--ranks: {rank_ranges(absent)} {'is' if len(absent) == 1 else 'are'} not in the run "
                             f"(its ranks: {rank_ranges(present)})")  # fmt: skip
        return tuple(wanted), None
    groups = process_groups(a.collectives)
    if group is not None:
        if group not in groups:
            known = ", ".join(sorted(groups)) or "none: its collectives name no process group"
            raise UsageError(f"--group {group!r} is no process group of the run's collectives (its groups: {known})")
        return tuple(r for r in present if r in groups[group]), None
    if len(present) <= limit:
        return tuple(present), None
    chosen = _straggler_group(a, groups, limit)
    if chosen is not None:
        name, rank, members = chosen
        return members, (f"{len(present)} ranks: exported process group {name} (ranks {rank_ranges(members)}), where "
                         f"rank {rank} kept the others waiting longest; --ranks or --group for others")  # fmt: skip
    return tuple(present[:limit]), (f"{len(present)} ranks: exported the first {limit}; pass --ranks or --group for "
                                    "others")  # fmt: skip


def _straggler_group(
    a: RunAnalysis, groups: dict[str, set[int]], limit: int
) -> tuple[str, int, tuple[int, ...]] | None:
    """(group, rank, its ranks): the group of at most ``limit`` ranks in which the run's worst
    straggler made its members wait longest."""
    from sptrace.reduce.matching import top_stragglers

    if a.matching is None or a.matching.matched.empty:
        return None
    top = top_stragglers(a.matching, 1)
    if top.empty:
        return None
    rank = int(top["rank"].iloc[0])
    matched = a.matching.matched
    waits = matched[matched["straggler"] == rank].groupby("group")["max_wait_us"].sum().sort_values(ascending=False)
    for name in waits.index.astype(str):
        members = tuple(r for r in sorted(a.run.ranks) if r in groups.get(name, ()))
        if 1 < len(members) <= limit:
            return name, rank, members
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportOptions:
    """What a merged trace holds."""

    ranks: tuple[int, ...] | None = None
    """The ranks exported (None: choose_ranks' default)."""
    window_ms: tuple[float | None, float | None] | None = None
    """Keep what overlaps [start, end) ms from the step start (RunAnalysis.step_zero_us); None: all."""
    events: bool = True
    """Write the events the ranks recorded (False: sptrace's own tracks only)."""

    def __post_init__(self) -> None:
        if self.window_ms is not None:
            lo, hi = self.window_ms
            if lo is not None and hi is not None and hi <= lo:
                raise ValueError(f"window_ms {self.window_ms}: the end must come after the start")


@dataclass
class ExportSummary:
    """What was written: counts and sizes (filled in as the trace streams)."""

    ranks: tuple[int, ...] = ()
    events: int = 0
    flows: int = 0
    """Flows linking the members of matched collectives (and sends to receives)."""
    bytes_out: int = 0
    bytes_in: int = 0
    """The exported ranks' trace files, as they are on disk."""
    notes: list[str] = field(default_factory=list)

    def line(self, name: str) -> str:
        """'wrote merged.json.gz: 8 ranks, 41,230 events, 1.20 MiB (0.92x the 8 input traces' 1.30 MiB)'."""
        ratio = f"{self.bytes_out / self.bytes_in:.2f}x" if self.bytes_in else "?x"
        inputs = f"the {len(self.ranks)} input traces'" if len(self.ranks) != 1 else "the input trace's"
        return (f"wrote {name}: {count(len(self.ranks), 'rank')}, {self.events:,} events, "
                f"{human_bytes(self.bytes_out)} ({ratio} {inputs} {human_bytes(self.bytes_in)})")  # fmt: skip


def export_run(a: RunAnalysis, out: Path, options: ExportOptions = ExportOptions()) -> ExportSummary:
    """Write the merged trace of ``a`` to ``out`` (atomically; gzip when it ends in .gz)."""
    out = check_output(out)
    summary = ExportSummary()
    chunks = trace_chunks(a, options, summary)
    if out.name.endswith(".gz"):
        chunks = gzip_chunks(chunks)
    try:
        summary.bytes_out = write_atomic_chunks(out, chunks)
    except OSError as exc:
        raise UsageError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return summary


def check_output(out: Path | str) -> Path:
    """The file to write (a folder is a UsageError: said before any trace is read)."""
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"{out}: is a directory; name the file to write (merged.json.gz)")
    return out


def gzip_chunks(chunks: Iterable[bytes], level: int = GZIP_LEVEL) -> Iterator[bytes]:
    """The chunks as one gzip stream, compressed as they come (a file, or an HTTP response)."""
    packer = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    for chunk in chunks:
        packed = packer.compress(chunk)
        if packed:
            yield packed
    yield packer.flush()


def trace_chunks(a: RunAnalysis, options: ExportOptions, summary: ExportSummary) -> Iterator[bytes]:
    """The merged trace's JSON text, a piece at a time: the critical path, then each rank (its
    process's names, sptrace's tracks, the events it recorded). ``summary`` is filled in as it
    goes. Bad options (a rank not in the run, a window outside it) raise before the first piece."""
    ranks, note = choose_ranks(a, options.ranks)
    if note:
        summary.notes.append(note)
    if not ranks:
        raise UsageError("no rank to export")
    path = a.critical_path
    clock, extent = _clock(a, ranks, path)
    window = _window(a, clock, extent, options.window_ms)
    summary.ranks = tuple(ranks)
    summary.bytes_in = sum(a.run.ranks[r].path.stat().st_size for r in ranks if a.run.ranks[r].path.is_file())
    return _stream(a, ranks, clock, window, path, options.events, summary)


def _clock(a: RunAnalysis, ranks: Iterable[int], path: CriticalPath | None) -> tuple[Clock, tuple[float, float]]:
    """The file's clock (its zero at or before everything written) and the aligned extent, in us,
    of the ranks' traces."""
    offsets = a.offsets_us
    starts, ends = [], []
    for r in ranks:
        span = a.run.ranks[r].time_span_ns()
        if span is not None:
            starts.append(span[0] / 1e3 - offsets.get(r, 0.0))
            ends.append(span[1] / 1e3 - offsets.get(r, 0.0))
    extent = (min(starts, default=a.step_zero_us), max(ends, default=a.step_zero_us))
    earliest = [extent[0], a.step_zero_us]
    if path is not None:
        earliest.append(float(path.start_us))
    return Clock.of(offsets, earliest), extent


def _window(
    a: RunAnalysis, clock: Clock, extent: tuple[float, float], window_ms: tuple[float | None, float | None] | None
) -> Window:
    """The window in file ns (None: open); one that misses the ranks' traces is a UsageError."""
    if window_ms is None:
        return None, None
    zero = float(clock.aligned_us(a.step_zero_us))
    lo, hi = (None if ms is None else round(zero + ms * 1e6) for ms in window_ms)
    first, last = (float(clock.aligned_us(us)) for us in extent)
    if (hi is not None and hi <= first) or (lo is not None and lo > last):
        shown = ":".join("" if ms is None else f"{ms:g}" for ms in window_ms)
        raise UsageError(f"--window {shown} holds nothing: the ranks' traces run from {(first - zero) / 1e6:.2f} to "
                         f"{(last - zero) / 1e6:.2f} ms from the step start")  # fmt: skip
    return lo, hi


def _stream(a: RunAnalysis, ranks: tuple[int, ...], clock: Clock, window: Window, path: CriticalPath | None,
            events: bool, summary: ExportSummary) -> Iterator[bytes]:  # fmt: skip
    """trace_chunks' pieces, once its options are checked."""
    collectives = collective_slices(a.collectives, a.matching, ranks, clock, window)
    summary.flows = collectives.n_flows
    next_flow = collectives.n_flows + 1
    yield b'{"displayTimeUnit":"ms","traceEvents":['
    first = True

    def encode(batch: list[JSONObject]) -> bytes:
        nonlocal first
        summary.events += len(batch)
        text = _ENCODE([_in_us(e) for e in batch])[1:-1]
        if first:
            first = False
            return text
        return b"," + text

    if path is not None:
        cp = critical_path_events(path, a.run.world_size, clock, window)
        if cp:
            yield encode(cp)
    for rank in ranks:
        trace = a.run.ranks[rank]
        held = trace.loaded is not None
        table = trace.table
        own = [
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
            *own_rank_events(rank, clock=clock, phases=a.phases, collectives=a.collectives,
                             markers=module_ranges(table), memory=a.memory,
                             collective_events=collectives.by_rank.get(rank, []), window_ns=window),
            *collectives.flows.get(rank, []),
        ]  # fmt: skip
        yield encode(own)
        if events:
            shift = clock.shift_ns(rank)
            raw = tuple(None if t is None else t + shift for t in window)
            rows = kept_rows(table, raw)  # type: ignore[arg-type]
            threads = Threads.of(rows)
            flows = flow_numbers(rows)
            yield encode(threads.metadata(rank))
            for batch in event_batches(rows, rank, shift, threads, flows, next_flow):
                if batch:
                    yield encode(batch)
            next_flow += len(flows)
            del rows
        del table
        if not held:  # read for this export alone: let it go before the next rank's
            trace.release()
    yield b'],"otherData":' + _ENCODE(_other_data(a, ranks, clock, window, summary, path)) + b"}"


def _in_us(event: JSONObject) -> JSONObject:
    """sptrace's own events carry integer ns (ts_ns, dur_ns) until written: us here."""
    if "ts_ns" in event:
        event = dict(event)
        event["ts"] = event.pop("ts_ns") / 1e3
        if "dur_ns" in event:
            event["dur"] = event.pop("dur_ns") / 1e3
    return event


def _other_data(a: RunAnalysis, ranks: tuple[int, ...], clock: Clock, window: Window, summary: ExportSummary,
                path: CriticalPath | None) -> JSONObject:  # fmt: skip
    """What the trace is: its run and ranks, its clock, its window and counts."""
    from sptrace import __version__

    zero_us = clock.zero_ns / 1e3
    return {
        "generator": f"sptrace {__version__} export", "run": a.run.root.name if a.run.root is not None else "run",
        "world_size": a.run.world_size, "ranks": rank_ranges(ranks),
        "clock": "each rank's trace time less its clock offset (aligned on matched collectives: sptrace analyze), "
                 "less ts_zero_us; in us",
        "ts_zero_us": zero_us, "step_start_ts": round(a.step_zero_us - zero_us, 3),
        "clock_offsets_us": {str(r): a.offsets_us.get(r, 0.0) for r in ranks},
        "window_ts": [None if t is None else t / 1e3 for t in window] if window != (None, None) else None,
        "events": summary.events, "collective_flows": summary.flows,
        "critical_path": f"pid {a.run.world_size}" if path is not None else None,
    }  # fmt: skip
