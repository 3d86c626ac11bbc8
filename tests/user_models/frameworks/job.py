"""Real-framework sequence-parallel traces on CPU/gloo, with a saved-tensor ground truth: the
real Megatron-Core tensor-parallel layers with sequence parallelism, and the real
DeepSpeed-Ulysses DistributedAttention, each clean and with one planted stray full-size save
(tests/user_models/test_frameworks.py judges `sptrace check` against the truth).

Launch (one launch runs every scenario, one after the other, in the same processes):

    python -m torch.distributed.run --standalone --nproc-per-node 4 \
        -m tests.user_models.frameworks.job --out DIR [--scenario NAME ...]

Scenarios (P = world size, layout seq-first [S, B, H] as both libraries use):

* megatron_clean  - Megatron-Core ColumnParallelLinear -> GELU -> RowParallelLinear, sequence_parallel=True,
                    TP = P.  Megatron saves the [S/P, B, H] input shard and re-all-gathers it in backward.
* megatron_stray  - the same, but layer STRAY_LAYER's fc1 runs as PyTorch-native ColwiseParallel after
                    SequenceParallel does: all-gather with autograd, then a local linear, so autograd saves
                    the full [S, B, H] input (and backward has no re-all-gather there).
* deepspeed_clean - DeepSpeed-Ulysses DistributedAttention (scatter_idx=2, gather_idx=0, batch_dim_idx=1)
                    around torch SDPA; qkv/proj are plain replicated nn.Linear.  Saves [S/P, B, *] outside
                    attention and [S, B, heads/P, d] head shards inside it.
* deepspeed_stray - the same, plus an activation-statistics pre-hook on layer STRAY_LAYER's attention that
                    all-gathers the query over the sequence with autograd on; pow() saves the full
                    [S, B, heads, d] (= S*B*H elements) tensor.  Numerically harmless (adds 0 * stat).

Each scenario: one untraced warm-up step, then torch.profiler (CPU, record_shapes, profile_memory,
with_stack; schedule wait=0 warmup=1 active=2) over 3 forward+backward steps, exported to
DIR/<scenario>/rank{r}.pt.trace.json.gz.  During the 2 recorded steps a saved_tensors_hooks census records
every tensor autograd saves; rank 0 writes DIR/<scenario>/truth.json with every rank's census.
The test asserts the census (the planted tensor is the only full-size save), the plant's lifetime, the
losses (the stray is numerically harmless) and the collective counts, then the gate's verdicts.

CPU/gloo patches (each marked PATCH below): DS_ACCELERATOR=cpu; torch.cuda.current_device -> cpu for
Megatron's allocations; DeepSpeed's shared-memory comm op marked incompatible so it is not JIT-built.
"""

import time

T_START = time.perf_counter()
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import weakref  # noqa: E402

# PATCH (config, no monkeypatch): make DeepSpeed pick its CPU accelerator (gloo comm backend when
# oneccl_bindings_for_pytorch is absent) instead of probing for CUDA.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402 (after DS_ACCELERATOR, which DeepSpeed reads when it is imported)
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# PATCH: Megatron-Core allocates with device=torch.cuda.current_device() on the sequence-parallel paths
# (global all-gather buffer, reduce-scatter outputs, the dgrad reduce-scatter buffer in backward) and has
# no option to avoid it; on a CPU build of torch that call raises.  Point it at the CPU.
torch.cuda.current_device = lambda: torch.device("cpu")

import deepspeed.comm as ds_dist  # noqa: E402
import deepspeed.ops  # noqa: E402
from deepspeed.sequence.layer import DistributedAttention  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.model_parallel_config import ModelParallelConfig  # noqa: E402
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region  # noqa: E402

B, S, H, FFN, HEADS, LAYERS = 2, 32, 48, 64, 8, 2  # S != H, FFN/P = 16 != H, d = 6
D = H // HEADS
STRAY_LAYER = 1
SEED = 1234
SCENARIOS = ("megatron_clean", "megatron_stray", "deepspeed_clean", "deepspeed_stray")


