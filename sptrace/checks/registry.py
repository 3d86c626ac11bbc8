"""The registry of checks: one protocol and one list. A check names the parts of the analysis it
reads (``needs``: collectives, sharding, path), whether its verdict gates CI (``gate``: it counts in
`sptrace check`'s exit code), and turns the run's reduced facts and its model into a CheckReport:
findings, a verdict and notes. `analyze`, `check`, their JSON, JUnit, the HTML report and the
dashboard read the reports generically (RunAnalysis.reports), so a new check is one ``register``
call (tests/checks/test_check_registry.py adds one).

The run's own checks (the collectives against the cost model or across ranks, and the sharding
check) are reported through the same CheckReport, under the names COLLECTIVES and SHARDING.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import pandas as pd

from sptrace.checks.findings import Finding, Verdict
from sptrace.detect.allocations import Retention
from sptrace.detect.timing import RankTiming
from sptrace.reduce.critical import CriticalPath
from sptrace.reduce.matching import Matching
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape

COLLECTIVES = "collectives"
SHARDING = "sharding"


@dataclass(frozen=True)
class CheckFacts:
    """What a check reads of a run: its reduced facts, built once by sptrace.analysis."""

    ranks: tuple[int, ...]
    world_size: int
    missing_ranks: tuple[int, ...]
    collectives: pd.DataFrame = field(repr=False)
    matching: Matching | None
    timing: tuple[RankTiming, ...]
    retained: tuple[Retention, ...]
    critical_path: CriticalPath | None


@dataclass(frozen=True)
class CheckReport:
    """One check's result: its verdict (None with ``unavailable`` when the run does not declare
    what it needs), its findings and notes."""

    name: str
    title: str
    verdict: Verdict | None
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    gate: bool = False
    unavailable: str | None = None

    def line(self) -> str:
        return self.verdict.line() if self.verdict is not None else f"not checked: {self.unavailable}"

    def to_dict(self) -> JSONObject:
        return {
            "name": self.name, "title": self.title, "gate": self.gate,
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "unavailable": self.unavailable, "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }  # fmt: skip


class Check(Protocol):
    name: str
    title: str
    needs: frozenset[str]
    """The parts of the analysis it reads (sptrace.analysis.PARTS): it runs when they were computed."""
    gate: bool
    """Whether its verdict counts in `sptrace check`'s exit code."""

    def run(self, facts: CheckFacts, model: ModelShape) -> CheckReport: ...


_CHECKS: dict[str, Check] = {}


def register(check: Check) -> Check:
    if check.name in (COLLECTIVES, SHARDING):
        raise ValueError(f"{check.name!r} is the name of one of the run's own checks")
    _CHECKS[check.name] = check
    return check


def unregister(name: str) -> None:
    _CHECKS.pop(name, None)


def checks() -> tuple[Check, ...]:
    """The registered checks, in registration order."""
    return tuple(_CHECKS.values())


def needed_parts(gate_only: bool = False) -> frozenset[str]:
    """The parts the registered checks read (those that gate CI, with ``gate_only``)."""
    return frozenset(p for c in _CHECKS.values() if c.gate or not gate_only for p in c.needs)


def run_checks(facts: CheckFacts, model: ModelShape, parts: Iterable[str]) -> dict[str, CheckReport]:
    """Every registered check whose needs were computed, by name."""
    computed = set(parts)
    return {c.name: c.run(facts, model) for c in _CHECKS.values() if c.needs <= computed}


def worst(verdicts: Iterable[Verdict | None]) -> int:
    """The exit code of several verdicts together: 1 when any FAILs (or MISMATCHes), else 2 when
    any could not decide, else 0."""
    codes = {v.exit_code for v in verdicts if v is not None}
    return 1 if 1 in codes else 2 if 2 in codes else 0
