"""Collectives per layer and per step, with shapes and wire bytes (SPEC.md §1-2): one module per
scheme appends its per-layer collectives, grads the step's gradient and ZeRO-3 ones."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypedDict

from sptrace.costmodel import grads, hybrid, megatron, ring, ulysses, usp
from sptrace.costmodel.spec import (
    NEEDS,
    PHASES,
    Builder,
    CollectiveSpec,
    CommEstimate,
    DeclaresShape,
    as_shape,
    needs,
    validate,
)
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import ModelShape

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["NEEDS", "PHASES", "CollectiveSpec", "CommEstimate", "as_shape", "estimate_comm"]

SCHEMES = {"megatron": megatron, "ulysses": ulysses, "hybrid": hybrid, "ring": ring, "usp": usp}


def estimate_comm(
    cfg: ModelShape | DeclaresShape,
    *,
    k: int = 2,
    attention_only: bool = False,
    grad_bytes: int | None = 4,
    grad_sync: bool = True,
) -> CommEstimate:
    """The collectives of one step of ``cfg.scheme`` (ZeRO-3 when ``cfg.zero3``), per rank.

    ``attention_only`` keeps the attention block alone (the first article's first example).
    ``grad_bytes`` is the element size of the gradient communication of replicated weights
    (DeepSpeed's fp32 default); None when unknown: the gradient collectives are then expected
    by phase and kind, compared in total, and their bytes left unjudged. ``k`` counts ZeRO-3
    parameter gathers per step (2: re-gathered for backward). ``grad_sync`` False leaves out the
    step-level all-reduces of replicated gradients (a profiled window that ends before them).
    """
    if k not in (1, 2):
        raise ValueError("k (ZeRO-3 parameter gathers per step) must be 1 or 2")
    cfg = as_shape(cfg)
    cfg.require(needs(cfg.scheme), f"the cost model of {cfg.scheme or 'a scheme'}")
    validate(cfg)
    b = Builder(cfg)
    SCHEMES[cfg.scheme].collectives(b, attention_only=attention_only)
    if grad_bytes is None:  # buckets cannot be cut without the element size: compare totals
        b.cfg = dataclasses.replace(cfg, grad_bucket_mib=None)
    grads.collectives(b, k=k, attention_only=attention_only, grad_bytes=grad_bytes or 4, sized=grad_bytes is not None)
    if not grad_sync:
        b.collectives = [c for c in b.collectives if c.module != "grad_sync"]
        b.notes[:] = [n for n in b.notes if "bucket cap" not in n]
        b.notes.append("the step-level gradient all-reduces are left out (--no-grad-sync)")
    return b.estimate(cfg.scheme + ("-zero3" if grads.zero3(cfg) else ""), k, grad_bytes)


class EstimateOptions(TypedDict, total=False):
    """estimate_comm's keyword options, passed through by those that build estimates for it."""

    k: int
    attention_only: bool
    grad_bytes: int | None
    grad_sync: bool


SOMETIMES = ("heads", "kv_heads", "ffn")
"""Sizes that shape some schemes' collectives and not others' (Megatron-SP's all-gathers carry
[B, S, H] whatever F is): asked for only where they change the estimate."""


def undeclared_sizes(cfg: ModelShape, **options: Unpack[EstimateOptions]) -> tuple[list[str], ModelShape | None]:
    """(the undeclared fields the estimate of ``cfg`` depends on, a stand-in config to estimate
    with when it depends on none of them). ``options``: estimate_comm's.

    Whether a size matters is found by building the estimate with several stand-in values for
    it and comparing the collectives (kinds, shapes, bytes, groups): a field that changes none of
    them is not needed. Only SOMETIMES are tried; scheme, P, L, B, S, H and the dtype size every
    scheme's bytes."""
    missing = cfg.missing(needs(cfg.scheme))
    if not missing:
        return [], cfg
    open_ = [n for n in missing if n in SOMETIMES]
    fixed = [n for n in missing if n not in SOMETIMES]
    if not open_ or "scheme" in fixed or "sp_size" in fixed:
        return missing, None
    # the sizes every scheme needs get stand-ins too, so that one message names all that is needed
    P = cfg.sp_size
    stand = {"layers": 2, "batch": 2, "seq": 4 * P, "hidden": (cfg.heads or 1) * 24 * P, "dtype": "bfloat16",
             "ulysses_degree": P}  # fmt: skip
    base = dataclasses.replace(cfg, **{n: stand[n] for n in fixed if n in stand})
    signatures: dict[tuple, tuple] = {}
    for combo in _stand_ins(base, open_):
        trial = dataclasses.replace(base, **dict(zip(open_, combo)))
        try:
            estimate = estimate_comm(trial, **options)
        except (UsageError, ValueError):
            continue
        signatures[combo] = tuple(
            (c.phase, c.kind, c.module, c.in_shape, c.out_shape, c.in_bytes, c.out_bytes, c.group_size, c.per_layer,
             c.total_only)
            for c in estimate.collectives
        )  # fmt: skip
    if not signatures:  # no stand-in fits the declared sizes: every open field is needed
        return missing, None
    needed = list(fixed)
    for i, name in enumerate(open_):
        by_rest: dict[tuple, set] = {}
        for combo, sig in signatures.items():
            by_rest.setdefault(combo[:i] + combo[i + 1 :], set()).add(sig)
        if any(len(sigs) > 1 for sigs in by_rest.values()):
            needed.append(name)
    if needed:
        return [n for n in missing if n in needed], None
    first = next(iter(signatures))
    return [], dataclasses.replace(cfg, **dict(zip(open_, first)))


def _stand_ins(cfg: ModelShape, names: list[str]) -> list[tuple[int, ...]]:
    """Candidate values of the undeclared ``names`` (heads, kv_heads, ffn), given what is declared:
    head counts that divide H and are multiples of P (or of U), kv counts on both sides of P."""
    P, H = cfg.sp_size or 1, cfg.hidden or 1
    heads = [cfg.heads] if cfg.heads else [a for a in sorted({P, 2 * P, 3 * P, 4 * P, 8 * P, 1, 2, 4}) if H % a == 0]
    combos: list[tuple[int, ...]] = []
    for a in heads:
        kv = [cfg.kv_heads] if cfg.kv_heads else sorted({g for g in (a, P, max(1, P // 2), 1) if a % g == 0})
        ffn = [cfg.ffn] if cfg.ffn else [P * -(-4 * H // P), P * (-(-4 * H // P) + 1)]
        for g in kv:
            for f in ffn:
                values = {"heads": a, "kv_heads": g, "ffn": f}
                combos.append(tuple(values[n] for n in names))
    return list(dict.fromkeys(combos))
