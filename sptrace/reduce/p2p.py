"""Point-to-point traffic across ranks: each send paired with its receive, ring steps, per-hop
time, bandwidth and skew, how much of each step's transfer computation hid, and the balance of
the work between the transfers.

Pairs: the run's one pairing (sptrace.reduce.pairing), which matching lists too; their times
and bandwidth are the run's one time base (sptrace.reduce.timebase).

Ring steps: a rank's sends within one (layer, phase) are steps 0, 1, 2 ... in issue order (ring
attention sends one block per step); a pair takes its send's step.

Overlap of a step, on one rank: the part of the step's transfer interval (from the first of its
send and receive to the last end) during which the rank computed (``detect_compute``: GPU
compute kernels, or the aten ops of the busiest CPU thread).

Balance: a rank's compute time between the first and the last of its sends and receives of a
(layer, phase): for ring attention, the attention of the blocks in hand. The zigzag layout exists
to make it equal across ranks under a causal mask; max / mean says how far it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sptrace.jsonable import records
from sptrace.reduce.pairing import Pairing, pair_sends
from sptrace.reduce.timebase import arrival_us, end_us

PAIR_COLUMNS = [
    "src", "dst", "k", "bytes", "recv_bytes", "phase", "layer", "module", "step", "send_start_us",
    "recv_start_us", "transfer_us", "algbw_gbps", "skew_us", "peer_disagrees",
]  # fmt: skip
UNPAIRED_COLUMNS = ["rank", "kind", "peer", "bytes", "phase", "layer", "module", "start_us"]
STEP_COLUMNS = ["layer", "phase", "step", "hops", "bytes", "transfer_us_max", "transfer_us_mean", "algbw_gbps_mean",
                "skew_us_max", "overlap"]  # fmt: skip
BALANCE_COLUMNS = ["layer", "phase", "rank", "compute_us"]


@dataclass
class P2PReport:
    pairs: pd.DataFrame
    """One row per send paired with its receive."""
    unpaired: pd.DataFrame
    """Sends and receives with no partner."""
    steps: pd.DataFrame
    """Per (layer, phase, ring step): hops, bytes, transfer time, bandwidth, skew, overlap."""
    overlap: pd.DataFrame
    """Per (rank, layer, phase, step): transfer and computed-during-transfer microseconds."""
    balance: pd.DataFrame
    """Per (layer, phase, rank): compute time during the ring."""
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.pairs.empty and self.unpaired.empty

    def imbalance(self) -> float | None:
        """max / mean over ranks of the compute time during the rings, summed over layers and
        phases (None without rings)."""
        if self.balance.empty:
            return None
        per_rank = self.balance.groupby("rank")["compute_us"].sum()
        mean = float(per_rank.mean())
        return float(per_rank.max()) / mean if mean > 0 else None

    def overlap_share(self) -> float | None:
        """Transfer time hidden behind computation, over all ranks and steps."""
        total = float(self.overlap["transfer_us"].sum()) if len(self.overlap) else 0.0
        return float(self.overlap["hidden_us"].sum()) / total if total > 0 else None

    def matrix(self, phase: str | None = None) -> pd.DataFrame:
        """Bytes sent, src (rows) x dst (columns), summed over the step (or one phase)."""
        p = self.pairs if phase is None else self.pairs[self.pairs["phase"] == phase]
        if p.empty:
            return pd.DataFrame()
        return p.pivot_table(index="src", columns="dst", values="bytes", aggfunc="sum", fill_value=0)

    def to_dict(self) -> dict[str, object]:
        return {
            "pairs": len(self.pairs), "unpaired": records(self.unpaired), "steps": records(self.steps),
            "overlap_share": self.overlap_share(), "imbalance": self.imbalance(),
            "peer_disagreements": int(self.pairs["peer_disagrees"].sum()) if len(self.pairs) else 0,
            "notes": self.notes,
        }  # fmt: skip


def pair_point_to_point(frame: pd.DataFrame, pairing: Pairing | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, unpaired) of the sends and receives in a run's collectives table: one row per send
    paired with its receive (PAIR_COLUMNS), with its ring step, and one per send or receive with
    no partner (UNPAIRED_COLUMNS). ``pairing``: the run's, when matching has paired it already."""
    pairing = pairing if pairing is not None else pair_sends(frame)
    ops, found = pairing.ops, pairing.pairs
    if ops.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS), pd.DataFrame(columns=UNPAIRED_COLUMNS)
    sends = ops.iloc[found["send"].to_numpy(dtype=int)].itertuples(index=False)
    recvs = ops.iloc[found["recv"].to_numpy(dtype=int)].itertuples(index=False)
    rows = []
    for p, s, r in zip(found.itertuples(index=False), sends, recvs):
        rows.append({
            "src": p.src, "dst": p.dst, "k": p.k, "bytes": s.in_bytes, "recv_bytes": r.in_bytes, "phase": s.phase,
            "layer": s.layer, "module": s.module, "step": -1, "send_start_us": p.send_arrival_us,
            "recv_start_us": p.recv_arrival_us, "transfer_us": p.transfer_us, "algbw_gbps": p.algbw_gbps,
            "skew_us": p.skew_us, "peer_disagrees": p.peer_disagrees,
        })  # fmt: skip
    pairs = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    if len(pairs):
        order = pairs.sort_values(["src", "send_start_us"], kind="stable")
        step = order.groupby(["src", "layer", "phase"], dropna=False).cumcount()
        pairs["step"] = step.reindex(pairs.index)
        pairs = pairs.sort_values(["send_start_us", "src"], kind="stable").reset_index(drop=True)
    left = pairing.unpaired
    unpaired = pd.DataFrame({
        "rank": left["rank"], "kind": left["kind"], "peer": left["peer"], "bytes": left["in_bytes"],
        "phase": left["phase"], "layer": left["layer"], "module": left["module"], "start_us": left["start_us"],
    }, columns=UNPAIRED_COLUMNS).reset_index(drop=True)  # fmt: skip
    return pairs, unpaired


