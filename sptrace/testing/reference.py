"""sptrace's reference models as a ``model_factory`` and ``step_fn`` for ``check_sharding``: a
sharding test that runs as written (the README's), and the model to copy from.

    sptrace_check(reference_model, reference_step, world_size=2, shape=REFERENCE_SHAPE)
"""

from __future__ import annotations

from typing import Any

REFERENCE_SHAPE = {"batch": 2, "seq": 64, "hidden": 96, "heads": 16, "kv_heads": 8, "ffn": 160, "layers": 2}
"""The reference models' widths (their F/P and a*d/P differ from H at P = 2 and 4) on a short
sequence: the shape ``reference_model`` builds."""


def reference_model(rank: int, world_size: int, *, scheme: str = "megatron", fault: str | None = None) -> Any:
    """The reference model of ``scheme`` (megatron, ulysses, hybrid, ring, usp) over the whole
    world at REFERENCE_SHAPE, with ``fault`` injected (``"stray-full-save"``: one column-parallel
    linear keeps its gathered input) and this rank's input shard attached."""
    import torch
    import torch.distributed as dist

    from sptrace.reference_models.config import StepConfig
    from sptrace.reference_models.layers import shard_of_step, step_batch
    from sptrace.reference_models.model import build_model

    cfg = StepConfig(scheme=scheme, sp_size=world_size, fault=fault, **REFERENCE_SHAPE)
    model = build_model(cfg, dist.group.WORLD, torch.device("cpu"))
    x, target = step_batch(cfg)
    model.inputs = (shard_of_step(x, cfg, rank, world_size), shard_of_step(target, cfg, rank, world_size))
    return model


def reference_step(model: Any, step: int) -> None:
    """One training step of a ``reference_model``: forward, backward, gradient sync."""
    import sptrace
    from sptrace.reference_models.layers import step_loss

    x, target = model.inputs
    with sptrace.phase("forward"):
        loss = step_loss(model(x), target, model.cfg)
    with sptrace.phase("backward"):
        loss.backward()
        model.finish_grad_sync()
    model.zero_grad(set_to_none=True)
    model.end_step()
