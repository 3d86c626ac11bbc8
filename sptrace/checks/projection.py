"""What the activations a step keeps would cost at a production shape: ``project``.

``sptrace check --at seq=131072,hidden=8192,layers=80`` (or a ``production:`` block in --config
or in run.json's config) scales each tensor the step keeps across the forward -> backward
boundary (holder in sptrace.detect.holders.KEEPERS) to the production shape
(sptrace.checks.production), dimension by dimension: each dimension is named by what it is in
the measured model (B, S, S/P, H, F/P, a/P, d, ...: sptrace.checks.dim_names) and takes that
name's value at the production shape. A dimension that no name fits, or that several fit with
different production values that neither the tensor's class nor its layout tells apart, or a name
whose production value is unknown, leaves the tensor unprojected: its measured bytes are carried
unscaled, counted apart, and the projection says why. Never a guess. The rules in full:
docs/check.md ("At production size").

Per rank, the boundary (step, micro-batch) that kept the most is projected (never a sum over
boundaries): the tensors in layers by the mean of the measured layers times the production
layers, the rest once; each FAIL's extra bytes (its storage less a 1/P shard) likewise; beside
them, Korthikanti et al.'s figure per layer at the production shape (sptrace.costmodel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from sptrace.checks.dim_names import Reading, base_sizes, read_dims, symbol_values
from sptrace.checks.findings import Finding
from sptrace.checks.production import KEY_NAMES, PRODUCTION_KEYS
from sptrace.checks.sharding_verdict import ShardingReport
from sptrace.costmodel.activations import activation_bytes_at_dtype
from sptrace.detect.holders import KEEPERS
from sptrace.vocab.dtypes import canonical, element_size
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape
from sptrace.vocab.units import rank_ranges


@dataclass(frozen=True)
class TensorProjection:
    """One kept tensor of a rank's worst boundary: its measured storage and, where its dims are
    named, the storage at production (the storage scales as the tensor's elements: a view keeps
    its share of its storage)."""

    rank: int
    module: str | None
    layer: int | None
    shape: tuple[int, ...] | None
    dtype: str | None
    cls: str | None
    storage_bytes: int
    labels: tuple[str, ...] | None
    projected_bytes: float | None
    why: str | None

    def to_dict(self) -> JSONObject:
        return {
            "rank": self.rank, "module": self.module, "layer": self.layer,
            "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype, "class": self.cls,
            "storage_bytes": self.storage_bytes, "labels": list(self.labels) if self.labels else None,
            "projected_bytes": self.projected_bytes, "why": self.why,
        }  # fmt: skip

    def place(self) -> str:
        """'layers.0.attn [1x32x1x12]'."""
        shape = "x".join(map(str, self.shape)) if self.shape is not None else f"{self.storage_bytes} bytes"
        return f"{self.module or '<unknown module>'} [{shape}]"


@dataclass(frozen=True)
class RankProjection:
    """One rank's kept bytes at the boundary that kept the most, measured and at production."""

    rank: int
    boundary: str | None
    measured_bytes: int
    per_layer_bytes: float | None
    """The mean over the measured layers of what their named tensors keep at production."""
    measured_layers: int
    outside_bytes: float
    """What the named tensors outside any layer keep at production."""
    projected_bytes: float | None
    """per_layer_bytes x the production layers + outside_bytes (None when the layers are unknown
    and some tensor is in a layer)."""
    unprojected_bytes: int
    """The measured storage of the tensors left unprojected, carried unscaled."""
    tensors: tuple[TensorProjection, ...]

    @property
    def total_bytes(self) -> float | None:
        return None if self.projected_bytes is None else self.projected_bytes + self.unprojected_bytes

    @property
    def unprojected(self) -> tuple[TensorProjection, ...]:
        return tuple(t for t in self.tensors if t.projected_bytes is None)

    def to_dict(self) -> JSONObject:
        return {
            "rank": self.rank, "boundary": self.boundary, "measured_bytes": self.measured_bytes,
            "per_layer_bytes": self.per_layer_bytes, "measured_layers": self.measured_layers,
            "outside_bytes": self.outside_bytes, "projected_bytes": self.projected_bytes,
            "unprojected_bytes": self.unprojected_bytes, "total_bytes": self.total_bytes,
            "unprojected_tensors": len(self.unprojected), "tensors": [t.to_dict() for t in self.tensors],
        }  # fmt: skip


