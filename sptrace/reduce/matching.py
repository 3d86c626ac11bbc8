"""The same collective on every rank of its group: matching, clock alignment, skew, stragglers
and bandwidth.

Matching key: (group, Seq) when the trace carries NCCL's sequence numbers; else (group, k) where
k counts the group's collectives on that rank in issue order. Order alone pairs the wrong events
when a rank's trace starts late or misses events (sampled or partial traces), so each rank's
order is first aligned to the reference rank's by the shift that makes the most (kind, bytes)
pairs agree, and matches whose kind or size disagree are dropped and counted. Sizes are compared
only for the kinds whose input every rank sizes alike (``same_size`` in the table of collective
kinds): an uneven all-to-all and a scatter's or gather's root differ by design.

Sends and receives are matched by the run's one pairing (sptrace.reduce.pairing), which the
point-to-point report reads too: each pair is one matched collective of group ``p2p``.

Arrival, end, transfer time, bandwidth and the ranks' clock offsets: sptrace.reduce.timebase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sptrace.reduce.pairing import Pairing, pair_sends
from sptrace.reduce.timebase import algbw_gbps, aligned, arrival_us, busbw_gbps, clock_offsets, end_us, transfer_us
from sptrace.vocab import collective_kinds
from sptrace.vocab.units import count

MAX_SHIFT = 16
"""How many collectives a rank's trace may miss at its start and still be aligned."""


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
    pairing: Pairing | None = None
    """The run's sends paired with their receives (sptrace.reduce.pairing), whose pairs are the
    ``p2p`` rows above: the point-to-point report reads the same pairs."""


MEMBER_COLUMNS = ["rank", "group", "key", "start_us", "skew_us"]
DISAGREEMENT_COLUMNS = ["rank", "group", "key", "kind", "in_bytes", "kind_major", "size_major", "start_us", "phase",
                        "layer", "module"]  # fmt: skip


UNKNOWN_GROUP = "?"
"""The group label of collectives whose process group the trace does not name."""


def _size_label(values: pd.Series) -> pd.Series:
    """Bytes as text, '?' when unknown (never a number standing in for 'unknown')."""
    return values.map(lambda v: "?" if v is None or pd.isna(v) else str(int(v)))


def _comparable_size(frame: pd.DataFrame) -> pd.Series:
    """The size label where every rank must issue the same size, else '?' (not compared)."""
    same = collective_kinds.where("same_size")  # the others differ by design: all_to_all_v, a root
    return _size_label(frame["in_bytes"]).where(frame["kind"].isin(same), "?")


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """Each rank's collectives with a per-group order index ``k``."""
    f = frame.copy()
    f["group"] = f["group"].map(lambda g: UNKNOWN_GROUP if g is None or pd.isna(g) else str(g))
    f = f.sort_values(["rank", "start_us"], kind="stable")
    f["k"] = f.groupby(["rank", "group"]).cumcount()
    f["end_us"] = end_us(f)
    return f


def _shifts(g: pd.DataFrame, ref_rank: int) -> dict[int, int]:
    """Per rank of one group's rows (in rank, then issue order): the shift that lines its
    collectives up with ``ref_rank``'s. Each row's (kind, size) label is made once for the group
    and each rank's rows found by one grouping (a filter per rank made this quadratic in the
    ranks: 23 s of a 10,000-rank reduce)."""
    labels = list(zip(g["kind"].tolist(), _comparable_size(g).tolist()))
    positions = g.groupby("rank", sort=True).indices
    ref = [labels[i] for i in positions[ref_rank]]
    return {int(r): 0 if r == ref_rank else _best_shift(ref, [labels[i] for i in at]) for r, at in positions.items()}


