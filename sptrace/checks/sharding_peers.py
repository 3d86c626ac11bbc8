"""The holder of a collective's buffer whose free one rank's trace lacks, from the same call on the
other ranks and in the other steps (a cross-rank rule: sptrace.checks.sharding_verdict applies it
before judging).

gloo and NCCL drop their reference to a call's tensors on a thread the profiler does not record.
When theirs is the last reference, the buffer's free is missing from the trace, and if its
address is not allocated again before the trace ends, one rank's trace alone cannot tell that
dropped reference from a buffer the model kept (sptrace.detect.holders: undecided). The job's
other ranks and steps run the same code: the same call (the same collective, at the same place in
its forward: sptrace.detect.call_fates) hands them the same buffer. Where no rank or forward kept
it past its boundary, and another rank released it before this very boundary (its free is in
that rank's trace, or its address was allocated again), the code does not keep that buffer: this
rank's missing free is the backend's last reference, which gloo drops on its own thread sooner or
later than the boundary by the threads' timing.

What this cannot tell: a keep of the very buffer a collective filled on some ranks only (``if
rank == 0: self.debug = buf``) reads the same way. A keep on every rank does not (its peers at that
boundary are unknown too, in whichever step or micro-batch it happens), and a keep of anything
derived from the buffer (a cat, a copy) is the model's own allocation, which no collective call
had. sptrace.instrument's census
decides the rank-specific keep (docs/gate.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sptrace.detect.allocations import Retention
from sptrace.vocab.units import count, rank_text


def settle_by_peers(saved: pd.DataFrame, retained: Sequence[Retention], rows: np.ndarray) -> pd.DataFrame:
    """``saved`` with each undecided buffer a collective filled or returned (among ``rows``, a
    mask) whose peers decide it, held by the backend (a copy; the rows nothing decides are
    unchanged)."""
    if saved.empty or "call_key" not in saved:
        return saved
    undecided = np.flatnonzero(
        rows & (saved["holder"] == "undecided").to_numpy() & saved["call_key"].notna().to_numpy()
    )
    if not len(undecided):
        return saved
    frames = [r.call_fates.assign(rank=r.rank) for r in retained if r.call_fates is not None and len(r.call_fates)]
    if not frames:
        return saved
    fates = pd.concat(frames, ignore_index=True)
    fates["step"] = fates["step"].astype(float).fillna(-1)
    by_key = {key: group for key, group in fates.groupby("key", sort=False)}
    out = saved.copy()
    holder, evidence = out["holder"].to_numpy(dtype=object), out["evidence"].to_numpy(dtype=object)
    for i in undecided.tolist():
        row = out.iloc[i]
        peers = by_key.get(row["call_key"])
        if peers is None:
            continue
        rank, step, micro = int(row["rank"]), _step(row["step"]), int(row["micro_batch"] or 0)
        here = (peers["rank"] == rank) & (peers["step"] == step) & (peers["micro_batch"] == micro)
        others = peers[~here]
        now = others[(others["rank"] != rank) & (others["step"] == step) & (others["micro_batch"] == micro)]
        released = sorted(set(now.loc[now["fate"] == "released", "rank"].astype(int)))
        mine = others[(others["rank"] == rank) & (others["fate"] == "released")]
        kept = others[others["fate"] == "kept"]
        if len(kept) or not released:
            evidence[i] = (
                f"{row['evidence']}; the same call's buffer was released before this boundary on none of the "
                f"{now['rank'].nunique()} other ranks" if not released else
                f"{row['evidence']}; the same call's buffer was kept past its boundary on "
                f"{rank_text(sorted(set(kept['rank'].astype(int))))}"
            ) + " (what decides: another rank releasing it before this boundary, and none keeping it)"  # fmt: skip
            continue
        also = f", and in {count(len(mine), 'other forward')} of this rank" if len(mine) else ""
        holder[i] = "backend"
        evidence[i] = (
            f"{row['evidence'].split(', and its free')[0]}; its free is not in the trace, but the same call's buffer "
            f"was released before this boundary on {rank_text(released)} (of {now['rank'].nunique()} other "
            f"ranks){also}, "
            "and no rank or forward kept it past its boundary: the code lets go of it, so the backend dropped the "
            "last reference on a thread the profiler does not record"
        )
    out["holder"], out["evidence"] = holder, evidence
    return out


def _step(value: object) -> float:
    return -1.0 if value is None or pd.isna(value) else float(value)
