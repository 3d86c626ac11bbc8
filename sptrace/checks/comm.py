"""Does a run communicate what its scheme must? Observed collectives per rank, layer and phase
against the cost model: missing, extra, wrong-size and wrongly-placed collectives, wire bytes
per step, and the skew and stragglers of the matched collectives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from sptrace.checks.comm_rank import LayerRow, RankRow, check_rank
from sptrace.checks.findings import Finding, Verdict, merge_ranks
from sptrace.costmodel.comm import CommEstimate
from sptrace.jsonable import records
from sptrace.reduce.matching import Matching
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import count, human_bytes


@dataclass
class CommReport:
    scheme: str
    ranks: pd.DataFrame
    """Per rank: observed and expected counts and wire bytes per step."""
    layers: pd.DataFrame
    """Per rank, layer and phase: observed and expected counts."""
    findings: list[Finding]
    matching: Matching | None = None
    notes: list[str] = field(default_factory=list)
    scope: str | None = None
    """What the comparison covered when less than the model (L not declared: the layers seen)."""

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def verdict(self) -> Verdict:
        errors = [f for f in self.findings if f.severity == "error"]
        unknown = [f for f in self.findings if f.code in ("size-unknown", "group-unknown", "grad-dtype-unknown")]
        per_rank = int(self.ranks["observed"].max()) if len(self.ranks) else 0
        wire = float(self.ranks["observed_wire_bytes"].max()) if len(self.ranks) else 0.0
        if errors:
            return Verdict("fail", "MISMATCH", f"{count(len(errors), 'finding')} against the {self.scheme} model")
        if unknown:
            what = []
            for codes, label in ((("size-unknown",), "the size"), (("group-unknown",), "the group"),
                                 (("grad-dtype-unknown",), "the gradient element size")):  # fmt: skip
                n = sum(len(f.ranks) for f in unknown if f.code in codes)
                if n:
                    what.append(f"{label} of {n}")
            return Verdict(
                "undecided", "CANNOT DECIDE",
                f"{count(per_rank, 'collective')} per rank, as the {self.scheme} model counts them, but the trace "
                f"does not record {' nor '.join(what)}",
                tuple(f.text() for f in unknown),
            )  # fmt: skip
        return Verdict(
            "pass",
            "MATCH",
            f"{count(per_rank, 'collective')} and {human_bytes(wire)} on the wire per rank, as the {self.scheme} "
            "model predicts" + (f" {self.scope}" if self.scope else ""),
        )

    def to_dict(self) -> JSONObject:
        out: JSONObject = {
            "scheme": self.scheme,
            "match": self.ok,
            "verdict": self.verdict.to_dict(),
            "ranks": records(self.ranks),
            "layers": records(self.layers),
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes,
        }
        if self.matching is not None:
            out["clock_offsets_us"] = self.matching.offsets_us
            out["matched_collectives"] = records(self.matching.matched.drop(columns=["ranks"]))
        return out


def check_collectives(
    frame: pd.DataFrame,
    est: CommEstimate,
    ranks: list[int],
    matching: Matching | None = None,
    *,
    also: Sequence[Finding] = (),
    notes: Sequence[str] = (),
    scope: str | None = None,
) -> CommReport:
    """Compare every rank's collectives with ``est``. ``ranks``: the ranks that have traces.
    A collective whose size the trace does not record meets an expectation of its phase and
    kind, and leaves a size-unknown finding: the run cannot be called a match on its bytes.
    ``also``: findings of other checks that count in this verdict (the point-to-point ones);
    ``notes``: the caller's, after this check's own; ``scope``: what the model was compared over."""
    findings: list[Finding] = []
    rank_rows: list[RankRow] = []
    layer_rows: list[LayerRow] = []
    for rank in ranks:
        obs = frame[frame["rank"] == rank]
        steps = _steps_of(obs)
        per_step_results = [check_rank(rank, part, est) for _, part in steps]
        findings += _across_steps([r[0] for r in per_step_results], [s for s, _ in steps] if len(steps) > 1 else None)
        layer_rows += per_step_results[0][1] if per_step_results else []
        rows = [r[2] for r in per_step_results]  # per step: several steps' rows are their mean
        rank_rows.append(rows[0] if len(rows) == 1 else {
            key: rows[0][key] if key in ("rank", "expected", "expected_wire_bytes")
            else sum(r[key] for r in rows) / len(rows)
            for key in rows[0]})  # fmt: skip
    ranks_frame = pd.DataFrame(rank_rows)
    findings = merge_ranks([*merge_ranks(findings), *also])
    report = CommReport(est.scheme, ranks_frame, pd.DataFrame(layer_rows), findings, matching, scope=scope)
    unknown_wire = int(ranks_frame["unknown_wire"].max()) if len(ranks_frame) else 0
    if unknown_wire:
        report.notes.append(
            f"wire bytes leave out up to {count(unknown_wire, 'collective')} per rank whose size or group the "
            "trace does not record"
        )
    if matching is not None and not matching.matched.empty:
        m = matching.matched[matching.matched["n_ranks"] > 1]
        if len(m) and m["arrival_skew_us"].notna().any():
            worst = m.loc[m["arrival_skew_us"].idxmax()]
            report.notes.append(
                f"largest arrival skew {worst['arrival_skew_us'] / 1e3:.2f} ms ({worst['kind']} #{worst['key']}, "
                f"{worst['module'] or 'no module'}), rank {int(worst['straggler'])} arriving last"
            )
        report.notes += matching.notes
    report.notes += notes
    return report


def _steps_of(obs: pd.DataFrame) -> list[tuple[int | None, pd.DataFrame]]:
    """A rank's collectives by profiled step (a trace of several ProfilerStep# windows holds the
    scheme's collectives once per step): [(step, its rows)], or one part of them all. Rows outside
    every step go with the first."""
    if "step" not in obs or obs["step"].nunique() < 2:
        return [(None, obs)]
    steps = sorted(int(s) for s in obs["step"].dropna().unique())
    first = obs["step"].isna() | (obs["step"] == steps[0])
    return [(steps[0], obs[first])] + [(s, obs[obs["step"] == s]) for s in steps[1:]]


def _across_steps(parts: list[list[Finding]], steps: list[int | None] | None) -> list[Finding]:
    """Each step's findings as one list: one that every step has once; one that only some steps
    have, named with its step ("step 3: ...")."""
    if steps is None:
        return parts[0] if parts else []
    everywhere = set.intersection(*(set(p) for p in parts)) if parts else set()
    out = [f for f in parts[0] if f in everywhere]
    for step, part in zip(steps, parts):
        out += [replace(f, message=f"step {step}: {f.message}") for f in part if f not in everywhere]
    return out
