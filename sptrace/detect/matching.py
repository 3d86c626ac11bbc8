"""The same collective on every rank of its group: matching, clock alignment, skew, stragglers
and bandwidth.

Matching key: (group, Seq) when the trace carries NCCL's sequence numbers; else (group, k) where
k counts the group's collectives on that rank in issue order. Order alone pairs the wrong events
when a rank's trace starts late or misses events (sampled or partial traces), so each rank's
order is first aligned to the reference rank's by the shift that makes the most (kind, bytes)
pairs agree, and matches whose kind or size disagree are dropped and counted. Sizes are compared
only for the kinds whose input every rank sizes alike (``SAME_SIZE_KINDS``): an uneven all-to-all
and a scatter's or gather's root differ by design.

Clocks: each rank's offset is the median, over its matched collectives, of its completion time
minus the reference rank's (collectives complete together, when the last rank has arrived).
Bandwidth follows nccl-tests: algbw = S / t, busbw = algbw x 2(n-1)/n for all-reduce and
(n-1)/n for all-gather, reduce-scatter and all-to-all (S: the larger of in and out bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sptrace.units import count

MAX_SHIFT = 16
"""How many collectives a rank's trace may miss at its start and still be aligned."""

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}  # fmt: skip


@dataclass
class Matching:
    """Matched collectives (one row per collective instance across ranks) and clock offsets."""

    matched: pd.DataFrame
    """key, group, kind, ranks, bytes, arrival skew, straggler, wait and transfer times, bandwidth."""
    offsets_us: dict[int, float]
    """Per rank: its clock minus the reference rank's (subtract to align)."""
    members: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MEMBER_COLUMNS))
    """Which rank's collective (by its issue time) belongs to which matched one, and how long after
    the first rank of its group it arrived (``skew_us``, on aligned clocks)."""
    unmatched: int = 0
    """Collectives that found no partner with the same kind and size."""
    notes: list[str] = field(default_factory=list)
    disagreements: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DISAGREEMENT_COLUMNS))
    """The collectives dropped from matching because their kind, or known size, differs from what
    most ranks of their group issued at that place: one row each, with the majority's kind and size."""
    counts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["group", "rank", "n"]))
    """How many collectives (not point-to-point) each rank issued in each group."""


MEMBER_COLUMNS = ["rank", "group", "key", "start_us", "skew_us"]
DISAGREEMENT_COLUMNS = ["rank", "group", "key", "kind", "in_bytes", "kind_major", "size_major", "start_us", "phase",
                        "layer", "module"]  # fmt: skip


UNKNOWN_GROUP = "?"
"""The group label of collectives whose process group the trace does not name."""


def _end_us(frame: pd.DataFrame) -> pd.Series:
    transfer_end = frame["transfer_start_us"].astype(float) + frame["transfer_dur_us"].astype(float)
    cpu_end = frame["start_us"].astype(float) + frame["dur_us"].astype(float)
    return transfer_end.fillna(cpu_end)


SAME_SIZE_KINDS = frozenset({"all_gather", "reduce_scatter", "all_reduce", "broadcast"})
"""Kinds whose input is the same size on every rank of the group. The others legitimately differ:
an uneven all-to-all (all_to_all_v) splits by rank, and a scatter's or gather's root holds the
whole list while the other ranks hold one piece (or nothing)."""


def _size_label(values: pd.Series) -> pd.Series:
    """Bytes as text, '?' when unknown (never a number standing in for 'unknown')."""
    return values.map(lambda v: "?" if v is None or pd.isna(v) else str(int(v)))


def _comparable_size(frame: pd.DataFrame) -> pd.Series:
    """The size label where every rank must issue the same size, else '?' (not compared)."""
    return _size_label(frame["in_bytes"]).where(frame["kind"].isin(SAME_SIZE_KINDS), "?")


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """Each rank's collectives with a per-group order index ``k``."""
    f = frame.copy()
    f["group"] = f["group"].map(lambda g: UNKNOWN_GROUP if g is None or pd.isna(g) else str(g))
    f = f.sort_values(["rank", "start_us"], kind="stable")
    f["k"] = f.groupby(["rank", "group"]).cumcount()
    f["end_us"] = _end_us(f)
    return f


def _best_shift(ref: pd.DataFrame, other: pd.DataFrame) -> int:
    """Shift s so that other's k + s lines up with ref's k, maximising (kind, bytes) agreement."""
    a = list(zip(ref["kind"], _comparable_size(ref)))
    b = list(zip(other["kind"], _comparable_size(other)))
    best, best_score = 0, -1
    for s in range(-min(MAX_SHIFT, len(b)), min(MAX_SHIFT, len(a)) + 1):
        score = sum(1 for i, x in enumerate(b) if 0 <= i + s < len(a) and a[i + s] == x)
        if score > best_score or (score == best_score and abs(s) < abs(best)):
            best, best_score = s, score
    return best


