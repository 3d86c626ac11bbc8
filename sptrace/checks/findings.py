"""What a check found, and what it concluded, in one shape for every check and output format.

A Finding is one fact about a run; the same fact on several ranks is one Finding with its
rank set (``merge_ranks``). A Verdict is a check's conclusion: pass, fail, or cannot decide,
with the reason, and the exit code the CLI returns for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.source_lines import SourceLine
from sptrace.vocab.units import rank_text

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str
    """error: the run breaks the scheme's contract; warning: worth a look; info: context."""
    check: str
    """Which check: "collectives", "sharding" ..."""
    code: str
    """Stable identifier: missing-collective, extra-collective, wrong-size, full-size-save ..."""
    message: str
    """What was found, without the rank (``ranks`` says where)."""
    ranks: tuple[int, ...] = ()
    layer: int | None = None
    module: str | None = None
    page: str | None = None
    """The dashboard page that shows it (timeline, collectives, memory)."""
    holder: str | None = None
    """For a tensor kept across the boundary: who holds it (sptrace.detect.holders)."""
    evidence: str | None = None
    """Why that holder: the evidence, in words a user can check."""
    source: SourceLine | None = None
    """Where the user's code made what was found (a kept tensor's maker), when the trace shows it."""
    saver: str | None = None
    """For a kept tensor: the module, and the autograd node, that kept it."""
    no_source: str | None = None
    """Why there is no ``source``, and how to get one (a trace without Python stacks)."""
    boundaries: tuple[tuple[int | None, int], ...] = ()
    """For a kept tensor: each boundary (step, micro-batch) it was kept at, where the run has
    several (the message says them in short: 'steps 1-862')."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def where(self) -> str:
        """'ranks 0-7' / 'rank 3' / '' ."""
        return rank_text(self.ranks, none="")

    def text(self) -> str:
        return f"{self.where}: {self.message}{self.origin_text()}" if self.ranks else self.message + self.origin_text()

    def origin_text(self) -> str:
        """'; made at model.py:52 in forward(), kept by layers.0 (MulBackward0)', or the way to
        record the source line where the trace has none; '' for a finding of no tensor."""
        kept = f", kept by {self.saver}" if self.saver else ""
        if self.source is not None:
            return f"; made at {self.source.text()}{kept}"
        return (f"; kept by {self.saver}" if self.saver else "") + (f"; {self.no_source}" if self.no_source else "")

    def to_dict(self) -> JSONObject:
        out = {
            "severity": self.severity, "check": self.check, "code": self.code, "message": self.message,
            "ranks": list(self.ranks), "layer": self.layer, "module": self.module, "page": self.page,
        }  # fmt: skip
        if self.holder is not None:
            out["holder"], out["evidence"] = self.holder, self.evidence
        if self.boundaries:
            out["boundaries"] = [{"step": step, "micro_batch": micro} for step, micro in self.boundaries]
        if self.source is not None or self.saver is not None or self.no_source is not None:
            out["source"] = None if self.source is None else self.source.to_dict()
            out["saver"], out["no_source"] = self.saver, self.no_source
        return out


def merge_ranks(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per distinct fact: identical findings of several ranks become one with their
    rank set, in first-seen order."""
    merged: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.severity, f.check, f.code, f.message, f.layer, f.module, f.page, f.holder, f.evidence, f.source,
               f.saver, f.boundaries)  # fmt: skip
        if key in merged:
            ranks = tuple(sorted(set(merged[key].ranks) | set(f.ranks)))
            merged[key] = replace(merged[key], ranks=ranks)
        else:
            merged[key] = replace(f, ranks=tuple(sorted(set(f.ranks))))
    return list(merged.values())


STATUSES = ("pass", "fail", "undecided")
EXIT_CODES = {"pass": 0, "fail": 1, "undecided": 2}


@dataclass(frozen=True, slots=True)
class Verdict:
    """A check's conclusion. ``undecided`` means the trace did not show enough to decide; the
    reason says what was missing and how to get it."""

    status: str
    label: str
    """MATCH / MISMATCH / PASS / FAIL / CANNOT DECIDE."""
    summary: str
    """One line: what was checked and found."""
    reasons: tuple[str, ...] = field(default=())
    """Why it could not decide (undecided), or the caveats of a pass."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def line(self) -> str:
        return f"{self.label}: {self.summary}"

    def to_dict(self) -> JSONObject:
        return {"status": self.status, "label": self.label, "summary": self.summary, "reasons": list(self.reasons)}
