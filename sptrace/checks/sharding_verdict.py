"""The sharding verdict: ``check_sharding`` classifies every retained tensor of every rank (with
sptrace.checks.sharding's Judge) and concludes, in a ``ShardingReport``.

FAIL on a full tensor (outside ``allow``); CANNOT DECIDE when the trace does not show enough (no
backward in the window, no retained tensor judged, a layer with none judged, a declared shape no
tensor has); else PASS. ``strict`` fails ambiguous and unknown tensors too.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd

from sptrace.checks.findings import Finding, Verdict, merge_ranks
from sptrace.checks.sharding import CLASSES, JUDGED, Judge
from sptrace.detect.allocations import Retention
from sptrace.jsonable import records
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape
from sptrace.vocab.units import count, human_bytes, rank_ranges


@dataclass
class ShardingReport:
    model: ModelShape
    saved: pd.DataFrame
    """Every retained tensor of every rank, with its class (``class``, ``why``)."""
    findings: list[Finding]
    layers: pd.DataFrame
    """Per rank and layer: retained bytes, full bytes, and Korthikanti's expectation."""
    verdict: Verdict
    notes: list[str] = field(default_factory=list)
    unseen_frees: dict[int, int] = field(default_factory=dict)
    """Per rank: allocations alive at the boundary whose free is not in the trace (not judged)."""

    @property
    def ok(self) -> bool:
        return self.verdict.status == "pass"

    def counts(self) -> dict[str, int]:
        return {c: int((self.saved["class"] == c).sum()) for c in CLASSES}

    def to_dict(self) -> JSONObject:
        saved = self.saved.copy()
        saved["shape"] = saved["shape"].map(lambda s: list(s) if isinstance(s, (tuple, list)) else None)
        return {
            "ok": self.ok,
            "verdict": self.verdict.to_dict(),
            "model": self.model.to_dict(),
            "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
            "layers": records(self.layers),
            "saved": records(saved.drop(columns=["alloc_ns", "free_ns"], errors="ignore")),
            "notes": self.notes,
            "unseen_frees": [{"rank": r, "allocations": n} for r, n in sorted(self.unseen_frees.items())],
        }


