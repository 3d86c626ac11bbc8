"""What a change did: two finished analyses (sptrace.analysis.RunAnalysis) compared by meaning,
never by event order. Communication by (layer, phase, kind), retained memory by module, time by
the ranks' spread, and the declared shape first. Rendering is sptrace.report.diff's.

Per rank and step: a run's collectives are summed over its ranks and divided by its rank count
and its step count (the steps its collectives carry, else one), so that two runs of different
sizes or profiled windows compare. When B or S differ, bytes and time are compared per token
(B x S tokens a step) as well, and a regression is judged per token.

A regression (exit 1) is a module keeping a full-size tensor the baseline did not keep, a layer
keeping more bytes across the forward/backward boundary than the baseline (what autograd or the
model keeps: no classification needed), more wire bytes a step than the baseline beyond
``bytes_tolerance``, or a slower step beyond ``time_tolerance`` and outside both runs' spread
across ranks. It fails closed: more bytes whose holder no evidence shows (sptrace.detect.holders:
undecided) than the baseline had is no verdict (exit 2), never a silent pass. What cannot be
judged (no model declared for the sharding classes, bytes a collective did not record) is said,
never guessed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from sptrace.timechange import TimeChange, module_time_changes, time_change
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import human_bytes

if TYPE_CHECKING:
    from sptrace.analysis import RunAnalysis

KEEPERS = ("autograd", "model")
"""Holders of what the step itself keeps across the boundary (sptrace.detect.holders.KEEPERS):
only their bytes and full-size tensors are compared; a buffer the backend or a parameter holds
is not the step's."""
NO_MODULE = "(no module)"
"""What a collective or a retained tensor no module claims is filed under."""
SHAPE_FIELDS = ("scheme", "batch", "seq", "hidden", "sp_size", "heads", "kv_heads", "ffn", "layers", "dtype")
"""ModelShape fields whose change is a change of the job itself, said before anything else."""


@dataclass(frozen=True)
class CommSide:
    """One run's collectives of one (layer, phase, kind), per rank and step."""

    count: float
    in_bytes: float
    out_bytes: float
    wire_bytes: float
    unknown_bytes: int
    """How many of them recorded no size (their bytes are left out of the sums)."""
    group_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    modules: tuple[str, ...]

    def per_op(self, value: float) -> float:
        return value / self.count if self.count else 0.0

    def to_dict(self) -> JSONObject:
        return {
            "count": self.count, "in_bytes": self.in_bytes, "out_bytes": self.out_bytes,
            "wire_bytes": self.wire_bytes, "unknown_bytes": self.unknown_bytes,
            "group_sizes": list(self.group_sizes), "dtypes": list(self.dtypes), "modules": list(self.modules),
        }  # fmt: skip


@dataclass(frozen=True)
class CommChange:
    layer: int | None
    phase: str
    kind: str
    base: CommSide | None
    new: CommSide | None
    changed: tuple[str, ...]
    """What differs: added, removed, count, size, group size, dtype (empty: the same)."""

    @property
    def wire_delta(self) -> float:
        return (self.new.wire_bytes if self.new else 0.0) - (self.base.wire_bytes if self.base else 0.0)

    @property
    def where(self) -> str:
        layer = "outside layers" if self.layer is None else f"layer {self.layer}"
        return f"{self.phase} {layer} {self.kind}"

    def to_dict(self) -> JSONObject:
        return {
            "layer": self.layer, "phase": self.phase, "kind": self.kind, "changed": list(self.changed),
            "base": self.base.to_dict() if self.base else None, "new": self.new.to_dict() if self.new else None,
            "wire_bytes_delta": self.wire_delta,
        }  # fmt: skip


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