@dataclass(frozen=True)
class FailProjection:
    """A FAIL (full-size-save): its extra bytes over a 1/P shard, measured and at production."""

    ranks: tuple[int, ...]
    module: str | None
    layer: int | None
    shape: tuple[int, ...] | None
    labels: tuple[str, ...] | None
    measured_extra_bytes: float
    projected_extra_bytes: float | None
    why: str | None

    def to_dict(self) -> JSONObject:
        return {
            "ranks": list(self.ranks), "module": self.module, "layer": self.layer,
            "shape": list(self.shape) if self.shape is not None else None,
            "labels": list(self.labels) if self.labels else None, "measured_extra_bytes": self.measured_extra_bytes,
            "projected_extra_bytes": self.projected_extra_bytes, "why": self.why,
        }  # fmt: skip


@dataclass(frozen=True)
class Projection:
    """The kept bytes of every rank, and each FAIL's extra bytes, at a production shape."""

    measured: ModelShape
    target: ModelShape
    korthikanti_per_layer: float | None
    """Korthikanti et al.'s activations per layer and rank at the production shape, at the scheme's
    setting and the activation dtype (sptrace.costmodel.activations.activation_bytes_at_dtype)."""
    korthikanti_why: str | None
    ranks: tuple[RankProjection, ...]
    fails: tuple[FailProjection, ...]
    notes: tuple[str, ...] = field(default=())

    def headline(self) -> str:
        """'seq=131072 hidden=8192 layers=80 heads=64 ffn=28672 (--at; batch=2, P=2, float32 as measured)'."""
        t = self.target
        given = [k for k in PRODUCTION_KEYS if getattr(t, k) is not None and not _measured(t, k)]
        kept = [k for k in PRODUCTION_KEYS if getattr(t, k) is not None and _measured(t, k)]
        sources = list(dict.fromkeys(t.provenance[k] for k in given))
        text = " ".join(f"{KEY_NAMES[PRODUCTION_KEYS.index(k)]}={getattr(t, k)}" for k in given)
        as_measured = ", ".join(_value_text(t, k) for k in kept)
        inside = "; ".join(x for x in (", ".join(sources), f"{as_measured} as measured" if kept else "") if x)
        return f"{text} ({inside})" if inside else text

    def to_dict(self) -> JSONObject:
        return {
            "target": self.target.to_dict(), "measured": self.measured.to_dict(), "headline": self.headline(),
            "korthikanti_per_layer": self.korthikanti_per_layer, "korthikanti_why": self.korthikanti_why,
            "ranks": [r.to_dict() for r in self.ranks], "fails": [f.to_dict() for f in self.fails],
            "notes": list(self.notes),
        }  # fmt: skip

    def rank_rows(self) -> pd.DataFrame:
        """For the views: one row per set of ranks that agree, at the boundary that kept the most,
        the bytes measured and at production, per layer beside Korthikanti's, and what was left
        unprojected (carried as measured) and why."""
        groups: dict[tuple, list[int]] = {}
        for r in self.ranks:
            whys = "; ".join(dict.fromkeys(f"{t.place()}: {t.why}" for t in r.unprojected))
            key = (r.boundary, r.measured_bytes, r.total_bytes, r.per_layer_bytes, self.korthikanti_per_layer,
                   r.unprojected_bytes, len(r.unprojected), whys)  # fmt: skip
            groups.setdefault(key, []).append(r.rank)
        columns = ["ranks", "boundary", "measured_bytes", "projected_bytes", "per_layer_bytes",
                   "korthikanti_per_layer_bytes", "unprojected_bytes", "unprojected_tensors",
                   "unprojected_why"]  # fmt: skip
        rows = [(rank_ranges(ranks), *key) for key, ranks in groups.items()]
        return pd.DataFrame(rows, columns=columns)

    def fail_rows(self) -> pd.DataFrame:
        """For the views: each FAIL's extra bytes over a 1/P shard, measured and at production."""
        rows = [(rank_ranges(f.ranks), f.module, f.layer, "x".join(map(str, f.shape)) if f.shape else None,
                 " x ".join(f.labels or ()) or None, f.measured_extra_bytes, f.projected_extra_bytes, f.why)
                for f in self.fails]  # fmt: skip
        return pd.DataFrame(rows, columns=["ranks", "module", "layer", "shape", "dims", "measured_extra_bytes",
                                           "projected_extra_bytes", "why"])  # fmt: skip