def check_sharding(
    retained: list[Retention],
    model: ModelShape,
    *,
    allow: tuple[str, ...] = (),
    strict: bool = False,
    expected_per_layer: float | None = None,
    notes: Sequence[str] = (),
) -> ShardingReport:
    """Classify every retained tensor of every rank and conclude. ``allow``: module globs that
    may keep full tensors; ``strict``: ambiguous and unknown tensors fail too; ``notes``: the
    caller's, after this check's own."""
    judge = Judge(model)
    frames = [r.tensors for r in retained if not r.tensors.empty]
    saved = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=retained[0].tensors.columns)
    for column in ("origin", "origin_text", "unseen_free"):
        if column not in saved:
            saved[column] = None
    classes = [
        judge.classify(
            tuple(s) if isinstance(s, (tuple, list)) else None, int(n),
            int(sb) if sb is not None and sb == sb else None, mod if isinstance(mod, str) else None,
            prod if isinstance(prod, str) else None, org if isinstance(org, str) else None,
            txt if isinstance(txt, str) else None,
        )
        for s, n, sb, mod, prod, org, txt in zip(
            saved["shape"], saved["nbytes"], saved["storage_bytes"], saved["module"],
            saved["producer"].fillna(saved["alloc_op"]), saved["origin"], saved["origin_text"])
    ]  # fmt: skip
    saved["class"] = [c for c, _ in classes]
    saved["why"] = [w for _, w in classes]
    unseen_mask = saved["unseen_free"].map(lambda v: v is True or v == 1).astype(bool)
    # a tensor whose free the trace does not show matters only if it would break the contract:
    # then the verdict cannot be PASS (nor FAIL: it may have died before the boundary)
    full_unseen = unseen_mask & (saved["class"] == "full")
    # the rest are counted (unseen_frees), not rows: whether gloo's thread freed them is a race,
    # and a report must not change with it
    keep = ~unseen_mask | full_unseen
    saved = saved[keep].reset_index(drop=True)
    unseen_mask = unseen_mask[keep].reset_index(drop=True)
    full_unseen = full_unseen[keep].reset_index(drop=True)
    if full_unseen.any():
        saved.loc[full_unseen, "why"] = "full-size, but its free is not in the trace: " + saved.loc[full_unseen, "why"]
        saved.loc[full_unseen, "class"] = "full-unknown-life"
    findings: list[Finding] = []
    judged = saved[~unseen_mask].rename(columns={"class": "cls"})[list(_Saved._fields)]
    for rec in map(_Saved._make, judged.itertuples(index=False, name=None)):
        cls = rec.cls
        if cls not in ("full", "ambiguous", "unknown") or (cls != "full" and not strict):
            continue
        module = rec.module or "<unknown module>"
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in allow):
            continue
        findings.append(_finding(rec, judge, strict))
    findings = merge_ranks(findings)
    layer_rows = []
    # per rank and layer, the boundary (step, micro-batch) that kept the most
    by_boundary = saved[saved["layer"].notna()].assign(
        _step=saved["step"].astype(float).fillna(-1), _micro=saved["micro_batch"].astype(float).fillna(0)
    )  # fmt: skip
    for (rank, layer), per_layer in by_boundary.groupby(["rank", "layer"]):
        worst = max((g for _, g in per_layer.groupby(["_step", "_micro"])), key=lambda g: int(g["storage_bytes"].sum()))
        layer_rows.append({
            "rank": int(rank), "layer": int(layer), "saved_tensors": len(worst),
            "judged": int(worst["class"].isin(JUDGED).sum()), "measured_bytes": int(worst["storage_bytes"].sum()),
            "full_bytes": int(worst[worst["class"] == "full"]["storage_bytes"].sum()),
            "expected_bytes": expected_per_layer,
        })  # fmt: skip
    layers = pd.DataFrame(
        layer_rows,
        columns=["rank", "layer", "saved_tensors", "judged", "measured_bytes", "full_bytes", "expected_bytes"],
    )
    caller_notes = notes
    notes = list(dict.fromkeys(n for r in retained for n in r.notes))
    unseen = sum(r.unseen_frees for r in retained)
    if unseen:
        notes.append(
            f"{unseen} allocations alive at the boundary were not judged: their free is not in the trace (gloo and "
            "NCCL release a collective's tensors on threads the profiler does not record)"
        )
    counts = {c: int((saved["class"] == c).sum()) for c in CLASSES}
    unseen_full = saved[full_unseen]
    if counts["ambiguous"]:
        notes.append(
            f"{count(counts['ambiguous'], 'tensor')} {'is' if counts['ambiguous'] == 1 else 'are'} ambiguous: "
            f"{_first_why(saved, 'ambiguous')}"
        )
    if counts["unknown"]:
        notes.append(
            f"{count(counts['unknown'], 'tensor')} without a shape, of a size that identifies nothing: not judged"
        )
    verdict = _conclude(retained, saved[~unseen_mask], findings, model, counts, strict, unseen_full)
    unseen_by_rank = {r.rank: r.unseen_frees for r in retained if r.unseen_frees}
    return ShardingReport(model, saved, findings, layers, verdict, [*notes, *caller_notes], unseen_by_rank)


class _Saved(NamedTuple):
    """The columns of a retained tensor's row (RETAINED_COLUMNS, its class and why) that its
    finding reads."""

    rank: int
    layer: float | None
    """NaN where the tensor is in no layer"""
    module: str | None
    shape: tuple[int, ...] | list[int] | None
    nbytes: int
    storage_bytes: int
    cls: str
    why: str
    holder: str | None
    alloc_op: str | None
    saved_by: str | None
    freed_in: str | None
    dtype: str | None
    boundary: str | None


