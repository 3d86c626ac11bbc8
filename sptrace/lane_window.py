"""What the Timeline draws of one time window of a run's lanes, at most about ``max_points``
points however long the run: the rows of each layer (phases, compute, collectives, stragglers,
links between matched collectives, the critical path) that overlap the window, decimated to the
window's resolution (``resolution`` buckets per lane: about two pixels of a wide screen) where they
are denser than that, and coarser still where the layers together would pass ``max_points``.

Decimation keeps what a reader looks for:

- collectives: in each bucket of a lane the longest one (so the run's longest collectives, and
  every bucket that holds any, stay drawn), each kept bar carrying how many it stands for;
- compute: neighbouring intervals of a lane closer than a bucket merge into one band (its busy
  time and count kept);
- phases: every phase band, but where one lane has two of one phase in a bucket (the longest kept);
- stragglers: in each bucket of a lane the marker of the one that kept its group waiting longest;
- links: the matched collectives with at least two kept members, the most skewed first;
- the critical path: consecutive segments of one rank within a bucket merge (the longest names it).

Zooming asks for a narrower window, whose finer buckets give back the detail. The figure
(sptrace.report.timeline) draws what this returns and counts nothing itself; this module never
imports a plotting library.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sptrace.analysis import RunAnalysis
from sptrace.lanes import collective_bars, on_aligned_clock

MAX_POINTS = 200_000
"""The most points the Timeline sends the browser for one view (issue 51)."""
RESOLUTION = 800
"""Buckets per lane over a window: two to the narrowest bar drawn (a 400th of the view), two pixels
of a wide plot; at 8 x 500 MB the whole view holds 13,600 points, not 25,500 at 1600."""
MARGIN = 0.1
"""The data window reaches this share of the shown range past each side, so that a small pan
shows bars before the detail of the new range arrives."""

CRITICAL_COLUMNS = ["rank", "start_us", "dur_us", "kind", "module", "phase", "collective", "waiting", "merged"]


@dataclass(frozen=True)
class LaneView:
    """One window of the lanes, decimated. Times are us on the aligned clock (``t0``: the step's
    zero); every frame holds only rows that overlap [lo_us, hi_us]."""

    ranks: list[int]
    t0: float
    lo_us: float
    hi_us: float
    shown: tuple[float, float]
    """The x range to show (a layer's or phase's extent, or the window asked for)."""
    extent: tuple[float, float]
    """The lanes' whole span: what zooming all the way out shows."""
    bucket_us: float
    """The decimation's bucket (0: every row of the window kept)."""
    phases: pd.DataFrame  # rank, phase, s, dur_us
    compute: pd.DataFrame  # rank, s, dur_us, busy_us, count
    collectives: pd.DataFrame  # collective_bars' rows, and ``hidden``: how many more each kept bar stands for
    links: pd.DataFrame  # group, key, rank, bar_start, bar_end, p2p: members of the linked collectives, in order
    stragglers: pd.DataFrame  # rank, bar_start, skew_us
    critical: pd.DataFrame  # CRITICAL_COLUMNS (start_us aligned), in path order; ``merged``: segments it stands for
    asked: bool = False
    """Whether ``shown`` is a window the caller asked for (a zoom), not the run's or a focus's extent."""
    critical_breaks: int = 0
    """Where the path leaves the ranks shown (a gap in its line)."""
    totals: dict[str, int] = field(default_factory=dict)
    """Rows of each layer in the window before decimation."""

    @property
    def link_points(self) -> int:
        if self.links.empty:
            return 0
        groups = self.links.groupby(["group", "key"], sort=False).size()
        p2p = self.links.drop_duplicates(["group", "key"])["p2p"].to_numpy(dtype=bool)
        return int(np.where(p2p, 3, groups.to_numpy() + 1).sum())

    @property
    def counts(self) -> dict[str, int]:
        """Points of each layer as the figure draws them."""
        return {
            "phases": len(self.phases), "compute": len(self.compute), "collectives": len(self.collectives),
            "stragglers": len(self.stragglers), "links": self.link_points,
            "critical path": 2 * len(self.critical) + self.critical_breaks,
        }  # fmt: skip

    @property
    def points(self) -> int:
        return sum(self.counts.values())

    @property
    def decimated(self) -> bool:
        return self.bucket_us > 0


