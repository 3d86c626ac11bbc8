"""Communication compared between two runs (sptrace.diff): each run's collectives per (layer,
phase, kind), per rank and step (``CommSide``), what changed between the two (``CommChange``:
added, removed, count, size, group size, dtype), and the wire bytes of each run and of each
module.

Per rank and step: a run's collectives are summed over its ranks and divided by its rank count
and its step count (the steps its collectives carry, else one), so that two runs of different
sizes or profiled windows compare."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from sptrace.vocab.jsontypes import JSONObject

if TYPE_CHECKING:
    from sptrace.analysis import RunAnalysis

NO_MODULE = "(no module)"
"""What a collective or a retained tensor no module claims is filed under."""

CommKey = tuple[int | None, str, str]
"""(layer, phase, kind): what a run's collectives are compared by (a layer of None: outside layers)."""


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


def comm_sides(a: RunAnalysis) -> dict[CommKey, CommSide]:
    """A run's collectives per (layer, phase, kind), per rank and step."""
    frame = a.collectives
    if frame is None or not len(frame):
        return {}
    per = max(len(a.run), 1) * _steps(frame)
    layer = frame["layer"].astype("Int64")
    out: dict[CommKey, CommSide] = {}
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


def comm_changes(base: dict[CommKey, CommSide], new: dict[CommKey, CommSide]) -> list[CommChange]:
    """Every (layer, phase, kind) of either run, compared: by layer (outside layers last), phase, kind."""
    return [_comm_change(key, base.get(key), new.get(key)) for key in _ordered(base, new)]


def _ordered(*sides: dict[CommKey, CommSide]) -> list[CommKey]:
    keys = set().union(*sides)
    return sorted(keys, key=lambda k: (k[0] is None, -1 if k[0] is None else k[0], k[1], k[2]))


def _comm_change(key: CommKey, base: CommSide | None, new: CommSide | None) -> CommChange:
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


def wire_per_rank_step(a: RunAnalysis, sides: dict[CommKey, CommSide]) -> float | None:
    """A run's wire bytes per rank and step (None: no collective recorded its size)."""
    if not sides:
        return 0.0 if a.collectives is not None else None
    frame = a.collectives
    if pd.to_numeric(frame["wire_bytes"], errors="coerce").notna().sum() == 0:
        return None
    return sum(s.wire_bytes for s in sides.values())


def module_wire(base: RunAnalysis, new: RunAnalysis) -> dict[str, tuple[float, float]]:
    """Per module (NO_MODULE without one): wire bytes per rank and step in each run (0 where it
    issued none)."""
    wb, wn = _module_wire(base), _module_wire(new)
    return {m: (wb.get(m, 0.0), wn.get(m, 0.0)) for m in sorted(set(wb) | set(wn))}


def _module_wire(a: RunAnalysis) -> dict[str, float]:
    frame = a.collectives
    if frame is None or not len(frame):
        return {}
    per = max(len(a.run), 1) * _steps(frame)
    wire = pd.to_numeric(frame["wire_bytes"], errors="coerce").fillna(0.0)
    module = frame["module"].fillna(NO_MODULE).astype(str)
    return {str(m): float(v) / per for m, v in wire.groupby(module).sum().items()}


def _steps(frame: pd.DataFrame) -> int:
    steps = frame["step"].dropna().unique() if "step" in frame and len(frame) else []
    return max(len(steps), 1)
