"""The sharding verdict: ``check_sharding`` judges every allocation alive at a forward ->
backward boundary of every rank and concludes, in a ``ShardingReport``.

Each retained tensor has a holder from evidence (sptrace.detect.holders) and a class (sptrace.
checks.sharding's Judge). The gate fails closed:
  FAIL           on positive evidence: a full-sequence tensor that autograd or the model keeps
                 (outside ``allow``);
  PASS           only when every allocation alive at a boundary has a holder and a class, on every
                 rank of the run, each with memory events and a backward in its window;
  CANNOT DECIDE  otherwise, naming the tensors or ranks left undecided and the one step that
                 decides them.
``strict`` fails what would otherwise leave the verdict undecided (ambiguous, unknown).
What the verdict covered (ranks, layers, boundaries) is sptrace.checks.sharding_coverage's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from sptrace.checks.findings import Finding, Verdict
from sptrace.checks.sharding import CLASSES, JUDGED, Judge
from sptrace.checks.sharding_coverage import Coverage, coverage_of, covered_text
from sptrace.checks.sharding_findings import held_text, kept_findings
from sptrace.checks.sharding_peers import settle_by_peers
from sptrace.detect.allocations import Retention
from sptrace.detect.holders import HOLDERS, KEEPERS
from sptrace.detect.source_frames import source_texts
from sptrace.jsonable import records
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape
from sptrace.vocab.units import count, rank_text


@dataclass
class ShardingReport:
    model: ModelShape
    saved: pd.DataFrame
    """Every retained tensor of every rank, with its holder (``holder``, ``evidence``) and class
    (``class``, ``why``)."""
    findings: list[Finding]
    layers: pd.DataFrame
    """Per rank and layer: retained bytes, full bytes, and Korthikanti's expectation."""
    verdict: Verdict
    coverage: Coverage
    """What the verdict covered: ranks, layers, boundaries, memory events."""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict.status == "pass"

    def counts(self) -> dict[str, int]:
        """Classes of what the step keeps (autograd, the model): a backend's buffer or a
        parameter is not the step's, whatever its shape."""
        return _class_counts(self.saved)

    def holders(self) -> dict[str, int]:
        """Tensors per holder ("offloaded" only where a pack hook's copy was kept)."""
        counts = {h: int((self.saved["holder"] == h).sum()) for h in HOLDERS}
        return {h: n for h, n in counts.items() if n or h != "offloaded"}

    def to_dict(self) -> JSONObject:
        saved = self.saved.copy()
        saved["shape"] = saved["shape"].map(lambda s: list(s) if isinstance(s, (tuple, list)) else None)
        return {
            "ok": self.ok,
            "verdict": self.verdict.to_dict(),
            "coverage": self.coverage,
            "model": self.model.to_dict(),
            "counts": self.counts(),
            "holders": self.holders(),
            "findings": [f.to_dict() for f in self.findings],
            "layers": records(self.layers),
            "saved": records(saved.drop(columns=["alloc_ns", "free_ns", "decides", "call_key"], errors="ignore")),
            "notes": self.notes,
        }


def check_sharding(
    retained: list[Retention],
    model: ModelShape,
    *,
    allow: tuple[str, ...] = (),
    strict: bool = False,
    expected_per_layer: float | None = None,
    notes: Sequence[str] = (),
    missing_ranks: Sequence[int] = (),
) -> ShardingReport:
    """Judge every retained tensor of every rank and conclude. ``allow``: module globs that may
    keep full tensors; ``strict``: ambiguous and unknown tensors that could be full-size fail
    too; ``notes``: the caller's, after this check's own; ``missing_ranks``: ranks of the run
    without a trace (never judged: no PASS)."""
    judge = Judge(model, weights={w: where for r in retained for w, where in sorted(r.weight_widths.items())})
    frames = [r.tensors for r in retained if not r.tensors.empty]
    saved = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=retained[0].tensors.columns)
    classes = [
        judge.classify(
            tuple(s) if isinstance(s, (tuple, list)) else None, int(n),
            int(sb) if sb is not None and sb == sb else None, mod if isinstance(mod, str) else None,
            prod if isinstance(prod, str) else None, org if isinstance(org, str) else None,
            txt if isinstance(txt, str) else None, dt if isinstance(dt, str) else None,
            not (str(src).startswith("memory events") and not isinstance(prod, str)),
        )
        for s, n, sb, mod, prod, org, txt, dt, src in zip(
            saved["shape"], saved["nbytes"], saved["storage_bytes"], saved["module"],
            saved["producer"].fillna(saved["alloc_op"]), saved["origin"], saved["origin_text"], saved["dtype"],
            saved["source"])
    ]  # fmt: skip
    saved["made_at"] = source_texts(saved)  # (what the views show: 'model.py:52 in forward()')
    saved["class"] = [c for c, _ in classes]
    saved["why"] = [w for _, w in classes]
    could_be_full = saved["class"].isin(("full", "ambiguous", "unknown")).to_numpy()
    saved = settle_by_peers(saved, retained, could_be_full)  # (what no holder would leave undecided)
    saved["decides"] = [_decides(h, c) for h, c in zip(saved["holder"], saved["class"])]
    saved["group"] = [_group(h, c, d) for h, c, d in zip(saved["holder"], saved["class"], saved["decides"])]
    findings = kept_findings(saved, judge, allow, strict, stacks=any(r.has_stacks for r in retained))
    layers = _layer_table(saved, expected_per_layer)
    caller_notes = notes
    notes = list(dict.fromkeys(n for r in retained for n in r.notes))
    counts = _class_counts(saved)
    by_backend = saved[(saved["holder"] == "backend") & saved["class"].isin(("full", "ambiguous", "unknown"))]
    if len(by_backend):
        notes.append(
            f"{count(len(by_backend), 'full-size allocation')} alive at the boundary "
            f"{'is' if len(by_backend) == 1 else 'are'} a collective call's own "
            f"{'tensor' if len(by_backend) == 1 else 'tensors'} "
            f"({', '.join(sorted(set(by_backend['collective'].dropna())))}), "
            "held by the backend, which drops its reference on a thread the profiler does not record (not kept by "
            "the step)"
        )
    coverage = coverage_of(retained, saved, missing_ranks)
    verdict = _conclude(retained, saved, findings, model, counts, coverage, missing_ranks)
    return ShardingReport(model, saved, findings, layers, verdict, coverage, [*notes, *caller_notes])