def lane_view(
    a: RunAnalysis,
    ranks: list[int],
    *,
    window: tuple[float, float] | None = None,
    layer: int | None = None,
    phase: str | None = None,
    max_points: int = MAX_POINTS,
    resolution: int = RESOLUTION,
) -> LaneView:
    """The lanes of ``ranks`` over ``window`` (ms from the step start, as the figure's x axis;
    None: the whole run, or the extent of ``layer``'s collectives or of ``phase``), decimated to
    ``resolution`` buckets per lane where denser, and to at most about ``max_points`` points."""
    t0 = a.step_zero_us
    coll = a.collectives
    coll = coll[coll["rank"].isin(ranks)] if len(coll) else coll
    bars = collective_bars(a, coll)
    phases = a.phases[a.phases["rank"].isin(ranks)] if len(a.phases) else a.phases
    phases = (phases.assign(s=on_aligned_clock(a, phases))[["rank", "phase", "s", "dur_us"]] if len(phases)
              else pd.DataFrame(columns=["rank", "phase", "s", "dur_us"]))  # fmt: skip
    compute = a.compute
    compute = compute[compute["rank"].isin(ranks)] if len(compute) else compute
    compute = (compute.assign(s=on_aligned_clock(a, compute))[["rank", "s", "dur_us"]] if len(compute)
               else pd.DataFrame(columns=["rank", "s", "dur_us"]))  # fmt: skip
    extent = _extent(t0, bars, phases)
    if window is not None:
        shown = (t0 + window[0] * 1e3, t0 + window[1] * 1e3)
    else:
        shown = _focus(extent, bars, phases, layer, phase)
    pad = (shown[1] - shown[0]) * MARGIN if window is not None or shown != extent else 0.0
    lo, hi = shown[0] - pad, shown[1] + pad
    bars = _inside(bars, "bar_start", "bar_dur", lo, hi)
    phases = _inside(phases, "s", "dur_us", lo, hi)
    compute = _inside(compute, "s", "dur_us", lo, hi)
    lane = {r: i for i, r in enumerate(ranks)}
    strag = _stragglers(a, bars)
    critical = _critical(a, lo, hi)
    totals = {"phases": len(phases), "compute": len(compute), "collectives": len(bars), "stragglers": len(strag),
              "critical path": len(critical)}  # fmt: skip

    def build(bucket: float) -> LaneView:
        kept = _longest(bars, "bar_start", "bar_dur", lane, lo, bucket)
        return LaneView(
            ranks=list(ranks), t0=t0, lo_us=lo, hi_us=hi, shown=shown, extent=extent, bucket_us=bucket,
            phases=_longest(phases, "s", "dur_us", lane, lo, bucket, by="phase").drop(columns="hidden"),
            compute=_merge_close(compute, bucket),
            collectives=kept,
            links=_links(a, kept, max_groups=max(1, int(resolution if not bucket else (hi - lo) / bucket))),
            stragglers=_longest(strag, "bar_start", "skew_us", lane, lo, bucket).drop(columns="hidden"),
            critical=_merge_segments(critical, lo, bucket, set(ranks)),
            critical_breaks=_breaks(critical, set(ranks)), totals=totals, asked=window is not None,
        )  # fmt: skip

    dense = max((_densest(f, c) for f, c in ((bars, "bar_start"), (compute, "s"))), default=0)
    if dense <= resolution:  # sparser than the buckets: every row, unless that passes the budget
        full = build(0.0)
        if full.points <= max_points:
            return full
    width = max(hi - lo, 1e-9)
    buckets = resolution
    view = build(width / buckets)
    for _ in range(8):  # coarser until under budget: each layer's points fall with the buckets
        if view.points <= max_points:
            break
        buckets = max(1, int(buckets * max_points / view.points * 0.9))
        view = build(width / buckets)
    return view


def _extent(t0: float, bars: pd.DataFrame, phases: pd.DataFrame) -> tuple[float, float]:
    lo = [t0]
    hi = []
    if len(bars):
        lo.append(float(bars["bar_start"].min()))
        hi.append(float((bars["bar_start"] + bars["bar_dur"]).max()))
    if len(phases):
        lo.append(float(phases["s"].min()))
        hi.append(float((phases["s"] + phases["dur_us"]).max()))
    start = min(lo)
    return start, max(hi) if hi else start + 1


def _focus(
    extent: tuple[float, float], bars: pd.DataFrame, phases: pd.DataFrame, layer: int | None, phase: str | None
) -> tuple[float, float]:
    """The extent of a layer's collectives or of a phase; the whole extent otherwise."""
    if layer is not None and len(bars):
        sel = bars[bars["layer"] == layer]
        if len(sel):
            return float(sel["bar_start"].min()), float((sel["bar_start"] + sel["bar_dur"]).max())
    elif phase is not None and len(phases):
        sel = phases[phases["phase"] == phase]
        if len(sel):
            return float(sel["s"].min()), float((sel["s"] + sel["dur_us"]).max())
    return extent


