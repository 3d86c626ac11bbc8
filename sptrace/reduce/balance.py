"""Compute balance across ranks, per layer and phase, and where an imbalance comes from.

Each rank's work lane (sptrace.detect.work) gives its compute time per module; the FLOPs of its
matrix products (sptrace.detect.flops, from the recorded shapes) give the work it was handed.
Both are summed per (layer, phase, rank), for the layer's attention (a module under an ``attn`` /
``attention`` module, less its projections) and for the whole layer, and compared across ranks
with what the model says each rank's attention work is (sptrace.costmodel.attention_work).

Causes, each named only when the trace shows it:

- ``causal-mask``: the ranks' attention work differs and the rest of the layer's does not, as a
  causal ring without load balancing predicts (rank R-1 at 2R/(R+1) of the mean): named with the
  rank, the measured ratio and the model's;
- ``more-tokens``: a rank's non-attention work (its linear layers, which scale with its tokens)
  is above the others': it holds more tokens;
- ``slow-device``: a rank takes longer per unit of work than the median rank on most layers and
  phases, in every profiled step: the device or host, not the code;
- ``code-path``: a rank takes longer on one layer's module and phase only, in every profiled step:
  something that rank runs there (a stall, a host sync, a different kernel).

Balanced means the work is equal across ranks (within 5%) and no rank is slow: the times' own
spread is said beside it, since on a shared host the times of equal work differ. A slow rank is
told from that noise only by being slow in each of two or more profiled steps: with one step,
time names no cause.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sptrace.costmodel.attention_work import attention_shares, contiguous_causal_formula, group_shares
from sptrace.detect.flops import FLOPS_COLUMNS
from sptrace.detect.layers import layer_of
from sptrace.detect.step_work import STEP_WORK_COLUMNS
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape

BALANCE_COLUMNS = ["step", "layer", "module", "phase", "rank", "time_us", "attention_us"]
WORK_COLUMNS = ["layer", "phase", "rank", "flops", "attention_flops"]
EQUAL_WORK = 0.05
"""Work (FLOPs) within this fraction of the mean is equal."""
SLOW = 1.5
"""A rank is slow in a (layer, phase) when it takes this many times the median rank's time per unit of work."""
MOST = 0.75
"""A slow device is slow in at least this share of the (layer, phase) rows of every step."""
MASK_TOLERANCE = 0.15
"""Measured attention shares within this fraction of a layout's prediction match it."""

_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_PROJECTION = re.compile(r"proj|qkv|dense|linear|query|key|value|^w[qkvo]$|^[qkvo]$|out", re.IGNORECASE)


def is_attention(module: str) -> bool:
    """A module path under an attention module, less its projections (linears, balanced work):
    ``layers.0.attn``, ``decoder.layers.3.self_attention.core_attention``."""
    parts = module.split(".")
    return any(_ATTENTION.search(p) for p in parts) and not _PROJECTION.search(parts[-1])


@dataclass(frozen=True)
class Cause:
    code: str
    """causal-mask, more-tokens, slow-device, code-path."""
    ranks: tuple[int, ...]
    text: str
    ratio: float
    """The measured ratio the cause is named for (work or time over the mean or median)."""
    predicted: float | None = None
    """The model's ratio, where it predicts one."""

    def to_dict(self) -> JSONObject:
        return {"code": self.code, "ranks": list(self.ranks), "text": self.text, "ratio": round(self.ratio, 4),
                "predicted": None if self.predicted is None else round(self.predicted, 4)}  # fmt: skip


