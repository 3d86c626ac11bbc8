"""Activation memory per layer and rank (Korthikanti et al. 2022, Table 2; SPEC.md §3)."""

from __future__ import annotations

from sptrace.costmodel.spec import DeclaresShape, as_shape
from sptrace.vocab.shape import ModelShape

KORTHIKANTI_SETTINGS = ("none", "tp", "tp_sp", "tp_sp_selective", "full_recompute")


def dtype_scale(dtype_bytes: int | None) -> float | None:
    """What Korthikanti's figures are multiplied by at an activation element of ``dtype_bytes``:
    Table 2 counts 2-byte activations (and 1-byte dropout masks), so fp32 doubles them. None when
    the element size is unknown."""
    return dtype_bytes / 2 if dtype_bytes else None


def activation_bytes_at_dtype(cfg: ModelShape | DeclaresShape) -> float | None:
    """activation_bytes_per_layer at the declared activation dtype (None when either is unknown)."""
    cfg = as_shape(cfg)
    act, scale = activation_bytes_per_layer(cfg), dtype_scale(cfg.dtype_bytes)
    return act * scale if act is not None and scale is not None else None


def korthikanti_bytes_per_layer(setting: str, *, seq: int, batch: int, hidden: int, heads: int, tp: int) -> float:
    """Bytes of activations one transformer layer keeps for backward, per rank, in the paper's
    fp16-with-dropout accounting: s*b*h*(34 + 5*a*s/h) without parallelism, and so on."""
    s, b, h, a, t = seq, batch, hidden, heads, tp
    sbh = s * b * h
    if setting == "none":
        return sbh * (34 + 5 * a * s / h)
    if setting == "tp":
        return sbh * (10 + 24 / t + 5 * a * s / (h * t))
    if setting == "tp_sp":
        return sbh / t * (34 + 5 * a * s / h)
    if setting == "tp_sp_selective":
        return 34 * sbh / t
    if setting == "full_recompute":
        return 2 * sbh
    raise ValueError(f"unknown setting {setting!r}; choose one of {', '.join(KORTHIKANTI_SETTINGS)}")


def activation_bytes_per_layer(cfg: ModelShape | DeclaresShape) -> float | None:
    """Bytes of activations one layer keeps for backward, per rank, for the scheme of ``cfg``.

    megatron, ulysses, hybrid: Korthikanti's figure; every scheme keeps its activations sequence-
    or head-sharded, so all reach s*b*h/P*(34 + 5*a*s/h) (SPEC.md §3), or 34*s*b*h/P when core
    attention is recomputed.
    ring, usp: the attention is flash-style (blockwise with an online softmax) and keeps no
    score matrix, so the 5*a*s/h term is gone with or without recompute: 34*s*b*h/P, plus the
    softmax log-sum-exp it saves instead, one fp32 value per query token and head, a*s*b/P*4.
    """
    cfg = as_shape(cfg)
    if cfg.missing(("seq", "batch", "hidden", "heads", "sp_size", "recompute")):
        return None
    if cfg.scheme in ("ring", "usp"):
        S, B, H, a, P = cfg.seq, cfg.batch, cfg.hidden, cfg.heads, cfg.sp_size
        return 34 * S * B * H / P + a * S * B / P * 4
    setting = "tp_sp_selective" if cfg.recompute == "selective" else "tp_sp"
    return korthikanti_bytes_per_layer(
        setting, seq=cfg.seq, batch=cfg.batch, hidden=cfg.hidden, heads=cfg.heads, tp=cfg.sp_size
    )
