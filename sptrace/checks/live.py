"""The sharding check on a live model, in-process: ``assert_sequence_sharded`` runs one forward
under a saved-tensors hook and judges every tensor autograd keeps with the same classifier as
``sptrace check`` (sptrace.checks.sharding), with no profiler and no trace. It needs torch:
the ``sptrace`` package exports it lazily (``sptrace.assert_sequence_sharded``), and nothing of
the analyzer imports it."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

import torch
from torch import nn

from sptrace.checks.sharding import Judge
from sptrace.detect.weights import weight_width
from sptrace.instrumentation import describe_saved, local_shard
from sptrace.vocab.markers import SavedTensor
from sptrace.vocab.shape import ModelShape


class ShardingViolation(AssertionError):
    """A model kept a full-sequence activation for backward; ``records`` lists the offenders."""

    def __init__(self, message: str, records: list[tuple[SavedTensor, str]]) -> None:
        super().__init__(message)
        self.records = records


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    """The unpack hook: the pack hook keeps each saved tensor itself."""
    return tensor


def assert_sequence_sharded(
    model: nn.Module,
    inputs: torch.Tensor | tuple[object, ...],
    *,
    sp_size: int,
    seq_dim: int = 1,
    hidden: int | None = None,
    heads: int | None = None,
    ffn: int | None = None,
    allow: tuple[str, ...] = (),
) -> list[SavedTensor]:
    """Run one forward of ``model`` on this rank's sequence shard ``inputs`` and check that every
    tensor autograd saves for backward is sequence- or head-sharded; no profiler needed.

    ``inputs``: a tensor, or a tuple of positional arguments whose first is the [B, S/P, H]
    (``seq_dim`` = 1) or [S/P, B, H] (``seq_dim`` = 0) activation. Raises ShardingViolation naming
    each module that keeps a full-sequence tensor (unless it matches an ``allow`` glob); returns
    the saved activations otherwise. A full-sequence tensor H or more wide is full unless a weight
    of the model ([N, H] or [H, N], a 2-D parameter) or ``ffn`` and ``heads`` make a shard that
    wide; such a tensor stays ambiguous and is not counted as a violation (nothing here sees which
    op made it, as a trace does). Works inside a unit test, e.g. under a 1-process group or
    torchrun.
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    x = local_shard(args[0])
    local = x.shape[seq_dim]
    batch = x.shape[1 - seq_dim] if x.dim() >= 3 else 1
    dtype = str(x.dtype).removeprefix("torch.")
    H = hidden or x.shape[-1]
    judge = Judge(ModelShape(
        batch=batch, seq=local * sp_size, hidden=H, sp_size=sp_size, heads=heads, ffn=ffn,
        dtype=dtype if dtype in ("float32", "bfloat16", "float16") else None,
    ), weights=_weight_widths(model, H))  # fmt: skip
    saved: list[SavedTensor] = []
    stack: list[str] = []
    handles = []

    def enter(qualname: str) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def hook(module: nn.Module, args: tuple[object, ...]) -> None:
            stack.append(qualname)

        return hook

    def leave(module: nn.Module, args: tuple[object, ...], output: object) -> None:  # returns None: output untouched
        if stack:
            stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name or "<root>")))
        handles.append(module.register_forward_hook(leave, always_call=True))

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(describe_saved(t, stack[-1] if stack else "<outside>"))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            out = model(*args)
        del out  # the graph (and what it saved) goes with it
    finally:
        for h in handles:
            h.remove()
    bad = []
    for rec in saved:
        if rec.kind == "param" or any(fnmatch.fnmatchcase(rec.module, p) for p in allow):
            continue
        cls, why = judge.classify(rec.shape, rec.nbytes, rec.storage_nbytes, rec.module)
        if cls == "full":
            bad.append((rec, why))
    if bad:
        lines = [f"{r.module} saves {list(r.shape)} {r.dtype} ({r.storage_nbytes} bytes): {why}" for r, why in bad]
        raise ShardingViolation(
            f"{len(bad)} full-sequence activations kept for backward (P={sp_size}, S={local * sp_size}):\n  "
            + "\n  ".join(lines),
            bad,
        )
    return [r for r in saved if r.kind != "param"]


def _weight_widths(model: nn.Module, hidden: int) -> dict[int, str]:
    """The widths the model's 2-D weights give (sptrace.detect.weights reads the same off a
    trace): N for an [N, H] weight, K for an [H, K] one."""
    out: dict[int, str] = {}
    for name, p in model.named_parameters():
        local = local_shard(p)
        if local.dim() != 2:
            continue
        n, k = (int(d) for d in local.shape)  # nn.Linear's layout: [out, in]
        width = weight_width(n, k, hidden)
        if width is not None:
            out.setdefault(width, f"the [{n}x{k}] weight {name}")
    return out