def _class_counts(saved: pd.DataFrame) -> dict[str, int]:
    kept = saved[saved["holder"].isin(KEEPERS)]
    return {c: int((kept["class"] == c).sum()) for c in CLASSES}


def _decides(holder: object, cls: str) -> str:
    """What a retained tensor means for the verdict:
    settled           nothing to judge: the backend's or a parameter's, or a shard whoever holds it;
    judged            the step keeps it (autograd, the model) and its class is known;
    unjudged          the step keeps it, and it could be full-size but its class is not known;
    undecided-holder  it could be full-size and the trace does not say who holds it."""
    could_be_full = cls in ("full", "ambiguous", "unknown")
    if holder in ("backend", "parameter"):
        return "settled"
    if holder in KEEPERS:
        return "judged" if cls in (*JUDGED, "other") else "unjudged"
    return "undecided-holder" if could_be_full else "settled"


GROUPS = ("sharded", "full", "undecided", "other", "backend or parameter")
"""How a retained tensor is shown (the memory figure's stacks, the dashboard's filter): what the
step keeps by class, what no evidence decides, and what the backend or a parameter holds."""


def _group(holder: object, cls: str, decides: str) -> str:
    if decides in ("undecided-holder", "unjudged"):
        return "undecided"
    if holder in ("backend", "parameter"):
        return "backend or parameter"
    if cls == "full":
        return "full"
    return "sharded" if cls in ("seq-sharded", "head-sharded") else "other"


def _layer_table(saved: pd.DataFrame, expected_per_layer: float | None) -> pd.DataFrame:
    """Per rank and layer, the boundary (step, micro-batch) that kept the most: what the step's
    own holders (autograd, the model) keep, and the full-size part of it."""
    step_kept = saved[saved["layer"].notna() & saved["holder"].isin(KEEPERS)]
    rows = []
    if len(step_kept):  # one grouping by (rank, layer, boundary), not one per rank and layer
        stored = step_kept["storage_bytes"]
        per = pd.DataFrame({
            "rank": step_kept["rank"], "layer": step_kept["layer"],
            "_step": step_kept["step"].astype(float).fillna(-1),
            "_micro": step_kept["micro_batch"].astype(float).fillna(0),
            "n": 1, "judged": step_kept["class"].isin(JUDGED), "bytes": stored,
            "full": stored.where(step_kept["class"] == "full", 0),
        }).groupby(["rank", "layer", "_step", "_micro"]).sum()  # fmt: skip
        # each (rank, layer)'s boundary that kept the most (truncated as int() does): the first of equals
        kept = per["bytes"].astype(float).apply(math.trunc) if per["bytes"].dtype.kind == "f" else per["bytes"]
        worst = kept.groupby(level=[0, 1], sort=False).idxmax()
        for (rank, layer, *_), n, judged, measured, full in zip(
            worst.tolist(), *(per[c].loc[worst.tolist()].tolist() for c in ("n", "judged", "bytes", "full"))
        ):  # fmt: skip
            rows.append({
                "rank": int(rank), "layer": int(layer), "saved_tensors": int(n), "judged": int(judged),
                "measured_bytes": int(measured), "full_bytes": int(full), "expected_bytes": expected_per_layer,
            })  # fmt: skip
    return pd.DataFrame(
        rows, columns=["rank", "layer", "saved_tensors", "judged", "measured_bytes", "full_bytes", "expected_bytes"]
    )


