"""The one pairing of a run's sends with its receives. Matching lists each pair as one matched
collective and the point-to-point report (sptrace.reduce.p2p) lists it as one hop: both read the
same ``Pairing``, so that they never disagree on what is paired or left unpaired.

From both ends: a send names its destination and a receive its source. First the k-th send from
a to b pairs with the k-th receive on b from a, unless both sizes are known and differ. PyTorch
traces can name the wrong source on a receive (pytorch#153819), so what is left is paired again
by destination alone, in order and by size: those pairs are marked ``peer_disagrees`` (the
report names them). What still has no partner is unpaired.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sptrace.reduce.timebase import algbw_gbps, arrival_us, end_us, transfer_us

PAIRING_COLUMNS = ["send", "recv", "src", "dst", "k", "send_arrival_us", "recv_arrival_us", "transfer_us",
                   "algbw_gbps", "skew_us", "peer_disagrees"]  # fmt: skip
"""send / recv: the pair's rows in ``Pairing.ops`` (positions); k: the send's place among its
rank's sends to dst; transfer from the later arrival to the receive's end; bandwidth of the
bytes sent; skew: how far apart the two ends arrived (sptrace.reduce.timebase)."""


@dataclass
class Pairing:
    """A run's sends and receives, and which send pairs with which receive."""

    ops: pd.DataFrame
    """The run's sends and receives in issue order per rank (by rank, then start_us), with when
    each arrived and ended (``arrive_us``, ``end_us``): the rows ``pairs`` points into."""
    pairs: pd.DataFrame
    """One row per send paired with its receive (PAIRING_COLUMNS): first those paired by both
    ends, in their sends' order, then those paired by destination and size."""

    @property
    def unpaired(self) -> pd.DataFrame:
        """The rows of ``ops`` with no partner, in their order."""
        used = np.zeros(len(self.ops), dtype=bool)
        used[self.pairs["send"].to_numpy(dtype=int)] = True
        used[self.pairs["recv"].to_numpy(dtype=int)] = True
        return self.ops[~used]


def pair_sends(frame: pd.DataFrame) -> Pairing:
    """The sends and receives of a run's collectives table (sptrace.detect.collectives.COLUMNS),
    each send paired with its receive."""
    ops = frame[frame["kind"].isin(["send", "recv"])] if len(frame) else frame
    if ops.empty:
        return Pairing(ops, pd.DataFrame(columns=PAIRING_COLUMNS))
    ops = ops.sort_values(["rank", "start_us"], kind="stable").reset_index(drop=True)
    ops = ops.assign(arrive_us=arrival_us(ops), end_us=end_us(ops))
    f = ops.assign(row=np.arange(len(ops)))
    sends, recvs = f[f["kind"] == "send"], f[f["kind"] == "recv"]
    named_s, named_r = sends[sends["peer"].notna()], recvs[recvs["peer"].notna()]
    named_s = named_s.assign(src=named_s["rank"], dst=named_s["peer"].astype(int))
    named_r = named_r.assign(dst=named_r["rank"], src=named_r["peer"].astype(int))
    named_s = named_s.assign(k=named_s.groupby(["src", "dst"]).cumcount())
    named_r = named_r.assign(k=named_r.groupby(["src", "dst"]).cumcount())
    first = named_s.merge(named_r, on=["src", "dst", "k"], suffixes=("_s", "_r"))
    first = first[
        (first["in_bytes_s"] == first["in_bytes_r"]) | first["in_bytes_s"].isna() | first["in_bytes_r"].isna()
    ]
    found: list[tuple[int, int, int, bool]] = [  # (send, recv, k, peer disagrees)
        (int(s), int(r), int(k), False) for s, r, k in zip(first["row_s"], first["row_r"], first["k"])
    ]
    used = set(first["row_s"]) | set(first["row_r"])
    # second pass: by destination alone (the send's claim), in order and by size
    left_s = named_s[~named_s["row"].isin(used)]
    left_r = recvs[~recvs["row"].isin(used)]
    for dst, group in left_s.groupby("dst"):
        pool = left_r[left_r["rank"] == dst]
        taken: set[int] = set()
        for s in group.itertuples(index=False):
            hit = next(
                (
                    r
                    for r in pool.itertuples(index=False)
                    if r.row not in taken and (pd.isna(r.in_bytes) or pd.isna(s.in_bytes) or r.in_bytes == s.in_bytes)
                ),
                None,
            )
            if hit is not None:
                taken.add(hit.row)
                found.append((int(s.row), int(hit.row), int(s.k), True))
    return Pairing(ops, _pairs(ops, found))


def _pairs(ops: pd.DataFrame, found: list[tuple[int, int, int, bool]]) -> pd.DataFrame:
    if not found:
        return pd.DataFrame(columns=PAIRING_COLUMNS)
    sends = ops.iloc[[s for s, _, _, _ in found]]
    recvs = ops.iloc[[r for _, r, _, _ in found]]
    rows = []
    for (send, recv, k, disagrees), s, r in zip(found, sends.itertuples(index=False), recvs.itertuples(index=False)):
        arrive_s, arrive_r = float(s.arrive_us), float(r.arrive_us)
        transfer = transfer_us(max(arrive_s, arrive_r), r.end_us)
        rows.append({
            "send": send, "recv": recv, "src": int(s.rank), "dst": int(r.rank), "k": k, "send_arrival_us": arrive_s,
            "recv_arrival_us": arrive_r, "transfer_us": transfer, "algbw_gbps": algbw_gbps(s.in_bytes, transfer),
            "skew_us": abs(arrive_s - arrive_r), "peer_disagrees": disagrees,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=PAIRING_COLUMNS)
