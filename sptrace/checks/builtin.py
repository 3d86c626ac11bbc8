"""The run's own two checks, entries of the registry like any other (sptrace.checks.registry):

- COLLECTIVES: every rank's collectives against the cost model of the declared scheme (``sptrace
  analyze``), or, when the run leaves a size the model needs undeclared, the ranks against each
  other; sends and receives that pair with nothing count in either;
- SHARDING: the activations kept for backward are sequence-sharded (``sptrace check``, the gate).

Each returns a CheckReport whose ``detail`` keeps its typed report for the views that draw more
than findings (RunAnalysis.comm, .crossrank, .estimate, .p2p, .sharding read it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import prod

import pandas as pd

from sptrace.checks.comm import CommReport, check_collectives
from sptrace.checks.crossrank import CrossRankReport, check_cross_rank
from sptrace.checks.p2p import check_point_to_point
from sptrace.checks.registry import COLLECTIVES, SHARDING, CheckFacts, CheckOptions, CheckReport
from sptrace.checks.sharding import NEEDS as SHARDING_NEEDS
from sptrace.checks.sharding_verdict import check_sharding
from sptrace.costmodel import CommEstimate, estimate_comm
from sptrace.costmodel.activations import activation_bytes_at_dtype
from sptrace.costmodel.comm import undeclared_sizes
from sptrace.detect.allocations import Retention
from sptrace.resolve import activation_dtypes
from sptrace.vocab.dtypes import element_size
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import FIELDS, ModelShape
from sptrace.vocab.units import count, rank_ranges


@dataclass(frozen=True)
class CollectivesDetail:
    """The collectives check's typed reports: the cost model's estimate and the comparison with it
    (None when the run leaves a size it needs undeclared: ``unavailable`` says which), the ranks
    against each other (always), and the point-to-point analysis (None without sends)."""

    estimate: CommEstimate | None
    comm: CommReport | None
    crossrank: CrossRankReport | None
    unavailable: str | None


class CollectivesCheck:
    name = COLLECTIVES
    needs = frozenset({"collectives"})
    gate = False
    title = "collectives against the cost model"

    def run(self, facts: CheckFacts, model: ModelShape) -> CheckReport:
        ranks, options = list(facts.ranks), facts.options
        p2p_found = check_point_to_point(facts.p2p, ranks) if facts.p2p is not None else []
        p2p_notes = list(facts.p2p.notes) if facts.p2p is not None else []
        missing = (f"ranks without a trace: {rank_ranges(facts.missing_ranks)} ({len(facts.missing_ranks)} of "
                   f"{facts.world_size})") if facts.missing_ranks else None  # fmt: skip
        unavailable, estimate, grad_note = _estimate(facts.collectives, model, options)
        comm = None
        if estimate is not None:
            notes = [n for n in (grad_note, missing and f"{missing}; analysed the rest") if n]
            comm = check_collectives(facts.collectives, estimate, ranks, facts.matching, also=p2p_found,
                                     notes=[*notes, *p2p_notes], scope=_layers_scope(model))  # fmt: skip
        crossrank = check_cross_rank(facts.collectives, facts.matching, ranks, unavailable, also=p2p_found,
                                     notes=[*([missing] if missing else []), *p2p_notes])  # fmt: skip
        own = comm or crossrank
        detail = CollectivesDetail(estimate, comm, crossrank, unavailable)
        title = self.title if comm is not None else "collectives across ranks"
        return CheckReport(self.name, title, own.verdict, tuple(own.findings), tuple(own.notes),
                           gate=self.gate, unavailable=unavailable, detail=detail)  # fmt: skip


class ShardingCheck:
    name = SHARDING
    needs = frozenset({"sharding"})
    gate = True
    title = "activations kept for backward are sharded"

    def run(self, facts: CheckFacts, model: ModelShape) -> CheckReport:
        unavailable = model.why_missing(SHARDING_NEEDS, "the sharding check") or model.seq_split_problem()
        if unavailable is not None:
            return CheckReport(self.name, self.title, None, gate=self.gate, unavailable=unavailable)
        report = check_sharding(list(facts.retained), model, allow=facts.options.allow, strict=facts.options.strict,
                                expected_per_layer=activation_bytes_at_dtype(model),
                                notes=dtype_contradiction(model, facts.retained),
                                missing_ranks=list(facts.missing_ranks))  # fmt: skip
        return CheckReport(self.name, self.title, report.verdict, tuple(report.findings), tuple(report.notes),
                           gate=self.gate, detail=report)  # fmt: skip


BUILTIN = (CollectivesCheck(), ShardingCheck())


def dtype_contradiction(model: ModelShape, retained: tuple[Retention, ...]) -> list[str]:
    """The note when the trace's ops took the [B, S/P, H] activations in types other than the
    model's dtype: an error would stop mixed precision (autocast keeps an fp32 residual stream
    beside bf16 matmuls), so it is said, and the dtype kept for tensors that record no type."""
    seen = activation_dtypes(model, retained)
    if model.dtype is None or not seen or model.dtype in seen:
        return []
    return [f"the declared dtype {model.dtype} is not the trace's: its ops took the [B, S/P, H] = [{model.batch}, "
            f"{model.local_seq}, {model.hidden}] activations as {', '.join(sorted(seen))} (mixed precision?); a "
            f"tensor without a recorded type is read at {model.dtype}'s size"]  # fmt: skip


def _estimate(
    collectives: pd.DataFrame, model: ModelShape, options: CheckOptions
) -> tuple[str | None, CommEstimate | None, str | None]:
    """(why the cost model cannot run, its estimate, the note on the gradients' element size)."""
    scope = {"attention_only": options.attention_only, "grad_sync": options.grad_sync}
    unavailable, stand_in = cost_model_needs(model, **scope)
    if stand_in is None:
        return unavailable, None, None
    grad_bytes, grad_note = gradient_element_size(collectives, stand_in, options.grad_dtype, options.k)
    try:
        estimate = estimate_comm(stand_in, k=options.k, grad_bytes=grad_bytes, **scope)
    except (UsageError, ValueError) as exc:
        return str(exc), None, grad_note
    # what the user declared, not the stand-in values of sizes the estimate does not use
    return None, dataclasses.replace(estimate, cfg=model), grad_note


def _layers_scope(model: ModelShape) -> str | None:
    if not str(model.provenance.get("layers", "")).startswith("the trace"):
        return None
    return (f"for the {count(model.layers, 'layer')} the trace shows (L not declared: pass --layers, or a window that "
            "misses a layer compares fewer)")  # fmt: skip


def cost_model_needs(
    model: ModelShape, *, attention_only: bool = False, grad_sync: bool = True
) -> tuple[str | None, ModelShape | None]:
    """(why the cost model cannot run, naming every undeclared size it depends on; or the config
    to estimate with). Sizes whose value changes none of the scheme's collectives (F for
    Megatron-SP's) are not asked for (sptrace.costmodel.comm.undeclared_sizes)."""
    needed, stand_in = undeclared_sizes(model, attention_only=attention_only, grad_sync=grad_sync)
    if stand_in is not None:
        return None, stand_in
    gqa = "kv_heads" in needed and "heads" in needed
    flags = ", ".join(FIELDS[n][0] for n in needed if not (gqa and n == "kv_heads"))
    also = " (--kv-heads defaults to --heads)" if gqa else ""
    of = f" of {model.scheme}" if model.scheme else ""
    them = "it" if len(needed) == 1 else "them"
    return f"the cost model{of} needs {flags}{also}; pass {them}, or --config FILE", None


def gradient_element_size(
    collectives: pd.DataFrame, model: ModelShape, declared: str | None, k: int = 2
) -> tuple[int | None, str | None]:
    """(bytes, note) of the gradients' element: declared, else the one dtype of the trace's
    gradient collectives (those of the scheme's gradient kinds, in backward, outside every layer
    or of exactly the element count the model gives them), else unknown. A declaration the trace
    contradicts is an error naming both."""
    if model.scheme == "megatron":  # its step-level all-reduce is the norms', in the activation dtype
        return 4, None
    seen: set[str] = set()
    if len(collectives):
        try:
            shape = estimate_comm(model, k=k, grad_bytes=None)
        except (UsageError, ValueError):
            shape = None
        grads = [c for c in shape.collectives if c.module == "grad_sync" or "gradient" in c.what] if shape else []
        kinds = {c.kind for c in grads}
        counts = {prod(c.in_shape) for c in grads}
        c = collectives
        rows = c[c["kind"].isin(kinds) & c["phase"].isin(["backward", "optimizer"])
                 & (c["layer"].isna() | c["in_elems"].isin(counts))]  # fmt: skip
        seen = {str(d) for d in rows["dtype"].dropna() if element_size(d)}
    if declared is not None:
        size = element_size(declared)
        if size is None:
            raise UsageError(f"--grad-dtype {declared!r} is not a dtype")
        if seen and {element_size(d) for d in seen} != {size}:
            raise UsageError(
                f"--grad-dtype {declared} contradicts the trace: its gradient collectives are {', '.join(sorted(seen))}"
            )
        return size, None
    if len({element_size(d) for d in seen}) == 1:
        dtype = sorted(seen)[0]
        size = element_size(dtype)
        return size, f"gradient element size {size} bytes: the trace's gradient collectives are {dtype}"
    return None, (
        "gradient element size unknown (pass --grad-dtype): the gradient collectives are compared by count, not bytes"
    )
