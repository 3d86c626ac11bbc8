"""Step-level collectives shared by the schemes: the gradient sync of replicated weights and
ZeRO-3 / FSDP2's parameter gathers and gradient reduce-scatters."""

from __future__ import annotations

from sptrace.costmodel.spec import Builder, params_per_layer
from sptrace.vocab.shape import ModelShape

_BLOCK = ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
_ATTN = ("attn.qkv", "attn.proj")

REPLICATED = {
    "megatron": ("norm1", "norm2"),
    "hybrid": ("norm1", *_ATTN, "norm2"),
    "ulysses": _BLOCK,
    "ring": _BLOCK,
    "usp": _BLOCK,
}
"""The weights each scheme keeps whole on every rank of the group (their gradients are summed
over it); the others are tensor-parallel shards."""

ZERO3 = {"hybrid": ("attn", _ATTN), "ulysses": ("block", _BLOCK), "ring": ("block", _BLOCK), "usp": ("block", _BLOCK)}
"""Under ZeRO-3, where FSDP2 wraps and which parameters it shards (Megatron has no ZeRO-3 here)."""

BUCKET_ORDER = ("mlp.fc2", "mlp.fc1", "norm2", "attn.proj", "attn.qkv", "norm1")
"""Reverse parameter order of a block, the order the reference models fill buckets in (like DDP)."""


def zero3(cfg: ModelShape) -> bool:
    return bool(cfg.zero3) and cfg.scheme in ZERO3


def grad_buckets(sizes_bytes: list[int], cap_bytes: int) -> list[int]:
    """Greedy buckets in the order given: a bucket closes when the next gradient would overflow it."""
    buckets: list[int] = []
    size = 0
    for s in sizes_bytes:
        if size and size + s > cap_bytes:
            buckets.append(size)
            size = 0
        size += s
    if size:
        buckets.append(size)
    return buckets


def _megatron_norms(b: Builder, *, attention_only: bool) -> None:
    """Megatron-Core's finalize_model_grads all-reduces the sequence-parallel norms' gradients, in
    the activation dtype, once per step; the articles' attention example has no norms."""
    cfg = b.cfg
    norms = sum(params_per_layer(cfg)[m] for m in REPLICATED["megatron"])
    if cfg.sp_size > 1 and not attention_only:
        shape = (cfg.layers * norms,)
        b.add(
            "backward",
            "all_reduce",
            "grad_sync",
            "all-reduce of the norm weights' gradients (finalize_model_grads)",
            shape,
            shape,
            per_layer=False,
        )


def _zero3(b: Builder, where: str, modules: tuple[str, ...], *, k: int, grad_bytes: int, sized: bool = True) -> None:
    """FSDP2 shards every parameter of the wrapped module, each padded to a multiple of P."""
    cfg, P = b.cfg, b.cfg.sp_size
    params = params_per_layer(cfg)
    shard_elems = sum(-(-params[m] // P) for m in modules)
    gathered = shard_elems * P
    W = sum(params[m] for m in modules) * cfg.layers
    for i in range(k):
        phase = "forward" if i == 0 else "backward"
        b.add(phase, "all_gather", where, f"ZeRO-3 parameter all-gather #{i + 1}", (shard_elems,), (gathered,))
    b.add(
        "backward",
        "reduce_scatter",
        where,
        f"ZeRO-3 gradient reduce-scatter ({f'{grad_bytes * 8}-bit' if sized else 'element size unknown'})",
        (gathered,),
        (shard_elems,),
        elem=grad_bytes,
        total_only=not sized,
    )
    b.notes.append(f"ZeRO-3 with k={k} parameter gathers per step (W = {W} weights)")


def collectives(b: Builder, *, k: int, attention_only: bool, grad_bytes: int, sized: bool = True) -> None:
    """Append the step's gradient and parameter collectives (``per_layer=False``). ``sized``:
    False when the gradients' element size is unknown (``grad_bytes`` is then a placeholder:
    the estimate says so, and the check compares those collectives by count alone)."""
    cfg = b.cfg
    if cfg.scheme == "megatron":
        _megatron_norms(b, attention_only=attention_only)
        return
    sharded: tuple[str, ...] = ()
    if zero3(cfg):
        where, sharded = ZERO3[cfg.scheme]
        _zero3(b, where, sharded, k=k, grad_bytes=grad_bytes, sized=sized)
    # the articles' attention example has only the four projections: no norms, no MLP
    synced = {m for m in REPLICATED[cfg.scheme] if m not in sharded and (m in _ATTN or not attention_only)}
    params = params_per_layer(cfg)
    sync = sum(params[m] for m in synced) * cfg.layers
    if not sync or cfg.sp_size <= 1:
        return
    if cfg.grad_bucket_mib is None and not attention_only:
        b.add(
            "backward", "all_reduce", "grad_sync",
            f"all-reduce of replicated gradients ({f'{grad_bytes * 8}-bit' if sized else 'element size unknown'}; "
            "bucket cap not declared, so the buckets are compared by their total)",
            (sync,), (sync,), per_layer=False, elem=grad_bytes, total_only=True,
        )  # fmt: skip
        b.notes.append("gradient bucket cap not declared (--grad-bucket-mib): all-reduces compared by total bytes")
        return
    if attention_only:
        buckets = [sync * grad_bytes]
    else:
        sizes = [params[m] * grad_bytes for _ in range(cfg.layers) for m in BUCKET_ORDER if m in synced]
        buckets = grad_buckets(sizes, int(cfg.grad_bucket_mib * 2**20))
    for i, nbytes in enumerate(buckets):
        elems = nbytes // grad_bytes
        b.add(
            "backward",
            "all_reduce",
            "grad_sync",
            f"all-reduce of replicated gradients, bucket {i} ({grad_bytes * 8}-bit)",
            (elems,),
            (elems,),
            per_layer=False,
            elem=grad_bytes,
        )
