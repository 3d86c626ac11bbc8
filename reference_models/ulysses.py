"""DeepSpeed-Ulysses (``deepspeed/sequence/layer.py``, DistributedAttention).

Projections are replicated and run on the local [B, S/P, H] tokens. Attention switches layout
with one all-to-all each for q, k and v ([B, S/P, h, d] -> [B, S, h/P, d], head-sharded full
sequence), attends locally, and switches the context back with a fourth all-to-all; backward
runs the four inverses (SPEC.md §1). The MLP is local. Replicated weights get their gradients
all-reduced across the group in fp32 buckets (DeepSpeed's default for sequence-parallel
gradient communication), or, with ``zero3``, are sharded by FSDP2.

GQA with g < P: kv heads are replicated up to P before the all-to-all, as DeepSpeed's HF
integration does, so every rank receives exactly one kv head.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from sptrace.reference_models import comm_ops
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import CoreAttention, apply_rope, split_grouped_qkv
from torch import Tensor, nn


class UlyssesAttention(nn.Module):
    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__()
        a, g, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.cfg, self.group = cfg, group
        self.qkv = nn.Linear(cfg.hidden, (a + 2 * g) * d, bias=False)
        self.core = CoreAttention(recompute=cfg.recompute == "selective", causal=cfg.causal)
        self.proj = nn.Linear(a * d, cfg.hidden, bias=False)
        self.tag = ""

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H]
        cfg, group = self.cfg, self.group
        P, rank = dist.get_world_size(group), dist.get_rank(group)
        a, g, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        q, k, v = split_grouped_qkv(self.qkv(x), g, a // g, d)  # [B, S/P, a, d], [B, S/P, g, d]
        first = rank * x.shape[1]  # global position of this rank's first token
        q, k = apply_rope(q, first), apply_rope(k, first)
        if g < P:
            k = k.repeat_interleave(P // g, dim=2)  # [B, S/P, P, d]
            v = v.repeat_interleave(P // g, dim=2)
        tag = self.tag
        q = comm_ops.all_to_all_seq_to_heads(q, group, f"{tag}::q")  # [B, S, a/P, d]
        k = comm_ops.all_to_all_seq_to_heads(k, group, f"{tag}::k")  # [B, S, max(g/P, 1), d]
        v = comm_ops.all_to_all_seq_to_heads(v, group, f"{tag}::v")
        ctx = self.core(q, k, v)  # [B, S, a/P, d]
        ctx = comm_ops.all_to_all_heads_to_seq(ctx, group, f"{tag}::context")  # [B, S/P, a, d]
        return self.proj(ctx.flatten(2))  # [B, S/P, H]


class LocalMLP(nn.Module):
    """The MLP on this rank's tokens with the full (replicated) weights."""

    def __init__(self, cfg: StepConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H] -> [B, S/P, F] -> [B, S/P, H]
        return self.fc2(F.gelu(self.fc1(x)))


class UlyssesBlock(nn.Module):
    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.attn = UlyssesAttention(cfg, group)
        self.norm2 = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.mlp = LocalMLP(cfg)

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H] in and out
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))
