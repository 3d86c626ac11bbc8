"""Run every user model on 8 gloo ranks, profile one training step of each with plain
torch.profiler (no sptrace code in the step), and write each rank's oracle beside it:

    python -m torch.distributed.run --standalone --nproc-per-node 8 -m tests.user_models.job --out DIR

DIR/<scenario>/rank{r}.json   the trace, as a user exports it
DIR/oracle/<scenario>/rank{r}.json
    comm_counts   CommDebugMode's count of each collective op over one forward + backward
    tensors       the shapes the model's own tensors had at each collective (in, out, group size)
    saved         a saved_tensors_hooks census of one forward: local shape, dtype, storage, module
    held          tensors the model keeps outside autograd across the boundary (their shapes)
    sac           what the SAC policy told checkpointing to keep (op, shape)
    p2p           every dist.isend / dist.irecv of a forward and a backward: peer, bytes
    stray         where a scenario put its one stray full-size save (its step or micro-batch and
                  module), and what autograd saved for it (a census with the stray on)
    config        B, S, H, a, F, P of the scenario

The oracles come from the models and torch, never from sptrace.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from tests.user_models import models

B, S, H, HEADS = 2, 64, 48, 8  # S/P = 8 at P = 8; H/P = 6; every shard width differs from H


def census(model: nn.Module, step: Callable[[], Tensor]) -> list[dict[str, Any]]:
    """Every tensor autograd saves during one forward, with the module that saved it (a
    saved_tensors_hooks pack hook and forward hooks: torch's own view of what is kept)."""
    stack: list[str] = []
    handles = []

    def enter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            stack.append(name or "<root>")

        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:  # None: the output is untouched
        if stack:
            stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    saved: list[dict[str, Any]] = []

    def pack(t: Tensor) -> Tensor:
        local = getattr(t, "_local_tensor", t)  # a DTensor: what this rank holds
        is_param = isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad)
        saved.append({
            "module": stack[-1] if stack else "<outside>", "shape": list(local.shape), "dtype": str(local.dtype),
            "storage": local.untyped_storage().data_ptr(), "storage_bytes": local.untyped_storage().nbytes(),
            "param": bool(is_param), "dtensor": hasattr(t, "_local_tensor"),
            # DTensor's own word on what this rank holds: Replicate() on every mesh dim is the
            # whole tensor (the gathered sequence), Shard(d) a 1/P piece of dim d
            "placements": [str(p) for p in t.placements] if hasattr(t, "placements") else None,
        })  # fmt: skip
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = step()
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return saved


def comm_counts(step: Callable[[], Tensor]) -> dict[str, int]:
    from torch.distributed.tensor.debug import CommDebugMode

    mode = CommDebugMode()
    with mode:
        step().backward()
    return {str(op): int(n) for op, n in mode.get_comm_counts().items()}


def profiled(out: Path, step: Callable[[], Any], *, backward_in_window: bool = True) -> None:
    """Two warm-up steps, then one step under torch.profiler with the usual options, exported as
    a user would (prof.export_chrome_trace)."""
    for _ in range(2):
        step()
    dist.barrier()
    rank = dist.get_rank()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True) as prof:
        step()
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    dist.barrier()


def two_active_steps(active: int = 2) -> Any:
    """torch.profiler with the usual options over a schedule of one warm-up step and two (or
    ``active``) active ones (the loop calls prof.step() after each step, as the torch.profiler
    docs show)."""
    from torch.profiler import schedule

    return profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
                   schedule=schedule(wait=0, warmup=1, active=active, repeat=1))  # fmt: skip


def write_oracle(root: Path, name: str, data: dict[str, Any]) -> None:
    path = root / "oracle" / name / f"rank{dist.get_rank()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def sgd_step(model: nn.Module, forward: Callable[[], Tensor], *, keep_graph_until_step: bool = False):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        loss = forward()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def shard_of(full: Tensor, rank: int, world: int, dim: int = 1) -> Tensor:
    return full.chunk(world, dim=dim)[rank].contiguous()