@dataclass
class RunDiff:
    base: str
    new: str
    shape_changes: list[tuple[str, object, object]]
    config_changes: list[tuple[str, object, object]]
    tokens: tuple[int | None, int | None]
    """B x S of each run (None: undeclared)."""
    comm: list[CommChange]
    wire: tuple[float | None, float | None]
    """Wire bytes per rank and step of each run (None: no collective recorded its size)."""
    kept: list[KeptChange]
    kept_layers: dict[int, tuple[float, float]]
    """Per layer: bytes the step kept (autograd, the model) at its largest rank and boundary, in
    each run."""
    undecided_layers: dict[int, tuple[float, float]]
    """Per layer (-1: outside layers): bytes alive at the boundary whose holder no evidence shows,
    in each run."""
    time: list[TimeChange]
    module_time: list[TimeChange]
    """Each module's own time, forward and backward (what: "forward layers.0.mlp.fc1"), the
    largest change outside the noise first."""
    module_wire: dict[str, tuple[float, float]]
    """Per module (the collectives' module, "(no module)" without one): wire bytes per rank and
    step in each run (0 where it issued none)."""
    classes: tuple[bool, bool]
    """Whether each run's retained tensors were classed (B, S and H declared)."""
    bytes_tolerance: float
    time_tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def per_token(self) -> bool:
        """B or S differ and both are known: bytes and time are judged per token."""
        a, b = self.tokens
        return a is not None and b is not None and a != b

    @property
    def wire_judged(self) -> tuple[float, float] | None:
        """(base, new) wire bytes per rank and step, per token when the shape changed."""
        a, b = self.wire
        if a is None or b is None:
            return None
        if self.per_token:
            return a / self.tokens[0], b / self.tokens[1]  # type: ignore[operator]
        return a, b

    @property
    def more_bytes(self) -> bool:
        judged = self.wire_judged
        if judged is None:
            return False
        base, new = judged
        return new > base * (1 + self.bytes_tolerance) + 1e-9 * max(base, 1.0)

    @property
    def comm_changed(self) -> list[CommChange]:
        """The collectives that changed, the most wire bytes added or saved first."""
        return sorted((c for c in self.comm if c.changed), key=lambda c: -abs(c.wire_delta))

    @property
    def kept_changed(self) -> list[KeptChange]:
        """The modules whose retained tensors changed: new full-size saves first, then the most
        bytes."""
        return sorted((k for k in self.kept if k.base != k.new), key=lambda k: (not k.became_full, -abs(k.bytes_delta)))

    @property
    def module_time_moved(self) -> list[TimeChange]:
        """Modules' own time changes beyond the noise, the largest first."""
        return [t for t in self.module_time if t.outside_noise]

    @property
    def new_full(self) -> list[KeptChange]:
        return [k for k in self.kept if k.became_full]

    @property
    def slower(self) -> list[TimeChange]:
        return [t for t in self.time if t.what == "step" and t.slower]

    @property
    def kept_more(self) -> list[tuple[int, float, float]]:
        """Layers keeping more bytes than the baseline (per token when B or S changed), beyond
        ``bytes_tolerance``: (layer, base, new)."""
        scale = (1 / self.tokens[0], 1 / self.tokens[1]) if self.per_token else (1.0, 1.0)  # type: ignore[operator]
        tolerance = 1 + self.bytes_tolerance
        return [(layer, b, n) for layer, (b, n) in self.kept_layers.items()
                if n * scale[1] > b * scale[0] * tolerance + 1e-9 * max(b * scale[0], 1.0)]  # fmt: skip

    @property
    def undecided(self) -> list[tuple[int, float, float]]:
        """Layers whose bytes of no known holder grew over the baseline's: (layer, base, new)."""
        return [(layer, b, n) for layer, (b, n) in self.undecided_layers.items() if n > b]

    @property
    def regressions(self) -> list[str]:
        out = [f"{k.module} keeps a full-size tensor the baseline did not" for k in self.new_full]
        unit = " a token" if self.per_token else ""
        out += [f"{'outside layers' if layer < 0 else f'layer {layer}'} keeps more across the forward/backward "
                f"boundary{unit}: {human_bytes(b)} -> {human_bytes(n)}" for layer, b, n in self.kept_more]  # fmt: skip
        if self.more_bytes:
            base, new = self.wire_judged  # type: ignore[misc]
            unit = " a token" if self.per_token else ""
            out.append(f"more wire bytes{unit} a step per rank: {human_bytes(base)} -> {human_bytes(new)}")
        out += [f"a slower {t.what}: {t.relative:+.1%}" for t in self.slower]
        return out

    @property
    def same(self) -> bool:
        """Nothing changed at all (a run against itself)."""
        return not (
            self.shape_changes or self.config_changes or any(c.changed for c in self.comm)
            or any(k.base != k.new for k in self.kept) or any(t.outside_noise for t in self.time)
            or bool(self.module_time_moved)
        )  # fmt: skip

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 2 if self.undecided else 0

    def to_dict(self) -> JSONObject:
        return {
            "base": self.base, "new": self.new, "regression": bool(self.regressions),
            "regressions": self.regressions, "same": self.same,
            "undecided": [{"layer": layer, "base": b, "new": n} for layer, b, n in self.undecided],
            "shape_changes": [{"field": f, "base": a, "new": b} for f, a, b in self.shape_changes],
            "config_changes": [{"key": k, "base": a, "new": b} for k, a, b in self.config_changes],
            "tokens": list(self.tokens), "per_token": self.per_token,
            "wire_bytes_per_rank_step": {"base": self.wire[0], "new": self.wire[1]},
            "communication": [c.to_dict() for c in self.comm if c.changed],
            "retained": [k.to_dict() for k in self.kept if k.base != k.new],
            "retained_per_layer": [{"layer": layer, "base": b, "new": n} for layer, (b, n) in self.kept_layers.items()],
            "time": [t.to_dict() for t in self.time],
            "module_time": [t.to_dict() for t in self.module_time_moved],
            "wire_bytes_per_module": [{"module": m, "base": b, "new": n} for m, (b, n) in self.module_wire.items()],
            "tolerances": {"bytes": self.bytes_tolerance, "time": self.time_tolerance},
            "notes": self.notes,
        }  # fmt: skip