@dataclass(frozen=True)
class Balance:
    """The ranks' compute per (layer, phase): ``rows`` one per (layer, phase) with the rank of the
    most attention work and its ratio (measured, and the model's), and the slowest rank's time
    ratio; ``causes`` what the trace shows of why."""

    rows: pd.DataFrame
    causes: tuple[Cause, ...]
    work_recorded: bool
    """Whether the trace recorded the shapes that give each rank's FLOPs."""
    steps: int = 1
    """Profiled steps: a slow rank is told from noise only by being slow in each of two or more."""

    @property
    def balanced(self) -> bool:
        return not self.causes

    def line(self) -> str:
        if self.causes:
            return "imbalanced: " + "; ".join(c.text for c in self.causes)
        spread = float(self.rows["time_ratio"].max()) if len(self.rows) else 1.0
        work = "equal work on every rank (FLOPs within 5%)" if self.work_recorded else "no work recorded (no shapes)"
        if self.steps < 2:
            return (f"balanced: {work}; time max/median up to {spread:.2f}x in one layer and phase, in the one "
                    "profiled step (a slow rank is told from noise by two or more: profile more steps)")  # fmt: skip
        return (f"balanced: {work}, and no rank slower than the others in every one of {self.steps} steps (time "
                f"max/median up to {spread:.2f}x in one layer and phase)")  # fmt: skip

    def to_dict(self) -> JSONObject:
        from sptrace.jsonable import records

        return {"balanced": self.balanced, "line": self.line(), "work_recorded": self.work_recorded,
                "steps": self.steps, "causes": [c.to_dict() for c in self.causes],
                "layers": records(self.rows)}  # fmt: skip


def compute_balance(
    step_work: Iterable[pd.DataFrame | None], flops: Iterable[pd.DataFrame | None], layers: Mapping[str, int],
    model: ModelShape,
) -> Balance | None:  # fmt: skip
    """The run's compute balance (module docstring) from the ranks' lanes per step, module and
    phase (sptrace.detect.step_work) and their FLOPs (sptrace.detect.flops), a frame of each per
    rank (None: not computed), or None with fewer than two ranks or no layer's work in the lanes."""
    times = _times(_joined(step_work, STEP_WORK_COLUMNS), layers)
    if times.empty or times["rank"].nunique() < 2:
        return None
    done = _work(_joined(flops, FLOPS_COLUMNS), layers)
    recorded = not done.empty and set(done["rank"]) >= set(times["rank"])
    rows = _rows(times, done if recorded else None, model)
    causes: list[Cause] = []
    if recorded:
        causes += _work_causes(done, model)
    steps = int(times["step"].nunique())
    if steps >= 2:
        causes += _time_causes(times, done if recorded else None)
    return Balance(rows=rows, causes=tuple(causes), work_recorded=recorded, steps=steps)


def _joined(frames: Iterable[pd.DataFrame | None], columns: list[str]) -> pd.DataFrame:
    kept = [f for f in frames if f is not None and len(f)]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=columns)


def _labelled(frame: pd.DataFrame, layers: Mapping[str, int]) -> pd.DataFrame:
    """The forward and backward rows of a frame with a ``module`` column that lie in a layer, with
    their ``layer`` (the collectives' map, else the path's) and whether they are ``attention``
    (each distinct path read once)."""
    frame = frame[frame["phase"].isin(["forward", "backward"])]
    modules = frame["module"].astype(str)
    names = modules.unique()
    layer = modules.map({m: layers[m] if m in layers else layer_of(m) for m in names})
    frame = frame.assign(module=modules, layer=layer)[layer.notna().to_numpy()]
    return frame.assign(layer=frame["layer"].astype(int),
                        attention=frame["module"].map({m: is_attention(m) for m in names}).astype(bool))  # fmt: skip


def _times(step_work: pd.DataFrame, layers: Mapping[str, int]) -> pd.DataFrame:
    """Per (step, layer, module, phase, rank) of the steps every rank recorded: the lane's compute
    time and its attention part (us)."""
    if step_work is None or step_work.empty:
        return pd.DataFrame(columns=BALANCE_COLUMNS)
    ranks = step_work.groupby("step")["rank"].nunique()
    common = ranks[ranks == step_work["rank"].nunique()].index
    frame = _labelled(step_work[step_work["step"].isin(common)], layers)
    if frame.empty:
        return pd.DataFrame(columns=BALANCE_COLUMNS)
    frame["attention_us"] = np.where(frame["attention"], frame["time_us"], 0.0)
    return frame[BALANCE_COLUMNS].reset_index(drop=True)


