"""Build a reference model for a StepConfig on one process group, load the dense reference
weights into its shards, and synchronise the gradients of its replicated parameters."""

from __future__ import annotations

import torch
import torch.distributed as dist
from sptrace.reference_models import comm_ops, faults
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.hybrid import HybridBlock
from sptrace.reference_models.layers import dense_layer_weights, torch_dtype
from sptrace.reference_models.megatron_sp import MegatronBlock
from sptrace.reference_models.ring import RingBlock, USPBlock
from sptrace.reference_models.ulysses import UlyssesBlock
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

BLOCKS = {"megatron": MegatronBlock, "ulysses": UlyssesBlock, "hybrid": HybridBlock, "ring": RingBlock, "usp": USPBlock}


class SPTransformer(nn.Module):
    """L pre-norm blocks of one scheme; input and output [B, S/P, H] on every rank."""

    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup, *, comm_markers: bool = True) -> None:
        super().__init__()
        self.cfg, self.group, self.comm_markers = cfg, group, comm_markers
        self.layers = nn.ModuleList(BLOCKS[cfg.scheme](cfg, group) for _ in range(cfg.layers))
        self.debug_stats: list[Tensor] = []
        self.fault_modules: list[str] = []
        """Qualified names of the modules a fault was injected into (recorded in run.json)."""
        if cfg.fault is not None:
            i = cfg.faulty_layer
            assert i is not None
            block = self.layers[i]
            if cfg.fault == "stray-full-save":
                where = faults.inject_stray_full_save(block, group)
            elif cfg.fault == "missing-reduce-scatter":
                where = faults.inject_missing_reduce_scatter(block)
            else:
                where = faults.inject_debug_hook(block, group, self.debug_stats, f"layers.{i}" if comm_markers else "")
            self.fault_modules.append(".".join(p for p in (f"layers.{i}", where) if p))
        if comm_markers:
            for name, module in self.named_modules():
                if hasattr(module, "tag"):
                    module.tag = name  # collectives carry the module they work for

    def forward(self, x: Tensor) -> Tensor:
        for block in self.layers:
            x = block(x)
        return x

    # -- weights ---------------------------------------------------------------------------

    def shard_of(self, name: str, full: Tensor) -> Tensor:
        """This rank's part of the dense parameter ``name`` (its gradient too)."""
        module = self.get_submodule(name.rpartition(".")[0])
        dim = getattr(module, "tp_shard_dim", None)
        if dim is None:
            return full
        P, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        return full.chunk(P, dim=dim)[rank]

    @torch.no_grad()
    def load_dense_weights(self) -> None:
        for i, block in enumerate(self.layers):
            for name, full in dense_layer_weights(self.cfg, i).items():
                param = block.get_parameter(name)
                param.copy_(self.shard_of(f"layers.{i}.{name}", full).to(param.dtype))

    # -- gradients -------------------------------------------------------------------------

    def replicated_params(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters every rank holds whole but trains on its own tokens: their gradients are
        partial sums over the group (Megatron: the norms; Ulysses: all, unless FSDP2 shards
        them; a norm that ran on the replicated full sequence is excluded)."""
        out = []
        for name, param in self.named_parameters():
            module = self.get_submodule(name.rpartition(".")[0])
            if isinstance(param, DTensor) or hasattr(module, "tp_shard_dim"):
                continue
            if getattr(module, "replicated_compute", False):
                continue
            out.append((name, param))
        return out

    @torch.no_grad()
    def finish_grad_sync(self) -> None:
        """Sum the replicated parameters' gradients over the group, after backward.

        megatron: one coalesced all-reduce in the gradient dtype (finalize_model_grads).
        ulysses / hybrid: fp32 buckets of at most ``grad_bucket_mib``, filled in reverse
        parameter order (DeepSpeed's default fp32 sequence-parallel gradient communication)."""
        grads = [p.grad for _, p in reversed(self.replicated_params()) if p.grad is not None]
        if not grads or dist.get_world_size(self.group) == 1:
            return
        if self.cfg.scheme == "megatron":
            buckets, fp32 = [grads], False
        else:
            cap = int(self.cfg.grad_bucket_mib * 2**20) // 4
            buckets, size, fp32 = [[]], 0, True
            for g in grads:
                if buckets[-1] and size + g.numel() > cap:
                    buckets.append([])
                    size = 0
                buckets[-1].append(g)
                size += g.numel()
        for i, bucket in enumerate(buckets):
            flat = torch.cat([g.reshape(-1).to(torch.float32 if fp32 else g.dtype) for g in bucket])
            comm_ops.all_reduce_(flat, self.group, "grad_sync" if self.comm_markers else "", f"ar_bucket{i}")
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def end_step(self) -> None:
        self.debug_stats.clear()


def build_model(
    cfg: StepConfig, group: dist.ProcessGroup, device: torch.device, *, comm_markers: bool = True
) -> SPTransformer:
    """The scheme's model on ``device`` with the dense reference weights, FSDP2-wrapped with
    ``cfg.zero3`` (gradients summed, reduced in fp32). ``comm_markers=False``: collectives carry
    no sptrace.comm markers (a trace like a foreign framework's)."""
    model = SPTransformer(cfg, group, comm_markers=comm_markers)
    model.to(device=device, dtype=torch_dtype(cfg))
    model.load_dense_weights()
    if cfg.zero3 and dist.get_world_size(group) > 1:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = DeviceMesh.from_group(group, device.type)
        policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)
        targets = [b.attn for b in model.layers] if cfg.scheme == "hybrid" else list(model.layers)
        for module in targets:
            # reshard after forward, gather again in backward: DeepSpeed ZeRO-3's default, k = 2
            # (explicit: left to None, FSDP2 keeps a root module's parameters gathered)
            fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
            # ranks' losses add up: sum the gradients, don't average (plain SUM also suits gloo,
            # which has neither AVG nor PREMUL_SUM)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model