# ---- building the comparison -------------------------------------------------------------------


def diff_runs(
    base: RunAnalysis, new: RunAnalysis, *, bytes_tolerance: float = 0.0, time_tolerance: float = 0.05
) -> RunDiff:
    notes: list[str] = []
    shape = [(f, getattr(base.model, f), getattr(new.model, f)) for f in SHAPE_FIELDS
             if getattr(base.model, f) != getattr(new.model, f)]  # fmt: skip
    tokens = (_tokens(base), _tokens(new))
    comm_base, comm_new = _comm_sides(base), _comm_sides(new)
    comm = [_comm_change(key, comm_base.get(key), comm_new.get(key)) for key in _ordered(comm_base, comm_new)]
    retained_base, retained_new = _retained(base, notes, "baseline"), _retained(new, notes, "new run")
    kept_base, kept_new = _kept_sides(_step_kept(retained_base)), _kept_sides(_step_kept(retained_new))
    lb, ln = _kept_layers(_step_kept(retained_base)), _kept_layers(_step_kept(retained_new))
    kept_layers = {layer: (lb.get(layer, 0.0), ln.get(layer, 0.0)) for layer in sorted(set(lb) | set(ln))}
    ub, un = _kept_layers(_undecided(retained_base)), _kept_layers(_undecided(retained_new))
    undecided_layers = {layer: (ub.get(layer, 0.0), un.get(layer, 0.0)) for layer in sorted(set(ub) | set(un))}
    kept = [KeptChange(m, kept_base.get(m), kept_new.get(m)) for m in sorted(set(kept_base) | set(kept_new))]
    scale = (1 / tokens[0], 1 / tokens[1]) if None not in tokens and tokens[0] != tokens[1] else None
    time = [time_change(what, base, new, time_tolerance, scale) for what in ("step", "transfer", "exposed transfer")]
    wire = (_wire(base, comm_base), _wire(new, comm_new))
    if None in wire:
        notes.append("wire bytes: no collective of the " + ("baseline" if wire[0] is None else "new run") +
                     " recorded its size; bytes are not judged")  # fmt: skip
    if any(x is None for x in tokens) and shape:
        notes.append("B or S is undeclared in a run whose shape changed: bytes and time are compared as they are, "
                     "not per token")  # fmt: skip
    wb, wn = _module_wire(base), _module_wire(new)
    module_wire = {m: (wb.get(m, 0.0), wn.get(m, 0.0)) for m in sorted(set(wb) | set(wn))}
    return RunDiff(
        base=base.name if base.path is None else str(base.path), new=new.name if new.path is None else str(new.path),
        shape_changes=shape, config_changes=_config_changes(base, new), tokens=tokens, comm=comm, wire=wire,
        kept=kept, kept_layers=kept_layers, undecided_layers=undecided_layers, time=[t for t in time if t is not None],
        module_time=module_time_changes(base, new, time_tolerance, scale),
        module_wire=module_wire,
        classes=(base.sharding is not None, new.sharding is not None), bytes_tolerance=bytes_tolerance,
        time_tolerance=time_tolerance, notes=notes,
    )  # fmt: skip


