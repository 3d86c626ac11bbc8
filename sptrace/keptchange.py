"""Retained tensors compared between two runs (sptrace.diff): what each module kept across the
forward -> backward boundary at its largest rank and boundary (``KeptSide``), what changed
(``KeptChange``: a full-size tensor the baseline did not keep, more bytes), and the bytes each
layer kept, and kept with no holder the trace can show, in each run.

Only what the step itself keeps (its holders sptrace.detect.holders.KEEPERS: autograd, the model)
is compared; a buffer the backend or a parameter holds is not the step's. Full-size tensors are
the sharding check's class, where the run declares the model it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from sptrace.commchange import NO_MODULE
from sptrace.detect.holders import KEEPERS
from sptrace.vocab.jsontypes import JSONObject

if TYPE_CHECKING:
    from sptrace.analysis import RunAnalysis


@dataclass(frozen=True)
class KeptSide:
    """What one module kept across forward -> backward, at its largest rank and boundary."""

    tensors: int
    bytes: float
    full: int
    """Tensors the sharding check classed full-size (None classes: not judged, 0 here)."""
    full_shapes: tuple[str, ...]
    holders: tuple[str, ...]
    layer: int | None

    def to_dict(self) -> JSONObject:
        return {
            "tensors": self.tensors, "bytes": self.bytes, "full": self.full, "full_shapes": list(self.full_shapes),
            "holders": list(self.holders), "layer": self.layer,
        }  # fmt: skip


@dataclass(frozen=True)
class KeptChange:
    module: str
    base: KeptSide | None
    new: KeptSide | None

    @property
    def became_full(self) -> bool:
        """The module keeps more full-size tensors than the baseline kept."""
        return (self.new.full if self.new else 0) > (self.base.full if self.base else 0)

    @property
    def bytes_delta(self) -> float:
        return (self.new.bytes if self.new else 0.0) - (self.base.bytes if self.base else 0.0)

    def to_dict(self) -> JSONObject:
        return {
            "module": self.module, "base": self.base.to_dict() if self.base else None,
            "new": self.new.to_dict() if self.new else None, "became_full": self.became_full,
            "bytes_delta": self.bytes_delta,
        }  # fmt: skip


def retained_tensors(a: RunAnalysis, notes: list[str], which: str) -> pd.DataFrame:
    """Every tensor the run kept across a boundary, with the sharding check's class when the run
    declares the model it needs."""
    if a.sharding is not None:
        return a.sharding.saved
    frames = [r.tensors for r in a.retained if r.tensors is not None and len(r.tensors)]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(frame):
        reason = a.sharding_unavailable or "no model declared"
        notes.append(f"full-size tensors of the {which} are not judged: {reason}")
    return frame


def kept_changes(base: pd.DataFrame, new: pd.DataFrame) -> list[KeptChange]:
    """Per module of either run (retained_tensors), what it kept in each, by module name."""
    kept_base, kept_new = _kept_sides(_step_kept(base)), _kept_sides(_step_kept(new))
    return [KeptChange(m, kept_base.get(m), kept_new.get(m)) for m in sorted(set(kept_base) | set(kept_new))]


def kept_per_layer(base: pd.DataFrame, new: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """Per layer (-1: outside layers): the bytes the step kept at its largest rank and boundary, in
    each run."""
    return _per_layer(_step_kept(base), _step_kept(new))


def undecided_per_layer(base: pd.DataFrame, new: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """Per layer (-1: outside layers): the bytes alive at the boundary whose holder no evidence
    shows, in each run."""
    return _per_layer(_undecided(base), _undecided(new))


def _per_layer(base: pd.DataFrame, new: pd.DataFrame) -> dict[int, tuple[float, float]]:
    lb, ln = _kept_layers(base), _kept_layers(new)
    return {layer: (lb.get(layer, 0.0), ln.get(layer, 0.0)) for layer in sorted(set(lb) | set(ln))}


def _step_kept(frame: pd.DataFrame) -> pd.DataFrame:
    """The tensors the step itself keeps (autograd, the model), of every retained one."""
    return frame[frame["holder"].isin(KEEPERS)] if len(frame) and "holder" in frame else frame


def _undecided(frame: pd.DataFrame) -> pd.DataFrame:
    """The tensors alive at a boundary whose holder no evidence shows and that could be
    full-size (where the run's tensors are classed; every undecided one where they are not)."""
    if not len(frame) or "holder" not in frame:
        return frame.iloc[:0]
    rows = frame[frame["holder"] == "undecided"]
    return rows[rows["class"].isin(("full", "ambiguous", "unknown"))] if "class" in rows else rows


def _kept_layers(frame: pd.DataFrame) -> dict[int, float]:
    """Per layer (-1: outside layers): the bytes it kept at its largest rank and boundary."""
    if not len(frame):
        return {}
    where = [c for c in ("rank", "step", "micro_batch") if c in frame]
    layered = frame.assign(layer=frame["layer"].astype(float).fillna(-1))
    sums = layered.groupby([layered["layer"].astype(int), *where], dropna=False)["storage_bytes"].sum()
    return {int(layer): float(v) for layer, v in sums.groupby(level=0).max().items()}


def _kept_sides(frame: pd.DataFrame) -> dict[str, KeptSide]:
    """Per module: the largest (rank, boundary) count and bytes it kept, and its full-size
    tensors by the sharding check's classes (when the run declares the model they need)."""
    if not len(frame):
        return {}
    frame = frame.assign(module=frame["module"].fillna(NO_MODULE).astype(str))
    where = [c for c in ("rank", "step", "micro_batch") if c in frame]
    out: dict[str, KeptSide] = {}
    for module, g in frame.groupby("module", sort=True):
        per = g.groupby(where, dropna=False)["storage_bytes"].agg(["size", "sum"]) if where else None
        full = g[g["class"] == "full"] if "class" in g else g.iloc[:0]
        full_per = full.groupby(where, dropna=False).size() if where and len(full) else pd.Series(dtype=int)
        layers = g["layer"].dropna()
        out[str(module)] = KeptSide(
            tensors=int(per["size"].max()) if per is not None else len(g),
            bytes=float(per["sum"].max()) if per is not None else float(g["storage_bytes"].sum()),
            full=int(full_per.max()) if len(full_per) else 0,
            full_shapes=tuple(sorted({_shape_text(s, d) for s, d in zip(full["shape"], full["dtype"])})),
            holders=tuple(sorted({str(h) for h in full["holder"].dropna()})) if "holder" in full else (),
            layer=int(layers.iloc[0]) if len(layers) else None,
        )  # fmt: skip
    return out


def _shape_text(shape: object, dtype: object) -> str:
    dims = list(shape) if isinstance(shape, (tuple, list)) else None
    text = "[" + ", ".join(map(str, dims)) + "]" if dims is not None else "(shape unknown)"
    return f"{text} {dtype}" if isinstance(dtype, str) and dtype else text
