"""Megatron-style tensor + sequence parallelism: all-gather before each column-parallel linear,
reduce-scatter after each row-parallel one, and their backward (SPEC.md §1)."""

from __future__ import annotations

from sptrace.costmodel.spec import Builder


def _shard_full(b: Builder) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A rank's sequence shard and the full sequence, sequence-first as Megatron and gloo's Input
    Dims list them."""
    P, B, S, H = b.cfg.sp_size, b.cfg.batch, b.cfg.seq, b.cfg.hidden
    return (S // P, B, H), (S, B, H)


def _qkv_width(b: Builder) -> int:
    return (b.cfg.heads + 2 * b.cfg.kv_heads) * b.cfg.head_dim


def mlp_forward(b: Builder) -> None:
    """AG before mlp.fc1 (column-parallel), RS after mlp.fc2 (row-parallel); also the hybrid's."""
    shard, full = _shard_full(b)
    b.add("forward", "all_gather", "mlp.fc1", "all-gather of the sequence before mlp.fc1", shard, full)
    b.add("forward", "reduce_scatter", "mlp.fc2", "reduce-scatter after mlp.fc2", full, shard)


def mlp_backward(b: Builder) -> None:
    """The MLP pair's backward: the output gradient gathered, the saved input re-gathered for the
    weight gradient, the input gradient reduce-scattered."""
    shard, full = _shard_full(b)
    b.add("backward", "all_gather", "mlp.fc2", "all-gather of the output gradient", shard, full)
    b.add("backward", "all_gather", "mlp.fc1", "all-gather of the SAVED input shard (weight gradient)", shard, full)
    b.add("backward", "reduce_scatter", "mlp.fc1", "reduce-scatter of the input gradient", full, shard)


def attention_forward(b: Builder) -> None:
    shard, full = _shard_full(b)
    B, S, P, g = b.cfg.batch, b.cfg.seq, b.cfg.sp_size, b.cfg.kv_heads
    b.add("forward", "all_gather", "attn.qkv", "all-gather of the sequence before attn.qkv", shard, full)
    if g < P:  # fewer kv heads than ranks: Megatron gathers the QKV output's last dim
        width = _qkv_width(b)
        b.add(
            "forward",
            "all_gather",
            "attn.qkv",
            "all-gather of the QKV output's last dim (GQA, g < P)",
            (width // P, B, S),
            (width, B, S),
        )
    b.add("forward", "reduce_scatter", "attn.proj", "reduce-scatter after attn.proj", full, shard)


def attention_backward(b: Builder) -> None:
    shard, full = _shard_full(b)
    B, S, P, g = b.cfg.batch, b.cfg.seq, b.cfg.sp_size, b.cfg.kv_heads
    b.add("backward", "all_gather", "attn.proj", "all-gather of the output gradient", shard, full)
    if g < P:  # the gather-last's backward runs before linear_qkv's
        width = _qkv_width(b)
        b.add(
            "backward",
            "reduce_scatter",
            "attn.qkv",
            "reduce-scatter of the QKV output gradient's last dim (GQA)",
            (width, B, S),
            (width // P, B, S),
        )
    b.add("backward", "all_gather", "attn.qkv", "all-gather of the SAVED input shard (weight gradient)", shard, full)
    b.add("backward", "reduce_scatter", "attn.qkv", "reduce-scatter of the input gradient", full, shard)


def collectives(b: Builder, *, attention_only: bool) -> None:
    """One layer's collectives in execution order."""
    attention_forward(b)
    if not attention_only:
        mlp_forward(b)
        mlp_backward(b)
    attention_backward(b)
