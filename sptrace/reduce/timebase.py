"""The one time base of a run: when a collective's data moved on each rank, how long it took once
its members had all arrived, its bandwidth, and how the ranks' clocks line up. Matching, the
point-to-point report and the timeline all read their times here, so that a collective has one
arrival, one end and one bandwidth wherever it is shown.

A rank's row (sptrace.detect.collectives.COLUMNS) has two spans: the CPU op that issued it
(``start_us``, ``dur_us``) and, where the trace links one, its transfer (``transfer_start_us``,
``transfer_dur_us``: the NCCL kernels or gloo worker that moved the data). The transfer is used
wherever it is known, the issue span elsewhere: the CPU issue time runs ahead of the GPU, so a
rank *arrives* at a collective when its transfer can start, and the collective *ends* on that
rank when its transfer ends.

Transfer time: from the last member's arrival to the end; nobody moves data before everyone is
there.

Clocks: each rank's offset is the median, over its matched collectives, of its end minus the
reference rank's (collectives complete together, when the last rank has arrived); subtracting it
puts the rank's times on the reference rank's clock.

Bandwidth follows nccl-tests: algbw = S / t, busbw = algbw x 2(n-1)/n for all-reduce and
(n-1)/n for all-gather, reduce-scatter and all-to-all (S: the larger of in and out bytes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

import numpy as np
import pandas as pd

from sptrace.vocab import collective_kinds

if TYPE_CHECKING:
    from pandas.api.typing import NAType


def transfer_span(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(start, duration) in us of when each row's data moved on its rank's own clock: its
    transfer where the trace links one, else its CPU issue span."""
    known = frame["transfer_start_us"].notna()
    start = frame["transfer_start_us"].where(known, frame["start_us"]).astype(float)
    return start, frame["transfer_dur_us"].where(known, frame["dur_us"]).astype(float)


def arrival_us(frame: pd.DataFrame) -> pd.Series:
    """When each row's rank arrived at its collective: when its transfer could start."""
    return transfer_span(frame)[0]


def end_us(frame: pd.DataFrame) -> pd.Series:
    """When each row's collective ended on its rank."""
    start, dur = transfer_span(frame)
    return start + dur


def transfer_us(last_arrival: float, end: float) -> float:
    """How long a collective moved data: from its last member's arrival to its end (none when it
    ended before, which only clocks that disagree can show)."""
    return max(float(end) - float(last_arrival), 0.0)


def algbw_gbps(size_bytes: float | NAType | None, transfer: float) -> float:
    """nccl-tests' algorithm bandwidth in GB/s: the bytes over the transfer time; NaN when the
    size is unknown (None, NaN or NA) or no time passed."""
    return float(size_bytes) / (transfer * 1e-6) / 1e9 if transfer > 0 and pd.notna(size_bytes) else np.nan


def busbw_gbps(algbw: float, kind: str, group_size: int | None) -> float:
    """nccl-tests' bus bandwidth: algbw x the kind's factor for the group's size (the table of
    collective kinds); NaN when either is unknown (the matched-rank count never stands in for the
    group's size, and a kind the table does not know has no factor)."""
    if np.isnan(algbw) or group_size is None:
        return np.nan
    return algbw * collective_kinds.bus_factor(kind, group_size)


def clock_offsets(matched: pd.DataFrame) -> dict[int, float]:
    """Per rank: its clock minus the lowest rank's, from the ``end_us`` of its collectives that
    matched one of the lowest rank's (same ``group`` and ``key``); 0 for a rank with none. One
    join of every rank's rows with the reference's and a grouped median (a join per rank cost
    47 s of a 10,000-rank reduce); a rank with an unknown end among its matches has NaN, as
    numpy's median gives."""
    if matched.empty:
        return {}
    ref_rank = int(matched["rank"].min())
    keys = ["group", "key"]
    ref = matched.loc[matched["rank"] == ref_rank, [*keys, "end_us"]].rename(columns={"end_us": "ref"})
    joined = matched[["rank", *keys, "end_us"]].merge(ref, on=keys, how="inner")
    apart = joined["end_us"].astype(float) - joined["ref"].astype(float)
    median = apart.groupby(joined["rank"]).median()
    median[apart.isna().groupby(joined["rank"]).any()] = np.nan
    offsets = dict.fromkeys(sorted(int(r) for r in pd.unique(matched["rank"])), 0.0)
    offsets.update({int(r): float(v) for r, v in median.items()})
    return offsets


@overload
def aligned(us: pd.Series, rank: pd.Series | int, offsets: dict[int, float]) -> pd.Series: ...
@overload
def aligned(us: float, rank: int, offsets: dict[int, float]) -> float: ...
def aligned(us: pd.Series | float, rank: pd.Series | int, offsets: dict[int, float]) -> pd.Series | float:
    """A rank's trace time in us on the reference rank's clock: minus the rank's offset (0 when
    none is known). Scalars, or a Series of times of one rank or beside a Series of their ranks."""
    if isinstance(rank, pd.Series):
        return us.astype(float) - rank.map(offsets).astype(float).fillna(0.0)
    return us - offsets.get(rank, 0.0)
