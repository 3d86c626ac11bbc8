"""Are the activations kept for backward sequence-sharded? Classify each saved tensor by shape
(and module), never by bytes alone when a shape is known, against the run's B, S, H and P.

  full            a full-sequence tensor at least H wide per token ([B, S, H], [S, B, H], [B*S, H],
                  [B, S, F]), or a view keeping such a storage alive: the contract is broken
  head-sharded    full sequence, a 1/P share of the width ([B, S, H/P], [B, a/P, S, d], [B, S, F/P])
  seq-sharded     a [B, S/P, ...] token shard
  other           no token dimension (weights, scalars)
  unknown         no shape, and a size that matches neither a full nor a sharded activation
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sptrace.checks.findings import Finding
from sptrace.units import human_bytes

CLASSES = ("full", "head-sharded", "seq-sharded", "other", "unknown")


@dataclass(frozen=True, slots=True)
class ShardingShape:
    """What classification needs to know about the step."""

    batch: int
    seq: int
    hidden: int
    sp_size: int
    element_size: int = 4

    def __post_init__(self) -> None:
        if min(self.batch, self.seq, self.hidden, self.sp_size, self.element_size) < 1:
            raise ValueError("batch, seq, hidden, sp_size and element size must be >= 1")
        if self.seq % self.sp_size:
            raise ValueError(f"seq {self.seq} is not divisible by sp_size {self.sp_size}")

    @property
    def full_bytes(self) -> int:
        return self.batch * self.seq * self.hidden * self.element_size

    @property
    def shard_bytes(self) -> int:
        return self.full_bytes // self.sp_size


def classify(shape: tuple[int, ...] | None, nbytes: int, storage_bytes: int, step: ShardingShape) -> tuple[str, str]:
    """(class, why) of one saved tensor."""
    B, S, H, P = step.batch, step.seq, step.hidden, step.sp_size
    s_local = S // P
    if shape:
        numel = math.prod(shape)
        full_tokens = [d for d in shape if d in (S, B * S)] if P > 1 else []
        n_full_seq = sum(1 for d in shape if d == S)
        if n_full_seq >= 2:  # attention scores [B, heads, S, S]
            return "head-sharded", "attention scores (full sequence twice, a share of the heads)"
        if full_tokens:
            tokens = B * S if (B * S in shape or (S in shape and B in shape)) else S
            width = numel / tokens
            if width >= H:
                cls, why = "full", f"full sequence, {width:.0f} wide per token (H = {H})"
            else:
                cls, why = "head-sharded", f"full sequence, {width:.0f} wide per token: a 1/{round(H / width)} share"
        elif any(d in (s_local, B * s_local) for d in shape):
            cls, why = "seq-sharded", f"a sequence shard ({s_local} of {S} tokens)"
        else:
            cls, why = "other", "no token dimension"
    elif nbytes == step.full_bytes:
        return "full", "no shape; exactly the size of a full [B, S, H] activation"
    elif nbytes == step.shard_bytes:
        return "seq-sharded", "no shape; exactly the size of a [B, S/P, H] shard"
    else:
        return "unknown", "no shape, and a size that identifies nothing"
    if cls != "full" and storage_bytes >= step.full_bytes and storage_bytes > nbytes:
        return "full", f"a view of {nbytes} bytes keeping a {storage_bytes}-byte storage alive"
    return cls, why


@dataclass
class ShardingReport:
    step: ShardingShape
    saved: pd.DataFrame
    """Every saved activation with its class."""
    findings: list[Finding]
    layers: pd.DataFrame
    """Per rank and layer: measured bytes kept, and Korthikanti's expectation."""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        saved = self.saved.copy()
        saved["shape"] = saved["shape"].map(lambda s: list(s) if s else None)
        return {
            "ok": self.ok,
            "step": {
                "batch": self.step.batch,
                "seq": self.step.seq,
                "hidden": self.step.hidden,
                "sp_size": self.step.sp_size,
                "element_size": self.step.element_size,
            },
            "findings": [f.to_dict() for f in self.findings],
            "layers": _records(self.layers),
            "saved": _records(saved.drop(columns=["alloc_ns", "free_ns"], errors="ignore")),
            "notes": self.notes,
        }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in frame.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()})
    return out