def analyse_point_to_point(
    frame: pd.DataFrame, compute: pd.DataFrame | None = None, pairing: Pairing | None = None
) -> P2PReport:
    """Pairs, ring steps, overlap and balance of a run's sends and receives. ``compute``: the
    ranks' compute intervals (rank, start_us, dur_us), as ``detect_compute`` gives them;
    ``pairing``: the run's, when matching has paired it already."""
    pairs, unpaired = pair_point_to_point(frame, pairing)
    notes = []
    if len(pairs) and pairs["peer_disagrees"].any():
        n = int(pairs["peer_disagrees"].sum())
        notes.append(f"{n} receives name a source that sent them nothing; paired by destination and size instead")
    overlap = _overlap(frame, compute)
    steps = _steps(pairs, overlap)
    balance = _balance(frame, compute)
    return P2PReport(pairs, unpaired, steps, overlap, balance, notes)


def _intervals(compute: pd.DataFrame | None, rank: int) -> tuple[np.ndarray, np.ndarray]:
    if compute is None or compute.empty:
        return np.empty(0), np.empty(0)
    c = compute[compute["rank"] == rank]
    starts = c["start_us"].to_numpy(dtype=float)
    return starts, starts + c["dur_us"].to_numpy(dtype=float)


def _covered(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> float:
    """Length of [lo, hi) covered by the (disjoint) intervals."""
    if not len(starts) or hi <= lo:
        return 0.0
    return float(np.clip(np.minimum(ends, hi) - np.maximum(starts, lo), 0.0, None).sum())


def _ring_ops(frame: pd.DataFrame) -> pd.DataFrame:
    p2p = frame[frame["kind"].isin(["send", "recv"])] if len(frame) else frame
    if p2p.empty:
        return p2p
    p2p = p2p.sort_values(["rank", "start_us"], kind="stable")
    # the i-th send and the i-th receive of a (layer, phase) are step i, whichever is issued first
    step = p2p.groupby([p2p["rank"], _layer_key(p2p["layer"]), p2p["phase"], p2p["kind"]]).cumcount()
    return p2p.assign(step=step, arrive_us=arrival_us(p2p), end_us=end_us(p2p))


def _overlap(frame: pd.DataFrame, compute: pd.DataFrame | None) -> pd.DataFrame:
    ops = _ring_ops(frame)
    columns = ["rank", "layer", "phase", "step", "transfer_us", "hidden_us"]
    if ops.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (rank, layer, phase, step), g in ops.groupby(["rank", _layer_key(ops["layer"]), "phase", "step"]):
        lo, hi = float(g["arrive_us"].min()), float(g["end_us"].max())
        starts, ends = _intervals(compute, int(rank))
        rows.append({
            "rank": int(rank), "layer": None if layer == -1 else int(layer), "phase": phase, "step": int(step),
            "transfer_us": hi - lo, "hidden_us": _covered(starts, ends, lo, hi),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def _steps(pairs: pd.DataFrame, overlap: pd.DataFrame) -> pd.DataFrame:
    if pairs.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    keyed = pairs.assign(layer=_layer_key(pairs["layer"]))
    g = keyed.groupby(["layer", "phase", "step"])
    steps = pd.DataFrame({
        "hops": g.size(), "bytes": g["bytes"].sum(min_count=1), "transfer_us_max": g["transfer_us"].max(),
        "transfer_us_mean": g["transfer_us"].mean(), "algbw_gbps_mean": g["algbw_gbps"].mean(),
        "skew_us_max": g["skew_us"].max(),
    }).reset_index()  # fmt: skip
    if len(overlap):
        o = overlap.assign(layer=_layer_key(overlap["layer"])).groupby(["layer", "phase", "step"])
        share = (o["hidden_us"].sum() / o["transfer_us"].sum().replace(0, np.nan)).rename("overlap").reset_index()
        steps = steps.merge(share, on=["layer", "phase", "step"], how="left")
    else:
        steps["overlap"] = np.nan
    # execution order: forward by layer, then backward from the last layer
    phase_order = steps["phase"].map({"forward": 0, "backward": 1}).fillna(2)
    layer_order = np.where(phase_order == 1, -steps["layer"], steps["layer"])
    steps = steps.assign(_p=phase_order, _l=layer_order).sort_values(["_p", "_l", "step"], kind="stable")
    steps["layer"] = steps["layer"].astype("Int64").replace(-1, pd.NA)
    return steps[STEP_COLUMNS].reset_index(drop=True)


def _balance(frame: pd.DataFrame, compute: pd.DataFrame | None) -> pd.DataFrame:
    ops = _ring_ops(frame)
    if ops.empty or compute is None or compute.empty:
        return pd.DataFrame(columns=BALANCE_COLUMNS)
    rows = []
    for (rank, layer, phase), g in ops.groupby(["rank", _layer_key(ops["layer"]), "phase"]):
        starts, ends = _intervals(compute, int(rank))
        rows.append(
            {
                "layer": None if layer == -1 else int(layer),
                "phase": phase,
                "rank": int(rank),
                "compute_us": _covered(starts, ends, float(g["start_us"].min()), float(g["end_us"].max())),
            }
        )
    return pd.DataFrame(rows, columns=BALANCE_COLUMNS)


def _layer_key(layers: pd.Series) -> pd.Series:
    """The layer as a grouping key: -1 outside every layer, typed from what the column then holds
    (the cast pandas did silently after fillna, which it deprecates, done explicitly)."""
    with pd.option_context("future.no_silent_downcasting", True):
        return layers.fillna(-1).infer_objects(copy=False)
