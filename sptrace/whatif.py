"""What if: a run's step replayed on its cross-rank dependency graph (sptrace.reduce.replay) with
changed costs, beside the same replay with nothing changed, which must reproduce the measured step.

The replay with no change is the calibration: its error against the measured step is always said,
and when it is larger than the run's own noise (the spread of its profiled steps, else 5%) the
prediction is said to be off, with what the graph lacks (collectives with members the trace does
not hold, ranks without a trace, collectives the replay had to end without all their arrivals).
A prediction's error is never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sptrace.analysis import RunAnalysis
from sptrace.reduce.critical import CriticalPath
from sptrace.reduce.replay import Changes, replay
from sptrace.vocab.errors import UsageError
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import count, rank_ranges

DEFAULT_NOISE = 0.05
"""The calibration tolerance when the run has one profiled step (no spread of its own to measure)."""


@dataclass(frozen=True)
class StepWhatIf:
    """One profiled step: measured, replayed with nothing changed, and predicted (us)."""

    step: str | None
    measured_us: float
    baseline_us: float
    predicted_us: float
    forced: int


@dataclass(frozen=True)
class WhatIf:
    """A what-if over a run's profiled steps: the slowest step's figures lead (as the critical path
    does), ``path`` is the predicted critical path of the step predicted slowest."""

    changes: Changes
    steps: tuple[StepWhatIf, ...]
    path: CriticalPath | None
    lacks: tuple[str, ...]
    """What the graph lacks that can make the replay miss (empty when it holds everything)."""

    @property
    def measured_us(self) -> float:
        return max(s.measured_us for s in self.steps)

    @property
    def baseline_us(self) -> float:
        return max(s.baseline_us for s in self.steps)

    @property
    def predicted_us(self) -> float:
        return max(s.predicted_us for s in self.steps)

    @property
    def error(self) -> float:
        """The replay with no change against the measured step (0.01: 1% long)."""
        return self.baseline_us / self.measured_us - 1.0 if self.measured_us > 0 else 0.0

    @property
    def noise(self) -> float | None:
        """The run-to-run noise: the spread of the profiled steps' measured times over their mean
        (None with one step)."""
        times = [s.measured_us for s in self.steps]
        if len(times) < 2:
            return None
        return (max(times) - min(times)) / (sum(times) / len(times))

    @property
    def tolerance(self) -> float:
        return max(self.noise or 0.0, DEFAULT_NOISE)

    @property
    def calibrated(self) -> bool:
        return abs(self.error) <= self.tolerance

    @property
    def gain(self) -> float:
        """The predicted step against the replay with no change (-0.2: 20% shorter)."""
        return self.predicted_us / self.baseline_us - 1.0 if self.baseline_us > 0 else 0.0

    def calibration_line(self) -> str:
        """'+0.0% off the measured step, within 5% (one profiled step)', or how far off, and why."""
        noise = f"the steps' spread, {self.noise:.1%}" if self.noise is not None else "5%, one profiled step"
        if self.calibrated:
            return f"{self.error:+.1%} off the measured step, within {noise}"
        lacks = "; ".join(self.lacks) or "nothing the graph knows of: an order the trace does not record"
        return (f"{self.error:+.1%} off the measured step, more than {noise}: the prediction may be off by as much; "
                f"the graph lacks {lacks}")  # fmt: skip

    def to_dict(self) -> JSONObject:
        return {
            "changes": self.changes.describe(),
            "measured_ms": float(self.measured_us) / 1e3, "baseline_ms": float(self.baseline_us) / 1e3,
            "predicted_ms": float(self.predicted_us) / 1e3, "gain": float(self.gain), "error": float(self.error),
            "noise": None if self.noise is None else float(self.noise), "calibrated": bool(self.calibrated),
            "lacks": list(self.lacks),
            "steps": [{"step": s.step, "measured_ms": float(s.measured_us) / 1e3,
                       "baseline_ms": float(s.baseline_us) / 1e3, "predicted_ms": float(s.predicted_us) / 1e3,
                       "forced": int(s.forced)} for s in self.steps],
            "critical_path": self.path.to_dict() if self.path is not None else None,
        }  # fmt: skip


def what_if(analysis: RunAnalysis, changes: Changes) -> WhatIf:
    """``changes`` replayed on every profiled step of ``analysis`` (analysed with the ``whatif``
    part, which builds the graphs)."""
    graphs = analysis.replay_graphs
    if not graphs:
        raise UsageError(f"{analysis.path}: no step to replay: the trace records no step window or no work lane")
    steps = []
    predictions = []
    for graph in graphs:
        base = replay(graph)
        new = base if changes.none else replay(graph, changes)
        steps.append(StepWhatIf(graph.step, graph.measured_us, base.step_us, new.step_us, base.forced))
        predictions.append((new, graph))
    new, graph = max(predictions, key=lambda p: p[0].step_us)
    path = new.path(graph)
    if path is not None and graph.step is not None:
        path = replace(path, step=graph.step)
    return WhatIf(changes, tuple(steps), path, _lacks(analysis, steps))


def _lacks(analysis: RunAnalysis, steps: list[StepWhatIf]) -> tuple[str, ...]:
    graph = analysis.replay_graphs[0]
    out = []
    if graph.unseen:
        out.append(f"{count(graph.unseen, 'collective')} with members the trace does not hold")
    missing = sorted(analysis.run.missing_ranks)
    if missing:
        out.append(f"ranks without a trace ({rank_ranges(missing)})")
    forced = max(s.forced for s in steps)
    if forced:
        out.append(f"{count(forced, 'collective')} ended without all arrivals (an order the trace contradicts)")
    unmatched = int((graph.members.groupby("collective")["rank"].transform("count") == 1).sum())
    if unmatched:
        out.append(f"{count(unmatched, 'collective')} no other rank's matched")
    return tuple(out)
