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

Sig = tuple[str, str, int]  # (phase, kind, in_bytes)


def _human(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


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
        # pool: what no layer explained, against the step-level expectations
        unattributed = obs[obs["layer"].isna() | (obs["layer"] >= L)]
        pool_exp = Counter(s for s, _ in missing) + Counter(per_step)
        pool_obs = Counter(s for s, _, _ in extra) + Counter(_sig(r) for r in unattributed.itertuples())
        still_missing = pool_exp - pool_obs
        still_extra = pool_obs - pool_exp
        miss = _take(missing, still_missing)
        ext_attr = _take_extra(extra, still_extra)
        ext_rest = [(s, None, None) for s, n in still_extra.items() for _ in range(n)][len(ext_attr) :]
        extras = ext_attr + ext_rest
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


def _from(observed_module: object, model_module: str) -> bool:
    return str(observed_module or "").endswith(model_module)


def _take(missing: list[tuple[Sig, int | None]], remaining: Counter) -> list[tuple[Sig, int | None]]:
    left = Counter(remaining)
    out = []
    for s, layer in missing:
        if left[s] > 0:
            out.append((s, layer))
            left[s] -= 1
    for s, n in left.items():  # step-level expectations nobody met
        out += [(s, None)] * n
    return out


def _take_extra(extra: list[tuple[Sig, int | None, str | None]], remaining: Counter) -> list:
    left = Counter(remaining)
    out = []
    for s, layer, module in extra:
        if left[s] > 0:
            out.append((s, layer, module))
            left[s] -= 1
    return out


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
                f"rank {rank}, {where}: a {kind} of {_human(same_place[0][2])} where the scheme sends {_human(size)}",
                rank, layer, same_place[2],
            ))  # fmt: skip
        elif same_size is not None:
            extra.remove(same_size)
            findings.append(Finding(
                "error", "collectives", "wrong-phase",
                f"rank {rank}, {where}: the {kind} of {_human(size)} ran in {same_size[0][0]} instead",
                rank, layer, same_size[2],
            ))  # fmt: skip
        else:
            findings.append(Finding(
                "error", "collectives", "missing-collective",
                f"rank {rank}, {where}: missing {kind} of {_human(size)}", rank, layer,
            ))  # fmt: skip
    for (phase, kind, size), layer, module in extra:
        where = f"layer {layer} {phase}" if layer is not None else f"{phase}"
        findings.append(Finding(
            "error", "collectives", "extra-collective",
            f"rank {rank}, {where}: unexpected {kind} of {_human(size)}" + (f" from {module}" if module else ""),
            rank, layer, module,
        ))  # fmt: skip
    return findings
