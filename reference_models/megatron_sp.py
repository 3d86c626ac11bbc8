"""Megatron-LM sequence parallelism (TP = SP = P), after Megatron-Core's
``ColumnParallelLinear`` / ``RowParallelLinear`` with ``sequence_parallel=True``.

Per layer and rank (SPEC.md §1 rows 1-10): forward all-gather before ``attn.qkv``,
reduce-scatter after ``attn.proj``, all-gather before ``mlp.fc1``, reduce-scatter after
``mlp.fc2``; backward, for each sub-block, the all-gather of the output gradient, the
all-gather of the SAVED input shard (for the weight gradient) and the reduce-scatter of the
input gradient. With GQA and g < P, Megatron adds an all-gather / reduce-scatter of the QKV
output along its last dim. After backward one all-reduce sums the norm weights' gradients.

Column-parallel linears save the [B, S/P, H] shard, never the gathered [B, S, H] input.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sptrace.reference_models import comm_ops
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import CoreAttention, apply_rope, split_grouped_qkv
from torch import Tensor, nn


class _LinearWithSequenceGather(torch.autograd.Function):
    """y = all_gather_seq(x) @ W^T, saving only the shard x (Megatron's
    LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, group: dist.ProcessGroup, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        ctx.save_for_backward(x, weight)  # x: [B, S/P, H] shard
        total = comm_ops.all_gather_seq(x, group, tag, "ag_fwd", buffer="gathered_input")  # [B, S, H], a temporary
        return F.linear(total, weight)  # [B, S, N/P]

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        # SPEC.md §1 row 6: re-gather the saved shard for the weight gradient
        total = comm_ops.all_gather_seq(x, ctx.group, ctx.tag, "ag_input_bwd", buffer="gathered_input")
        grad_total = grad_out.matmul(weight)  # [B, S, H], partial over the N/P outputs
        grad_x = comm_ops.reduce_scatter_seq(grad_total, ctx.group, ctx.tag, "rs_bwd")  # row 7
        grad_w = grad_out.reshape(-1, grad_out.shape[-1]).t().matmul(total.reshape(-1, total.shape[-1]))
        return grad_x, grad_w, None, None


class ColumnParallelLinear(nn.Module):
    """[B, S/P, H] -> [B, S, N/P]; weight rows are split across ranks.

    ``keep_gathered_input`` reproduces PyTorch-native ColwiseParallel after SequenceParallel:
    the all-gather is an autograd op and the matmul saves the full [B, S, H] input
    (the stray-full-save fault)."""

    tp_shard_dim = 0

    def __init__(
        self, in_features: int, out_per_rank: int, group: dist.ProcessGroup, *, keep_gathered_input: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_per_rank, in_features))
        self.group = group
        self.keep_gathered_input = keep_gathered_input
        self.sequence_parallel = True
        """False: plain Megatron TP, the input is already replicated [B, S, H] (identity
        forward, all-reduce of the input gradient backward)."""
        self.tag = ""

    def forward(self, x: Tensor) -> Tensor:
        if not self.sequence_parallel:
            return F.linear(comm_ops.copy_to_tensor_parallel_region(x, self.group, self.tag), self.weight)
        if self.keep_gathered_input:
            total = comm_ops.gather_from_sequence_parallel_region(x, self.group, self.tag)
            return F.linear(total, self.weight)  # autograd saves total: [B, S, H]
        if dist.get_world_size(self.group) == 1:
            return F.linear(x, self.weight)
        return _LinearWithSequenceGather.apply(x, self.weight, self.group, self.tag)


class RowParallelLinear(nn.Module):
    """[B, S, K/P] -> [B, S/P, H]: local matmul, then reduce-scatter the partial sums."""

    tp_shard_dim = 1

    def __init__(self, in_per_rank: int, out_features: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_per_rank))
        self.group = group
        self.sequence_parallel = True
        """False: plain Megatron TP, all-reduce the partial sums into a replicated [B, S, H]."""
        self.tag = ""

    def forward(self, x: Tensor) -> Tensor:
        partial = F.linear(x, self.weight)  # [B, S, H]
        if not self.sequence_parallel:
            return comm_ops.reduce_from_tensor_parallel_region(partial, self.group, self.tag)
        return comm_ops.reduce_scatter_to_sequence_parallel_region(partial, self.group, self.tag)