def check_sharding(
    saved: pd.DataFrame, step: ShardingShape, *, allow: tuple[str, ...] = (), expected_per_layer: float | None = None
) -> ShardingReport:
    """Classify every saved activation of every rank; a full one is an error unless its module
    matches an ``allow`` glob."""
    saved = saved.copy()
    classes = [
        classify(tuple(s) if s else None, int(n), int(sb) if sb == sb else int(n), step)
        for s, n, sb in zip(saved["shape"], saved["nbytes"], saved["storage_bytes"])
    ]
    saved["class"] = [c for c, _ in classes]
    saved["why"] = [w for _, w in classes]
    findings: list[Finding] = []
    for rec in saved[saved["class"] == "full"].to_dict(orient="records"):
        module = rec["module"] or "<unknown module>"
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in allow):
            continue
        shape = "x".join(map(str, rec["shape"])) if rec["shape"] else f"{rec['nbytes']} bytes"
        excess = rec["storage_bytes"] - rec["storage_bytes"] / step.sp_size
        origin = []
        if rec.get("alloc_op"):
            origin.append(f"allocated by {rec['alloc_op']}")
        if rec.get("saved_by") and rec.get("saved_by") != rec.get("freed_in"):
            origin.append(f"saved by {rec['saved_by']}")
        if rec.get("freed_in"):
            origin.append(f"for {rec['freed_in']}")
        findings.append(Finding(
            "error", "sharding", "full-size-save",
            f"rank {rec['rank']}: {module} keeps a full-sequence [{shape}] {rec['dtype'] + ' ' if rec['dtype'] else ''}"
            f"tensor for backward "
            f"({human_bytes(rec['storage_bytes'])}, {human_bytes(excess)} more than a 1/{step.sp_size} shard per layer"
            + (f"; {', '.join(origin)}" if origin else "") + f"): {rec['why']}",
            rec["rank"], rec["layer"] if rec["layer"] == rec["layer"] else None, module,
        ))  # fmt: skip
    layer_rows = []
    for (rank, layer), g in saved[saved["layer"].notna()].groupby(["rank", "layer"]):
        layer_rows.append({
            "rank": int(rank), "layer": int(layer), "saved_tensors": len(g),
            "measured_bytes": int(g["storage_bytes"].sum()),
            "full_bytes": int(g[g["class"] == "full"]["storage_bytes"].sum()),
            "expected_bytes": expected_per_layer,
        })  # fmt: skip
    notes = []
    unknown = int((saved["class"] == "unknown").sum())
    if unknown:
        notes.append(f"{unknown} saved tensors have no shape and a size that identifies nothing; not judged")
    return ShardingReport(step, saved, findings, pd.DataFrame(layer_rows), notes)


def render_junit(report: ShardingReport, ranks: list[int]) -> str:
    """JUnit XML: one test case per rank x module, failed when that module saves a full tensor."""
    from xml.sax.saxutils import quoteattr

    saved = report.saved
    cases = []
    failures = 0
    for rank in ranks:
        modules = sorted({m or "<unknown module>" for m in saved[saved["rank"] == rank]["module"]})
        for module in modules:
            bad = [f for f in report.findings if f.rank == rank and (f.module or "<unknown module>") == module]
            name = quoteattr(f"rank{rank}.{module}")
            if bad:
                failures += 1
                text = quoteattr("; ".join(f.message for f in bad))
                cases.append(
                    f'    <testcase classname="sptrace.sharding" name={name}><failure message={text}/></testcase>'
                )
            else:
                cases.append(f'    <testcase classname="sptrace.sharding" name={name}/>')
    head = f'  <testsuite name="sptrace check" tests="{len(cases)}" failures="{failures}" errors="0">'
    return "\n".join(
        ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>", head, *cases, "  </testsuite>", "</testsuites>", ""]
    )