def _measured(t: ModelShape, key: str) -> bool:
    return str(t.provenance.get(key, "")).startswith("measured")


def _value_text(t: ModelShape, key: str) -> str:
    value = getattr(t, key)
    if key == "dtype":
        return str(value)
    return f"{'P' if key == 'sp_size' else key}={value}"


class _Projector:
    """Reads and projects tensors, each distinct (shape, class, dtype) once."""

    def __init__(self, measured: ModelShape, target: ModelShape) -> None:
        self.measured_values = symbol_values(base_sizes(measured), measured.scheme)
        self.target_base = base_sizes(target)
        self.target_values = symbol_values(self.target_base, measured.scheme)
        self.measured_dtype, self.target_dtype = measured.dtype, target.dtype
        self.sp_measured = measured.sp_size
        self._cache: dict[tuple, Reading] = {}

    def reading(self, shape: tuple[int, ...], cls: str | None) -> Reading:
        key = (shape, cls)
        if key not in self._cache:
            measured = {k: v for k, v in self.measured_values.items() if v is not None}
            self._cache[key] = read_dims(shape, cls, measured, self.target_values, self.target_base)
        return self._cache[key]

    def project(
        self, shape: object, cls: object, dtype: object, nbytes: int, storage: int
    ) -> tuple[Reading, float | None]:
        if not isinstance(shape, (tuple, list)):
            return Reading(None, None, "no shape recorded"), None
        shape = tuple(int(x) for x in shape)
        reading = self.reading(shape, cls if isinstance(cls, str) else None)
        if reading.numel is None:
            return reading, None
        numel = math.prod(shape)
        if numel == 0 or nbytes <= 0:
            return reading, float(storage)
        elem = nbytes / numel
        if (
            self.measured_dtype is not None and self.target_dtype is not None
            and canonical(dtype) == self.measured_dtype
        ):  # fmt: skip
            elem = float(element_size(self.target_dtype) or elem)  # an activation takes the production dtype
        return reading, reading.numel * elem * (storage / nbytes)


def project(report: ShardingReport, target: ModelShape) -> Projection:
    """``report``'s kept tensors at ``target`` (production_shape)."""
    measured = report.model
    projector = _Projector(measured, target)
    kept = report.saved[report.saved["holder"].isin(KEEPERS)] if len(report.saved) else report.saved
    ranks = tuple(_rank(int(rank), rows, projector, target) for rank, rows in kept.groupby("rank", sort=True))
    fails = tuple(_fail(f, kept, projector, target) for f in report.findings if f.code == "full-size-save")
    korthikanti = activation_bytes_at_dtype(target)
    why = None
    if korthikanti is None:
        missing = target.missing(("seq", "batch", "hidden", "heads", "sp_size", "dtype"))
        why = (f"needs {', '.join(KEY_NAMES[PRODUCTION_KEYS.index(m)] for m in missing)} at production "
               f"(--at {KEY_NAMES[PRODUCTION_KEYS.index(missing[0])]}=N)" if missing
               else "needs the run's recompute setting (run.json, --config)")  # fmt: skip
    notes = []
    if target.seq is not None and target.sp_size is not None and target.seq_split_problem():
        notes.append(f"at production, {target.seq_split_problem()}: S/P has no value")
    return Projection(measured, target, korthikanti, why, ranks, fails, tuple(notes))


