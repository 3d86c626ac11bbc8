"""Numerical and communication self-check of the reference models, run under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 8 -m sptrace.reference_models.verify --out DIR

1. Equivalence: for every case (scheme x P in 1, 2, 4, 8 x MHA/GQA, ZeRO-3, selective
   recompute, faults; ring attention zigzag and contiguous; causal and not), the world is split into groups of
   P ranks; each group runs the sharded step and every rank compares the loss and each
   parameter gradient with the dense model.
2. Collectives: at P = world size, CommDebugMode (torch.distributed.tensor.debug) counts the
   c10d ops of forward and backward, globally and per module, as torchtitan's tests do, and
   ``count_p2p`` the point-to-point sends and receives, which CommDebugMode does not see.

Each rank writes DIR/verify_rank{r}.json; the tests read them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import DenseTransformer, shard_of_step, step_batch, step_loss
from sptrace.reference_models.model import build_model

BASE = StepConfig(layers=2, batch=2, seq=32, hidden=64, heads=8, kv_heads=8, ffn=96)


SCHEMES = ("megatron", "ulysses", "hybrid", "ring", "usp")


def cases(world: int) -> Iterator[tuple[str, StepConfig]]:
    for scheme in SCHEMES:
        base = BASE.replace(scheme=scheme, ulysses_degree=2 if scheme == "usp" else 1)
        for P in (1, 2, 4, 8):
            if P > world:
                continue
            for kv in (8, 2):  # MHA; GQA with g >= P at P <= 2 and g < P at P >= 4
                if scheme == "usp":  # every Ulysses degree U <= P (at U = 4, kv2 has g < U)
                    for U in (1, 2, 4):
                        if U <= P:
                            cfg = base.replace(sp_size=P, kv_heads=kv, ulysses_degree=U)
                            yield f"{scheme}-P{P}-U{U}-kv{kv}", cfg
                    continue
                yield f"{scheme}-P{P}-kv{kv}", base.replace(sp_size=P, kv_heads=kv)
        yield (
            f"{scheme}-P{world}-recompute",
            base.replace(sp_size=world, kv_heads=2, recompute="selective"),
        )
        if scheme != "megatron":
            for P in (2, world):
                yield f"{scheme}-P{P}-zero3", base.replace(sp_size=P, kv_heads=2, zero3=True)
        for fault in ("stray-full-save", "missing-reduce-scatter", "debug-hook"):
            if fault == "missing-reduce-scatter" and scheme in ("ulysses", "ring", "usp"):
                continue
            yield f"{scheme}-P{world}-{fault}", base.replace(sp_size=world, fault=fault, fault_layer=0)
        if scheme in ("ring", "usp"):  # the contiguous layout, causal and not
            for P in (2, world):
                cfg = base.replace(sp_size=P, kv_heads=2, cp_balance="none")
                yield f"{scheme}-P{P}-contiguous", cfg
                yield f"{scheme}-P{P}-contiguous-noncausal", cfg.replace(causal=False)
        yield f"{scheme}-P{world}-noncausal", base.replace(sp_size=world, kv_heads=2, causal=False)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().item() or 1.0
    return (got.float() - want.float()).abs().max().item() / scale


def check_equivalence(cfg: StepConfig, group: dist.ProcessGroup) -> dict[str, float]:
    """Max relative error of the loss and of every parameter gradient vs the dense model."""
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    x, target = step_batch(cfg)
    dense = DenseTransformer(cfg)
    dense_loss = step_loss(dense(x), target, cfg)
    dense_loss.backward()
    dense_grads = {n: p.grad for n, p in dense.named_parameters()}

    model = build_model(cfg, group, torch.device("cpu"))
    loss = step_loss(model(shard_of_step(x, cfg, rank, P)), shard_of_step(target, cfg, rank, P), cfg)
    loss.backward()
    model.finish_grad_sync()
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    errors = {"loss": _rel_err(total, dense_loss.detach())}
    for name, param in model.named_parameters():
        grad = param.grad
        if hasattr(grad, "full_tensor"):  # FSDP2: a sharded DTensor gradient
            grad = grad.full_tensor()
        errors[name] = _rel_err(grad, model.shard_of(name, dense_grads[name]))
    return errors


@contextlib.contextmanager
def count_p2p(calls: list[dict[str, object]]) -> Iterator[None]:
    """Every ``torch.distributed.isend``/``irecv`` call (batch_isend_irecv issues them) appended
    to ``calls`` as {op, peer, bytes}: CommDebugMode does not see point-to-point ops (they do
    not go through the dispatcher), so this wraps the two functions themselves."""
    from torch.distributed import distributed_c10d as c10d

    originals = {"isend": c10d.isend, "irecv": c10d.irecv}

    def counted(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def call(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
            peer = args[0] if args else kwargs.get("dst", kwargs.get("src"))
            local = kwargs.get("group_dst", kwargs.get("group_src"))
            if peer is None and local is not None:  # a rank of the group: its global rank
                group = kwargs.get("group")
                peer = dist.get_global_rank(group, local) if group is not None else local
            calls.append({"op": name, "peer": peer, "bytes": tensor.numel() * tensor.element_size()})
            return fn(tensor, *args, **kwargs)

        return call

    wrapped = {name: counted(name, fn) for name, fn in originals.items()}
    for module in (c10d, dist):  # P2POp checks its op against distributed_c10d's own names
        for name, fn in wrapped.items():
            setattr(module, name, fn)
    try:
        yield
    finally:
        for module in (c10d, dist):
            for name, fn in originals.items():
                setattr(module, name, fn)


def count_collectives(cfg: StepConfig) -> dict[str, object]:
    """CommDebugMode counts of one step on the whole world, forward and backward apart, and
    the point-to-point calls (count_p2p)."""
    from torch.distributed.tensor.debug import CommDebugMode

    rank, P = dist.get_rank(), dist.get_world_size()
    x, target = step_batch(cfg)
    model = build_model(cfg, dist.group.WORLD, torch.device("cpu"))
    result: dict[str, object] = {}
    fwd, bwd = CommDebugMode(), CommDebugMode()
    p2p: dict[str, list[dict[str, object]]] = {"forward": [], "backward": [], "grad_sync": []}
    with fwd, count_p2p(p2p["forward"]):
        loss = step_loss(model(shard_of_step(x, cfg, rank, P)), shard_of_step(target, cfg, rank, P), cfg)
    with bwd, count_p2p(p2p["backward"]):
        loss.backward()
    grad_sync = CommDebugMode()
    with grad_sync, count_p2p(p2p["grad_sync"]):
        model.finish_grad_sync()
    result["p2p"] = p2p
    for phase, mode in (("forward", fwd), ("backward", bwd), ("grad_sync", grad_sync)):
        result[phase] = {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items() if n}
        per_module: dict[str, dict[str, int]] = {}
        for fqn, counts in mode.comm_module_counts.items():
            for direction in ("forward", "backward"):
                for op, n in counts.get(direction, {}).items():
                    if n:
                        key = f"{fqn}|{direction}"
                        per_module.setdefault(key, {})[str(op).split(".")[-1]] = n
        result[phase + "_modules"] = per_module
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    try:
        run(Path(args.out))
    finally:
        dist.destroy_process_group()


def run(out: Path) -> None:
    """Every rank's report into ``out``, in the process group already initialised (the test
    suite runs this in its user-model launch, to import torch on eight ranks once for both)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    groups = {P: dist.new_subgroups(group_size=P)[0] for P in (1, 2, 4, 8) if P <= world and world % P == 0}
    report: dict[str, object] = {"rank": rank, "world_size": world, "equivalence": {}, "collectives": {}}
    for name, cfg in cases(world):
        report["equivalence"][name] = check_equivalence(cfg, groups[cfg.sp_size])  # type: ignore[index]
    for scheme in SCHEMES:
        for kv in (8, 2):
            cfg = BASE.replace(scheme=scheme, sp_size=world, kv_heads=kv, ulysses_degree=2 if scheme == "usp" else 1)
            report["collectives"][f"{scheme}-kv{kv}"] = count_collectives(cfg)  # type: ignore[index]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".verify_rank{rank}.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out / f"verify_rank{rank}.json")
    dist.barrier()


if __name__ == "__main__":
    main()