# ---------------------------------------------------------------- saved-tensor census
class Census:
    """Records every tensor autograd saves while `active`, tagged with the innermost running module."""

    def __init__(self):
        self.records, self.active, self.step, self.stack = [], False, None, []
        self.param_ptrs = set()
        self.plant = self.plant_ptr = None  # weakref / storage address of this step's planted stray
        self.plant_info = None

    def attach(self, model):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        for name, mod in model.named_modules():
            # prepend=True: the module name is pushed before any other pre-hook (the planted one) runs
            mod.register_forward_pre_hook(lambda m, a, n=name: self.stack.append(n), prepend=True)
            mod.register_forward_hook(lambda m, a, o: self.stack.pop() and None)  # None: keep the output

    def pack(self, t):
        if self.active:
            st = t.untyped_storage()
            self.records.append(
                {
                    "step": self.step,
                    "module": self.stack[-1] if self.stack else "(loss)",
                    "shape": list(t.shape),
                    "dtype": str(t.dtype).replace("torch.", ""),
                    "numel": t.numel(),
                    "storage_nbytes": st.nbytes(),
                    "data_ptr": st.data_ptr(),
                    "is_param": isinstance(t, nn.Parameter) or st.data_ptr() in self.param_ptrs,
                    "planted": st.data_ptr() == self.plant_ptr,
                }
            )
        return t

    def planted(self, t, module, kind):
        self.plant, self.plant_ptr = weakref.ref(t), t.untyped_storage().data_ptr()
        self.plant_info = {
            "module": module,
            "kind": kind,
            "shape": list(t.shape),
            "bytes": t.untyped_storage().nbytes(),
            "data_ptr": t.untyped_storage().data_ptr(),
        }


CENSUS = Census()


# ---------------------------------------------------------------- Megatron-Core TP + SP
class StrayColumnParallelLinear(ColumnParallelLinear):
    """PLANTED STRAY: ColwiseParallel-style forward (autograd all-gather, then local linear).

    Same weights, same result as Megatron's fused path, but F.linear saves the gathered [S, B, H] input.
    """

    def forward(self, input_, weight=None, runtime_gather_output=None):
        full = gather_from_sequence_parallel_region(input_, group=self.tp_group)
        CENSUS.planted(full, CENSUS.stack[-1], "colwise_parallel_saved_full_input")
        return F.linear(full, self.weight, self.bias), None


class MegatronMLP(nn.Module):
    def __init__(self, cfg, stray):
        super().__init__()
        init = lambda w: nn.init.normal_(w, std=0.05)  # noqa: E731
        col = StrayColumnParallelLinear if stray else ColumnParallelLinear
        self.fc1 = col(H, FFN, config=cfg, init_method=init, bias=True, gather_output=False)
        self.fc2 = RowParallelLinear(
            FFN, H, config=cfg, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False
        )

    def forward(self, x):  # x: [S/P, B, H] -> [S/P, B, H]
        h, _ = self.fc1(x)  # [S, B, FFN/P]: sequence all-gathered inside the layer
        y, _ = self.fc2(F.gelu(h))  # reduce-scattered back to [S/P, B, H]
        return x + y


def build_megatron(stray):
    cfg = ModelParallelConfig(
        tensor_model_parallel_size=dist.get_world_size(),
        sequence_parallel=True,
        use_cpu_initialization=True,  # config, not patch: init weights on CPU
        params_dtype=torch.float32,
        gradient_accumulation_fusion=False,
    )
    layers = [MegatronMLP(cfg, stray and i == STRAY_LAYER) for i in range(LAYERS)]
    return nn.ModuleDict({"layers": nn.Sequential(*layers)})


# ---------------------------------------------------------------- DeepSpeed-Ulysses
class LocalAttention(nn.Module):
    """Local attention over the full sequence and this rank's heads: [S, B, h, d] -> [S, B, h, d]."""

    def forward(self, q, k, v):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # SDPA wants [B, h, S, d]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3)