def _boundaries(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(_step=rows["step"].astype(float).fillna(-1), _micro=rows["micro_batch"].astype(float).fillna(0))


def _rank(rank: int, rows: pd.DataFrame, projector: _Projector, target: ModelShape) -> RankProjection:
    keyed = _boundaries(rows)
    worst = max((g for _, g in keyed.groupby(["_step", "_micro"], sort=True)),
                key=lambda g: int(g["storage_bytes"].sum()))  # fmt: skip
    tensors = []
    columns = ("module", "layer", "shape", "dtype", "class", "nbytes", "storage_bytes")
    for module, layer, shape, dtype, cls, nbytes, storage in zip(*(worst[c] for c in columns)):
        reading, projected = projector.project(shape, cls, dtype, int(nbytes), int(storage))
        tensors.append(TensorProjection(
            rank, module if isinstance(module, str) else None,
            int(layer) if layer is not None and layer == layer else None,
            tuple(int(x) for x in shape) if isinstance(shape, (tuple, list)) else None,
            dtype if isinstance(dtype, str) else None, cls if isinstance(cls, str) else None, int(storage),
            reading.labels, projected, reading.why,
        ))  # fmt: skip
    per_layer: dict[int, float] = {}
    outside = 0.0
    for t in tensors:
        if t.layer is not None:
            per_layer[t.layer] = per_layer.get(t.layer, 0.0) + (t.projected_bytes or 0.0)
        else:
            outside += t.projected_bytes or 0.0
    mean = sum(per_layer.values()) / len(per_layer) if per_layer else None
    if mean is None:
        projected_total: float | None = outside
    elif target.layers is not None:
        projected_total = mean * target.layers + outside
    else:
        projected_total = None
    label = worst["boundary"].iloc[0] if "boundary" in worst else None
    return RankProjection(
        rank, label if isinstance(label, str) and label else None, int(worst["storage_bytes"].sum()), mean,
        len(per_layer), outside, projected_total,
        sum(t.storage_bytes for t in tensors if t.projected_bytes is None), tuple(tensors),
    )  # fmt: skip


def _fail(f: Finding, kept: pd.DataFrame, projector: _Projector, target: ModelShape) -> FailProjection:
    """A FAIL's tensor (the full rows of its ranks, module and layer whose shape and boundary its
    message names), its extra bytes over a 1/P shard, measured and at production."""
    rows = _finding_rows(f, kept)
    P, P_prod = projector.sp_measured, target.sp_size
    best: tuple[float, tuple[int, ...] | None, Reading, float | None] | None = None
    for shape, dtype, nbytes, storage in zip(rows["shape"], rows["dtype"], rows["nbytes"], rows["storage_bytes"]):
        reading, projected = projector.project(shape, "full", dtype, int(nbytes), int(storage))
        extra = int(storage) - int(storage) / P if P else float(storage)
        if best is None or extra > best[0]:
            named = tuple(int(x) for x in shape) if isinstance(shape, (tuple, list)) else None
            best = (extra, named, reading, projected)
    if best is None:
        return FailProjection(f.ranks, f.module, f.layer, None, None, float("nan"), None,
                              "its tensor is not among the kept rows")  # fmt: skip
    extra, shape, reading, projected = best
    why = reading.why
    if projected is not None and not P_prod:
        why, projected = "P is unknown at production (--at sp=N)", None
    projected_extra = projected - projected / P_prod if projected is not None and P_prod else None
    return FailProjection(f.ranks, f.module, f.layer, shape, reading.labels, extra, projected_extra,
                          None if projected_extra is not None else why)  # fmt: skip


def _finding_rows(f: Finding, kept: pd.DataFrame) -> pd.DataFrame:
    if kept.empty:
        return kept
    module = kept["module"].where(kept["module"].map(lambda m: isinstance(m, str)), "<unknown module>")
    layer = kept["layer"].astype(float)
    same_layer = layer.isna() if f.layer is None else layer == float(f.layer)
    rows = kept[(module == (f.module or "<unknown module>")) & same_layer & kept["rank"].isin(f.ranks)
                & (kept["class"] == "full")]  # fmt: skip
    named = [(f"[{_shape_text(s, n)}]" in f.message) and (not isinstance(b, str) or not b or f" of {b}" in f.message)
             for s, n, b in zip(rows["shape"], rows["nbytes"], rows["boundary"])]  # fmt: skip
    return rows[named] if len(rows) else rows


def _shape_text(shape: object, nbytes: object) -> str:
    return "x".join(map(str, shape)) if isinstance(shape, (tuple, list)) else f"{nbytes} bytes"