def _first_why(saved: pd.DataFrame, cls: str) -> str:
    rows = saved[saved["class"] == cls]
    return str(rows["why"].iloc[0]) if len(rows) else ""


def _finding(rec: _Saved, judge: Judge, strict: bool) -> Finding:
    module = rec.module or "<unknown module>"
    shape = "x".join(map(str, rec.shape)) if isinstance(rec.shape, (tuple, list)) else f"{rec.nbytes} bytes"
    layer = int(rec.layer) if rec.layer is not None and rec.layer == rec.layer else None
    where = _boundary(rec)
    if rec.cls != "full":
        return Finding(
            "error", "sharding", f"{rec.cls}-tensor",
            f"{module} keeps a [{shape}] tensor across the forward/backward boundary{where} that cannot be judged "
            f"(--strict): {rec.why}",
            (int(rec.rank),), layer, module, page="memory",
        )  # fmt: skip
    storage = int(rec.storage_bytes)
    excess = storage - storage / judge.model.sp_size
    origin = [str(rec.holder)] if rec.holder else []
    if rec.alloc_op:
        origin.append(f"allocated by {rec.alloc_op}")
    if rec.saved_by and rec.saved_by != rec.freed_in:
        origin.append(f"saved by {rec.saved_by}")
    dtype = f"{rec.dtype} " if rec.dtype else ""
    return Finding(
        "error", "sharding", "full-size-save",
        f"{module} keeps a full-sequence [{shape}] {dtype}tensor across the forward/backward boundary{where} "
        f"({human_bytes(storage)}, {human_bytes(excess)} more than a 1/{judge.model.sp_size} shard"
        + (f"; {'; '.join(origin)}" if origin else "") + f"): {rec.why}",
        (int(rec.rank),), layer, module, page="memory",
    )  # fmt: skip


def _boundary(rec: _Saved) -> str:
    """' of step 3, micro-batch 1' where the trace has several boundaries, else ''."""
    label = rec.boundary
    return f" of {label}" if isinstance(label, str) and label else ""