# ---- scenarios ---------------------------------------------------------------------------------


def tp_sp_native(root: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ffn = 4 * H
    model = models.parallelize_tp_sp(models.Transformer(2, H, HEADS, ffn), mesh)
    x_full = torch.randn(B, S, H)
    x = shard_of(x_full, rank, world)  # [B, S/P, H]: the residual stream stays a local shard

    def forward() -> Tensor:
        return model(x).square().mean()

    counts = comm_counts(forward)
    saved = census(model, forward)
    profiled(root / "tp_sp_native", sgd_step(model, forward))
    write_oracle(root, "tp_sp_native", {
        "comm_counts": counts, "saved": saved,
        "config": {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "ffn": ffn, "sp": world, "layers": 2},
        "tensors": {"all_gather": {"in": [B, S // world, H], "out": [B, S, H]}},
    })  # fmt: skip


def tp_sp_instrumented(root: Path) -> None:
    """The same PyTorch-native TP + SP model, with the one line a user adds for exact shapes:
    sptrace.instrument(model) after parallelize_module (saved-tensor records of DTensors)."""
    from torch.distributed.device_mesh import init_device_mesh

    import sptrace

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = models.parallelize_tp_sp(models.Transformer(2, H, HEADS, 4 * H), mesh)
    sptrace.instrument(model)
    x = shard_of(torch.randn(B, S, H), rank, world)

    def forward() -> Tensor:
        return model(x).square().mean()

    saved = census(model, forward)
    profiled(root / "tp_sp_instrumented", sgd_step(model, forward))
    write_oracle(root, "tp_sp_instrumented", {
        "saved": saved, "config": {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "ffn": 4 * H, "sp": world},
    })  # fmt: skip


def functional_ulysses(root: Path) -> None:
    import torch.distributed._functional_collectives as funcol

    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch.manual_seed(1)
    model = nn.Sequential(*(models.FunctionalUlysses(H, HEADS, 2 * H, group) for _ in range(2)))
    x = shard_of(torch.randn(B, S, H), rank, world)
    # an uneven all-to-all (all_to_all_v), as token routing issues: rank r sends r+1 rows to each peer
    send_rows = [rank + 1] * world
    recv_rows = [peer + 1 for peer in range(world)]

    def forward() -> Tensor:
        out = model(x)
        routed = funcol.all_to_all_single(torch.ones(sum(send_rows), 4), recv_rows, send_rows, group)
        total = funcol.all_reduce(out.square().mean().reshape(1), "sum", group)
        return total.sum() / world + 0 * routed.sum()

    counts = comm_counts(forward)
    profiled(root / "functional_ulysses", sgd_step(model, forward))
    per = B * (S // world) * H  # elements of one q, k, v or context shard
    write_oracle(root, "functional_ulysses", {
        "comm_counts": counts,
        "config": {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "sp": world, "layers": 2},
        "tensors": {
            "all_to_all": {"elements": per},
            "all_to_all_v": {"in_elements": sum(send_rows) * 4, "out_elements": sum(recv_rows) * 4},
            "all_reduce": {"elements": 1},
        },
    })  # fmt: skip


def deepspeed_ulysses(root: Path) -> None:
    """DeepSpeed-Ulysses' layout, sequence-first: x is [S/P, B, H] on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(3)
    model = nn.Sequential(*(models.DeepSpeedUlysses(H, HEADS, dist.group.WORLD) for _ in range(2)))
    x = shard_of(torch.randn(S, B, H), rank, world, dim=0)

    def forward() -> Tensor:
        return model(x).square().mean()

    saved = census(model, forward)
    counts = comm_counts(forward)
    profiled(root / "deepspeed_ulysses", sgd_step(model, forward))
    write_oracle(root, "deepspeed_ulysses", {
        "saved": saved, "comm_counts": counts,
        "config": {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "sp": world, "layers": 2},
    })  # fmt: skip


def list_allgather(root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(2)
    model = nn.Sequential(*(models.ListGatherBlock(H, dist.group.WORLD) for _ in range(2)))
    x = shard_of(torch.randn(B, S, H), rank, world)

    def forward() -> Tensor:
        return model(x).square().mean()

    counts = comm_counts(forward)
    profiled(root / "list_allgather", sgd_step(model, forward))
    write_oracle(root, "list_allgather", {
        "comm_counts": counts, "config": {"batch": B, "seq": S, "hidden": H, "sp": world, "layers": 2},
        "tensors": {"all_gather": {"in_elements": B * (S // world) * H, "group": world},
                    "scatter": {"out_elements": B * (S // world) * H, "group": world}},
    })  # fmt: skip


def p2p_ring(root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(3)
    model = models.RingMixer(H, dist.group.WORLD)
    x = shard_of(torch.randn(B, S, H), rank, world)

    def forward() -> Tensor:
        return model(x).square().mean()

    profiled(root / "p2p_ring", sgd_step(model, forward))
    write_oracle(root, "p2p_ring", {
        "config": {"batch": B, "seq": S, "hidden": H, "sp": world},
        "tensors": {"send": {"elements": B * (S // world) * H, "count": world - 1, "peer": (rank + 1) % world},
                    "recv": {"elements": B * (S // world) * H, "count": world - 1, "peer": (rank - 1) % world}},
    })  # fmt: skip


def p2p_calls(step: Callable[[], None]) -> dict[str, list[dict[str, Any]]]:
    """Every dist.isend / dist.irecv of one forward and one backward, with its global peer and
    bytes: torch's own functions wrapped (CommDebugMode does not see point-to-point ops)."""
    calls: dict[str, list[dict[str, Any]]] = {"forward": [], "backward": []}
    phase = ["forward"]
    originals = {"isend": dist.isend, "irecv": dist.irecv}

    def counted(name: str) -> Callable[..., Any]:
        def call(tensor: Tensor, peer: int, *args: Any, **kwargs: Any) -> Any:
            calls[phase[0]].append({"op": name, "peer": peer, "bytes": tensor.numel() * tensor.element_size()})
            return originals[name](tensor, peer, *args, **kwargs)

        return call

    dist.isend, dist.irecv = counted("isend"), counted("irecv")
    try:
        loss = step()
        phase[0] = "backward"
        loss.backward()
    finally:
        dist.isend, dist.irecv = originals["isend"], originals["irecv"]
    return calls


def ring_isend(root: Path) -> None:
    """Two rings of four ranks (even and odd ranks), each on its own sequence: the peers in the
    trace are ranks of a subgroup the trace does not name."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rings = [dist.new_group(list(range(i, world, 2))) for i in range(2)]  # every rank creates both
    ring, members = rings[rank % 2], list(range(rank % 2, world, 2))
    torch.manual_seed(5)
    model = models.UserRingAttention(H, HEADS, ring)
    x = shard_of(torch.randn(B, S, H, generator=torch.Generator().manual_seed(rank % 2)), rank // 2, len(members))

    def forward() -> Tensor:
        return model(x).square().mean()

    calls = p2p_calls(forward)
    profiled(root / "ring_isend", sgd_step(model, forward))
    write_oracle(root, "ring_isend", {
        "p2p": calls, "members": members,
        "config": {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "ring": len(members)},
    })  # fmt: skip


def stray_list(root: Path, name: str = "stray_list", keep: bool = True) -> None:
    """Megatron-style SP that saves shards correctly, plus a debug list that keeps each layer's
    gathered [B, S, H] activation until the optimizer step is done (``keep=False``: the same model
    and step without the list, its clean twin for sptrace diff)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(4)
    model = models.MegatronStack(2, H, 2 * H, dist.group.WORLD)
    x = shard_of(torch.randn(B, S, H), rank, world)
    store: list[Tensor] = []
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def forward() -> Tensor:
        return model(x).square().mean()

    counts = comm_counts(forward)
    saved = census(model, forward)

    def step() -> None:
        for layer in model.layers:
            layer.debug_store = store if keep else None
        loss = forward()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        held = [list(t.shape) for t in store]
        store.clear()  # "logged": dropped once the step is done
        step.held = held  # type: ignore[attr-defined]

    profiled(root / name, step)
    write_oracle(root, name, {
        "comm_counts": counts, "saved": saved, "held": step.held,  # type: ignore[attr-defined]
        "config": {"batch": B, "seq": S, "hidden": H, "ffn": 2 * H, "sp": world, "layers": 2},
    })  # fmt: skip


def ffn4h_p4(root: Path) -> None:
    """Two tensor-parallel groups of 4 ranks (DP = 2 x TP = 4), Megatron-style SP with F = 4H:
    F/P = H, so the MLP's [B, S, F/P] activations have the shape of a full [B, S, H] one."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = 4
    groups = [dist.new_group(list(range(i, i + tp))) for i in range(0, world, tp)]
    dp_groups = [dist.new_group([i, i + tp]) for i in range(tp)]
    group = groups[rank // tp]
    dp = dp_groups[rank % tp]
    torch.manual_seed(5)
    ffn = 4 * H
    model = models.MegatronStack(2, H, ffn, group)
    tp_rank = dist.get_rank(group)
    x = shard_of(torch.randn(B, S, H), tp_rank, tp)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def forward() -> Tensor:
        return model(x).square().mean()

    counts = comm_counts(forward)
    saved = census(model, forward)

    def step() -> None:
        forward().backward()
        for p in model.parameters():  # data-parallel gradient sync over the 2-rank DP group
            dist.all_reduce(p.grad, group=dp)
        opt.step()
        opt.zero_grad(set_to_none=True)

    profiled(root / "ffn4h_p4", step)
    write_oracle(root, "ffn4h_p4", {
        "comm_counts": counts, "saved": saved,
        "config": {"batch": B, "seq": S, "hidden": H, "ffn": ffn, "sp": tp, "layers": 2, "world": world},
        "tensors": {"all_gather": {"in": [S // tp, B, H], "out": [S, B, H], "group": tp}, "dp_group": 2},
    })  # fmt: skip


def forward_only(root: Path) -> None:
    """A profiling window that holds only the forward: backward runs after the profiler stops."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(6)
    model = models.MegatronStack(2, H, 2 * H, dist.group.WORLD)
    x = shard_of(torch.randn(B, S, H), rank, world)
    for _ in range(2):
        model(x).square().mean().backward()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True) as prof:
        loss = model(x).square().mean()
    out = root / "forward_only"
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    loss.backward()
    dist.barrier()
    write_oracle(root, "forward_only", {"config": {"batch": B, "seq": S, "hidden": H, "sp": world}})


def sac(root: Path, name: str = "sac", keep_gathered: bool = True) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)
    blocks = [models.CheckpointedGather(H, dist.group.WORLD, keep_gathered) for _ in range(2)]
    model = nn.Sequential(*blocks)
    if not keep_gathered:  # the clean run, instrumented as the README says
        import sptrace

        sptrace.instrument(model)
    x = shard_of(torch.randn(B, S, H), rank, world).requires_grad_(False)

    def forward() -> Tensor:
        return model(x).square().mean()

    step = sgd_step(model, forward)
    for b in blocks:
        b.recorded.clear()
    profiled(root / name, step)
    # the policy saw the warm-up steps too: one step's worth is the last third
    kept = [r for b in blocks for r in b.recorded]
    per_step = len(kept) // 3
    write_oracle(root, name, {
        "sac": kept[-per_step:], "config": {"batch": B, "seq": S, "hidden": H, "sp": world, "layers": 2},
    })  # fmt: skip


def _stray_census(model: nn.Module, forward: Callable[[], Tensor], layer: nn.Module) -> list[dict[str, Any]]:
    """What autograd saves of a full [B, S, H] size when ``layer`` keeps its gathered input: the
    census of one forward with the stray switched on, then off again."""
    layer.keep_gathered = True
    try:
        saved = census(model, forward)
    finally:
        layer.keep_gathered = False
    return [s for s in saved if not s["param"] and s["storage_bytes"] >= B * S * H * 4]


def accumulation(root: Path) -> None:
    """Gradient accumulation in one profiled step: forward, backward, forward, backward, then the
    optimizer. Only micro-batch 1 keeps a gathered input (layer 1's fc1, as native ColwiseParallel
    does); micro-batch 0 saves shards only."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(8)
    model = models.MegatronStack(2, H, 2 * H, dist.group.WORLD)
    xs = [shard_of(torch.randn(B, S, H), rank, world) for _ in range(2)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stray_mb, stray_layer = 1, model.layers[1]
    full = _stray_census(model, lambda: model(xs[stray_mb]).square().mean(), stray_layer)

    def step() -> None:
        for mb, x in enumerate(xs):
            stray_layer.keep_gathered = mb == stray_mb
            (model(x).square().mean() / len(xs)).backward()
        stray_layer.keep_gathered = False
        opt.step()
        opt.zero_grad(set_to_none=True)

    profiled(root / "accumulation", step)
    write_oracle(root, "accumulation", {
        "stray": {"micro_batch": stray_mb, "module": "layers.1", "full_saved": full},
        "config": {"batch": B, "seq": S, "hidden": H, "sp": world, "layers": 2, "micro_batches": len(xs)},
    })  # fmt: skip


def two_steps(root: Path) -> None:
    """A profiler schedule with two active steps (prof.step() after each, as the torch.profiler
    docs show); only the second active step keeps a gathered input. The oracle is the step number
    the profiler had when the stray ran."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(9)
    model = models.MegatronStack(2, H, 2 * H, dist.group.WORLD)
    x = shard_of(torch.randn(B, S, H), rank, world)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stray_layer = model.layers[1]
    full = _stray_census(model, lambda: model(x).square().mean(), stray_layer)
    stray_at = None
    dist.barrier()
    with two_active_steps() as prof:
        for i in range(3):  # step 0 warms up, steps 1 and 2 are recorded
            stray_layer.keep_gathered = i == 2
            if stray_layer.keep_gathered:
                stray_at = prof.step_num
            model(x).square().mean().backward()
            stray_layer.keep_gathered = False
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    out = root / "two_steps"
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    dist.barrier()
    write_oracle(root, "two_steps", {
        "stray": {"step": stray_at, "module": "layers.1", "full_saved": full},
        "config": {"batch": B, "seq": S, "hidden": H, "sp": world, "layers": 2, "active_steps": [1, 2]},
    })  # fmt: skip


def pp2_sp4(root: Path) -> None:
    """Two pipeline stages of four sequence-parallel ranks each (SP groups [0-3] and [4-7]; stage
    pairs [r, r+4]), one micro-batch, written with dist.send / dist.recv in the pair's group as
    a hand-rolled pipeline does: stage 0 sends its activations forward, stage 1 sends the
    gradient of its input back, and stage 0's backward starts from that gradient. The oracle is
    every send and receive with its global peer and bytes, and the autograd work it belongs to."""
    rank, world = dist.get_rank(), dist.get_world_size()
    half = world // 2
    sp_groups = [dist.new_group(list(range(i * half, (i + 1) * half))) for i in range(2)]
    pairs = [dist.new_group([r, r + half]) for r in range(half)]  # every rank creates every group
    stage, sp, pair = rank // half, sp_groups[rank // half], pairs[rank % half]
    torch.manual_seed(11 + stage)
    layer = models.MegatronMlp(H, 2 * H, sp)
    x = shard_of(torch.randn(B, S, H), rank % half, half)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    calls: list[dict[str, Any]] = []

    def send(t: Tensor, peer: int, phase: str) -> None:
        calls.append({"op": "send", "peer": peer, "bytes": t.numel() * t.element_size(), "phase": phase})
        dist.send(t.contiguous(), dst=peer, group=pair)

    def recv(shape: tuple[int, ...], peer: int, phase: str) -> Tensor:
        t = torch.empty(shape)
        calls.append({"op": "recv", "peer": peer, "bytes": t.numel() * t.element_size(), "phase": phase})
        dist.recv(t, src=peer, group=pair)
        return t

    def step() -> None:
        if stage == 0:
            out = layer(x)
            send(out.detach(), rank + half, "forward")
            grad = recv(tuple(out.shape), rank + half, "backward")
            out.backward(grad)
        else:
            inp = recv(tuple(x.shape), rank - half, "forward").requires_grad_(True)
            layer(inp).square().mean().backward()
            send(inp.grad, rank - half, "backward")
        opt.step()
        opt.zero_grad(set_to_none=True)

    saved = census(layer, lambda: layer(x).square().mean())  # torch's view of what one stage's MLP keeps
    opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    calls.clear()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True) as prof:
        step()
    out = root / "pp2_sp4"
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    dist.barrier()
    write_oracle(root, "pp2_sp4", {
        "p2p": calls, "stage": stage, "sp_group": list(range(stage * half, (stage + 1) * half)), "saved": saved,
        "config": {"batch": B, "seq": S, "hidden": H, "sp": half, "layers": 1},
    })  # fmt: skip


def warm_stack(seed: int) -> tuple[nn.Module, Callable[[], None]]:
    """A 3-layer Megatron-style stack over the world, its training step, and two steps run (warm)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = models.MegatronStack(3, H, 2 * H, dist.group.WORLD)
    x = shard_of(torch.randn(B, S, H), rank, world)
    step = sgd_step(model, lambda: model(x).square().mean())
    for _ in range(2):
        step()
    return model, step


def slow_rank(root: Path) -> None:
    """In each of two profiled steps (a profiler schedule with two active steps), one rank
    computes more than the others inside one layer (an auxiliary statistic before the layer's
    up-projection): in the first, rank world-3 in layer 1; in the second, rank 1 in layer 0, half
    as much. Every other rank then waits for it at that layer's next collective, the all-gather
    before fc1. The oracle is, per step (the profiler's number), where the extra work was put and
    how long it took, timed around it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # step -> (slow rank, layer, matmuls): 400 matmuls take ~0.13 s on an idle core, several times a
    # rank's longest stall when 8 ranks share 2 busy cores (CI once saw a 0.1 s stall in a backward
    # outrun 100 of them)
    plan = {1: (world - 3, 1, 800), 2: (1, 0, 400)}
    model, step = warm_stack(12)
    steps: dict[str, dict[str, Any]] = {}
    dist.barrier()
    with two_active_steps() as prof:
        for i in range(3):  # step 0 warms up, steps 1 and 2 are recorded
            slow, layer, matmuls = plan.get(i, (-1, 0, 0))
            extra = model.layers[layer]
            extra.aux_steps = matmuls if rank == slow else 0
            name = f"ProfilerStep#{prof.step_num}"
            step()
            extra.aux_steps = 0
            if matmuls:
                steps[name] = {
                    "rank": slow, "layer": layer, "phase": "forward", "next_collective": "all_gather",
                    "extra_us": extra.aux_seconds[-1] * 1e6 if rank == slow else None,
                }  # fmt: skip
            prof.step()
    out = root / "slow_rank"
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    dist.barrier()
    write_oracle(root, "slow_rank", {
        "steps": steps, "config": {"batch": B, "seq": S, "hidden": H, "sp": world, "layers": 3},
    })  # fmt: skip


SLEEPS_MS = (80, 40, 0)
SLEEPY_STEPS = 4
"""Profiled steps per run: their spread is each run's noise (8 ranks on a few cores are noisy)."""


def sleepy_rank(root: Path) -> None:
    """One rank sleeps T ms inside one layer (a Stall module before layer 1's work, on rank
    world-3) in each of four profiled steps; the same job at T = 80, 40 and 0 ms, three runs of one
    launch (sleep_80, sleep_40, sleep_0). The oracle is the job's record of T, the rank, the
    stall's module path, and how long each sleep took (timed around it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sleeper, layer = world - 3, 1
    model, step = warm_stack(13)
    slept: dict[str, list[float]] = {}
    for ms in SLEEPS_MS:
        stall = models.Stall(ms / 1e3 if rank == sleeper else 0.0)
        model.layers[layer].stall = stall
        dist.barrier()
        with two_active_steps(SLEEPY_STEPS) as prof:
            for _ in range(SLEEPY_STEPS + 1):  # step 0 warms up, the others are recorded
                step()
                prof.step()
        out = root / f"sleep_{ms}"
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / f"rank{rank}.json"))
        slept[f"sleep_{ms}"] = [s * 1e3 for s in stall.slept]
        dist.barrier()
    model.layers[layer].stall = None
    write_oracle(root, "sleepy_rank", {
        "rank": sleeper, "layer": layer, "module": f"layers.{layer}.stall", "sleeps_ms": list(SLEEPS_MS),
        "slept_ms": slept if rank == sleeper else None,
        "config": {"batch": B, "seq": S, "hidden": H, "sp": world, "layers": 3},
    })  # fmt: skip


def source_lines(root: Path) -> None:
    """The four stray forms of tests.user_models.source_forms, each profiled bare (plain
    torch.profiler with stacks) and under sptrace.instrument (profile_step), and the first form once
    more without stacks: what the source lines of `sptrace check`'s FAILs are checked against."""
    import sptrace
    from tests.user_models import source_forms

    rank, world = dist.get_rank(), dist.get_world_size()
    x = shard_of(torch.randn(S, B, H), rank, world, dim=0)
    for form in source_forms.FORMS:
        for how in ("bare", "instrumented", *(("no_stack",) if form == "saved" else ())):
            torch.manual_seed(7)
            model = source_forms.Model(H, form)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)

            def step(_: object = None, model: source_forms.Model = model, opt: torch.optim.SGD = opt) -> None:
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                model.forget()

            out = root / "source_lines" / f"{form}_{how}"
            if how == "instrumented":
                with sptrace.instrument(model):
                    sptrace.profile_step(step, out, warmup=1, steps=1)
            elif how == "bare":
                profiled(out, step)
            else:
                step()
                dist.barrier()
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
                    step()
                out.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(out / f"rank{rank}.json"))
                dist.barrier()


SCENARIOS = {
    "tp_sp_native": tp_sp_native,
    "tp_sp_instrumented": tp_sp_instrumented,
    "functional_ulysses": functional_ulysses,
    "list_allgather": list_allgather,
    "deepspeed_ulysses": deepspeed_ulysses,
    "p2p_ring": p2p_ring,
    "stray_list": stray_list,
    "ffn4h_p4": ffn4h_p4,
    "forward_only": forward_only,
    "stray_list_clean": lambda root: stray_list(root, "stray_list_clean", keep=False),
    "sac": sac,
    "sac_clean": lambda root: sac(root, "sac_clean", keep_gathered=False),
    "accumulation": accumulation,
    "two_steps": two_steps,
    "slow_rank": slow_rank,
    "sleepy_rank": sleepy_rank,
    "source_lines": source_lines,
    # last: their groups stay in every later trace's process groups, where the other scenarios'
    # checks read P from "the run's only process group"
    "ring_isend": ring_isend,
    "pp2_sp4": pp2_sp4,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--verify-out", help="then sptrace.reference_models.verify's reports into this folder "
                        "(the suite's one launch for both: eight torch imports instead of sixteen)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    root = Path(args.out)
    try:
        for name in args.only:
            SCENARIOS[name](root)
            dist.barrier()
        if args.verify_out:  # after the user models: its process groups must not be in their traces
            from sptrace.reference_models import verify

            verify.run(Path(args.verify_out))
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        (root / "done").write_text("ok\n")


if __name__ == "__main__":
    main()