def _inside(frame: pd.DataFrame, start: str, dur: str, lo: float, hi: float) -> pd.DataFrame:
    """The rows of ``frame`` whose [start, start + dur] overlaps [lo, hi]."""
    if frame.empty:
        return frame
    s = frame[start].to_numpy(dtype=float)
    e = s + np.nan_to_num(frame[dur].to_numpy(dtype=float))
    return frame[(e >= lo) & (s <= hi)]


def _densest(frame: pd.DataFrame, start: str) -> int:
    """The most rows any one rank has in the window."""
    return int(frame.groupby("rank")[start].size().max()) if len(frame) else 0


def _longest(
    frame: pd.DataFrame, start: str, size: str, lane: dict[int, int], lo: float, bucket: float, by: str | None = None
) -> pd.DataFrame:
    """In each bucket of each lane (and value of ``by``), the row with the largest ``size``,
    with ``hidden``: the rows it stands for beside itself. ``bucket`` 0 keeps every row."""
    if frame.empty or bucket <= 0:
        return frame.assign(hidden=0)
    cell = np.floor((np.maximum(frame[start].to_numpy(dtype=float), lo) - lo) / bucket).astype(np.int64)
    keys = pd.DataFrame({"lane": frame["rank"].map(lane).to_numpy(), "cell": cell}, index=frame.index)
    if by is not None:
        keys[by] = frame[by].to_numpy()
    cols = list(keys.columns)
    order = keys.assign(v=-np.nan_to_num(frame[size].to_numpy(dtype=float), nan=-np.inf)).sort_values(
        [*cols, "v"], kind="stable"
    )
    first = ~order.duplicated(cols)
    sizes = order.groupby(cols, sort=False, dropna=False).size()
    kept = order.index[first.to_numpy()]
    hidden = sizes.to_numpy() - 1  # groups in the order their first row appears, as ``kept``
    out = frame.loc[kept].assign(hidden=hidden)
    return out.sort_values(start, kind="stable")


def _merge_close(compute: pd.DataFrame, bucket: float) -> pd.DataFrame:
    """Compute intervals of a lane closer than ``bucket`` merged: (rank, s, dur_us, busy_us, count)."""
    if compute.empty or bucket <= 0:
        return compute.assign(busy_us=compute["dur_us"], count=1)
    c = compute.sort_values(["rank", "s"], kind="stable")
    rank = c["rank"].to_numpy()
    s = c["s"].to_numpy(dtype=float)
    d = c["dur_us"].to_numpy(dtype=float)
    e = s + d
    reach = pd.Series(e).groupby(rank).cummax().to_numpy()  # the latest end so far on the lane
    new = np.ones(len(c), dtype=bool)
    new[1:] = (rank[1:] != rank[:-1]) | (s[1:] > reach[:-1] + bucket)
    gid = np.cumsum(new) - 1
    out = (
        pd.DataFrame({"rank": rank, "s": s, "e": e, "busy_us": d, "gid": gid})
        .groupby("gid")
        .agg(rank=("rank", "first"), s=("s", "min"), e=("e", "max"), busy_us=("busy_us", "sum"), count=("s", "size"))
    )
    return out.assign(dur_us=out["e"] - out["s"])[["rank", "s", "dur_us", "busy_us", "count"]].reset_index(drop=True)


def _stragglers(a: RunAnalysis, bars: pd.DataFrame) -> pd.DataFrame:
    """Per matched collective whose straggler's bar is in the window: that bar's start and the
    collective's arrival skew."""
    m = a.matching
    empty = pd.DataFrame(columns=["rank", "bar_start", "skew_us"])
    if m is None or m.members.empty or bars.empty or "straggler" not in m.matched:
        return empty
    members = m.members[["rank", "group", "key", "start_us"]].merge(bars[["rank", "start_us", "bar_start"]],
                                                                    on=["rank", "start_us"])  # fmt: skip
    skew = m.matched["arrival_skew_us"] if "arrival_skew_us" in m.matched else pd.Series(0.0, index=m.matched.index)
    info = m.matched[["group", "key", "straggler"]].assign(skew_us=skew.astype(float))
    s = members.merge(info, on=["group", "key"])
    s = s[s["rank"] == s["straggler"]]
    return s[["rank", "bar_start", "skew_us"]].reset_index(drop=True) if len(s) else empty


