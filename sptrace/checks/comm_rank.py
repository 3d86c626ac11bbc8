"""One rank's collectives of one profiled step against the cost model (sptrace.checks.comm's
check_collectives runs it per rank and step): each layer's expected collectives met by the
observed ones, strictest first (the module the model names and its size; any module with that
size; the same phase and kind of a size the trace does not record), then what no layer explained
met by the step-level expectations. What is left becomes findings: missing, extra, wrong-size,
wrong-phase, wrong-group, out of order, or a size the trace does not record."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple, TypedDict

import numpy as np
import pandas as pd

from sptrace.checks.findings import Finding
from sptrace.costmodel.comm import CommEstimate
from sptrace.costmodel.spec import CollectiveSpec
from sptrace.detect.args import present
from sptrace.vocab.units import human_bytes

Sig = tuple[str, str, int | None]  # (phase, kind, in_bytes); None: the trace did not say
Missing = tuple[Sig, int | None]
"""An expected collective no observed one met: its signature and layer (None: step level)."""
Extra = tuple[Sig, int | None, str | None]
"""An observed collective no expectation met: its signature, layer and module."""


class Observed(NamedTuple):
    """The columns of an observed collective's row (sptrace.detect.collectives.COLUMNS) that the
    check reads."""

    layer: float | None
    """NaN or NA where the collective is in no layer."""
    phase: str
    kind: str
    module: str | None
    in_bytes: float | None
    out_bytes: float | None
    wire_bytes: float | None
    group_size: float | None
    start_us: float


class LayerRow(TypedDict):
    """One rank's collectives of one layer and phase: observed and expected counts."""

    rank: int
    layer: int
    phase: str
    observed: int
    expected: int


class RankRow(TypedDict):
    """One rank's collectives against the model (the mean over its steps where it has several)."""

    rank: int
    observed: float
    expected: int
    observed_wire_bytes: float
    expected_wire_bytes: float
    unknown_wire: float
    missing: float
    extra: float


def _expected_by_layer(est: CommEstimate) -> tuple[list[Sig], list[Sig]]:
    per_layer = [(c.phase, c.kind, c.in_bytes) for c in est.collectives if c.per_layer]
    per_step = [(c.phase, c.kind, c.in_bytes) for c in est.collectives if not c.per_layer and not c.total_only]
    return per_layer, per_step


def _sig(row: Observed) -> Sig:
    phase = "backward" if row.phase == "optimizer" else str(row.phase)
    size = int(row.in_bytes) if row.in_bytes is not None and not pd.isna(row.in_bytes) else None
    return (phase, str(row.kind), size)


def _fits(observed: Sig, expected: Sig) -> bool:
    """Same phase and kind, and the same size unless the trace does not know it."""
    return observed[:2] == expected[:2] and (observed[2] is None or observed[2] == expected[2])


def _take(pool: list[Sig] | list[Missing], sig: Sig, exact_only: bool) -> int | None:
    """Index of the first entry of ``pool`` (sigs, or (sig, ...) tuples) that fits ``sig``."""
    for i, item in enumerate(pool):
        got = item if isinstance(item[0], str) else item[0]
        if got == sig or (not exact_only and _fits(got, sig)) or (not exact_only and _fits(sig, got)):
            return i
    return None


