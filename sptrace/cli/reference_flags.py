"""The reference models' flags (sptrace profile, demo and sweep): the model's sizes, the fault to
inject and the seed, and the StepConfig they give (sptrace.reference_models.config checks every
value before anything launches)."""

from __future__ import annotations

import argparse

from sptrace.reference_models.config import FAULTS, StepConfig
from sptrace.vocab.dtypes import ACTIVATION_DTYPES
from sptrace.vocab.shape import CP_BALANCE, RECOMPUTE, ShapeValues


def add_model_flags(p: argparse.ArgumentParser, *, with_seq: bool = True) -> None:
    d = StepConfig()
    g = p.add_argument_group("reference model (defaults are sized for a 2-core machine)")
    g.add_argument("--layers", type=int, default=d.layers, help=f"L blocks (default {d.layers})")
    g.add_argument("--batch", type=int, default=d.batch, help=f"B micro-batch (default {d.batch})")
    if with_seq:
        g.add_argument("--seq", type=int, default=d.seq, help=f"S sequence length (default {d.seq})")
    g.add_argument("--hidden", type=int, default=d.hidden, help=f"H width (default {d.hidden})")
    g.add_argument("--heads", type=int, default=d.heads, help=f"a query heads (default {d.heads})")
    g.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"g kv heads, GQA (default {d.kv_heads})")
    g.add_argument("--ffn", type=int, default=d.ffn, help=f"F MLP width (default {d.ffn})")
    g.add_argument("--dtype", choices=ACTIVATION_DTYPES, default=d.dtype)
    g.add_argument(
        "--zero3", action="store_true", help="shard replicated weights with FSDP2 (ulysses, hybrid, ring, usp)"
    )
    g.add_argument(
        "--ulysses-degree", type=int,
        help="usp: U ranks per Ulysses group, the ring spans P/U of them (default 2 when P is even)",
    )  # fmt: skip
    g.add_argument("--recompute", choices=RECOMPUTE, default=d.recompute, help="selective: recompute core attention")
    g.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=d.causal,
        help="a causal attention mask (default; --no-causal attends every token to every token)",
    )  # fmt: skip
    g.add_argument(
        "--cp-balance", choices=CP_BALANCE, default=d.cp_balance,
        help="ring and usp: the sequence layout, zigzag (chunks r and 2P-1-r of 2P, Megatron CP's load balancing; "
        "default) or none (contiguous chunks: a causal mask then leaves rank P-1 the most work)",
    )  # fmt: skip
    g.add_argument(
        "--fault", choices=tuple(FAULTS),
        help="inject a fault into one layer: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )  # fmt: skip
    g.add_argument("--fault-layer", type=int, help="layer the fault goes into (default: the last)")
    g.add_argument("--seed", type=int, default=d.seed)


class StepValues(ShapeValues, total=False):
    """StepConfig's fields as the flags give them: the model's, and the reference models' own."""

    fault: str | None
    fault_layer: int | None
    seed: int


def config_values(args: argparse.Namespace, scheme: str, nproc: int) -> StepValues:
    return StepValues(
        scheme=scheme, sp_size=nproc, layers=args.layers, batch=args.batch, seq=args.seq,
        hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads, ffn=args.ffn,
        dtype=args.dtype, zero3=args.zero3, recompute=args.recompute, fault=args.fault,
        fault_layer=args.fault_layer, seed=args.seed, ulysses_degree=ulysses_degree_of(args, scheme, nproc),
        causal=args.causal, cp_balance=args.cp_balance,
    )  # fmt: skip


def config_from(args: argparse.Namespace, scheme: str, nproc: int) -> StepConfig:
    return StepConfig(**config_values(args, scheme, nproc))


def ulysses_degree_of(args: argparse.Namespace, scheme: str, nproc: int) -> int:
    if args.ulysses_degree is not None:
        return args.ulysses_degree
    return 2 if scheme == "usp" and nproc % 2 == 0 else 1