class MegatronAttention(nn.Module):
    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__()
        P = dist.get_world_size(group)
        a, g, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.cfg, self.group, self.sp_size = cfg, group, P
        self.qkv = ColumnParallelLinear(cfg.hidden, (a + 2 * g) * d // P, group)
        self.core = CoreAttention(recompute=cfg.recompute == "selective", causal=cfg.causal)
        self.proj = RowParallelLinear(a * d // P, cfg.hidden, group)
        self.tag = ""

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H]
        cfg, P = self.cfg, self.sp_size
        a, g, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        mixed = self.qkv(x)  # [B, S, (a + 2g) d / P] in the grouped layout
        if g >= P:
            q, k, v = split_grouped_qkv(mixed, g // P, a // g, d)  # [B, S, a/P, d], [B, S, g/P, d]
        else:
            # g < P: a rank's rows are not whole groups. Megatron gathers the last dim, keeps
            # its group and, inside it, its a/P query heads.
            mixed = comm_ops.gather_last_dim_from_tensor_parallel_region(mixed, self.group, self.tag)
            rank = dist.get_rank(self.group)
            ranks_per_group = P // g
            group_size = (a // g + 2) * d
            idx = rank // ranks_per_group
            # Megatron-Core slices a view here; saving v (a view) then keeps the whole gathered
            # [B, S, (a + 2g) d] buffer alive until backward. The reference copies its group's
            # slice so that clean runs stay sharded; saved-tensor records carry storage_bytes,
            # which exposes the view case in real traces.
            mine = mixed[..., idx * group_size : (idx + 1) * group_size].contiguous()
            q, k, v = split_grouped_qkv(mine, 1, a // g, d)
            j = rank % ranks_per_group
            q = q[:, :, j * (a // P) : (j + 1) * (a // P)]  # [B, S, a/P, d]; k, v: [B, S, 1, d]
        ctx = self.core(apply_rope(q, 0), apply_rope(k, 0), v)  # [B, S, a/P, d]
        return self.proj(ctx.flatten(2))  # [B, S/P, H]


class MegatronMLP(nn.Module):
    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__()
        P = dist.get_world_size(group)
        self.fc1 = ColumnParallelLinear(cfg.hidden, cfg.ffn // P, group)
        self.fc2 = RowParallelLinear(cfg.ffn // P, cfg.hidden, group)

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H] -> [B, S, F/P] -> [B, S/P, H]
        return self.fc2(F.gelu(self.fc1(x)))


class MegatronBlock(nn.Module):
    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group
        self.norm1 = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.attn: nn.Module = MegatronAttention(cfg, group)
        self.norm2 = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.mlp = MegatronMLP(cfg, group)
        self.tag = ""

    def disable_mlp_sequence_parallel(self) -> None:
        """Run this block's MLP as plain tensor parallelism (the missing-reduce-scatter fault):
        the residual is gathered and stays replicated through norm2 and the MLP, fc2
        all-reduces instead of reduce-scattering, and the block returns to a sequence shard
        only at its end. norm2 then sees every token, so its gradient is already complete."""
        self.mlp.fc1.sequence_parallel = False
        self.mlp.fc2.sequence_parallel = False
        self.norm2.replicated_compute = True

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H] in and out
        h = x + self.attn(self.norm1(x))
        if self.mlp.fc2.sequence_parallel:
            return h + self.mlp(self.norm2(h))
        h_full = comm_ops.gather_from_sequence_parallel_region(
            h, self.group, f"{self.tag}::residual", reduce_grad=False
        )
        out = h_full + self.mlp(self.norm2(h_full))  # [B, S, H] on every rank
        return comm_ops.scatter_to_sequence_parallel_region(out, self.group, f"{self.tag}::residual")