def check_rank(rank: int, obs: pd.DataFrame, est: CommEstimate) -> tuple[list[Finding], list[LayerRow], RankRow]:
    """One rank's collectives of one profiled step against the model: (findings, rows per layer
    and phase, the rank's row)."""
    per_layer, per_step = _expected_by_layer(est)
    per_layer_specs = [c for c in est.collectives if c.per_layer]
    totals = [c for c in est.collectives if c.total_only]
    L = est.layers
    findings: list[Finding] = []
    layer_rows: list[LayerRow] = []
    # once per rank (split by layer below), of the columns the check reads: itertuples costs per column
    observed = [Observed._make(r) for r in obs[list(Observed._fields)].itertuples(index=False, name=None)]
    missing: list[Missing] = []
    extra: list[Extra] = []
    unsized: list[Extra] = []
    for layer in range(L):
        rows = [r for r in observed if not pd.isna(r.layer) and r.layer == layer]
        used = [False] * len(rows)
        unmet: list[int] = list(range(len(per_layer_specs)))
        # passes, strictest first: the observed collective from the module the model names
        # with the model's size; from any module with that size; then one of the same phase
        # and kind whose size the trace does not know. What is left over is extra.
        for strict, exact in ((True, True), (False, True), (False, False)):
            todo, unmet = unmet, []
            for j in todo:
                spec = per_layer_specs[j]
                sig = (spec.phase, spec.kind, spec.in_bytes)
                hit = next(
                    (
                        i
                        for i, r in enumerate(rows)
                        if not used[i]
                        and (_sig(r) == sig if exact else _fits(_sig(r), sig))
                        and (not strict or _from(r.module, spec.module))
                    ),
                    None,
                )
                if hit is None:
                    unmet.append(j)
                else:
                    used[hit] = True
                    if _sig(rows[hit])[2] is None:
                        unsized.append((sig, layer, rows[hit].module))
                    else:
                        findings += _compare(rank, layer, spec, rows[hit])
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
    extras: list[Extra] = []
    leftovers = [(_sig(r), None, r.module) for r in observed if pd.isna(r.layer) or r.layer >= L]
    for exact in (True, False):
        pending, leftovers = leftovers, []
        for sig, layer, module in pending:
            hit = _take(miss, sig, exact)
            if hit is not None:
                if sig[2] is None:
                    unsized.append((miss[hit][0], miss[hit][1], module))
                miss.pop(hit)
                continue
            hit = _take(step_left, sig, exact)
            if hit is not None:
                if sig[2] is None:
                    unsized.append((step_left[hit], None, module))
                step_left.pop(hit)
                continue
            leftovers.append((sig, layer, module))
    for sig, layer, module in extra:
        hit = _take(step_left, sig, exact_only=False)
        if hit is not None:
            if sig[2] is None:
                unsized.append((step_left[hit], None, module))
            step_left.pop(hit)
        else:
            leftovers.append((sig, layer, module))
    # gradient buckets the model cannot count: what is left of their kind, compared in total
    for spec in totals:
        mine = [e for e in leftovers if e[0][:2] == (spec.phase, spec.kind) and e[1] is None]
        leftovers = [e for e in leftovers if e not in mine]
        if est.grad_bytes is None and mine:
            findings.append(Finding(
                "warning", "collectives", "grad-dtype-unknown",
                f"{spec.phase} (step level): {len(mine)} {spec.kind}s of gradients, "
                f"{human_bytes(sum(int(e[0][2] or 0) for e in mine))} in all; their element size is neither "
                "declared (--grad-dtype) nor recorded in the trace, so their bytes are not checked",
                (rank,), page="collectives",
            ))  # fmt: skip
        elif any(e[0][2] is None for e in mine):
            unsized.append(((spec.phase, spec.kind, spec.in_bytes), None, "grad_sync"))
        elif sum(int(e[0][2] or 0) for e in mine) != spec.in_bytes:
            got = sum(int(e[0][2] or 0) for e in mine)
            findings.append(Finding(
                "error", "collectives", "wrong-size",
                f"{spec.phase} (step level): {len(mine)} {spec.kind}s of {human_bytes(got)} in all, where the "
                f"scheme sends {human_bytes(spec.in_bytes)} of gradients", (rank,), page="collectives",
            ))  # fmt: skip
    extras = leftovers
    miss += [(s, None) for s in step_left]
    findings += _explain(rank, miss, extras)
    for sig, layer, module in unsized:
        where = f"layer {layer} {sig[0]}" if layer is not None else f"{sig[0]} (step level)"
        findings.append(Finding(
            "warning", "collectives", "size-unknown",
            f"{where}: {_a(sig[1])} where the scheme sends {human_bytes(sig[2])}; the trace does not record its "
            "size", (rank,), layer, module, page="collectives",
        ))  # fmt: skip
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
    observed_wire = float(obs["wire_bytes"].dropna().sum())
    return findings, layer_rows, {
        "rank": rank, "observed": len(obs), "expected": est.count(),
        "observed_wire_bytes": observed_wire, "expected_wire_bytes": est.wire_per_step(),
        "unknown_wire": int(obs["wire_bytes"].isna().sum()), "missing": len(miss), "extra": len(extras),
    }  # fmt: skip


