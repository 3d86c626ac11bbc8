"""The real-framework matrix at the shapes CI runs: real framework layers at P = 2, 4 and 8 on 8
gloo ranks, where the dimensions collide (S == H, (a/P)*S == H, F/P == H), each clean and with a
stray full-sequence tensor, and torch's own record of what was kept (a census by identity).

    python -m torch.distributed.run --standalone --nproc-per-node 8 \\
        -m tests.user_models.frameworks.matrix --out DIR [--only NAME ...] [--full]

Frameworks (``FRAMEWORKS``):

* megatron       Megatron-Core's TransformerBlock (two TransformerLayers from the local spec:
                 sequence parallelism, TP = P, unfused DotProductAttention with its global memory
                 buffer). Its stray: a pre-hook on layer 1's MLP gathers the sequence with autograd
                 and takes a statistic of it (pow saves the whole [S, B, H]).
* megatron_sdpa  the same block with torch's scaled_dot_product_attention as its core attention.
* ulysses        DeepSpeed-Ulysses' DistributedAttention around SDPA, replicated projections; its
                 stray: the same kind of hook on layer 1's attention.
* torch_tp       PyTorch-native TP + SP (``parallelize_module``: SequenceParallel norms,
                 PrepareModuleInput, ColwiseParallel / RowwiseParallel). The plain plan keeps each
                 ColwiseParallel linear's gathered input (a true stray in every layer);
                 checkpointed, each layer keeps only its input shard (clean).
* fsdp_tp        the torch_tp layers under FSDP2's ``fully_shard`` on a 2-D (dp, tp) mesh.
* ring           context parallelism: every head on this rank's S/P tokens, K and V passed around
                 the ring (``batch_isend_irecv``), each layer under activation checkpointing (clean);
                 the stray: layer 1 concatenates the received blocks into whole-sequence K and V
                 [B, a, S, d] and runs plain autograd attention, which saves them.

Each scenario is one untraced warm-up step, then torch.profiler (CPU, record_shapes,
profile_memory, with_stack; wait=0 warmup=1 active=2) over 3 steps, bare or under
``sptrace.instrument``, into DIR/<name>/. The truth (DIR/truth/<name>.json) is what torch saw, by identity: every
storage autograd saved during the profiled steps (a saved_tensors_hooks census), the storages known
to hold the whole sequence at width H (the planted tensor, each ColwiseParallel linear's gathered
input), and whether each was alive at its forward -> backward boundary.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()
import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import weakref  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator (see frameworks/job.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

# PATCH: Megatron-Core allocates with device=torch.cuda.current_device() (its global memory buffer, the
# sequence-parallel outputs); on a CPU build of torch that call raises. Point it at the CPU.
torch.cuda.current_device = lambda: torch.device("cpu")

FRAMEWORKS = ("megatron", "megatron_sdpa", "ulysses", "torch_tp", "fsdp_tp", "ring")
STRAY_LAYER = 1
LAYERS = 2
SEED = 4321


@dataclass(frozen=True)
class Shape:
    """One scenario's dimensions (batch, sequence, hidden, heads, MLP width) and its collisions."""

    B: int
    S: int
    H: int
    a: int
    F: int

    def collisions(self, p: int) -> list[str]:
        d = self.H // self.a
        hit = {"S==H": self.S == self.H, "(a/P)*S==H": self.a // p * self.S == self.H,
               "F/P==H": self.F // p == self.H, "a*d/P==H": self.a * d // p == self.H}  # fmt: skip
        return [k for k, v in hit.items() if v]


SHAPES = {
    2: Shape(B=2, S=32, H=32, a=4, F=96),  # S == H
    4: Shape(B=2, S=16, H=32, a=8, F=128),  # (a/P)*S == H, F/P == H
    8: Shape(B=2, S=16, H=16, a=8, F=128),  # S == H, (a/P)*S == H, F/P == H
}


@dataclass(frozen=True)
class Scenario:
    name: str
    framework: str
    sp: int
    stray: bool
    """Whether the model keeps a full-sequence tensor (the plant, or the plain TP plan's saves)."""
    instrumented: bool
    checkpointed: bool = False

    @property
    def shape(self) -> Shape:
        return SHAPES[self.sp]

    @property
    def stray_layers(self) -> list[int]:
        if not self.stray:
            return []
        return list(range(LAYERS)) if self.framework in ("torch_tp", "fsdp_tp") else [STRAY_LAYER]


def scenarios(full: bool = False) -> list[Scenario]:
    """Every framework clean and with its stray at P = 2, 4 and 8 (``full``), else the suite's
    share: each framework clean and stray at one P, the P's taking turns, every collision met."""
    out = []
    turn = {"megatron": 4, "megatron_sdpa": 8, "ulysses": 2, "torch_tp": 8, "fsdp_tp": 4, "ring": 2}
    for fw in FRAMEWORKS:
        for p in (2, 4, 8):
            if not full and p != turn[fw]:
                continue
            for stray in (False, True):
                tp = fw in ("torch_tp", "fsdp_tp")
                instrumented = p == 4 and fw != "fsdp_tp"
                name = f"{fw}_p{p}_{'stray' if stray else 'clean'}{'_instrumented' if instrumented else ''}"
                out.append(Scenario(name, fw, p, stray, instrumented, checkpointed=tp and not stray))
    return out


# ---------------------------------------------------------------- the census
class Census:
    """What autograd saved while ``active`` (storages, shapes, the innermost module), and the
    storages known to hold the whole sequence at width H (weak references, by identity)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.active = False
        self.step: int | None = None
        self.stack: list[str] = []
        self.param_ptrs: set[int] = set()
        self.full: dict[int, tuple[weakref.ref, dict]] = {}
        """storage pointer -> (weak reference to the storage, what it is)"""

    def attach(self, model: nn.Module) -> None:
        self.param_ptrs = {getattr(p, "_local_tensor", p).untyped_storage().data_ptr() for p in model.parameters()}
        for name, mod in model.named_modules():
            mod.register_forward_pre_hook(lambda m, a, n=name: self.stack.append(n), prepend=True)
            mod.register_forward_hook(lambda m, a, o: self._leave())

    def _leave(self) -> None:
        self.stack.pop()  # (returns None: a forward hook that returns something replaces the output)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            local = getattr(t, "_local_tensor", t)
            st = local.untyped_storage()
            self.records.append({
                "step": self.step, "module": self.stack[-1] if self.stack else "(loss)", "shape": list(t.shape),
                "dtype": str(t.dtype).replace("torch.", ""), "numel": local.numel(), "storage_nbytes": st.nbytes(),
                "data_ptr": st.data_ptr(), "is_param": st.data_ptr() in self.param_ptrs,
            })  # fmt: skip
        return t

    def full_sequence(self, t: torch.Tensor, what: str) -> None:
        """Record ``t`` (or a DTensor's local tensor) as holding the whole sequence at width H."""
        if not self.active:
            return
        local = getattr(t, "_local_tensor", t)
        st = local.untyped_storage()
        module = self.stack[-1] if self.stack else None
        self.full[st.data_ptr()] = (weakref.ref(st), {"what": what, "module": module, "shape": list(local.shape),
                                                      "bytes": st.nbytes(), "step": self.step})  # fmt: skip

    def alive_full(self) -> list[dict]:
        return [dict(info, data_ptr=ptr) for ptr, (ref, info) in self.full.items() if ref() is not None]


CENSUS = Census()


def layer_of(module: str | None) -> int | None:
    parts = (module or "").split(".")
    return next((int(p) for p in parts if p.isdigit()), None)


# ---------------------------------------------------------------- Megatron-Core
def build_megatron(sc: Scenario) -> nn.Module:
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    from megatron.core.transformer.transformer_block import TransformerBlock, TransformerBlockSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    # PATCH: the block forks Megatron's CUDA RNG tracker under sequence parallelism (for dropout, 0 here);
    # on a CPU build of torch the tracker cannot read a CUDA RNG state. Its fork changes nothing here.
    CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=sc.sp, create_gloo_process_groups=False)
    sh = sc.shape
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=sh.H, num_attention_heads=sh.a, ffn_hidden_size=sh.F,
        tensor_model_parallel_size=sc.sp, sequence_parallel=True, use_cpu_initialization=True,
        params_dtype=torch.float32, gradient_accumulation_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        attention_dropout=0.0, hidden_dropout=0.0,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = SequenceParallelLayerNorm
    if sc.framework == "megatron_sdpa":
        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    block = TransformerBlock(
        cfg, TransformerBlockSubmodules(layer_specs=[spec] * LAYERS, layer_norm=SequenceParallelLayerNorm)
    )
    if sc.stray:
        group = parallel_state.get_tensor_model_parallel_group()

        def stats(module: nn.Module, args: tuple) -> tuple:
            """PLANTED STRAY: activation statistics of the whole sequence, with autograd on."""
            x = args[0]
            full = gather_from_sequence_parallel_region(x, group=group)  # [S, B, H]
            CENSUS.full_sequence(full, "planted: the MLP input gathered by a statistics hook")
            return (x + 0.0 * full.pow(2).mean(), *args[1:])

        block.layers[STRAY_LAYER].mlp.register_forward_pre_hook(stats)
    return MegatronModel(block, sc)


class SequenceParallelLayerNorm:
    """torch's LayerNorm as Megatron-Core builds a norm (config, hidden_size, eps), its parameters
    marked sequence-parallel as Megatron's own norms mark them (WrappedTorchNorm refuses sequence
    parallelism; Apex's and Transformer Engine's norms need CUDA)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5):
        norm = nn.LayerNorm(hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = True
        return norm


class SDPACoreAttention(nn.Module):
    """A Megatron-Core core attention (the DotProductAttention interface) that runs torch's
    scaled_dot_product_attention on this rank's heads: [sq, b, np, hn] -> [sq, b, np * hn]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **kwargs) -> None:
        super().__init__()
        self.config = config

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):  # fmt: skip
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, np, s, hn]
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s, b = query.shape[0], query.shape[1]
        return ctx.permute(2, 0, 1, 3).reshape(s, b, -1)


