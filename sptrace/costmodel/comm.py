"""Collectives per layer and per step, with shapes and wire bytes (SPEC.md §1-2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sptrace.errors import UsageError
from sptrace.shape import ModelShape

KINDS = (
    "all_gather", "reduce_scatter", "all_to_all", "all_reduce", "broadcast", "reduce", "gather", "scatter", "send",
    "recv", "send_recv", "barrier", "other",
)  # fmt: skip
PHASES = ("forward", "backward")


def wire_bytes(kind: str, in_bytes: int, out_bytes: int, group_size: int) -> float:
    """Bytes one rank sends for one collective under ring algorithms (nccl-tests' model).

    Rooted collectives as c10d records them on each rank: a scatter's root has the whole input
    (the others 0) and keeps its own chunk; a gather's non-roots send their input, the root
    (whose output is not 0) sends nothing; reduce chains the partial sums, one input each."""
    if kind == "send":
        return float(in_bytes)
    if kind == "recv":
        return 0.0
    if group_size <= 1:
        return 0.0
    r = (group_size - 1) / group_size
    if kind == "all_gather":
        return out_bytes * r
    if kind in ("reduce_scatter", "all_to_all"):
        return in_bytes * r
    if kind == "all_reduce":
        return 2 * in_bytes * r
    if kind == "broadcast":
        return float(in_bytes)
    if kind == "send_recv":
        return float(in_bytes)
    if kind == "scatter":
        return in_bytes * r
    if kind == "gather":
        return 0.0 if out_bytes else float(in_bytes)
    if kind == "reduce":
        return float(in_bytes)
    return 0.0


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """One collective a scheme issues, per layer (``per_layer``) or once per step."""

    phase: str  # forward | backward
    kind: str
    module: str  # where in the layer: "attn.qkv", "mlp.fc1", "grad_sync" ...
    what: str  # human description, e.g. "all-gather of the saved input shard (SPEC §1 row 6)"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_bytes: int
    out_bytes: int
    group_size: int
    per_layer: bool = True
    total_only: bool = False
    """Several collectives whose number the model cannot know (gradient buckets with no declared
    bucket cap): the observed ones are compared by their total bytes."""

    @property
    def wire_bytes(self) -> float:
        return wire_bytes(self.kind, self.in_bytes, self.out_bytes, self.group_size)


@dataclass(frozen=True)
class CommEstimate:
    """Everything a scheme communicates in one step."""

    scheme: str  # megatron | ulysses | ulysses-zero3 | hybrid | hybrid-zero3
    cfg: ModelShape
    collectives: tuple[CollectiveSpec, ...]
    k: int  # ZeRO-3 parameter gathers per step
    notes: tuple[str, ...] = field(default=())

    @property
    def layers(self) -> int:
        return self.cfg.layers

    def count(self, kind: str | None = None, phase: str | None = None, per_layer_only: bool = False) -> int:
        total = 0
        for c in self.collectives:
            if (kind and c.kind != kind) or (phase and c.phase != phase) or (per_layer_only and not c.per_layer):
                continue
            total += self.layers if c.per_layer else 1
        return total

    def wire_per_layer(self, kind: str | None = None, phase: str | None = None) -> float:
        return sum(
            c.wire_bytes
            for c in self.collectives
            if c.per_layer and (not kind or c.kind == kind) and (not phase or c.phase == phase)
        )

    def wire_per_step(self, kind: str | None = None, phase: str | None = None) -> float:
        return sum(
            c.wire_bytes * (self.layers if c.per_layer else 1)
            for c in self.collectives
            if (not kind or c.kind == kind) and (not phase or c.phase == phase)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "config": self.cfg.to_dict(),
            "k": self.k,
            "wire_bytes_per_layer": self.wire_per_layer(),
            "wire_bytes_per_step": self.wire_per_step(),
            "by_kind": {
                kind: {"count": self.count(kind), "wire_bytes": self.wire_per_step(kind)}
                for kind in KINDS
                if self.count(kind)
            },
            "collectives": [
                {
                    "phase": c.phase,
                    "kind": c.kind,
                    "module": c.module,
                    "what": c.what,
                    "per_layer": c.per_layer,
                    "count_per_step": self.layers if c.per_layer else 1,
                    "in_shape": list(c.in_shape),
                    "out_shape": list(c.out_shape),
                    "in_bytes": c.in_bytes,
                    "out_bytes": c.out_bytes,
                    "wire_bytes": c.wire_bytes,
                    "group_size": c.group_size,
                }
                for c in self.collectives
            ],
            "notes": list(self.notes),
        }


def _params_per_layer(cfg: ModelShape) -> dict[str, int]:
    """Weights of one block by module, in elements (no biases; RMSNorm weights)."""
    H, F, a, g, d = cfg.hidden, cfg.ffn, cfg.heads, cfg.kv_heads, cfg.head_dim
    return {
        "norm1": H,
        "attn.qkv": (a + 2 * g) * d * H,
        "attn.proj": H * a * d,
        "norm2": H,
        "mlp.fc1": F * H,
        "mlp.fc2": H * F,
    }


def _grad_buckets(sizes_bytes: list[int], cap_bytes: int) -> list[int]:
    """Greedy buckets in the order given (the reference models fill them in reverse parameter
    order, like DDP): a bucket closes when the next gradient would overflow it."""
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


NEEDS = ("scheme", "sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "dtype")
"""What the model of any scheme needs declared (F sizes the MLP's collectives or gradients)."""


def _validate(cfg: ModelShape) -> None:
    """The divisibility the schemes need (Megatron-Core's and DeepSpeed's own checks)."""
    P = cfg.sp_size
    problems = [
        (cfg.hidden % cfg.heads, f"hidden {cfg.hidden} is not divisible by heads {cfg.heads}"),
        (cfg.heads % cfg.kv_heads, f"heads {cfg.heads} is not divisible by kv heads {cfg.kv_heads}"),
        (cfg.seq % P, f"seq {cfg.seq} is not divisible by the sequence-parallel size {P}"),
        (cfg.heads % P, f"heads {cfg.heads} is not divisible by the sequence-parallel size {P}"),
        (cfg.kv_heads % P and P % cfg.kv_heads, f"kv heads {cfg.kv_heads} and P={P}: one must divide the other"),
        (cfg.scheme in ("megatron", "hybrid") and cfg.ffn % P, f"ffn {cfg.ffn} is not divisible by P={P}"),
    ]
    for bad, message in problems:
        if bad:
            raise UsageError(message)


def as_shape(cfg: Any) -> ModelShape:
    """A ModelShape, or anything that declares one (the reference models' StepConfig)."""
    return cfg if isinstance(cfg, ModelShape) else cfg.shape()


def estimate_comm(
    cfg: Any,
    *,
    k: int = 2,
    attention_only: bool = False,
    grad_bytes: int = 4,
) -> CommEstimate:
    """The collectives of one step of ``cfg.scheme`` (ZeRO-3 when ``cfg.zero3``), per rank.

    ``attention_only`` keeps the attention block alone (the first article's first example).
    ``grad_bytes`` is the element size of the Ulysses gradient communication (DeepSpeed's fp32
    default). ``k`` counts ZeRO-3 parameter gathers per step (2: re-gathered for backward).
    """
    if k not in (1, 2):
        raise ValueError("k (ZeRO-3 parameter gathers per step) must be 1 or 2")
    cfg = as_shape(cfg)
    cfg.require(NEEDS, f"the cost model of {cfg.scheme or 'a scheme'}")
    _validate(cfg)
    P, B, S, H = cfg.sp_size, cfg.batch, cfg.seq, cfg.hidden
    a, g, d, b = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.dtype_bytes
    colls: list[CollectiveSpec] = []
    notes: list[str] = []

    def add(
        phase: str,
        kind: str,
        module: str,
        what: str,
        in_shape: tuple[int, ...],
        out_shape: tuple[int, ...],
        *,
        per_layer: bool = True,
        elem: int = b,
        group: int = P,
        total_only: bool = False,
    ) -> None:
        n_in = elem
        for x in in_shape:
            n_in *= x
        n_out = elem
        for x in out_shape:
            n_out *= x
        colls.append(
            CollectiveSpec(phase, kind, module, what, in_shape, out_shape, n_in, n_out, group, per_layer, total_only)
        )

    shard, full = (S // P, B, H), (S, B, H)  # sequence-first, as Megatron and gloo's Input Dims list them

    def megatron_pair(module_in: str, module_out: str, label: str) -> None:
        """AG before a column-parallel linear, RS after the row-parallel one, and their backward."""
        add("forward", "all_gather", module_in, f"all-gather of the sequence before {label}", shard, full)
        add("forward", "reduce_scatter", module_out, f"reduce-scatter after {label}", full, shard)

    def megatron_backward(module_in: str, module_out: str) -> None:
        add("backward", "all_gather", module_out, "all-gather of the output gradient", shard, full)
        add("backward", "all_gather", module_in, "all-gather of the SAVED input shard (weight gradient)", shard, full)
        add("backward", "reduce_scatter", module_in, "reduce-scatter of the input gradient", full, shard)

    scheme = cfg.scheme
    params = _params_per_layer(cfg)
    attn_params = params["attn.qkv"] + params["attn.proj"]
    mlp_params = params["mlp.fc1"] + params["mlp.fc2"]
    # the articles' attention example has no norms: only the four projections
    norm_params = 0 if attention_only else params["norm1"] + params["norm2"]

    # ---- attention ---------------------------------------------------------------------------
    if scheme == "megatron":
        add("forward", "all_gather", "attn.qkv", "all-gather of the sequence before attn.qkv", shard, full)
        if g < P:
            width = (a + 2 * g) * d
            add(
                "forward",
                "all_gather",
                "attn.qkv",
                "all-gather of the QKV output's last dim (GQA, g < P)",
                (width // P, B, S),
                (width, B, S),
            )
        add("forward", "reduce_scatter", "attn.proj", "reduce-scatter after attn.proj", full, shard)
    else:  # ulysses attention, also the hybrid's
        kv = max(g, P)  # DeepSpeed replicates kv heads up to P
        if g < P:
            notes.append(f"kv heads replicated from {g} to {P} before the all-to-all (DeepSpeed HF)")
        for t, heads in (("q", a), ("k", kv), ("v", kv)):
            add(
                "forward",
                "all_to_all",
                "attn",
                f"all-to-all of {t}: sequence -> heads",
                (B, S // P, heads, d),
                (B, S, heads // P, d),
            )
        add(
            "forward",
            "all_to_all",
            "attn",
            "all-to-all of the context: heads -> sequence",
            (B, S, a // P, d),
            (B, S // P, a, d),
        )
    # ---- MLP -----------------------------------------------------------------------------------
    if not attention_only and scheme in ("megatron", "hybrid"):
        megatron_pair("mlp.fc1", "mlp.fc2", "mlp.fc1 / after mlp.fc2")
    # ---- backward, in execution order (MLP first) ----------------------------------------------
    if not attention_only and scheme in ("megatron", "hybrid"):
        megatron_backward("mlp.fc1", "mlp.fc2")
    if scheme == "megatron":
        add("backward", "all_gather", "attn.proj", "all-gather of the output gradient", shard, full)
        if g < P:  # the gather-last's backward runs before linear_qkv's
            width = (a + 2 * g) * d
            add(
                "backward",
                "reduce_scatter",
                "attn.qkv",
                "reduce-scatter of the QKV output gradient's last dim (GQA)",
                (width, B, S),
                (width // P, B, S),
            )
        add("backward", "all_gather", "attn.qkv", "all-gather of the SAVED input shard (weight gradient)", shard, full)
        add("backward", "reduce_scatter", "attn.qkv", "reduce-scatter of the input gradient", full, shard)
    else:
        for t, heads in (("context", a), ("v", max(g, P)), ("k", max(g, P)), ("q", a)):
            src, dst = (
                ((B, S // P, a, d), (B, S, a // P, d))
                if t == "context"
                else ((B, S, heads // P, d), (B, S // P, heads, d))
            )
            add("backward", "all_to_all", "attn", f"inverse all-to-all of {t}'s gradient", src, dst)
    # ---- gradients and parameters --------------------------------------------------------------
    zero3 = cfg.zero3 and scheme in ("ulysses", "hybrid")
    label = scheme + ("-zero3" if zero3 else "")
    if scheme == "megatron":
        if P > 1 and norm_params:
            add(
                "backward",
                "all_reduce",
                "grad_sync",
                "all-reduce of the norm weights' gradients (finalize_model_grads)",
                (cfg.layers * norm_params,),
                (cfg.layers * norm_params,),
                per_layer=False,
            )
    else:
        # replicated weights: everything for ulysses, attention (+ norms) for the hybrid
        replicated = attn_params + (mlp_params if scheme == "ulysses" and not attention_only else 0)
        if zero3:
            # FSDP2 shards every parameter of the wrapped module (ulysses: the whole block, norms
            # included; hybrid: attention), each padded to a multiple of P
            modules = ("attn.qkv", "attn.proj") if scheme == "hybrid" else tuple(params)
            shard_elems = sum(-(-params[m] // P) for m in modules)
            gathered = shard_elems * P
            W = sum(params[m] for m in modules) * cfg.layers
            where = "attn" if scheme == "hybrid" else "block"
            for i in range(k):
                phase = "forward" if i == 0 else "backward"
                add(phase, "all_gather", where, f"ZeRO-3 parameter all-gather #{i + 1}", (shard_elems,), (gathered,))
            add(
                "backward",
                "reduce_scatter",
                where,
                f"ZeRO-3 gradient reduce-scatter ({grad_bytes * 8}-bit)",
                (gathered,),
                (shard_elems,),
                elem=grad_bytes,
            )
            notes.append(f"ZeRO-3 with k={k} parameter gathers per step (W = {W} weights)")
            sync = norm_params * cfg.layers if scheme == "hybrid" else 0
        else:
            sync = (replicated + norm_params) * cfg.layers
        if sync and P > 1 and cfg.grad_bucket_mib is None and not attention_only:
            add(
                "backward", "all_reduce", "grad_sync",
                f"all-reduce of replicated gradients ({grad_bytes * 8}-bit; bucket cap not declared, so the "
                "buckets are compared by their total)",
                (sync,), (sync,), per_layer=False, elem=grad_bytes, total_only=True,
            )  # fmt: skip
            notes.append("gradient bucket cap not declared (--grad-bucket-mib): all-reduces compared by total bytes")
        elif sync and P > 1:
            if attention_only:
                buckets = [sync * grad_bytes]
            else:
                sizes = []
                for _ in range(cfg.layers):  # reverse parameter order, as the reference fills buckets
                    for module in ("mlp.fc2", "mlp.fc1", "norm2", "attn.proj", "attn.qkv", "norm1"):
                        replicated_module = module.startswith("norm") or (
                            not zero3 and (module.startswith("attn") or scheme == "ulysses")
                        )
                        if replicated_module:
                            sizes.append(params[module] * grad_bytes)
                buckets = _grad_buckets(sizes, int(cfg.grad_bucket_mib * 2**20))
            for i, nbytes in enumerate(buckets):
                elems = nbytes // grad_bytes
                add(
                    "backward",
                    "all_reduce",
                    "grad_sync",
                    f"all-reduce of replicated gradients, bucket {i} ({grad_bytes * 8}-bit)",
                    (elems,),
                    (elems,),
                    per_layer=False,
                    elem=grad_bytes,
                )
    return CommEstimate(label, cfg, tuple(colls), k, tuple(notes))