def match_collectives(frame: pd.DataFrame, world_size: int | None = None) -> Matching:
    """Every collective matched across the ranks that issued it. ``world_size``: the job's rank
    count, when known: a collective matched on all of them ran in a group of exactly that size
    (a group holds no more ranks than the world), which busbw needs when the trace names none."""
    cols = [
        "key", "group", "kind", "n_ranks", "ranks", "in_bytes", "wire_bytes", "phase", "layer", "module",
        "arrival_skew_us", "straggler", "max_wait_us", "transfer_us", "algbw_gbps", "busbw_gbps", "start_us",
    ]  # fmt: skip
    if frame.empty:
        return Matching(pd.DataFrame(columns=cols), {}, unmatched=0, notes=["no collectives"])
    point_to_point = frame["kind"].isin(["send", "recv"])
    p2p_rows, p2p_members, p2p_unmatched = _match_point_to_point(frame[point_to_point])
    if point_to_point.all():
        matched = pd.DataFrame(p2p_rows, columns=cols).sort_values("start_us", kind="stable").reset_index(drop=True)
        notes = [f"{p2p_unmatched} sends or receives found no partner"] if p2p_unmatched else []
        return Matching(matched, {}, unmatched=p2p_unmatched, notes=notes, members=pd.DataFrame(p2p_members))
    f = _keyed(frame[~point_to_point])
    notes: list[str] = []
    pieces = []
    for group, g in f.groupby("group", sort=False):
        ranks = sorted(g["rank"].unique())
        ref_rank = ranks[0]
        ref = g[g["rank"] == ref_rank]
        if g["seq"].notna().all():
            g = g.assign(key=g["seq"].astype(int))
        else:
            shifts = {r: _best_shift(ref, g[g["rank"] == r]) if r != ref_rank else 0 for r in ranks}
            for r, s in shifts.items():
                if s:
                    where = f"group {group}" if group != UNKNOWN_GROUP else "an unnamed group"
                    notes.append(f"{where}: rank {r}'s collectives realigned by {s:+d} (its trace is partial)")
            g = g.assign(key=g["k"] + g["rank"].map(shifts))
        pieces.append(g)
    f = pd.concat(pieces)
    # drop members whose kind, or known size, disagrees with the key's majority
    f = f.assign(size=_comparable_size(f))
    kind_major = _majority(f, "kind")
    size_major = _majority(f[f["size"] != "?"], "size")
    f = f.join(kind_major.rename("kind_major"), on=["group", "key"]).join(
        size_major.rename("size_major"), on=["group", "key"]
    )
    bad = (f["kind"] != f["kind_major"]) | (
        (f["size"] != "?") & f["size_major"].notna() & (f["size"] != f["size_major"])
    )
    unmatched = int(bad.sum()) + p2p_unmatched
    if unmatched:
        notes.append(
            f"{count(unmatched, 'collective')} {'disagrees' if unmatched == 1 else 'disagree'} in kind or size with "
            "their counterparts on other ranks"
        )
    disagreements = f.loc[bad, [c for c in DISAGREEMENT_COLUMNS if c in f.columns]].reset_index(drop=True)
    counts = f.groupby(["group", "rank"]).size().rename("n").reset_index()
    f = f[~bad]
    # clock offsets from matched completions (against the lowest rank)
    ref_rank = int(f["rank"].min())
    ref_end = f[f["rank"] == ref_rank].set_index(["group", "key"])["end_us"]
    offsets: dict[int, float] = {}
    for r, rf in f.groupby("rank"):
        joined = rf.set_index(["group", "key"])["end_us"].to_frame("end").join(ref_end.rename("ref"), how="inner")
        offsets[int(r)] = float(np.median(joined["end"] - joined["ref"])) if len(joined) else 0.0
    # arrival: when the transfer could start on this rank (GPU kernel or gloo worker start; the
    # CPU issue time runs ahead of the GPU), else the CPU issue time
    arrival = f["transfer_start_us"].astype(float).fillna(f["start_us"].astype(float))
    f = f.assign(
        start_al=arrival - f["rank"].map(offsets),
        end_al=f["end_us"] - f["rank"].map(offsets),
    )
    rows = _matched_rows(f, world_size)
    rows += p2p_rows
    matched = pd.DataFrame(rows, columns=cols).sort_values("start_us", kind="stable").reset_index(drop=True)
    f = f.assign(skew_us=f["start_al"] - f.groupby(["group", "key"])["start_al"].transform("min"))
    members = f[MEMBER_COLUMNS].reset_index(drop=True)
    if p2p_members:
        members = pd.concat([members, pd.DataFrame(p2p_members)], ignore_index=True)
    if p2p_unmatched:
        notes.append(f"{p2p_unmatched} sends or receives found no partner")
    return Matching(matched, offsets, unmatched=unmatched, notes=notes, members=members, disagreements=disagreements,
                    counts=counts)  # fmt: skip


