"""Does a run communicate what its scheme must? Observed collectives per rank, layer and phase
against the cost model: missing, extra, wrong-size and wrongly-placed collectives, wire bytes
per step, and the skew and stragglers of the matched collectives."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sptrace.checks.findings import Finding
from sptrace.costmodel.comm import CommEstimate
from sptrace.detect.matching import Matching
from sptrace.units import human_bytes

Sig = tuple[str, str, int]  # (phase, kind, in_bytes)


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

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        def clean(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return [
                {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in r.items()}
                for r in frame.to_dict(orient="records")
            ]

        out: dict[str, Any] = {
            "scheme": self.scheme,
            "match": self.ok,
            "ranks": clean(self.ranks),
            "layers": clean(self.layers),
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes,
        }
        if self.matching is not None:
            out["clock_offsets_us"] = self.matching.offsets_us
            out["matched_collectives"] = clean(self.matching.matched.drop(columns=["ranks"]))
        return out


def _expected_by_layer(est: CommEstimate) -> tuple[list[Sig], list[Sig]]:
    per_layer = [(c.phase, c.kind, c.in_bytes) for c in est.collectives if c.per_layer]
    per_step = [(c.phase, c.kind, c.in_bytes) for c in est.collectives if not c.per_layer]
    return per_layer, per_step


def _sig(row: Any) -> Sig:
    phase = "backward" if row.phase == "optimizer" else str(row.phase)
    size = int(row.in_bytes) if row.in_bytes is not None and not pd.isna(row.in_bytes) else -1
    return (phase, str(row.kind), size)


def check_collectives(
    frame: pd.DataFrame, est: CommEstimate, ranks: list[int], matching: Matching | None = None
) -> CommReport:
    """Compare every rank's collectives with ``est``. ``ranks``: the ranks that have traces."""
    per_layer, per_step = _expected_by_layer(est)
    per_layer_specs = [c for c in est.collectives if c.per_layer]
    L = est.layers
    findings: list[Finding] = []
    rank_rows, layer_rows = [], []
    for rank in ranks:
        obs = frame[frame["rank"] == rank]
        missing: list[tuple[Sig, int | None]] = []
        extra: list[tuple[Sig, int | None, str | None]] = []
        for layer in range(L):
            rows = list(obs[obs["layer"] == layer].itertuples())
            used = [False] * len(rows)
            unmet: list[int] = []
            # two passes: first the observed collective from the module the model names, then any
            # of the same phase, kind and size; what is left over is extra, with its own module
            for strict in (True, False):
                todo = range(len(per_layer_specs)) if strict else list(unmet)
                unmet = []
                for j in todo:
                    spec = per_layer_specs[j]
                    sig = (spec.phase, spec.kind, spec.in_bytes)
                    hit = next(
                        (
                            i
                            for i, r in enumerate(rows)
                            if not used[i] and _sig(r) == sig and (not strict or _from(r.module, spec.module))
                        ),
                        None,
                    )
                    if hit is None:
                        unmet.append(j)
                    else:
                        used[hit] = True
            missing += [
                ((per_layer_specs[j].phase, per_layer_specs[j].kind, per_layer_specs[j].in_bytes), layer) for j in unmet
            ]
            extra += [(_sig(r), layer, r.module) for i, r in enumerate(rows) if not used[i]]
            if not unmet and all(used):
                findings += _check_order(rank, layer, rows, per_layer_specs)
        # what no layer explained: collectives without a layer (FSDP2's post-backward traffic,
        # gradient syncs) may meet a layer's missing expectation or a step-level one; extras that
        # do have a layer may only meet step-level ones (never another layer's: that would hide
        # a misplaced collective behind a missing one)
        step_left = list(per_step)
        miss = list(missing)
        extras: list[tuple[Sig, int | None, str | None]] = []
        for r in obs[obs["layer"].isna() | (obs["layer"] >= L)].itertuples():
            sig = _sig(r)
            hit = next((i for i, (s, _) in enumerate(miss) if s == sig), None)
            if hit is not None:
                miss.pop(hit)
            elif sig in step_left:
                step_left.remove(sig)
            else:
                extras.append((sig, None, r.module))
        for s, layer, module in extra:
            if s in step_left:
                step_left.remove(s)
            else:
                extras.append((s, layer, module))
        miss += [(s, None) for s in step_left]
        findings += _explain(rank, miss, extras)
        # per layer: what the layer was expected to issue, less what is still missing there, plus
        # what is extra there (collectives no marker placed in a layer but that the pool matched
        # to a layer's expectation, e.g. FSDP2's post-backward reduce-scatter, count as present)
        for layer in range(L):
            for phase in ("forward", "backward"):
                expected = sum(1 for s in per_layer if s[0] == phase)
                gone = sum(1 for s, lay in miss if lay == layer and s[0] == phase)
                more = sum(1 for s, lay, _ in extras if lay == layer and s[0] == phase)
                layer_rows.append({
                    "rank": rank, "layer": layer, "phase": phase, "observed": expected - gone + more,
                    "expected": expected,
                })  # fmt: skip
        observed_wire = float(obs["wire_bytes"].fillna(0).sum())
        rank_rows.append({
            "rank": rank, "observed": len(obs), "expected": est.count(),
            "observed_wire_bytes": observed_wire, "expected_wire_bytes": est.wire_per_step(),
            "missing": len(miss), "extra": len(extras),
        })  # fmt: skip
    ranks_frame = pd.DataFrame(rank_rows)
    report = CommReport(est.scheme, ranks_frame, pd.DataFrame(layer_rows), findings, matching)
    if matching is not None and not matching.matched.empty:
        m = matching.matched
        worst = m.loc[m["arrival_skew_us"].idxmax()]
        counts = m["straggler"].value_counts()
        report.notes.append(
            f"largest arrival skew {worst['arrival_skew_us']:.0f} us ({worst['kind']} #{worst['key']}, "
            f"{worst['module'] or 'no module'}); rank {int(counts.index[0])} arrived last in "
            f"{int(counts.iloc[0])} of {len(m)} collectives"
        )
        report.notes += matching.notes
    return report