def _best_shift(a: list[tuple[object, str]], b: list[tuple[object, str]]) -> int:
    """Shift s so that b's k + s lines up with a's k, maximising (kind, bytes) agreement (the
    smallest such |s|). A b that a begins with is shift 0: no shift agrees on more than all of b."""
    if len(b) <= len(a) and a[: len(b)] == b:
        return 0
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
    pairing = pair_sends(frame)
    p2p_rows, p2p_members = _point_to_point_rows(pairing)
    p2p_unmatched = len(pairing.unpaired)
    if point_to_point.all():
        matched = pd.DataFrame(p2p_rows, columns=cols).sort_values("start_us", kind="stable").reset_index(drop=True)
        notes = [f"{p2p_unmatched} sends or receives found no partner"] if p2p_unmatched else []
        return Matching(matched, {}, unmatched=p2p_unmatched, notes=notes, members=pd.DataFrame(p2p_members),
                        pairing=pairing)  # fmt: skip
    f = _keyed(frame[~point_to_point])
    notes: list[str] = []
    pieces = []
    for group, g in f.groupby("group", sort=False):
        ranks = sorted(g["rank"].unique())
        ref_rank = ranks[0]
        if g["seq"].notna().all():
            g = g.assign(key=g["seq"].astype(int))
        else:
            shifts = _shifts(g, ref_rank)
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
    # clock offsets from matched completions (against the lowest rank); each rank's arrival and
    # end on that clock
    offsets = clock_offsets(f)
    f = f.assign(start_al=aligned(arrival_us(f), f["rank"], offsets), end_al=aligned(f["end_us"], f["rank"], offsets))
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
                    counts=counts, pairing=pairing)  # fmt: skip


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
        transfer = transfer_us(last, a["end"])
        kind = row["kind"]
        size_bytes = float(np.nanmax([a["in_max"], a["out_max"]])) if a["in_known"] else np.nan
        # the bus factor needs the group's size: unknown stays unknown (never the matched-rank
        # count), unless every rank of the world took part
        group_size = int(a["group_size"]) if pd.notna(a["group_size"]) else None
        if group_size is None and world_size is not None and n == world_size:
            group_size = world_size
        algbw = algbw_gbps(size_bytes, transfer)
        busbw = busbw_gbps(algbw, kind, group_size)
        skew = last - float(a["first_arrival"]) if n > 1 else np.nan  # one rank alone has no skew
        rows.append({
            "key": key, "group": group, "kind": kind, "n_ranks": n, "ranks": members,
            "in_bytes": row["in_bytes"], "wire_bytes": row["wire_bytes"], "phase": row["phase"],
            "layer": row["layer"], "module": row["module"], "arrival_skew_us": skew,
            "straggler": int(slowest) if n > 1 else None, "max_wait_us": skew, "transfer_us": transfer,
            "algbw_gbps": algbw, "busbw_gbps": busbw, "start_us": float(a["first_arrival"]),
        })  # fmt: skip
    return rows


def _point_to_point_rows(pairing: Pairing) -> tuple[list[dict], list[dict]]:
    """Each pair of the run's pairing as one matched collective, keyed by its send (the k-th send
    from rank a to rank b), and its two members: the sender first, then the receiver."""
    rows: list[dict] = []
    members: list[dict] = []
    pairs, ops = pairing.pairs, pairing.ops
    if pairs.empty:
        return rows, members
    sends = ops.iloc[pairs["send"].to_numpy(dtype=int)].itertuples(index=False)
    recvs = ops.iloc[pairs["recv"].to_numpy(dtype=int)].itertuples(index=False)
    for p, s, r in zip(pairs.itertuples(index=False), sends, recvs):
        key = f"p2p:{p.src}->{p.dst}#{p.k}"
        arrive_s, arrive_r = p.send_arrival_us, p.recv_arrival_us
        first = min(arrive_s, arrive_r)
        rows.append({
            "key": key, "group": "p2p", "kind": "send", "n_ranks": 2, "ranks": sorted([p.src, p.dst]),
            "in_bytes": s.in_bytes, "wire_bytes": s.wire_bytes, "phase": s.phase, "layer": s.layer,
            "module": s.module, "arrival_skew_us": p.skew_us, "max_wait_us": p.skew_us,
            "straggler": p.src if arrive_s >= arrive_r else p.dst, "transfer_us": p.transfer_us,
            "algbw_gbps": p.algbw_gbps, "busbw_gbps": busbw_gbps(p.algbw_gbps, "send", 2), "start_us": first,
        })  # fmt: skip
        members.append({"rank": p.src, "group": "p2p", "key": key, "start_us": s.start_us, "skew_us": arrive_s - first})
        members.append({"rank": p.dst, "group": "p2p", "key": key, "start_us": r.start_us, "skew_us": arrive_r - first})
    return rows, members


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
