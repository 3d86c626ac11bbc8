"""``sptrace model``: the analytic table of a scheme's collectives and activation memory."""

from __future__ import annotations

import argparse
import json

from sptrace.cli.common import SHAPE_FLAGS
from sptrace.vocab import collective_kinds
from sptrace.vocab.dtypes import ACTIVATION_DTYPES
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import RECOMPUTE, SCHEME_CHOICES, ModelShape
from sptrace.vocab.units import human_bytes

PRESET_NAMES = ("seed-attention", "seed-3.6b", "reference")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="the analytic cost model: collectives, shapes, wire bytes, activation memory")
    p.add_argument("--scheme", choices=SCHEME_CHOICES, required=True)
    p.add_argument(
        "--preset", choices=PRESET_NAMES,
        help="the first article's configurations, or 'reference' (sptrace profile's defaults); flags override it",
    )  # fmt: skip
    p.add_argument("--sp", type=int, help="P, the sequence/tensor-parallel size")
    for name in SHAPE_FLAGS:
        extra = " (default: --heads, no GQA)" if name == "kv_heads" else ""
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"default: the preset's{extra}")
    p.add_argument("--dtype", choices=ACTIVATION_DTYPES)
    p.add_argument("--recompute", choices=RECOMPUTE)
    p.add_argument("--grad-bucket-mib", type=float, help="gradient bucket cap (default: one total)")
    p.add_argument("--k", type=int, default=2, help="ZeRO-3 parameter gathers per step: 1, or 2 (default, DeepSpeed)")
    p.add_argument("--grad-bytes", type=int, default=4, choices=(2, 4), help="Ulysses gradient element size (4: fp32)")
    p.add_argument(
        "--attention-only", action="store_true", help="the attention block alone (the article's first example)"
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="text, or JSON")
    p.set_defaults(func=run)


def _preset(name: str | None) -> tuple[ModelShape, bool]:
    from sptrace.costmodel import PRESETS

    if name is None:
        return ModelShape(), False
    if name == "reference":
        from sptrace.reference_models.config import StepConfig

        return StepConfig().shape(source="preset reference"), False
    values = dict(PRESETS[name])
    attention_only = bool(values.pop("attention_only", False))
    return ModelShape.from_mapping(values, f"preset {name}"), attention_only


def run(args: argparse.Namespace) -> int:
    from sptrace.costmodel import activation_bytes_per_layer, estimate_comm, korthikanti_bytes_per_layer
    from sptrace.costmodel.activations import dtype_scale

    if args.k not in (1, 2):
        raise UsageError("--k must be 1 or 2")
    cfg, attention_only = _preset(args.preset)
    attention_only = attention_only or args.attention_only
    flags = {name: getattr(args, name) for name in SHAPE_FLAGS}
    cfg = cfg.override(
        "flags", scheme=args.scheme, sp_size=args.sp, dtype=args.dtype, recompute=args.recompute,
        grad_bucket_mib=args.grad_bucket_mib, **flags,
    )  # fmt: skip
    if cfg.kv_heads is None and cfg.heads is not None:
        cfg = cfg.override("--heads (no GQA)", kv_heads=cfg.heads)
    if cfg.recompute is None:
        cfg = cfg.override("no --recompute", recompute="none")
    est = estimate_comm(cfg, k=args.k, attention_only=attention_only, grad_bytes=args.grad_bytes)
    act = activation_bytes_per_layer(cfg)
    korthikanti = {
        s: korthikanti_bytes_per_layer(
            s, seq=cfg.seq, batch=cfg.batch, hidden=cfg.hidden, heads=cfg.heads, tp=cfg.sp_size
        )
        for s in ("none", "tp", "tp_sp", "tp_sp_selective", "full_recompute")
    }
    scale = dtype_scale(cfg.dtype_bytes) or 1.0  # the text shows 2-byte figures when the dtype is unknown
    if args.format == "json":
        out = est.to_dict()
        out["attention_only"] = attention_only
        # the paper's fp16 figures as printed there, and scaled to the declared dtype as the text
        # shows them (null where the dtype or the heads are unknown)
        out["activation_bytes_per_layer_fp16"] = act
        out["korthikanti_bytes_per_layer_fp16"] = korthikanti
        known = cfg.dtype_bytes is not None
        out["activation_bytes_per_layer"] = None if act is None or not known else round(act * scale)
        out["korthikanti_bytes_per_layer"] = {s: (round(v * scale) if known and v is not None else None)
                                              for s, v in korthikanti.items()}  # fmt: skip
        out["activation_dtype"] = cfg.dtype
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(
        f"{est.scheme}{' (attention only)' if attention_only else ''}: {cfg.describe()} d={cfg.head_dim}"
        + (f", ZeRO-3 k={est.k}" if cfg.zero3 else "")
    )
    print(
        f"\n{'phase':<9}{'kind':<15}{'module':<11}{'x/step':>7}  {'in -> out shape':<34}"
        f"{'in bytes':>12}{'wire/step':>12}  what"
    )
    for c in est.collectives:
        n = cfg.layers if c.per_layer else 1
        shapes = f"{list(c.in_shape)} -> {list(c.out_shape)}"
        print(
            f"{c.phase:<9}{c.kind:<15}{c.module:<11}{n:>7}  {shapes:<34}{human_bytes(c.in_bytes):>12}"
            f"{human_bytes(c.wire_bytes * n):>12}  {c.what}"
        )
    print("\nwire bytes sent per rank, one direction:")
    for kind in collective_kinds.names():
        if est.count(kind):
            noun = "ops" if kind in ("send", "recv") else "collectives"
            print(f"  {kind:<15}{est.count(kind):>5} {noun:<12}{human_bytes(est.wire_per_step(kind)):>12}")
    print(f"  {'per layer':<15}{'':>18}{human_bytes(est.wire_per_layer()):>12}  (layer-level collectives)")
    step = est.wire_per_step()
    print(f"  {'per step':<15}{est.count():>5} collectives  {human_bytes(step):>12}  ({step / 2**20:.2f} MiB)")
    for note in est.notes:
        print(f"  note: {note}")
    basis = "fp16 with dropout" if scale == 1 else f"its fp16 formula with dropout, scaled to {cfg.dtype}"
    print(f"\nactivations kept per layer and rank (Korthikanti et al. Table 2, {basis}):")
    print(
        f"  this scheme ({'selective recompute' if cfg.recompute == 'selective' else 'no recompute'}): "
        + ("unknown (needs --heads)" if act is None else human_bytes(act * scale))
    )
    if cfg.recompute != "selective":
        print(f"  with selective recompute of core attention: {human_bytes(korthikanti['tp_sp_selective'] * scale)}")
    return 0
