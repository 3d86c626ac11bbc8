"""Pieces shared by every scheme: the dense reference weights, RoPE, core attention, the
grouped QKV layout, and the dense single-process model the sharded ones must match."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from sptrace.reference_models.config import StepConfig
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# torch >= 2.14: checkpointing can honour the surrounding saved_tensors_hooks, so that sptrace's
# saved-tensor records see what a checkpointed region keeps (older torch bypasses them)
CHECKPOINT_HOOKS = (
    {"respect_saved_tensors_hooks": True}
    if "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters
    else {}
)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(cfg: StepConfig) -> torch.dtype:
    return TORCH_DTYPES[cfg.dtype]


# ---- weights -------------------------------------------------------------------------------


def dense_layer_weights(cfg: StepConfig, layer: int) -> dict[str, Tensor]:
    """Full (unsharded) fp32 weights of one block, drawn on the CPU from ``cfg.seed`` so every
    rank and the dense reference see the same numbers.

    qkv.weight uses Megatron's grouped row layout: for each of the g kv groups, its a/g query
    heads, then its key head, then its value head: [g * (a/g + 2) * d, H].
    """
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + layer)
    H, F_, a, g, d = cfg.hidden, cfg.ffn, cfg.heads, cfg.kv_heads, cfg.head_dim

    def draw(*shape: int, fan_in: int) -> Tensor:
        return torch.randn(*shape, generator=gen) / fan_in**0.5

    return {
        "norm1.weight": 1.0 + 0.1 * torch.randn(H, generator=gen),
        "attn.qkv.weight": draw((a + 2 * g) * d, H, fan_in=H),
        "attn.proj.weight": draw(H, a * d, fan_in=a * d),
        "norm2.weight": 1.0 + 0.1 * torch.randn(H, generator=gen),
        "mlp.fc1.weight": draw(F_, H, fan_in=H),
        "mlp.fc2.weight": draw(H, F_, fan_in=F_),
    }


def step_batch(cfg: StepConfig) -> tuple[Tensor, Tensor]:
    """The full [B, S, H] input and regression target of the step (fp32, CPU)."""
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    shape = (cfg.batch, cfg.seq, cfg.hidden)
    return torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)


def seq_shard(x: Tensor, rank: int, sp_size: int, zigzag: bool = False) -> Tensor:
    """This rank's [B, S/P, ...] slice of a batch-first [B, S, ...] tensor: contiguous, or with
    ``zigzag`` chunks rank and 2P-1-rank of 2P (ring attention's load-balanced layout)."""
    if zigzag:
        chunks = x.chunk(2 * sp_size, dim=1)
        return torch.cat([chunks[rank], chunks[2 * sp_size - 1 - rank]], dim=1).contiguous()
    n = x.shape[1] // sp_size
    return x[:, rank * n : (rank + 1) * n].contiguous()


def shard_of_step(x: Tensor, cfg: StepConfig, rank: int, sp_size: int) -> Tensor:
    """The scheme's sequence shard of a step's [B, S, ...] input or target: contiguous, the
    zigzag chunks (ring with --cp-balance zigzag), or a slice of the ring rank's chunks (usp)."""
    if cfg.scheme == "usp":
        from sptrace.reference_models.ring import usp_positions

        positions = usp_positions(x.shape[1], rank, sp_size, cfg.ulysses_degree, cfg.cp_balance)
        return x.index_select(1, positions).contiguous()
    return seq_shard(x, rank, sp_size, zigzag=cfg.scheme == "ring" and cfg.cp_balance == "zigzag")


def step_loss(out: Tensor, target: Tensor, cfg: StepConfig) -> Tensor:
    """Sum of squared errors over this rank's tokens, normalised by the GLOBAL element count,
    so the ranks' losses add up to the dense model's loss (and gradients need a plain sum)."""
    diff = out.float() - target.float()
    return diff.square().sum() / (cfg.batch * cfg.seq * cfg.hidden)


# ---- attention helpers ---------------------------------------------------------------------


def split_grouped_qkv(mixed: Tensor, groups: int, q_per_group: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """[B, S, groups * (q_per_group + 2) * d] -> q [B, S, groups*q_per_group, d], k, v [B, S, groups, d]."""
    B, S = mixed.shape[:2]
    grouped = mixed.view(B, S, groups, q_per_group + 2, head_dim)
    q = grouped[:, :, :, :q_per_group].reshape(B, S, groups * q_per_group, head_dim)
    k = grouped[:, :, :, q_per_group]
    v = grouped[:, :, :, q_per_group + 1]
    return q, k, v


def apply_rope(x: Tensor, first_position: int | Tensor, base: float = 10000.0) -> Tensor:
    """Rotary embedding (rotate-half form) of x [B, s, heads, d] at global positions
    first_position .. first_position + s - 1, or at the s positions given as a tensor (the
    zigzag layout of ring attention)."""
    s, d = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    if isinstance(first_position, Tensor):
        pos = first_position.to(device=x.device, dtype=torch.float32)
    else:
        pos = torch.arange(first_position, first_position + s, device=x.device, dtype=torch.float32)
    angles = torch.outer(pos, inv_freq)  # [s, d/2]
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1)[None, :, None, :].to(x.dtype)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1)[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class CoreAttention(nn.Module):
    """SDPA (causal unless told otherwise) over the FULL sequence for a subset of heads: q [B, S, hq, d], k, v
    [B, S, hk, d] with hq a multiple of hk (GQA) -> [B, S, hq, d].

    ``recompute`` wraps it in a non-reentrant checkpoint: Korthikanti et al.'s selective
    recomputation, which keeps q, k, v and recomputes the attention internals in backward.
    """

    def __init__(self, recompute: bool = False, causal: bool = True) -> None:
        super().__init__()
        self.recompute, self.causal = recompute, causal

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        rep = q.shape[2] // k.shape[2]
        if rep > 1:
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return out.transpose(1, 2)  # [B, S, hq, d]

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._attend, q, k, v, use_reentrant=False, **CHECKPOINT_HOOKS)
        return self._attend(q, k, v)


# ---- the dense reference -------------------------------------------------------------------


class DenseAttention(nn.Module):
    def __init__(self, cfg: StepConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H, a, g, d = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(H, (a + 2 * g) * d, bias=False)
        self.core = CoreAttention(causal=cfg.causal)
        self.proj = nn.Linear(a * d, H, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # [B, S, H]
        cfg = self.cfg
        q, k, v = split_grouped_qkv(self.qkv(x), cfg.kv_heads, cfg.heads // cfg.kv_heads, cfg.head_dim)
        ctx = self.core(apply_rope(q, 0), apply_rope(k, 0), v)
        return self.proj(ctx.flatten(2))


class DenseMLP(nn.Module):
    def __init__(self, cfg: StepConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class DenseBlock(nn.Module):
    def __init__(self, cfg: StepConfig) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.attn = DenseAttention(cfg)
        self.norm2 = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.mlp = DenseMLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class DenseTransformer(nn.Module):
    """Single-process model with the full weights: what every sharded scheme must reproduce."""

    def __init__(self, cfg: StepConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseBlock(cfg) for _ in range(cfg.layers))
        with torch.no_grad():
            for i, block in enumerate(self.layers):
                for name, value in dense_layer_weights(cfg, i).items():
                    block.get_parameter(name).copy_(value)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.layers:
            x = block(x)
        return x
