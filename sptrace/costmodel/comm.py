"""Collectives per layer and per step, with shapes and wire bytes (SPEC.md §1-2): one module per
scheme appends its per-layer collectives, grads the step's gradient and ZeRO-3 ones."""

from __future__ import annotations

import dataclasses
from typing import Any

from sptrace.costmodel import grads, hybrid, megatron, ring, ulysses, usp
from sptrace.costmodel.spec import (
    KINDS,
    NEEDS,
    PHASES,
    Builder,
    CollectiveSpec,
    CommEstimate,
    as_shape,
    needs,
    validate,
    wire_bytes,
)

__all__ = ["KINDS", "NEEDS", "PHASES", "CollectiveSpec", "CommEstimate", "as_shape", "estimate_comm", "wire_bytes"]

SCHEMES = {"megatron": megatron, "ulysses": ulysses, "hybrid": hybrid, "ring": ring, "usp": usp}


def estimate_comm(cfg: Any, *, k: int = 2, attention_only: bool = False, grad_bytes: int | None = 4) -> CommEstimate:
    """The collectives of one step of ``cfg.scheme`` (ZeRO-3 when ``cfg.zero3``), per rank.

    ``attention_only`` keeps the attention block alone (the first article's first example).
    ``grad_bytes`` is the element size of the gradient communication of replicated weights
    (DeepSpeed's fp32 default); None when unknown: the gradient collectives are then expected
    by phase and kind, compared in total, and their bytes left unjudged. ``k`` counts ZeRO-3
    parameter gathers per step (2: re-gathered for backward).
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
    return b.estimate(cfg.scheme + ("-zero3" if grads.zero3(cfg) else ""), k, grad_bytes)
