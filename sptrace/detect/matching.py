"""The same collective on every rank of its group: matching, clock alignment, skew, stragglers
and bandwidth.

Matching key: (group, Seq) when the trace carries NCCL's sequence numbers; else (group, k) where
k counts the group's collectives on that rank in issue order. Order alone pairs the wrong events
when a rank's trace starts late or misses events (sampled or partial traces), so each rank's
order is first aligned to the reference rank's by the shift that makes the most (kind, bytes)
pairs agree, and matches whose kind or size disagree are dropped and counted.

Clocks: each rank's offset is the median, over its matched collectives, of its completion time
minus the reference rank's (collectives complete together, when the last rank has arrived).
Bandwidth follows nccl-tests: algbw = S / t, busbw = algbw x 2(n-1)/n for all-reduce and
(n-1)/n for all-gather, reduce-scatter and all-to-all (S: the larger of in and out bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

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
    members: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["rank", "group", "key", "start_us"]))
    """Which rank's collective (by its issue time) belongs to which matched one."""
    unmatched: int = 0
    """Collectives that found no partner with the same kind and size."""
    notes: list[str] = field(default_factory=list)


def _end_us(frame: pd.DataFrame) -> pd.Series:
    comm_end = frame["comm_start_us"].astype(float) + frame["comm_dur_us"].astype(float)
    cpu_end = frame["start_us"].astype(float) + frame["dur_us"].astype(float)
    return comm_end.fillna(cpu_end)


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """Each rank's collectives with a per-group order index ``k``."""
    f = frame.copy()
    f["group"] = f["group"].astype(str)
    f = f.sort_values(["rank", "start_us"], kind="stable")
    f["k"] = f.groupby(["rank", "group"]).cumcount()
    f["end_us"] = _end_us(f)
    return f


def _best_shift(ref: pd.DataFrame, other: pd.DataFrame) -> int:
    """Shift s so that other's k + s lines up with ref's k, maximising (kind, bytes) agreement."""
    a = list(zip(ref["kind"], ref["in_bytes"].fillna(-1)))
    b = list(zip(other["kind"], other["in_bytes"].fillna(-1)))
    best, best_score = 0, -1
    for s in range(-min(MAX_SHIFT, len(b)), min(MAX_SHIFT, len(a)) + 1):
        score = sum(1 for i, x in enumerate(b) if 0 <= i + s < len(a) and a[i + s] == x)
        if score > best_score or (score == best_score and abs(s) < abs(best)):
            best, best_score = s, score
    return best


def match_collectives(frame: pd.DataFrame) -> Matching:
    cols = [
        "key", "group", "kind", "n_ranks", "ranks", "in_bytes", "wire_bytes", "phase", "layer", "module",
        "arrival_skew_us", "straggler", "max_wait_us", "transfer_us", "algbw_gbps", "busbw_gbps", "start_us",
    ]  # fmt: skip
    if frame.empty:
        return Matching(pd.DataFrame(columns=cols), {}, unmatched=0, notes=["no collectives"])
    f = _keyed(frame)
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
                    notes.append(f"group {group}: rank {r}'s collectives realigned by {s:+d} (its trace is partial)")
            g = g.assign(key=g["k"] + g["rank"].map(shifts))
        pieces.append(g)
    f = pd.concat(pieces)
    # drop members whose kind or size disagrees with the key's majority
    sig = f["kind"] + "|" + f["in_bytes"].fillna(-1).astype("int64").astype(str)
    f = f.assign(sig=sig)
    majority = f.groupby(["group", "key"])["sig"].agg(lambda s: s.value_counts().index[0])
    f = f.join(majority.rename("majority"), on=["group", "key"])
    bad = f["sig"] != f["majority"]
    unmatched = int(bad.sum())
    if unmatched:
        notes.append(f"{unmatched} collectives disagree in kind or size with their counterparts on other ranks")
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
    arrival = f["comm_start_us"].astype(float).fillna(f["start_us"].astype(float))
    f = f.assign(
        start_al=arrival - f["rank"].map(offsets),
        end_al=f["end_us"] - f["rank"].map(offsets),
    )
    rows = []
    for (group, key), m in f.groupby(["group", "key"], sort=False):
        n = int(m["rank"].nunique())
        arrive = m.set_index("rank")["start_al"]
        last = float(arrive.max())
        end = float(m["end_al"].median())
        transfer = max(end - last, 0.0)
        kind = m["kind"].iloc[0]
        size_bytes = (
            float(np.nanmax([m["in_bytes"].max(), m["out_bytes"].max()])) if m["in_bytes"].notna().any() else np.nan
        )
        group_size = int(m["group_size"].max()) if m["group_size"].notna().any() else n
        algbw = size_bytes / (transfer * 1e-6) / 1e9 if transfer > 0 and not np.isnan(size_bytes) else np.nan
        busbw = algbw * BUS_FACTOR.get(kind, lambda _: 1.0)(group_size) if not np.isnan(algbw) else np.nan
        first = m.iloc[0]
        rows.append({
            "key": key, "group": group, "kind": kind, "n_ranks": n, "ranks": sorted(int(r) for r in m["rank"]),
            "in_bytes": first["in_bytes"], "wire_bytes": first["wire_bytes"], "phase": first["phase"],
            "layer": first["layer"], "module": first["module"], "arrival_skew_us": last - float(arrive.min()),
            "straggler": int(arrive.idxmax()), "max_wait_us": last - float(arrive.min()), "transfer_us": transfer,
            "algbw_gbps": algbw, "busbw_gbps": busbw, "start_us": float(arrive.min()),
        })  # fmt: skip
    matched = pd.DataFrame(rows, columns=cols).sort_values("start_us", kind="stable").reset_index(drop=True)
    members = f[["rank", "group", "key", "start_us"]].reset_index(drop=True)
    return Matching(matched, offsets, unmatched=unmatched, notes=notes, members=members)
