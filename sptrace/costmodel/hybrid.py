"""The hybrid: Ulysses attention over all P ranks, Megatron's tensor-parallel MLP."""

from __future__ import annotations

from sptrace.costmodel import megatron, ulysses
from sptrace.costmodel.spec import Builder


def collectives(b: Builder, *, attention_only: bool) -> None:
    """One layer's collectives in execution order."""
    P = b.cfg.sp_size
    ulysses.attention_forward(b, P)
    if not attention_only:
        megatron.mlp_forward(b)
        megatron.mlp_backward(b)
    ulysses.attention_backward(b, P)