class _SeqAllGather(torch.autograd.Function):
    """All-gather along dim 0 through deepspeed.comm; backward reduce-scatters (used by the stray only)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, p = group, ds_dist.get_world_size(group)
        out = x.new_empty((x.shape[0] * p, *x.shape[1:]))
        ds_dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        p = ds_dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // p, *grad.shape[1:]))
        ds_dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def stray_stats_hook(module, args):
    """PLANTED STRAY: activation statistics of the full-sequence query, computed with autograd on."""
    q = args[0]
    full = _SeqAllGather.apply(q, module.spg)  # [S, B, heads, d]: S*B*H elements
    CENSUS.planted(full, CENSUS.stack[-1], "debug_stats_hook_saved_full_query")
    stat = full.pow(2).mean()  # pow saves `full` for backward
    return (q + 0.0 * stat, *args[1:])


class UlyssesLayer(nn.Module):
    def __init__(self, group, stray):
        super().__init__()
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.attn = DistributedAttention(LocalAttention(), group, scatter_idx=2, gather_idx=0)
        if stray:
            self.attn.register_forward_pre_hook(stray_stats_hook)

    def forward(self, x):  # x: [S/P, B, H] -> [S/P, B, H]
        s, b, _ = x.shape
        q, k, v = self.qkv(x).view(s, b, 3, HEADS, D).unbind(2)  # [S/P, B, heads, d]
        ctx = self.attn(q, k, v, 1)  # batch_dim_idx=1: seq-first; all-to-all -> [S, B, heads/P, d] inside
        return x + self.proj(ctx.reshape(s, b, H))


def build_deepspeed(stray):
    layers = [UlyssesLayer(dist.group.WORLD, stray and i == STRAY_LAYER) for i in range(LAYERS)]
    return nn.ModuleDict({"layers": nn.Sequential(*layers)})


# ---------------------------------------------------------------- driver
def run_scenario(name, out_dir, rank, world):
    torch.manual_seed(SEED)  # same seed everywhere: Megatron's CPU init splits one master weight
    stray = name.endswith("_stray")
    model = (build_megatron if name.startswith("megatron") else build_deepspeed)(stray)
    CENSUS.__init__()
    CENSUS.attach(model)
    x_full = torch.randn(S, B, H)
    # clone: a chunk of x_full is a view that would keep (and report) the full input's storage
    x = x_full.chunk(world, dim=0)[rank].clone()  # this rank's sequence shard [S/P, B, H]
    boundary, freed, losses = [], [], []

    def step(i, record):
        CENSUS.step, CENSUS.active, CENSUS.plant, CENSUS.plant_ptr = i, record, None, None
        with torch.autograd.graph.saved_tensors_hooks(CENSUS.pack, lambda t: t):
            loss = model["layers"](x).pow(2).mean()
        CENSUS.active = False
        if record:  # forward -> backward boundary
            boundary.append(CENSUS.plant is not None and CENSUS.plant() is not None)
        loss.backward()
        if record:
            freed.append(CENSUS.plant is None or CENSUS.plant() is None)
            losses.append(loss.item())
        model.zero_grad(set_to_none=True)

    step(-1, False)  # untraced warm-up
    os.makedirs(os.path.join(out_dir, name), exist_ok=True)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    t0 = time.perf_counter()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=sched,
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    ) as prof:
        for i in range(3):
            step(i, record=i >= 1)  # step 0 is the profiler's warm-up
            prof.step()
    prof.export_chrome_trace(os.path.join(out_dir, name, f"rank{rank}.pt.trace.json.gz"))
    elapsed = time.perf_counter() - t0

    full_numel = S * B * H  # a saved tensor is "full-size" if its elements or its storage reach [S, B, H]
    big = [
        r for r in CENSUS.records if not r["is_param"] and max(r["numel"] * 4, r["storage_nbytes"]) >= full_numel * 4
    ]
    mine = {
        "records": CENSUS.records,
        "full_size_saved": big,
        "plant": CENSUS.plant_info,
        "plant_alive_at_boundary": boundary,
        "plant_freed_after_backward": freed,
        "losses": losses,
        "profiled_s": round(elapsed, 3),
    }
    gathered = [None] * world
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)  # after export: not in the trace
    if rank == 0:
        truth = {
            "scenario": name,
            "framework": name.split("_")[0],
            "want_exit": int(stray),
            "config": {
                "B": B,
                "S": S,
                "H": H,
                "P": world,
                "F": FFN,
                "heads": HEADS,
                "head_dim": D,
                "layers": LAYERS,
                "dtype": "float32",
                "layout": "seq_first",
                "full_activation_numel": full_numel,
                "full_activation_bytes": full_numel * 4,
            },
            "stray": ({"layer": STRAY_LAYER, **gathered[0]["plant"]} if stray else None),
            "profiled_steps": [1, 2],
            "versions": versions(),
            "ranks": {str(r): g for r, g in enumerate(gathered)},
        }
        with open(os.path.join(out_dir, name, "truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
    return elapsed


def versions():
    import deepspeed
    import megatron.core

    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "megatron_core": megatron.core.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_imported = time.perf_counter()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert S % world == 0 and HEADS % world == 0 and FFN % world == 0
    # Megatron: real parallel_state with TP = world size (no PP/CP/DP); no extra gloo groups needed.
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world, create_gloo_process_groups=False)
    # PATCH (DeepSpeed's own op-compatibility table, not a monkeypatch): with the CPU accelerator,
    # init_distributed JIT-compiles a C++ shared-memory all-reduce op (~55 s on 2 cores, needs g++) that only
    # inference_all_reduce uses.  Marked incompatible, DeepSpeed skips it and keeps plain torch.distributed.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    ds_dist.init_distributed(dist_backend="gloo")  # wraps the already initialised torch.distributed
    timings = {"import_s": round(t_imported - T_START, 2), "init_s": round(time.perf_counter() - t_imported, 2)}
    for name in args.scenario or SCENARIOS:
        t0 = time.perf_counter()
        run_scenario(name, args.out, rank, world)
        dist.barrier()
        timings[name] = round(time.perf_counter() - t0, 2)
    if rank == 0:
        print(json.dumps({"seconds": timings}))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
