"""Realistic ways a sequence-parallel step stops keeping its activations sharded, injected into
one layer so that the checks have something true to find (sptrace.config.FAULTS describes each).

- stray-full-save: PyTorch-native ``ColwiseParallel`` after ``SequenceParallel`` all-gathers
  the input with an autograd op and lets the matmul save the gathered [B, S, H] tensor
  (SPEC.md §1 note, §3 last row), instead of Megatron's save-the-shard-and-re-gather.
- missing-reduce-scatter: one MLP left out of sequence parallelism (Megatron's
  ``sequence_parallel=False`` path): all-reduce instead of reduce-scatter, replicated residual.
- debug-hook: an activation-statistics hook that all-gathers a block's output across the
  sequence with autograd on and keeps the statistic (and so the full tensor) until the step ends.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from sptrace.reference_models import comm_ops
from sptrace.reference_models.megatron_sp import ColumnParallelLinear, MegatronBlock
from torch import Tensor, nn


class GatheredInputLinear(nn.Linear):
    """A replicated linear (Ulysses' local MLP) fed the all-gathered full sequence: computes
    [B, S, out], saves the [B, S, H] input, and returns this rank's [B, S/P, out] tokens."""

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.group = group
        self.tag = ""

    def forward(self, x: Tensor) -> Tensor:
        P = dist.get_world_size(self.group)
        total = comm_ops.gather_from_sequence_parallel_region(x, self.group, self.tag)  # [B, S, H]
        out = F.linear(total, self.weight)  # saves total
        n = x.shape[1]
        return out.narrow(1, dist.get_rank(self.group) * n, n) if P > 1 else out


def inject_stray_full_save(block: nn.Module, group: dist.ProcessGroup) -> str:
    fc1 = block.mlp.fc1
    if isinstance(fc1, ColumnParallelLinear):
        fc1.keep_gathered_input = True
    else:
        replacement = GatheredInputLinear(fc1.in_features, fc1.out_features, group)
        block.mlp.fc1 = replacement
    return "mlp.fc1"


def inject_missing_reduce_scatter(block: nn.Module) -> str:
    if not isinstance(block, MegatronBlock):
        raise ValueError("missing-reduce-scatter needs a tensor-parallel MLP (megatron or hybrid)")
    block.disable_mlp_sequence_parallel()
    return "norm2"


class DebugActivationHook:
    """``register_forward_hook`` callable: gathers the block output [B, S/P, H] -> [B, S, H]
    and records its mean square, with autograd on (the bug), into ``stats``."""

    def __init__(self, group: dist.ProcessGroup, stats: list[Tensor], tag: str) -> None:
        self.group, self.stats, self.tag = group, stats, tag

    def __call__(self, module: nn.Module, args: object, output: Tensor) -> None:
        full = comm_ops.gather_from_sequence_parallel_region(output, self.group, f"{self.tag}::debug_hook")
        self.stats.append(full.float().square().mean())  # square() saves full: [B, S, H]


def inject_debug_hook(block: nn.Module, group: dist.ProcessGroup, stats: list[Tensor], tag: str) -> str:
    block.register_forward_hook(DebugActivationHook(group, stats, tag))
    return ""