def _links(a: RunAnalysis, kept: pd.DataFrame, max_groups: int) -> pd.DataFrame:
    """Members of the matched collectives with at least two kept bars, the most skewed
    ``max_groups`` (in time order): a point-to-point pair is one send -> receive line."""
    cols = ["group", "key", "rank", "bar_start", "bar_end", "p2p"]
    m = a.matching
    if m is None or m.members.empty or kept.empty:
        return pd.DataFrame(columns=cols)
    ends = kept.assign(bar_end=kept["bar_start"] + kept["bar_dur"])[["rank", "start_us", "bar_start", "bar_end"]]
    members = m.members[["rank", "group", "key", "start_us"]].merge(ends, on=["rank", "start_us"])
    if members.empty:
        return pd.DataFrame(columns=cols)
    size = members.groupby(["group", "key"])["rank"].transform("size")
    members = members[size >= 2]
    if members.empty:
        return pd.DataFrame(columns=cols)
    spread = members.groupby(["group", "key"])["bar_start"].agg(["min", "max"])
    spread = spread.assign(skew=spread["max"] - spread["min"])
    chosen = (
        spread.nlargest(max_groups, "skew").sort_values("min")
        if len(spread) > max_groups
        else spread.sort_values("min")
    )
    order = pd.DataFrame({"order": np.arange(len(chosen))}, index=chosen.index)
    members = members.join(order, on=["group", "key"], how="inner")
    n = members.groupby(["group", "key"])["rank"].transform("size")
    members = members.assign(p2p=(members["group"] == "p2p") & (n == 2))
    # matching lists a pair's sender first: keep that order there, ranks in order elsewhere
    members = members.assign(r=np.where(members["p2p"], 0, members["rank"]))
    members = members.sort_values(["order", "r"], kind="stable")
    return members[cols].reset_index(drop=True)


def _critical(a: RunAnalysis, lo: float, hi: float) -> pd.DataFrame:
    path = a.critical_path
    if path is None or path.segments.empty:
        return pd.DataFrame(columns=CRITICAL_COLUMNS)
    seg = path.segments.reset_index(drop=True)
    seg = seg.reindex(columns=[c for c in CRITICAL_COLUMNS if c != "merged"]).assign(merged=1)
    return _inside(seg, "start_us", "dur_us", lo, hi)


def _breaks(critical: pd.DataFrame, ranks: set[int]) -> int:
    """The gaps the path's line takes where it leaves the ranks shown (one per run of hidden ranks)."""
    if critical.empty:
        return 0
    shown = critical["rank"].astype(int).isin(ranks).to_numpy()
    return int((~shown[1:] & shown[:-1]).sum())


def _merge_segments(critical: pd.DataFrame, lo: float, bucket: float, ranks: set[int]) -> pd.DataFrame:
    """The path's segments on the ranks shown; consecutive ones of one rank within a bucket merge
    into one (named by its longest, ``merged`` counting them). Segments on hidden ranks stay, for
    the line's breaks, but are not drawn (the figure skips them)."""
    if critical.empty or bucket <= 0:
        return critical
    c = critical.reset_index(drop=True)
    rank = c["rank"].to_numpy()
    cell = np.floor((np.maximum(c["start_us"].to_numpy(dtype=float), lo) - lo) / bucket).astype(np.int64)
    new = np.ones(len(c), dtype=bool)
    new[1:] = (rank[1:] != rank[:-1]) | (cell[1:] != cell[:-1])
    gid = np.cumsum(new) - 1
    end = c["start_us"] + c["dur_us"]
    longest = c.assign(gid=gid).sort_values(["gid", "dur_us"], ascending=[True, False]).drop_duplicates("gid")
    out = longest.set_index("gid").assign(
        start_us=c.groupby(gid)["start_us"].min(), dur_us=end.groupby(gid).max() - c.groupby(gid)["start_us"].min(),
        merged=c.groupby(gid).size(),
    )  # fmt: skip
    out = out[CRITICAL_COLUMNS].reset_index(drop=True)
    if len(out) > 2 * (cell.max() + 1):  # a path that changes rank within every bucket: its longest per bucket
        cells = np.floor((np.maximum(out["start_us"].to_numpy(dtype=float), lo) - lo) / bucket).astype(np.int64)
        out = out.assign(cell=cells).sort_values(["cell", "dur_us"], ascending=[True, False])
        out = out.drop_duplicates("cell").sort_values("start_us").drop(columns="cell").reset_index(drop=True)
    return out