def _majority(frame: pd.DataFrame, col: str) -> pd.Series:
    """Per (group, key), the value of ``col`` most of its members have. Where they all agree (the
    common case) it is their value; only mixed keys count their values (a per-key value_counts
    over thousands of collectives cost most of a second)."""
    by = frame.groupby(["group", "key"])[col]
    out = by.first()
    distinct = by.nunique()
    mixed = distinct.index[distinct > 1]
    if len(mixed):
        sub = frame[pd.MultiIndex.from_frame(frame[["group", "key"]]).isin(mixed)]
        out.loc[mixed] = sub.groupby(["group", "key"])[col].agg(lambda s: s.value_counts().index[0])
    return out


def _matched_rows(f: pd.DataFrame, world_size: int | None) -> list[dict]:
    """One row per (group, key) matched across its ranks, from the ranks' aligned arrival and
    end times: skew, straggler, transfer time, algbw and busbw. Grouped aggregations, not a loop
    over collectives (a run of thousands of collectives spent seconds in per-group pandas calls)."""
    m = f[f["start_al"].notna() & f["end_al"].notna()]
    if m.empty:
        return []
    # the aggregated columns as floats: an object column (None for unknown) takes pandas' Python path
    numeric = {c: pd.to_numeric(m[c], errors="coerce").astype(float) for c in ("in_bytes", "out_bytes", "group_size")}
    by = m.assign(**{f"{c}_num": v for c, v in numeric.items()}).groupby(["group", "key"], sort=False)
    agg = by.agg(
        n=("rank", "nunique"), last=("start_al", "max"), first_arrival=("start_al", "min"), end=("end_al", "median"),
        in_max=("in_bytes_num", "max"), out_max=("out_bytes_num", "max"), in_known=("in_bytes_num", "count"),
        group_size=("group_size_num", "max"),
    )  # fmt: skip
    straggler = m.loc[by["start_al"].idxmax().to_numpy(), "rank"].to_numpy()
    ranks = by["rank"].agg(lambda r: sorted(int(x) for x in r)).tolist()
    first = m.drop_duplicates(["group", "key"]).set_index(["group", "key"]).loc[agg.index]
    rows = []
    for (group, key), a, row, members, slowest in zip(
        agg.index, agg.to_dict("records"), first.to_dict("records"), ranks, straggler
    ):
        n, last = int(a["n"]), float(a["last"])
        transfer = max(float(a["end"]) - last, 0.0)
        kind = row["kind"]
        size_bytes = float(np.nanmax([a["in_max"], a["out_max"]])) if a["in_known"] else np.nan
        # the bus factor needs the group's size: unknown stays unknown (never the matched-rank
        # count), unless every rank of the world took part
        group_size = int(a["group_size"]) if pd.notna(a["group_size"]) else None
        if group_size is None and world_size is not None and n == world_size:
            group_size = world_size
        algbw = size_bytes / (transfer * 1e-6) / 1e9 if transfer > 0 and not np.isnan(size_bytes) else np.nan
        busbw = (
            algbw * BUS_FACTOR.get(kind, lambda _: 1.0)(group_size)
            if not np.isnan(algbw) and group_size is not None
            else np.nan
        )
        skew = last - float(a["first_arrival"]) if n > 1 else np.nan  # one rank alone has no skew
        rows.append({
            "key": key, "group": group, "kind": kind, "n_ranks": n, "ranks": members,
            "in_bytes": row["in_bytes"], "wire_bytes": row["wire_bytes"], "phase": row["phase"],
            "layer": row["layer"], "module": row["module"], "arrival_skew_us": skew,
            "straggler": int(slowest) if n > 1 else None, "max_wait_us": skew, "transfer_us": transfer,
            "algbw_gbps": algbw, "busbw_gbps": busbw, "start_us": float(a["first_arrival"]),
        })  # fmt: skip
    return rows


