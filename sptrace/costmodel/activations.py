"""Activation memory per layer and rank (Korthikanti et al. 2022, Table 2; SPEC.md §3)."""

from __future__ import annotations

from typing import Any

from sptrace.costmodel.comm import as_shape

KORTHIKANTI_SETTINGS = ("none", "tp", "tp_sp", "tp_sp_selective", "full_recompute")


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


def activation_bytes_per_layer(cfg: Any) -> float | None:
    """Korthikanti's figure for the scheme of ``cfg``: every scheme keeps its activations
    sequence- or head-sharded, so all reach s*b*h/P*(34 + 5*a*s/h) (SPEC.md §3), or
    34*s*b*h/P when core attention is recomputed."""
    cfg = as_shape(cfg)
    if cfg.missing(("seq", "batch", "hidden", "heads", "sp_size", "recompute")):
        return None
    setting = "tp_sp_selective" if cfg.recompute == "selective" else "tp_sp"
    return korthikanti_bytes_per_layer(
        setting, seq=cfg.seq, batch=cfg.batch, hidden=cfg.hidden, heads=cfg.heads, tp=cfg.sp_size
    )