class MegatronModel(nn.Module):
    def __init__(self, block: nn.Module, sc: Scenario) -> None:
        super().__init__()
        self.decoder = block
        s = sc.shape.S
        self.register_buffer("mask", torch.triu(torch.ones(s, s), diagonal=1).bool()[None, None], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [S/P, B, H] -> [S/P, B, H]
        return self.decoder(hidden_states=x, attention_mask=self.mask)


# ---------------------------------------------------------------- DeepSpeed-Ulysses
def build_ulysses(sc: Scenario, group: dist.ProcessGroup) -> nn.Module:
    from deepspeed.sequence.layer import DistributedAttention

    sh = sc.shape
    d = sh.H // sh.a

    class LocalAttention(nn.Module):
        def forward(self, q, k, v):  # [S, B, h/P, d]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3)

    class UlyssesLayer(nn.Module):
        def __init__(self, stray: bool) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(sh.H)
            self.qkv, self.proj = nn.Linear(sh.H, 3 * sh.H), nn.Linear(sh.H, sh.H)
            self.attn = DistributedAttention(LocalAttention(), group, scatter_idx=2, gather_idx=0)
            self.up, self.down = nn.Linear(sh.H, sh.F), nn.Linear(sh.F, sh.H)
            if stray:
                self.attn.register_forward_pre_hook(partial(ulysses_stray, group))

        def forward(self, x):  # [S/P, B, H]
            s, b, _ = x.shape
            q, k, v = self.qkv(self.norm(x)).view(s, b, 3, sh.a, d).unbind(2)
            x = x + self.proj(self.attn(q, k, v, 1).reshape(s, b, sh.H))
            return x + self.down(F.gelu(self.up(x)))

    return Layers([UlyssesLayer(sc.stray and i == STRAY_LAYER) for i in range(LAYERS)])


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 0 with autograd (the stray hooks' own gather); backward reduce-scatters."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def ulysses_stray(group, module, args):
    """PLANTED STRAY: statistics of the whole-sequence query, with autograd on."""
    q = args[0]
    full = _GatherSeq.apply(q, group)  # [S, B, a, d]: S*B*H elements
    CENSUS.full_sequence(full, "planted: the query gathered by a statistics hook")
    return (q + 0.0 * full.pow(2).mean(), *args[1:])


class Layers(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# ---------------------------------------------------------------- PyTorch-native TP + SP (and FSDP2)
class TPAttention(nn.Module):
    def __init__(self, sh: Shape) -> None:
        super().__init__()
        self.d = sh.H // sh.a
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(sh.H, sh.H, bias=False) for _ in range(4))

    def forward(self, x):  # [B, S, H] (replicated: gathered by PrepareModuleInput)
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.d).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(ctx.transpose(1, 2).reshape(b, s, -1))


class TPFeedForward(nn.Module):
    def __init__(self, sh: Shape) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(sh.H, sh.F, bias=False), nn.Linear(sh.F, sh.H, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TPBlock(nn.Module):
    def __init__(self, sh: Shape, checkpointed: bool) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(sh.H), nn.LayerNorm(sh.H)
        self.attention, self.feed_forward = TPAttention(sh), TPFeedForward(sh)
        self.checkpointed = checkpointed

    def block(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))

    def forward(self, x):  # [B, S/P, H] -> [B, S/P, H]
        return checkpoint(self.block, x, use_reentrant=False) if self.checkpointed else self.block(x)


def build_torch_tp(sc: Scenario) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )  # fmt: skip

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // sc.sp, sc.sp), mesh_dim_names=("dp", "tp"))
    model = Layers([TPBlock(sc.shape, sc.checkpointed) for _ in range(LAYERS)])
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }  # fmt: skip
    for block in model.layers:
        parallelize_module(block, mesh["tp"], plan)
        for linear in (block.attention.wq, block.feed_forward.w1):  # the truth: what each colwise linear took
            linear.register_forward_pre_hook(lambda m, a: CENSUS.full_sequence(a[0], "a ColwiseParallel input"))
    if sc.framework == "fsdp_tp":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model