def _work(flops: pd.DataFrame, layers: Mapping[str, int]) -> pd.DataFrame:
    """Per (layer, phase, rank): the FLOPs counted, and those of attention."""
    if flops is None or flops.empty:
        return pd.DataFrame(columns=WORK_COLUMNS)
    done = _labelled(flops, layers)
    done["attention_flops"] = np.where(done["attention"], done["flops"], 0.0)
    return done.groupby(["layer", "phase", "rank"], as_index=False)[["flops", "attention_flops"]].sum()


def _rows(times: pd.DataFrame, done: pd.DataFrame | None, model: ModelShape) -> pd.DataFrame:
    """One row per (layer, phase): the rank with the most attention work and its ratio over the
    mean (FLOPs where recorded, else time), the model's ratio for that rank, and the slowest
    rank's time over the median."""
    shares = attention_shares(model)
    total = times.groupby(["layer", "phase", "rank"], as_index=False)[["time_us", "attention_us"]].sum()
    out = []
    for (layer, phase), g in total.groupby(["layer", "phase"], sort=True):
        by_rank = g.set_index("rank")
        measure = by_rank["attention_us"]
        if done is not None:
            w = done[(done["layer"] == layer) & (done["phase"] == phase)].set_index("rank")["attention_flops"]
            if w.sum() > 0:
                measure = w
        top = int(measure.idxmax()) if measure.sum() > 0 else int(by_rank.index[0])
        mean = float(measure.mean()) if measure.sum() > 0 else 0.0
        slow = int(by_rank["time_us"].idxmax())
        median = float(by_rank["time_us"].median())
        P = model.sp_size
        predicted = shares[top % P] if shares is not None and P else None
        attention_mean = float(by_rank["attention_us"].mean())
        its_time = float(by_rank["attention_us"][top]) / attention_mean if attention_mean > 0 else None
        out.append({
            "layer": int(layer), "phase": phase, "attention_rank": top,
            "attention_ratio": float(measure[top]) / mean if mean > 0 else 1.0, "predicted_ratio": predicted,
            "measured_by": "flops" if measure is not by_rank["attention_us"] else "time",
            "attention_time_ratio": its_time,
            "slowest_rank": slow, "time_ratio": float(by_rank["time_us"][slow]) / median if median > 0 else 1.0,
        })  # fmt: skip
    return pd.DataFrame(out)