def _module_wire(a: RunAnalysis) -> dict[str, float]:
    frame = a.collectives
    if frame is None or not len(frame):
        return {}
    per = max(len(a.run), 1) * _steps(frame)
    wire = pd.to_numeric(frame["wire_bytes"], errors="coerce").fillna(0.0)
    module = frame["module"].fillna(NO_MODULE).astype(str)
    return {str(m): float(v) / per for m, v in wire.groupby(module).sum().items()}


def _tokens(a: RunAnalysis) -> int | None:
    return a.model.batch * a.model.seq if a.model.batch and a.model.seq else None


def _steps(frame: pd.DataFrame) -> int:
    steps = frame["step"].dropna().unique() if "step" in frame and len(frame) else []
    return max(len(steps), 1)


_Key = tuple[int | None, str, str]


def _comm_sides(a: RunAnalysis) -> dict[_Key, CommSide]:
    frame = a.collectives
    if frame is None or not len(frame):
        return {}
    per = max(len(a.run), 1) * _steps(frame)
    layer = frame["layer"].astype("Int64")
    out: dict[_Key, CommSide] = {}
    keys = [frame["phase"].fillna("?").astype(str), frame["kind"].astype(str)]
    for (lay, phase, kind), g in frame.groupby([layer, *keys], dropna=False, sort=True):
        wire = pd.to_numeric(g["wire_bytes"], errors="coerce")
        out[(None if pd.isna(lay) else int(lay), str(phase), str(kind))] = CommSide(
            count=len(g) / per,
            in_bytes=float(pd.to_numeric(g["in_bytes"], errors="coerce").sum()) / per,
            out_bytes=float(pd.to_numeric(g["out_bytes"], errors="coerce").sum()) / per,
            wire_bytes=float(wire.sum()) / per, unknown_bytes=int(wire.isna().sum()),
            group_sizes=tuple(sorted({int(s) for s in g["group_size"].dropna()})),
            dtypes=tuple(sorted({str(d) for d in g["dtype"].dropna()})),
            modules=tuple(sorted({str(m) for m in g["module"].dropna()})),
        )  # fmt: skip
    return out


def _ordered(*sides: dict[_Key, CommSide]) -> list[_Key]:
    keys = set().union(*sides)
    return sorted(keys, key=lambda k: (k[0] is None, -1 if k[0] is None else k[0], k[1], k[2]))


def _comm_change(key: _Key, base: CommSide | None, new: CommSide | None) -> CommChange:
    changed: list[str] = []
    if base is None:
        changed.append("added")
    elif new is None:
        changed.append("removed")
    else:
        if not math.isclose(base.count, new.count, rel_tol=1e-9):
            changed.append("count")
        if not math.isclose(base.per_op(base.wire_bytes), new.per_op(new.wire_bytes), rel_tol=1e-9) or not (
            math.isclose(base.per_op(base.in_bytes), new.per_op(new.in_bytes), rel_tol=1e-9)
        ):
            changed.append("size")
        if base.group_sizes != new.group_sizes:
            changed.append("group size")
        if base.dtypes != new.dtypes:
            changed.append("dtype")
    return CommChange(key[0], key[1], key[2], base, new, tuple(changed))


def _wire(a: RunAnalysis, sides: dict[_Key, CommSide]) -> float | None:
    if not sides:
        return 0.0 if a.collectives is not None else None
    frame = a.collectives
    if pd.to_numeric(frame["wire_bytes"], errors="coerce").notna().sum() == 0:
        return None
    return sum(s.wire_bytes for s in sides.values())


def _retained(a: RunAnalysis, notes: list[str], which: str) -> pd.DataFrame:
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


def _config_changes(base: RunAnalysis, new: RunAnalysis) -> list[tuple[str, object, object]]:
    """run.json's declared configuration, key by key, where both runs have one."""
    a = (base.run.run_info or {}).get("config")
    b = (new.run.run_info or {}).get("config")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