# ---------------------------------------------------------------- ring attention (context parallelism)
class RingLayer(nn.Module):
    """Every head on this rank's tokens; K and V blocks passed around the ring, then joined."""

    def __init__(self, sh: Shape, group: dist.ProcessGroup, stray: bool) -> None:
        super().__init__()
        self.a, self.d, self.group, self.stray = sh.a, sh.H // sh.a, group, stray
        self.norm, self.qkv, self.proj = nn.LayerNorm(sh.H), nn.Linear(sh.H, 3 * sh.H), nn.Linear(sh.H, sh.H)

    def gather_ring(self, t: torch.Tensor) -> torch.Tensor:
        """[B, a, S/P, d] -> [B, a, S, d]: P - 1 ring steps (to the next rank, from the previous), joined."""
        p, me = dist.get_world_size(self.group), dist.get_rank(self.group)
        ranks = dist.get_process_group_ranks(self.group)
        blocks, block = [t] * p, t.contiguous()
        for step in range(1, p):
            incoming = torch.empty_like(block)
            ops = [dist.P2POp(dist.isend, block, ranks[(me + 1) % p], self.group),
                   dist.P2POp(dist.irecv, incoming, ranks[(me - 1) % p], self.group)]  # fmt: skip
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            blocks[(me - step) % p] = block = incoming
        return _RingJoin.apply(torch.cat(blocks, dim=2), t, me)

    def block(self, x: torch.Tensor) -> torch.Tensor:  # [B, S/P, H]
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.a, self.d).permute(2, 0, 3, 1, 4)
        k_all, v_all = self.gather_ring(k), self.gather_ring(v)
        if torch.is_grad_enabled() and self.stray:
            for t in (k_all, v_all):
                CENSUS.full_sequence(t, "planted: K or V joined over the whole sequence, saved by attention")
        probs = (q @ k_all.transpose(-1, -2) / self.d**0.5).softmax(-1)  # [B, a, S/P, S]
        return x + self.proj((probs @ v_all).transpose(1, 2).reshape(b, s, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) if self.stray else checkpoint(self.block, x, use_reentrant=False)


class _RingJoin(torch.autograd.Function):
    """The joined blocks, with this rank's block's gradient back (the others' go to their ranks in
    a real ring's backward; here they are dropped: the numbers do not matter, what is kept does)."""

    @staticmethod
    def forward(ctx, joined: torch.Tensor, mine: torch.Tensor, me: int) -> torch.Tensor:
        ctx.me, ctx.s = me, mine.shape[2]
        return joined

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, grad.narrow(2, ctx.me * ctx.s, ctx.s), None


def build_ring(sc: Scenario, group: dist.ProcessGroup) -> nn.Module:
    return Layers([RingLayer(sc.shape, group, sc.stray and i == STRAY_LAYER) for i in range(LAYERS)])


# ---------------------------------------------------------------- driver
def run_scenario(sc: Scenario, root: Path, groups: dict[int, dist.ProcessGroup]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)  # one seed everywhere: Megatron's CPU init splits one master weight
    sh = sc.shape
    if sc.framework.startswith("megatron"):
        model = build_megatron(sc)
    elif sc.framework == "ulysses":
        model = build_ulysses(sc, groups[sc.sp])
    elif sc.framework == "ring":
        model = build_ring(sc, groups[sc.sp])
    else:
        model = build_torch_tp(sc)
    CENSUS.__init__()
    CENSUS.attach(model)
    if sc.instrumented:
        import sptrace

        sptrace.instrument(model)
    batch_first = sc.framework in ("torch_tp", "fsdp_tp", "ring")
    s_local = sh.S // sc.sp
    member = rank % sc.sp
    torch.manual_seed(SEED + rank // sc.sp)
    x_full = torch.randn(sh.B, sh.S, sh.H) if batch_first else torch.randn(sh.S, sh.B, sh.H)
    x = (x_full[:, member * s_local : (member + 1) * s_local] if batch_first
         else x_full[member * s_local : (member + 1) * s_local]).clone()  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    boundary: list[list[dict]] = []
    saved_full: list[list[dict]] = []
    losses: list[float] = []

    def step(i: int, record: bool) -> None:
        CENSUS.step, CENSUS.active, CENSUS.full = i, record, {}
        CENSUS.records = [r for r in CENSUS.records if r["step"] != i]
        with torch.autograd.graph.saved_tensors_hooks(CENSUS.pack, lambda t: t):
            loss = model(x).pow(2).mean()
        CENSUS.active = False
        if record:  # the forward -> backward boundary: which whole-sequence storages are alive, which were saved
            # (alive is kept: each is the model's own tensor, never a buffer a backend could hold,
            # and under sptrace.instrument its saved-tensor hooks, not this census's, see the saves)
            alive = CENSUS.alive_full()
            boundary.append(alive)
            saved_full.append(alive)
        loss.backward()
        if record:
            losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(-1, False)  # untraced warm-up
    out = root / sc.name
    out.mkdir(parents=True, exist_ok=True)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
    ) as prof:  # fmt: skip
        for i in range(3):
            step(i, record=i >= 1)  # step 0 is the profiler's warm-up
            prof.step()
    prof.export_chrome_trace(str(out / f"rank{rank}.pt.trace.json.gz"))
    mine = {"kept_full": saved_full, "alive_full": boundary, "losses": losses,
            "saved": [r for r in CENSUS.records if r["step"] in (1, 2)]}  # fmt: skip
    gathered: list = [None] * world
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
    if rank == 0:
        kept = {r: [sorted({layer_of(x["module"]) for x in step_kept}) for step_kept in g["kept_full"]]
                for r, g in enumerate(gathered)}  # fmt: skip
        want = int(any(any(k) for k in kept.values()))
        truth = {
            "scenario": asdict(sc), "framework": sc.framework, "want_exit": want,
            "config": {"batch": sh.B, "seq": sh.S, "hidden": sh.H, "sp": sc.sp, "heads": sh.a, "ffn": sh.F,
                       "layers": LAYERS, "dtype": "float32", "layout": "bsh" if batch_first else "sbh",
                       "collisions": sh.collisions(sc.sp)},
            "stray_layers": sorted({layer for k in kept.values() for per_step in k for layer in per_step
                                    if layer is not None}),
            "kept_layers_by_rank": kept, "profiled_steps": [1, 2], "versions": versions(),
            "ranks": {str(r): g for r, g in enumerate(gathered)},
        }  # fmt: skip
        (root / "truth").mkdir(exist_ok=True)
        (root / "truth" / f"{sc.name}.json").write_text(json.dumps(truth, indent=1))
    dist.barrier()


def versions() -> dict:
    import deepspeed
    import megatron.core

    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "megatron_core": megatron.core.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--full", action="store_true", help="every framework at P = 2, 4 and 8 (CI)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {world: dist.group.WORLD}
    for p in (2, 4):
        mine = [dist.new_group(list(range(start, start + p))) for start in range(0, world, p)]
        groups[p] = mine[rank // p]
    import deepspeed.comm as ds_dist
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # (frameworks/job.py says why)
    ds_dist.init_distributed(dist_backend="gloo")
    timings = {"import_s": round(time.perf_counter() - T_START, 2)}
    root = Path(args.out)
    for sc in scenarios(args.full):
        if args.only and sc.name not in args.only and sc.framework not in args.only:
            continue
        t0 = time.perf_counter()
        run_scenario(sc, root, groups)
        timings[sc.name] = round(time.perf_counter() - t0, 2)
    if rank == 0:
        print(json.dumps({"seconds": timings}))
        (root / "done").write_text("ok\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