def _work_causes(done: pd.DataFrame, model: ModelShape) -> list[Cause]:
    """more-tokens and causal-mask, from the FLOPs each rank was handed."""
    causes = []
    other = done.assign(other=done["flops"] - done["attention_flops"])
    per_rank = other.groupby("rank")["other"].sum()
    median = float(per_rank.median())
    if median > 0:
        more = per_rank[per_rank > (1 + EQUAL_WORK) * median]
        for rank, value in more.items():
            ratio = float(value) / median
            causes.append(Cause("more-tokens", (int(rank),), f"rank {rank} has {ratio:.2f}x the median rank's tokens: "
                                f"its layers' linear work (FLOPs) is {ratio:.2f}x the median", ratio))  # fmt: skip
    attention = done.groupby("rank")["attention_flops"].sum()
    if attention.sum() <= 0 or causes:
        return causes
    measured = attention / attention.mean()
    top = int(measured.idxmax())
    ratio = float(measured[top])
    if ratio <= 1 + EQUAL_WORK:
        return causes
    P = model.sp_size or len(measured)
    U = model.ulysses_degree if model.scheme == "usp" and model.ulysses_degree else 1
    shares = attention_shares(model)
    said = f"the model ({model.label}, causal={model.causal}, --cp-balance {model.cp_balance}) predicts"
    if shares is None:  # the layout not declared: does the trace show a causal ring in the contiguous layout?
        shares = group_shares(P, U, True, "none")
        said = "a causal ring without load balancing predicts"
    ranks = sorted(int(r) for r in measured.index)
    predicted = np.array([shares[r % P] for r in ranks])
    got = measured.reindex(ranks).to_numpy()
    fits = bool(np.all(np.abs(got - predicted) <= MASK_TOLERANCE * predicted))
    want = float(predicted[ranks.index(top)])
    R = max(P // U, 1)
    if fits and want > 1 + EQUAL_WORK:
        text = (f"rank {top} computes {ratio:.2f}x the mean attention work (FLOPs), and {said} {want:.2f}x "
                f"({contiguous_causal_formula(R)}): a causal mask over a contiguous ring layout; balance it with "
                "Megatron CP's zigzag layout (--cp-balance zigzag)")  # fmt: skip
    else:
        text = (f"rank {top} computes {ratio:.2f}x the mean attention work (FLOPs), where {said} {want:.2f}x: "
                "the ranks' sequences differ (variable lengths, packing) or the mask is not the model's")  # fmt: skip
    causes.append(Cause("causal-mask" if fits else "attention-work", (top,), text, ratio, want))
    return causes


def _time_causes(by_module: pd.DataFrame, done: pd.DataFrame | None) -> list[Cause]:
    """slow-device and code-path, from time per unit of work, in every profiled step."""
    frame = by_module.groupby(["step", "layer", "phase", "rank"], as_index=False)["time_us"].sum()
    if done is not None:  # time per unit of work: a rank handed more work is not slow for it
        scale = done.assign(share=done["flops"] / done.groupby(["layer", "phase"])["flops"].transform("mean"))
        frame = frame.merge(scale[["layer", "phase", "rank", "share"]], on=["layer", "phase", "rank"], how="left")
        frame["share"] = frame["share"].fillna(1.0).where(frame["share"] > 0, 1.0)
    else:
        frame["share"] = 1.0
    frame["per_work"] = frame["time_us"] / frame["share"]
    median = frame.groupby(["step", "layer", "phase"])["per_work"].transform("median")
    frame["slowness"] = frame["per_work"] / median.where(median > 0, np.nan)
    frame["slow"] = frame["slowness"] >= SLOW
    steps = frame["step"].nunique()
    causes: list[Cause] = []
    devices = set()
    share = frame.groupby(["rank", "step"])["slow"].mean().unstack("step").fillna(0.0)
    for rank, row in share.iterrows():
        if len(row) == steps and (row >= MOST).all():
            devices.add(int(rank))
            ratio = float(frame.loc[frame["rank"] == rank, "slowness"].median())
            text = (f"rank {rank} takes {ratio:.2f}x the median rank's time per unit of work on most layers, in "
                    "every step: a slow device or host, not the model's code")  # fmt: skip
            causes.append(Cause("slow-device", (int(rank),), text, ratio))
    every = frame[frame["slow"]].groupby(["rank", "layer", "phase"])["step"].nunique()
    for (rank, layer, phase), n in every.items():
        if n < steps or int(rank) in devices:
            continue
        mine = frame[(frame["rank"] == rank) & (frame["layer"] == layer) & (frame["phase"] == phase)]
        ratio = float(mine["slowness"].min())
        where = _slowest_module(by_module, int(rank), int(layer), str(phase))
        causes.append(Cause("code-path", (int(rank),), f"rank {rank} takes {ratio:.2f}x the median rank's time in "
                            f"{where} {phase} only, in every step: a code path that rank runs there, not the device",
                            ratio))  # fmt: skip
    return causes


def _slowest_module(by_module: pd.DataFrame, rank: int, layer: int, phase: str) -> str:
    """The module of a layer and phase where ``rank`` spent the most time beyond the median rank's."""
    mine = by_module[(by_module["layer"] == layer) & (by_module["phase"] == phase)]
    per = mine.groupby(["module", "rank"])["time_us"].sum().unstack("rank").fillna(0.0)
    if rank not in per.columns:
        return f"layer {layer}"
    excess = per[rank] - per.median(axis=1)
    return str(excess.idxmax()) if len(excess) else f"layer {layer}"