def _match_point_to_point(frame: pd.DataFrame) -> tuple[list[dict], list[dict], int]:
    """The k-th send from rank a to rank b pairs with the k-th receive on b from a (ranks as the
    rows name them; a peer the trace does not name leaves its row unpaired)."""
    rows: list[dict] = []
    members: list[dict] = []
    if frame.empty:
        return rows, members, 0
    f = frame.sort_values(["rank", "start_us"], kind="stable")
    f = f.assign(end_us=_end_us(f))
    sends = f[(f["kind"] == "send") & f["peer"].notna()]
    recvs = f[(f["kind"] == "recv") & f["peer"].notna()]
    sends = sends.assign(k=sends.groupby(["rank", "peer"]).cumcount())
    recvs = recvs.assign(k=recvs.groupby(["rank", "peer"]).cumcount())
    pairs = sends.merge(recvs, left_on=["rank", "peer", "k"], right_on=["peer", "rank", "k"], suffixes=("_s", "_r"))
    for p in pairs.itertuples(index=False):
        key = f"p2p:{int(p.rank_s)}->{int(p.rank_r)}#{int(p.k)}"
        arrive_s = p.transfer_start_us_s if pd.notna(p.transfer_start_us_s) else p.start_us_s
        arrive_r = p.transfer_start_us_r if pd.notna(p.transfer_start_us_r) else p.start_us_r
        last = max(float(arrive_s), float(arrive_r))
        end = float(p.end_us_r)
        transfer = max(end - last, 0.0)
        size = p.in_bytes_s if pd.notna(p.in_bytes_s) else np.nan
        algbw = float(size) / (transfer * 1e-6) / 1e9 if transfer > 0 and pd.notna(size) else np.nan
        skew = abs(float(arrive_s) - float(arrive_r))
        rows.append({
            "key": key, "group": "p2p", "kind": "send", "n_ranks": 2, "ranks": sorted([int(p.rank_s), int(p.rank_r)]),
            "in_bytes": p.in_bytes_s, "wire_bytes": p.wire_bytes_s, "phase": p.phase_s, "layer": p.layer_s,
            "module": p.module_s, "arrival_skew_us": skew, "max_wait_us": skew,
            "straggler": int(p.rank_s) if arrive_s >= arrive_r else int(p.rank_r), "transfer_us": transfer,
            "algbw_gbps": algbw, "busbw_gbps": algbw, "start_us": min(float(arrive_s), float(arrive_r)),
        })  # fmt: skip
        first = min(float(arrive_s), float(arrive_r))
        members.append({"rank": int(p.rank_s), "group": "p2p", "key": key, "start_us": p.start_us_s,
                        "skew_us": float(arrive_s) - first})  # fmt: skip
        members.append({"rank": int(p.rank_r), "group": "p2p", "key": key, "start_us": p.start_us_r,
                        "skew_us": float(arrive_r) - first})  # fmt: skip
    unmatched = len(f) - 2 * len(pairs)
    return rows, members, unmatched


def skew_by_rank(m: Matching, max_rows: int = 400) -> pd.DataFrame:
    """Arrival skew as collectives x ranks: row i is each rank's i-th matched collective in issue
    order (the same collective on every rank of an SPMD program), the value how long after the
    first rank of its group that rank arrived (us). At most ``max_rows`` rows (the first ones)."""
    mem = m.members
    if mem.empty or "skew_us" not in mem:
        return pd.DataFrame()
    mem = mem.sort_values(["rank", "start_us"], kind="stable")
    mem = mem.assign(i=mem.groupby("rank").cumcount())
    mem = mem[mem["i"] < max_rows]
    return mem.pivot_table(index="i", columns="rank", values="skew_us", aggfunc="first").sort_index(axis=1)


STRAGGLER_COLUMNS = ["rank", "times_last", "wait_caused_ms", "mean_skew_ms", "max_skew_ms"]


def top_stragglers(m: Matching, k: int = 10) -> pd.DataFrame:
    """The ``k`` ranks that kept their groups waiting longest: how often each arrived last, the
    wait it caused (sum of its collectives' skew where it was last), its mean and largest skew."""
    matched, mem = m.matched, m.members
    if matched.empty or mem.empty or "skew_us" not in mem:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    last = (
        matched[matched["n_ranks"] > 1]
        .groupby("straggler")
        .agg(times_last=("key", "size"), wait_caused_us=("max_wait_us", "sum"))
    )
    per_rank = mem.groupby("rank")["skew_us"].agg(["mean", "max"])
    out = per_rank.join(last, how="left").fillna({"times_last": 0, "wait_caused_us": 0.0})
    out = out.assign(
        rank=out.index.astype(int), times_last=out["times_last"].astype(int),
        wait_caused_ms=(out["wait_caused_us"] / 1e3).round(3), mean_skew_ms=(out["mean"] / 1e3).round(3),
        max_skew_ms=(out["max"] / 1e3).round(3),
    ).reset_index(drop=True)  # fmt: skip
    out = out.sort_values(["wait_caused_ms", "times_last", "rank"], ascending=[False, False, True])
    return out[STRAGGLER_COLUMNS].head(k).reset_index(drop=True)
