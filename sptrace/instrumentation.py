"""Instrument any ``nn.Module`` so that its profiled steps carry sptrace's markers.

``instrument(model)`` adds, to every submodule, a ``sptrace.module::<qualname>`` range around
its forward and, while the root module runs, a ``saved_tensors_hooks`` pack hook that notes each
tensor autograd keeps for backward (module, shape, dtype, bytes, storage pointer; docs/facts.md
§5). The notes are written in bulk: one ``sptrace.saved::...`` event when the root module's
forward returns, each record starting with the prefix, instead of a profiler range per tensor (which
cost most of the instrumentation's overhead). At that point every saved tensor is still alive,
so its storage pointer still names its allocation. Everything checks
``torch.autograd._profiler_enabled()`` first: with no profiler running the hooks only push and
pop a name, so an instrumented model can stay instrumented in production.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.autograd.profiler import record_function

from sptrace import markers
from sptrace.markers import SavedTensor

_profiler_enabled = torch.autograd._profiler_enabled


def _profiling() -> bool:
    return _profiler_enabled()


def annotate(name: str) -> contextlib.AbstractContextManager[Any]:
    """A record_function range named ``name`` while a profiler runs, else a no-op."""
    return record_function(name) if _profiling() else contextlib.nullcontext()


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """Mark a phase of the step: ``with sptrace.phase("backward"): loss.backward()``."""
    return annotate(markers.phase_name(name))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds), else the tensor itself."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def describe_saved(tensor: torch.Tensor, module: str) -> SavedTensor:
    """What a pack hook records about one saved tensor. A DTensor is described by its local
    shard: that is what this rank keeps (its global shape says nothing about the rank)."""
    local = _local(tensor)
    try:
        storage = local.untyped_storage()
        ptr, storage_nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # subclasses without storage (fake, sparse)
        ptr, storage_nbytes = 0, 0
    base = tensor._base
    if isinstance(base, torch.Tensor) and base.is_leaf and base.requires_grad:
        kind = "param"  # a view of a weight, e.g. W.t() saved by a matmul
    elif tensor.grad_fn is not None:
        kind = "activation"
    else:
        kind = "param" if tensor.requires_grad else "input"
    return SavedTensor(
        module=module,
        shape=tuple(int(d) for d in local.shape),
        dtype=str(local.dtype).removeprefix("torch."),
        nbytes=local.numel() * local.element_size(),
        storage_ptr=ptr,
        storage_nbytes=storage_nbytes,
        kind=kind,
    )


class Instrumentation:
    """The hooks ``instrument`` installed on one model; ``remove()`` takes them off again."""

    def __init__(self, model: nn.Module, *, prefix: str = "", saved_tensors: bool = True) -> None:
        self.model = model
        self.prefix = prefix
        self.saved_tensors = saved_tensors
        # (qualname, open record_function or None, open saved_tensors_hooks or None) per call
        self._stack: list[tuple[str, Any, Any]] = []
        self._pending: list[str] = []
        """Saved-tensor records of the forward running now, written when the root returns."""
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            qualname = ".".join(p for p in (prefix, name) if p) or "<root>"
            # prepend: our range opens before other pre-hooks (FSDP2's parameter all-gather),
            # so their collectives are attributed to this module.
            self._handles.append(module.register_forward_pre_hook(self._make_pre(qualname), prepend=True))
            self._handles.append(module.register_forward_hook(self._make_post(), always_call=True))

    @property
    def current_module(self) -> str:
        return self._stack[-1][0] if self._stack else "<outside>"

    def _make_pre(self, qualname: str) -> Any:
        def pre_hook(module: nn.Module, args: Any) -> None:
            if not _profiling():
                self._stack.append((qualname, None, None))
                return
            hooks = None
            if self.saved_tensors and not self._stack:
                hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
                hooks.__enter__()
            rf = record_function(markers.module_name(qualname))
            rf.__enter__()
            self._stack.append((qualname, rf, hooks))

        return pre_hook

    def _make_post(self) -> Any:
        def post_hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self._stack:
                return
            _, rf, hooks = self._stack.pop()
            if rf is not None:
                rf.__exit__(None, None, None)
            if hooks is not None:
                hooks.__exit__(None, None, None)
            if not self._stack and self._pending:
                self._flush()

        return post_hook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        # The hot path: with_stack=True records every call made here, C methods included, so it
        # makes as few calls as it can and leaves the formatting to _flush (describe_saved is
        # the readable equivalent). A DTensor is described by its local shard.
        if _profiler_enabled():
            local = getattr(tensor, "_local_tensor", tensor)
            try:
                storage = local.untyped_storage()
                ptr, storage_nbytes = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):
                ptr, storage_nbytes = 0, 0
            base = tensor._base
            if base is not None and base.is_leaf and base.requires_grad:
                kind = "param"
            elif tensor.grad_fn is not None:
                kind = "activation"
            else:
                kind = "param" if tensor.requires_grad else "input"
            module = self._stack[-1][0] if self._stack else "<outside>"
            self._pending.append((module, local.shape, local.dtype, local.nbytes, ptr, storage_nbytes, kind))
        return tensor

    def _flush(self) -> None:
        """The forward's saved-tensor records as one profiler event, each starting with
        markers.SAVED (markers.SavedTensor.all_from_marker reads them)."""
        pending, self._pending = self._pending, []
        if _profiling():
            records = [
                markers.saved_marker(module, shape, str(dtype)[6:], nbytes, ptr, storage_nbytes, kind)
                for module, shape, dtype, nbytes, ptr, storage_nbytes, kind in pending
            ]
            with record_function(" ".join(records)):
                pass

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def instrument(model: nn.Module, *, prefix: str = "", saved_tensors: bool = True) -> Instrumentation:
    """Add module markers and saved-tensor records to ``model`` (active only while profiling).

    Call it before wrapping the model (``fully_shard``, DDP) so that the wrapper's own
    collectives fall inside the module ranges. Use as a plain call or as a context manager that
    removes the hooks on exit.
    """
    return Instrumentation(model, prefix=prefix, saved_tensors=saved_tensors)


class ShardingViolation(AssertionError):
    """A model kept a full-sequence activation for backward; ``records`` lists the offenders."""

    def __init__(self, message: str, records: list[tuple[SavedTensor, str]]) -> None:
        super().__init__(message)
        self.records = records


def assert_sequence_sharded(
    model: nn.Module,
    inputs: Any,
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
    the saved activations otherwise. ``heads`` and ``ffn`` (when a tensor-parallel shard width can
    equal H, as with a 4H MLP at P=4) let widths be judged that shapes alone cannot; tensors that
    stay ambiguous are not counted as violations. Works inside a unit test, e.g. under a 1-process group or
    torchrun.
    """
    import fnmatch

    from sptrace.checks.sharding import Judge
    from sptrace.shape import ModelShape

    args = inputs if isinstance(inputs, tuple) else (inputs,)
    x = _local(args[0])
    local = x.shape[seq_dim]
    batch = x.shape[1 - seq_dim] if x.dim() >= 3 else 1
    dtype = str(x.dtype).removeprefix("torch.")
    judge = Judge(ModelShape(
        batch=batch, seq=local * sp_size, hidden=hidden or x.shape[-1], sp_size=sp_size, heads=heads, ffn=ffn,
        dtype=dtype if dtype in ("float32", "bfloat16", "float16") else None,
    ))  # fmt: skip
    saved: list[SavedTensor] = []
    stack: list[str] = []
    handles = []

    def enter(qualname: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            stack.append(qualname)

        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:  # returns None: output untouched
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