def _check_order(rank: int, layer: int, rows: list, specs: list) -> list[Finding]:
    """The layer issued every expected collective: did it issue them in the scheme's order?
    (ZeRO-3 parameter traffic is left out: FSDP prefetches it across layers.)"""
    ordered = [(c.phase, c.kind, c.in_bytes) for c in specs if not c.what.startswith("ZeRO-3")]
    wanted = Counter(ordered)
    seen = [_sig(r) for r in sorted(rows, key=lambda r: r.start_us)]
    seen = [s for s in seen if wanted[s] > 0]
    if seen == ordered:
        return []
    first = next(i for i, (a, b) in enumerate(zip(seen, ordered)) if a != b)
    got, want = seen[first], ordered[first]
    return [Finding(
        "warning", "collectives", "order",
        f"rank {rank}, layer {layer}: collective #{first + 1} is a {got[0]} {got[1]} of {human_bytes(got[2])}; "
        f"the scheme issues a {want[0]} {want[1]} of {human_bytes(want[2])} there",
        rank, layer,
    )]  # fmt: skip


def _from(observed_module: object, model_module: str) -> bool:
    return str(observed_module or "").endswith(model_module)


def _explain(rank: int, missing: list, extra: list) -> list[Finding]:
    """Pair what is missing with what is extra: same phase and kind, other size -> wrong-size;
    same kind and size, other phase -> wrong-phase; the rest stays missing / extra."""
    findings = []
    extra = list(extra)
    for (phase, kind, size), layer in missing:
        where = f"layer {layer} {phase}" if layer is not None else f"{phase} (step level)"
        same_size = next((e for e in extra if e[0][1] == kind and e[0][2] == size), None)
        # the nearest in size among the same phase and kind, in the same layer first
        place = [e for e in extra if e[0][0] == phase and e[0][1] == kind]
        place.sort(key=lambda e: (e[1] != layer, abs(np.log(max(e[0][2], 1) / max(size, 1)))))
        same_place = place[0] if place else None
        if same_place is not None:
            extra.remove(same_place)
            findings.append(Finding(
                "error", "collectives", "wrong-size",
                f"rank {rank}, {where}: a {kind} of {human_bytes(same_place[0][2])} "
                f"where the scheme sends {human_bytes(size)}",
                rank, layer, same_place[2],
            ))  # fmt: skip
        elif same_size is not None:
            extra.remove(same_size)
            findings.append(Finding(
                "error", "collectives", "wrong-phase",
                f"rank {rank}, {where}: the {kind} of {human_bytes(size)} ran in {same_size[0][0]} instead",
                rank, layer, same_size[2],
            ))  # fmt: skip
        else:
            findings.append(Finding(
                "error", "collectives", "missing-collective",
                f"rank {rank}, {where}: missing {kind} of {human_bytes(size)}", rank, layer,
            ))  # fmt: skip
    for (phase, kind, size), layer, module in extra:
        where = f"layer {layer} {phase}" if layer is not None else f"{phase}"
        findings.append(Finding(
            "error", "collectives", "extra-collective",
            f"rank {rank}, {where}: unexpected {kind} of {human_bytes(size)}" + (f" from {module}" if module else ""),
            rank, layer, module,
        ))  # fmt: skip
    return findings