def _a(kind: str) -> str:
    """'an all_gather', 'a reduce_scatter'."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _compare(rank: int, layer: int, spec: CollectiveSpec, row: Observed) -> list[Finding]:
    """A collective matched to the model's by phase, kind and input bytes: do its group, output
    bytes and wire bytes agree too? (A MATCH claims all of them.) An unknown group is said, never
    taken for the model's."""
    if spec.kind in ("send", "recv"):
        return []
    where = f"layer {layer} {spec.phase}: {_a(spec.kind)}"
    module = row.module if isinstance(row.module, str) and row.module else None

    def finding(severity: str, code: str, text: str) -> list[Finding]:
        return [Finding(severity, "collectives", code, f"{where} {text}", (rank,), layer, module, page="collectives")]

    if not present(row.group_size):
        return finding(
            "warning", "group-unknown",
            f"of {human_bytes(spec.in_bytes)} whose group the trace does not record (the scheme's has "
            f"{spec.group_size} ranks): its wire bytes cannot be checked",
        )  # fmt: skip
    group = int(row.group_size)
    if group != spec.group_size:
        wire = (
            f" ({human_bytes(float(row.wire_bytes))} on the wire, not {human_bytes(spec.wire_bytes)})"
            if present(row.wire_bytes)
            else ""
        )
        return finding(
            "error", "wrong-group",
            f"of {human_bytes(spec.in_bytes)} in a group of {group} ranks where the scheme's has "
            f"{spec.group_size}{wire}",
        )  # fmt: skip
    if present(row.out_bytes) and int(row.out_bytes) != spec.out_bytes:
        return finding(
            "error", "wrong-size",
            f"that returns {human_bytes(int(row.out_bytes))} where the scheme's returns {human_bytes(spec.out_bytes)}",
        )  # fmt: skip
    return []


def _check_order(rank: int, layer: int, rows: list[Observed], specs: list[CollectiveSpec]) -> list[Finding]:
    """The layer issued every expected collective: did it issue them in the scheme's order?
    (ZeRO-3 parameter traffic is left out: FSDP prefetches it across layers.)"""
    ordered = [(c.phase, c.kind, c.in_bytes) for c in specs if not c.what.startswith("ZeRO-3")]
    wanted = Counter(ordered)
    seen = [_sig(r) for r in sorted(rows, key=lambda r: r.start_us)]
    if any(s[2] is None for s in seen):
        return []  # sizes unknown: the order of same-kind collectives cannot be told apart
    seen = [s for s in seen if wanted[s] > 0]
    if seen == ordered:
        return []
    first = next(i for i, (a, b) in enumerate(zip(seen, ordered)) if a != b)
    got, want = seen[first], ordered[first]
    return [Finding(
        "warning", "collectives", "order",
        f"layer {layer}: collective #{first + 1} is a {got[0]} {got[1]} of {human_bytes(got[2] or 0)}; "
        f"the scheme issues a {want[0]} {want[1]} of {human_bytes(want[2] or 0)} there",
        (rank,), layer, page="timeline",
    )]  # fmt: skip


def _from(observed_module: object, model_module: str) -> bool:
    return str(observed_module or "").endswith(model_module)


def _explain(rank: int, missing: list[Missing], extra: list[Extra]) -> list[Finding]:
    """Pair what is missing with what is extra: same phase and kind, other size -> wrong-size;
    same kind and size, other phase -> wrong-phase; the rest stays missing / extra."""
    findings = []
    extra = list(extra)
    for (phase, kind, size), layer in missing:
        where = f"layer {layer} {phase}" if layer is not None else f"{phase} (step level)"
        same_size = next((e for e in extra if e[0][1] == kind and e[0][2] == size), None)
        # the nearest in size among the same phase and kind, in the same layer first
        place = [e for e in extra if e[0][0] == phase and e[0][1] == kind and e[0][2] is not None]
        place.sort(key=lambda e: (e[1] != layer, abs(np.log(max(e[0][2], 1) / max(size, 1)))))
        same_place = place[0] if place else None
        if same_place is not None:
            extra.remove(same_place)
            findings.append(Finding(
                "error", "collectives", "wrong-size",
                f"{where}: {_a(kind)} of {human_bytes(same_place[0][2])} where the scheme sends {human_bytes(size)}",
                (rank,), layer, same_place[2], page="collectives",
            ))  # fmt: skip
        elif same_size is not None:
            extra.remove(same_size)
            findings.append(Finding(
                "error", "collectives", "wrong-phase",
                f"{where}: the {kind} of {human_bytes(size)} ran in {same_size[0][0]} instead",
                (rank,), layer, same_size[2], page="timeline",
            ))  # fmt: skip
        else:
            findings.append(Finding(
                "error", "collectives", "missing-collective",
                f"{where}: missing {kind} of {human_bytes(size)}", (rank,), layer, page="collectives",
            ))  # fmt: skip
    for (phase, kind, size), layer, module in extra:
        where = f"layer {layer} {phase}" if layer is not None else f"{phase}"
        size_text = "unknown size" if size is None else human_bytes(size)
        findings.append(Finding(
            "error", "collectives", "extra-collective",
            f"{where}: unexpected {kind} of {size_text}" + (f" from {module}" if module else ""),
            (rank,), layer, module, page="collectives",
        ))  # fmt: skip
    return findings