def _conclude(
    retained: list[Retention], saved: pd.DataFrame, findings: list[Finding], model: ModelShape,
    counts: dict[str, int], coverage: Coverage, missing: Sequence[int],
) -> Verdict:  # fmt: skip
    errors = [f for f in findings if f.severity == "error"]
    judged = saved[saved["decides"] != "undecided-holder"]
    by_holder = saved["holder"].value_counts()
    held = ", ".join(f"{int(by_holder[h])} {held_text(h)}" for h in ("autograd", "model", "offloaded", "backend",
                                                                  "parameter") if by_holder.get(h, 0))  # fmt: skip
    summary = (
        f"{count(len(judged), 'tensor')} alive at the boundary judged on {covered_text(coverage)} "
        f"({counts['seq-sharded']} sequence-sharded, {counts['head-sharded']} head-sharded, {counts['full']} full; "
        f"{held})"
    )
    if errors:
        full = [f for f in errors if f.code == "full-size-save"]
        at = {b for f in full for b in f.boundaries}
        what = (
            f"{len(full)} full-size {'tensor' if len(full) == 1 else 'tensors'} kept for backward"
            + (f" (at {len(at)} boundaries)" if len(at) > 1 else "")
            if full
            else f"{len(errors)} unjudgeable {'tensor' if len(errors) == 1 else 'tensors'} (--strict)"
        )
        return Verdict("fail", "FAIL", f"{what}; {summary}")
    reasons: list[str] = []
    if missing:
        reasons.append(f"{rank_text(list(missing))} of the run {'has' if len(missing) == 1 else 'have'} no trace: "
                       "profile every rank (a stray on those ranks would go unseen)")  # fmt: skip
    no_backward = [r.rank for r in retained if r.boundary_ns is None]
    if no_backward:
        reasons.append(
            f"the profiled window has no backward on {rank_text(no_backward)}: what is kept for backward cannot be "
            "told from the rest; profile a whole training step"
        )
    blind = [r.rank for r in retained if not r.has_memory]
    if blind:
        reasons.append(
            f"{rank_text(blind)} {'has' if len(blind) == 1 else 'have'} no [memory] events, so what the model holds "
            "itself (a list, a hook, a cache) is not seen: profile with profile_memory=True"
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
    undecided = saved[saved["decides"] == "undecided-holder"]
    if len(undecided):
        reasons.append(
            f"{count(len(undecided), 'allocation')} that could be full-size {'has' if len(undecided) == 1 else 'have'} "
            f"no holder the trace can show ({_places(undecided)}): {undecided['evidence'].iloc[0]}; "
            "run the model under sptrace.instrument, whose census watches who releases each buffer a collective "
            "fills"
            + (
                ""
                if len(coverage["steps"]) > 1
                else " (or profile two steps, torch.profiler.schedule(wait=0, warmup=1, active=2): a buffer the "
                "backend released is often allocated again in the next step, and the same call in the other "
                "steps and on the other ranks shows what the code does with its buffer)"
            )
        )
    unjudged = saved[saved["decides"] == "unjudged"]
    if len(unjudged):
        shaped = unjudged["shape"].map(lambda x: isinstance(x, (tuple, list))).all()
        remedy = (
            "pass --heads and --ffn" if unjudged["why"].str.contains("--heads|--ffn").any()
            else "only the op that made it tells a tensor-parallel shard from a full tensor, and a trace recorded with "
            "record_shapes=True and with_stack=True (sptrace.profile_step's default) shows that op" if shaped
            else "profile with record_shapes=True, or run the model under sptrace.instrument for exact shapes"
        )  # fmt: skip
        reasons.append(
            f"{count(len(unjudged), 'tensor')} kept for backward that could be full-size cannot be judged "
            f"({_places(unjudged)}): {unjudged['why'].iloc[0]}; {remedy}"
        )
    if not reasons and not len(saved):
        reasons.append("nothing is alive at any forward/backward boundary, which no training step does: is the "
                       "backward in the window and the memory profiled?")  # fmt: skip
    if reasons:
        return Verdict("undecided", "CANNOT DECIDE", reasons[0], tuple(reasons))
    return Verdict(
        "pass",
        "PASS",
        f"every tensor alive at the boundary is sharded, or held by the backend or a parameter; {summary}",
    )


def _places(rows: pd.DataFrame) -> str:
    """'ranks 2, 6: layers.1, layers.2 [64x48]' (at most four modules)."""
    modules = sorted({m if isinstance(m, str) else "<unknown module>" for m in rows["module"]})
    shapes = sorted({"x".join(map(str, s)) if isinstance(s, (tuple, list)) else f"{n} bytes"
                     for s, n in zip(rows["shape"], rows["nbytes"])})  # fmt: skip
    more = ", ..." if len(modules) > 4 else ""
    return (f"{rank_text(sorted({int(r) for r in rows['rank']}))}: {', '.join(modules[:4])}{more}"
            f" [{', '.join(shapes[:3])}{', ...' if len(shapes) > 3 else ''}]")  # fmt: skip


def _hidden_in_heads(shape: tuple[int, ...], B: int, S: int, s: int, H: int) -> bool:
    """A [B, S', a, d] or [S', B, a, d] activation with a*d == H (S' = S or s = S/P): the hidden
    state split into heads, as an attention module alone takes it (DeepSpeed's DistributedAttention)."""
    if len(shape) != 4 or math.prod(shape[2:]) != H:
        return False
    lead = {tuple(shape[:2])}
    return bool(lead & {(B, s), (s, B), (B, S), (S, B)})
