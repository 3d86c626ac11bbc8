"""Do the ranks agree with each other? The part of ``analyze`` that needs no model of the job:
every rank of a process group must issue the same collectives, in the same order, with the same
sizes (else NCCL hangs or reduces garbage), and the matched collectives show who waits for whom.

Findings:
- ``mismatched-collective`` (error): a rank issued a different kind or size than the rest of its
  group at the same place in the group's sequence. One finding per rank and group, at the first
  place it diverges, with how many of its collectives disagree after it. In the group the trace
  does not name (``?``), collectives of different groups may share a sequence, so there it is a
  warning: the trace cannot tell a desync from two groups. Sizes are compared only where every
  rank's input has the same size (``same_size`` in the table of collective kinds); an uneven all-to-all and a
  scatter's or gather's root differ by design.
- ``collective-count`` (warning): ranks of one group issued different numbers of collectives. A
  profiled window that starts or stops at a different point on some rank does this too, so it
  does not fail the check.
- ``straggler`` (info): the rank that arrived last most often, and the largest arrival skew.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from sptrace.checks.findings import Finding, Verdict, merge_ranks
from sptrace.jsonable import records
from sptrace.reduce.matching import UNKNOWN_GROUP, Matching
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import count, human_bytes


@dataclass
class CrossRankReport:
    ranks: pd.DataFrame
    """Per rank: collectives issued, wire bytes (where known), and how many disagree with the group."""
    findings: list[Finding]
    matched: int
    """Collective instances matched across ranks."""
    skipped: str | None = None
    """Why the cost-model comparison did not run (None when it did, elsewhere)."""
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        errors = [f for f in self.findings if f.severity == "error"]
        unsure = [f for f in self.findings if f.code == "mismatched-collective" and f.severity != "error"]
        per_rank = int(self.ranks["collectives"].max()) if len(self.ranks) else 0
        if not per_rank:
            return Verdict("undecided", "CANNOT DECIDE", "the trace holds no collective to compare across ranks")
        reasons = (f"the cost-model comparison was skipped: {self.skipped}",) if self.skipped else ()
        if errors:
            summary = f"{count(len(errors), 'finding')}: ranks disagree on the collectives they issue"
            return Verdict("fail", "INCONSISTENT", summary, reasons)
        if not self.matched:
            return Verdict(
                "undecided", "CANNOT DECIDE",
                f"{count(per_rank, 'collective')} per rank, but none was matched on two or more ranks: one rank's "
                "trace, or ranks from different groups, cannot show that ranks agree", reasons,
            )  # fmt: skip
        if unsure:
            n = int(self.ranks["disagree"].sum()) if "disagree" in self.ranks else len(unsure)
            return Verdict(
                "undecided", "CANNOT DECIDE",
                f"{count(self.matched, 'collective')} matched across ranks agree, but {n} disagree where the trace "
                "names no process group: a desync and two groups look the same there",
                (*reasons, *(f.text() for f in unsure)),
            )  # fmt: skip
        return Verdict(
            "pass", "CONSISTENT",
            f"{count(per_rank, 'collective')} per rank; {self.matched} matched across ranks agree in kind and size",
            reasons,
        )  # fmt: skip

    def to_dict(self) -> JSONObject:
        return {
            "verdict": self.verdict.to_dict(), "ranks": records(self.ranks), "matched": self.matched,
            "findings": [f.to_dict() for f in self.findings], "notes": self.notes,
            "cost_model": {"skipped": self.skipped},
        }  # fmt: skip


def _size(v: object) -> str:
    """A size cell as text: its bytes, or 'size unknown' (None, NaN, NA or '?')."""
    return "size unknown" if v is None or pd.isna(v) or v == "?" else human_bytes(float(v))


def _per_rank(collectives: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    """Per rank of ``ranks``: its collectives, their known wire bytes and how many are unknown (one
    grouping: a filter per rank was quadratic in the ranks, 9 s of a 10,000-rank analyze)."""
    if len(collectives):
        unknown = collectives["wire_bytes"].isna()
        wire = pd.to_numeric(collectives["wire_bytes"], errors="coerce").astype(float).where(~unknown, 0.0)
        parts = pd.DataFrame({"n": 1, "wire": wire, "unknown": unknown.astype(int)})
        totals = parts.groupby(collectives["rank"].to_numpy()).sum()
    else:
        totals = pd.DataFrame({"n": pd.Series(dtype=float), "wire": pd.Series(dtype=float),
                               "unknown": pd.Series(dtype=float)})  # fmt: skip
    totals = totals.reindex(ranks)
    return pd.DataFrame({
        "rank": list(ranks), "collectives": totals["n"].fillna(0).astype(int).to_numpy(),
        "wire_bytes": totals["wire"].fillna(0.0).astype(float).to_numpy(),
        "unknown_wire": totals["unknown"].fillna(0).astype(int).to_numpy(),
    }, columns=["rank", "collectives", "wire_bytes", "unknown_wire"])  # fmt: skip


def check_cross_rank(
    collectives: pd.DataFrame,
    matching: Matching | None,
    ranks: list[int],
    skipped: str | None = None,
    *,
    also: Sequence[Finding] = (),
    notes: Sequence[str] = (),
) -> CrossRankReport:
    """The ranks compared with each other (no model needed). ``also``: findings of other checks
    that count in this verdict; ``notes``: the caller's, after this check's own."""
    findings: list[Finding] = []
    frame = _per_rank(collectives, ranks)
    if matching is None:
        return CrossRankReport(frame.assign(disagree=0), merge_ranks(list(also)), 0, skipped, list(notes))
    bad = matching.disagreements
    disagree = bad.groupby("rank").size() if len(bad) else pd.Series(dtype=int)
    frame["disagree"] = frame["rank"].map(disagree).fillna(0).astype(int)
    for (group, rank), g in bad.sort_values("start_us", kind="stable").groupby(["group", "rank"], sort=True):
        first = g.iloc[0]
        where = f"layer {int(first['layer'])} {first['phase']}" if pd.notna(first["layer"]) else str(first["phase"])
        module = first["module"] if isinstance(first["module"], str) and first["module"] else None
        known = group != UNKNOWN_GROUP
        message = (
            f"{_group(group)}: its collective #{int(first['key'])} ({where}{', ' + module if module else ''}) is "
            f"{first['kind']} of {_size(first['in_bytes'])} where the group's other ranks issued "
            f"{first['kind_major']} of {_size(first['size_major'])}"
            + (f"; {len(g)} of its collectives disagree from there on" if len(g) > 1 else "")
            + ("" if known else " (this may be two groups, not a desync)")
        )
        findings.append(Finding("error" if known else "warning", "cross-rank", "mismatched-collective", message,
                                (int(rank),), None if pd.isna(first["layer"]) else int(first["layer"]), module,
                                "timeline"))  # fmt: skip
    for group, g in matching.counts.groupby("group", sort=False):
        common = int(g["n"].mode().iloc[0])
        for r in g[g["n"] != common].itertuples():
            findings.append(Finding("warning", "cross-rank", "collective-count",
                                    f"{_group(group)}: {count(int(r.n), 'collective')} where most of its ranks issued "
                                    f"{common}",
                                    (int(r.rank),), page="collectives"))  # fmt: skip
    # (unpaired sends and receives: sptrace.checks.p2p names each)
    caller_notes = notes
    notes = [n for n in matching.notes if "found no partner" not in n and "disagree in kind or size" not in n]
    m = matching.matched
    m = m[m["n_ranks"] > 1] if len(m) else m  # a collective seen on one rank matched nothing
    straggler = _straggler(m)
    if straggler is not None:
        findings.append(straggler)
    elif len(m) and m["arrival_skew_us"].notna().any():
        notes.append(
            f"no rank arrives last more often than chance ({count(len(m), 'collective')} matched across ranks; the "
            f"largest arrival skew is {m['arrival_skew_us'].max() / 1e3:.2f} ms): no straggler"
        )
    findings = merge_ranks([*merge_ranks(findings), *also])
    return CrossRankReport(frame, findings, len(m), skipped, [*notes, *caller_notes])


def _straggler(m: pd.DataFrame) -> Finding | None:
    """The rank that arrives last far more often than chance: with n ranks each is last in 1/n of
    the collectives by luck; one rank last in at least 3 and at least twice its share is named.
    The largest skew is reported with the rank that caused it, which may be another."""
    if not len(m) or not m["arrival_skew_us"].notna().any():
        return None
    counts = m["straggler"].dropna().astype(int).value_counts()
    if counts.empty:
        return None
    rank, times = int(counts.index[0]), int(counts.iloc[0])
    share = float((1.0 / m["n_ranks"]).sum())  # the count chance alone gives one rank
    if times < 3 or times < 2 * share:
        return None
    mine = m[m["straggler"] == rank]
    worst_mine = mine.loc[mine["arrival_skew_us"].idxmax()]
    worst = m.loc[m["arrival_skew_us"].idxmax()]
    text = (
        f"arrived last in {times} of {len(m)} matched collectives (chance: {share:.1f}); its largest arrival skew is "
        f"{worst_mine['arrival_skew_us'] / 1e3:.2f} ms ({worst_mine['kind']} #{worst_mine['key']}, "
        f"{worst_mine['module'] or 'no module'})"
    )
    if int(worst["straggler"]) != rank:
        text += (
            f"; the run's largest, {worst['arrival_skew_us'] / 1e3:.2f} ms ({worst['kind']} #{worst['key']}), "
            f"was rank {int(worst['straggler'])}'s"
        )
    return Finding("info", "cross-rank", "straggler", text, (rank,), page="timeline")


def _group(name: str) -> str:
    """'group 0' as `sptrace info` names it, or what the trace left unsaid."""
    return f"group {name}" if name != UNKNOWN_GROUP else "the process group the trace does not name"
