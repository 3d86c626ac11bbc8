"""The registry of checks: one protocol and one list. A check names the parts of the analysis it
reads (``needs``: collectives, sharding, path), whether its verdict gates CI (``gate``: it counts in
`sptrace check`'s exit code), and turns the run's reduced facts and its model into a CheckReport:
findings, a verdict and notes. `analyze`, `check`, their JSON, JUnit, the HTML report and the
dashboard read the reports generically (RunAnalysis.reports), so a new check is one ``register``
call (tests/checks/test_check_registry.py adds one).

The run's own checks (the collectives against the cost model or across ranks, and the sharding
check: sptrace.checks.builtin) are entries of the same list, first, under the names COLLECTIVES and
SHARDING; their typed reports ride along in CheckReport.detail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pandas as pd

from sptrace.checks.findings import Finding, Verdict
from sptrace.detect.allocations import Retention
from sptrace.detect.timing import RankTiming
from sptrace.reduce.critical import CriticalPath
from sptrace.reduce.matching import Matching
from sptrace.reduce.p2p import P2PReport
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape

COLLECTIVES = "collectives"
SHARDING = "sharding"


@dataclass(frozen=True)
class CheckOptions:
    """How the user asked the checks to judge: ``allow`` module globs that may keep full tensors,
    ``strict`` (ambiguous tensors that could be full-size fail too), the cost model's ``k`` and
    scope (``attention_only``, ``grad_sync``) and the gradients' declared element type."""

    allow: tuple[str, ...] = ()
    strict: bool = False
    k: int = 2
    grad_dtype: str | None = None
    attention_only: bool = False
    grad_sync: bool = True


@dataclass(frozen=True)
class CheckFacts:
    """What a check reads of a run: its reduced facts, built once by sptrace.analysis, and the
    options the user judges with."""

    ranks: tuple[int, ...]
    world_size: int
    missing_ranks: tuple[int, ...]
    collectives: pd.DataFrame = field(repr=False)
    matching: Matching | None
    timing: tuple[RankTiming, ...]
    retained: Sequence[Retention]
    critical_path: CriticalPath | None
    p2p: P2PReport | None = None
    """Sends paired with receives (None without point-to-point)."""
    options: CheckOptions = field(default_factory=CheckOptions)


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
    detail: object = field(default=None, repr=False, compare=False)
    """The check's own typed report, for the views that draw more than findings (the run's own
    checks': sptrace.checks.builtin.CollectivesDetail and ShardingReport)."""

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
    """Every check: the run's own two, then the registered ones in registration order."""
    from sptrace.checks.builtin import BUILTIN  # (they build their reports with this module's types)

    return (*BUILTIN, *_CHECKS.values())


def needed_parts(gate_only: bool = False) -> frozenset[str]:
    """The parts the registered checks read (those that gate CI, with ``gate_only``)."""
    return frozenset(p for c in _CHECKS.values() if c.gate or not gate_only for p in c.needs)


def run_checks(facts: CheckFacts, model: ModelShape, parts: Iterable[str]) -> dict[str, CheckReport]:
    """Every check whose needs were computed, by name, the run's own first."""
    computed = set(parts)
    return {c.name: c.run(facts, model) for c in checks() if c.needs <= computed}


def worst(verdicts: Iterable[Verdict | None]) -> int:
    """The exit code of several verdicts together: 1 when any FAILs (or MISMATCHes), else 2 when
    any could not decide, else 0."""
    codes = {v.exit_code for v in verdicts if v is not None}
    return 1 if 1 in codes else 2 if 2 in codes else 0
