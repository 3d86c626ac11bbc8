"""The first article's third system: Ulysses attention (all-to-all between sequence and head
shards; its weights replicated, or sharded by FSDP2 with ``zero3``) plus a Megatron TP/SP MLP
(all-gather before fc1, reduce-scatter after fc2, and their backward twins)."""

from __future__ import annotations

import torch.distributed as dist
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.megatron_sp import MegatronBlock
from sptrace.reference_models.ulysses import UlyssesAttention


class HybridBlock(MegatronBlock):
    """A Megatron block whose attention is Ulysses'; the MLP and its collectives are Megatron's."""

    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__(cfg, group)
        self.attn = UlyssesAttention(cfg, group)
