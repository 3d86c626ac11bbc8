"""Time compared between two runs (sptrace.diff): a per-rank quantity as its median and range over
the ranks (Spread), and a change that counts only beyond a tolerance and outside both runs'
spreads (TimeChange): the step, its transfer and exposed transfer, and each module's own time,
which counts by its share of the baseline's step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sptrace.vocab.jsontypes import JSONObject

if TYPE_CHECKING:
    from sptrace.analysis import RunAnalysis


@dataclass(frozen=True)
class Spread:
    """A per-rank quantity over a run's ranks: median, least, most (ms)."""

    median: float
    low: float
    high: float
    ranks: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        known = sorted(v for v in values if v is not None and not math.isnan(v))
        if not known:
            return None
        n = len(known)
        median = known[n // 2] if n % 2 else (known[n // 2 - 1] + known[n // 2]) / 2
        return cls(median, known[0], known[-1], n)

    def scaled(self, factor: float) -> Spread:
        return Spread(self.median * factor, self.low * factor, self.high * factor, self.ranks)

    def to_dict(self) -> JSONObject:
        return {"median": self.median, "low": self.low, "high": self.high, "ranks": self.ranks}


@dataclass(frozen=True)
class TimeChange:
    what: str
    """step, transfer, exposed transfer."""
    base: Spread | None
    new: Spread | None
    tolerance: float
    per_token: bool = False
    of_step: float | None = None
    """For a part of the step (a module's own time): the baseline's step (ms, as scaled), which
    its change is measured against; a module's change matters by its share of the step."""

    @property
    def relative(self) -> float | None:
        if self.base is None or self.new is None or not self.base.median:
            return None
        return self.new.median / self.base.median - 1

    @property
    def outside_noise(self) -> bool:
        """Beyond the tolerance and outside both runs' spread across ranks."""
        b, n = self.base, self.new
        if b is None or n is None:
            return False
        if self.of_step is not None:
            if not self.of_step or abs(n.median - b.median) <= self.tolerance * self.of_step:
                return False
            return n.low > b.high if n.median > b.median else n.high < b.low
        rel = self.relative
        if rel is None or abs(rel) <= self.tolerance:
            return False
        return n.low > b.high if rel > 0 else n.high < b.low

    @property
    def slower(self) -> bool:
        return self.outside_noise and (self.relative or 0) > 0

    def to_dict(self) -> JSONObject:
        return {
            "what": self.what, "base_ms": self.base.to_dict() if self.base else None,
            "new_ms": self.new.to_dict() if self.new else None, "relative": self.relative,
            "outside_noise": self.outside_noise, "per_token": self.per_token, "of_step_ms": self.of_step,
        }  # fmt: skip


def time_change(
    what: str, base: RunAnalysis, new: RunAnalysis, tolerance: float, scale: tuple[float, float] | None
) -> TimeChange | None:
    field_of = {"step": "step_ms", "transfer": "comm_ms", "exposed transfer": "exposed_ms"}[what]
    b = Spread.of(getattr(t, field_of) for t in base.timing)
    n = Spread.of(getattr(t, field_of) for t in new.timing)
    if b is None and n is None:
        return None
    if scale is not None and b is not None and n is not None:
        b, n = b.scaled(scale[0]), n.scaled(scale[1])
    return TimeChange(what, b, n, tolerance, per_token=scale is not None)


def module_time_changes(
    base: RunAnalysis, new: RunAnalysis, tolerance: float, scale: tuple[float, float] | None
) -> list[TimeChange]:
    """Per (phase, module): the ranks' own time in each run, as TimeChanges, those outside the
    noise first and the largest of them first (then the rest, by size). A module's change counts
    beyond the tolerance of the baseline's step (its share of the step), outside both spreads."""
    sides = []
    for a in (base, new):
        frame = a.module_times
        per: dict[tuple[str, str], list[float]] = {}
        if frame is not None and len(frame):
            for (module, phase), g in frame.groupby(["module", "phase"], sort=False):
                per[(str(phase), str(module))] = g.groupby("rank")["ms"].sum().tolist()
        sides.append(per)
    step = Spread.of(t.step_ms for t in base.timing)
    of_step = None if step is None else step.median * (scale[0] if scale is not None else 1.0)
    out = []
    for phase, module in sorted(set(sides[0]) | set(sides[1])):
        b, n = Spread.of(sides[0].get((phase, module), [])), Spread.of(sides[1].get((phase, module), []))
        if scale is not None and b is not None and n is not None:
            b, n = b.scaled(scale[0]), n.scaled(scale[1])
        out.append(TimeChange(f"{phase} {module}", b or Spread(0.0, 0.0, 0.0, 0), n or Spread(0.0, 0.0, 0.0, 0),
                              tolerance, per_token=scale is not None, of_step=of_step or 0.0))  # fmt: skip
    return sorted(out, key=lambda t: (not t.outside_noise, -abs(t.new.median - t.base.median)))  # type: ignore[union-attr]