def _conclude(
    retained: list[Retention], saved: pd.DataFrame, findings: list[Finding], model: ModelShape,
    counts: dict[str, int], strict: bool, unseen_full: pd.DataFrame,
) -> Verdict:  # fmt: skip
    judged = sum(counts[c] for c in JUDGED)
    errors = [f for f in findings if f.severity == "error"]
    by_size = int((saved["class"].isin(JUDGED) & ~saved["shape"].map(lambda s: isinstance(s, (tuple, list)))).sum())
    summary = (
        f"{count(judged, 'retained tensor')} judged on {count(len(retained), 'rank')} "
        f"({counts['seq-sharded']} sequence-sharded, "
        f"{counts['head-sharded']} head-sharded, {counts['full']} full"
        + (f"; {by_size} by size alone, with no recorded shape" if by_size else "")
        + ")"
    )
    if errors:
        full = [f for f in errors if f.code == "full-size-save"]
        what = (
            f"{len(full)} full-size {'tensor' if len(full) == 1 else 'tensors'} kept for backward"
            if full
            else f"{len(errors)} unjudgeable {'tensor' if len(errors) == 1 else 'tensors'} (--strict)"
        )
        return Verdict("fail", "FAIL", f"{what}; {summary}")
    reasons: list[str] = []
    no_backward = [r.rank for r in retained if r.boundary_ns is None]
    if no_backward:
        reasons.append(
            f"the profiled window has no backward on {_ranks(no_backward)}: what is kept for backward cannot be told "
            "from the rest; profile a whole training step"
        )
    blind = [r.rank for r in retained if not r.has_records and not r.has_memory]
    if blind:
        reasons.append(
            f"{_ranks(blind)} have neither [memory] events nor sptrace.saved records: profile with "
            "profile_memory=True (sptrace.instrument adds exact shapes)"
        )
    if not reasons:
        B, S, H, P, s = model.batch, model.seq, model.hidden, model.sp_size, model.local_seq
        residual = {(B, s, H), (s, B, H), (B * s, H), (B, S, H), (S, B, H), (B * S, H)}
        if B == 1:
            residual |= {(s, H), (S, H)}
        seen = set().union(*(r.shapes_seen for r in retained))
        if seen and not residual & seen and not any(_hidden_in_heads(shape, B, S, s, H) for shape in seen):
            reasons.append(
                f"the declared shape (B={B}, S={S}, H={H}, P={P}) matches no tensor in the trace: no op took a "
                f"[B, S/P, H] = [{B}, {s}, {H}] activation (in any layout); is the declared config right?"
            )
    if not reasons:
        token_dims = saved["class"].isin(JUDGED).any()
        if not token_dims:
            if len(saved) and not saved["shape"].map(lambda s: isinstance(s, (tuple, list))).any():
                reasons.append(
                    f"no retained tensor could be judged: none has a known shape ({len(saved)} by bytes only)"
                )
            else:
                reasons.append(
                    f"the declared shape (B={model.batch}, S={model.seq}, S/P={model.local_seq}, "
                    f"H={model.hidden}) matches no tensor the trace kept: is the declared config right?"
                    if counts["ambiguous"] == 0
                    else f"no retained tensor could be judged ({counts['ambiguous']} ambiguous)"
                )
        else:
            seen = sorted(set().union(*(r.layers_seen for r in retained)))
            judged_layers = set(saved[saved["class"].isin(JUDGED)]["layer"].dropna().astype(int))
            blank = [layer for layer in seen if layer not in judged_layers]
            if blank:
                reasons.append(
                    f"no retained tensor of layer{'s' if len(blank) > 1 else ''} {rank_ranges(blank)} could be judged"
                )
    if counts["ambiguous"] and not strict:
        rows = saved[saved["class"] == "ambiguous"]
        where = sorted({m or "<unknown module>" for m in rows["module"]})
        reasons.append(
            f"{counts['ambiguous']} retained {'tensor is' if counts['ambiguous'] == 1 else 'tensors are'} ambiguous "
            f"(in {', '.join(where[:4])}{', ...' if len(where) > 4 else ''}): {rows['why'].iloc[0]}"
        )
    if len(unseen_full):
        where = sorted({m or "<unknown module>" for m in unseen_full["module"]})
        reasons.append(
            f"{len(unseen_full)} full-size {'allocation has' if len(unseen_full) == 1 else 'allocations have'} no "
            f"recorded free (in {', '.join(where[:4])}{', ...' if len(where) > 4 else ''}): a collective's backend "
            "may have released it on a thread the profiler does not record, or a Python reference still holds it; "
            "the trace cannot tell which (on CUDA the allocator's count decides)"
        )
    if reasons:
        return Verdict("undecided", "CANNOT DECIDE", reasons[0], tuple(reasons))
    caveats = []
    if counts["unknown"] and not strict:
        caveats.append(f"{count(counts['unknown'], 'tensor')} of unknown shape not judged")
    text = f"every judged tensor is sharded; {summary}" + (f"; {', '.join(caveats)}" if caveats else "")
    return Verdict("pass", "PASS", text, tuple(caveats))


def _hidden_in_heads(shape: tuple[int, ...], B: int, S: int, s: int, H: int) -> bool:
    """A [B, S', a, d] or [S', B, a, d] activation with a*d == H (S' = S or s = S/P): the hidden
    state split into heads, as an attention module alone takes it (DeepSpeed's DistributedAttention)."""
    if len(shape) != 4 or math.prod(shape[2:]) != H:
        return False
    lead = {tuple(shape[:2])}
    return bool(lead & {(B, s), (s, B), (B, S), (S, B)})


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)
