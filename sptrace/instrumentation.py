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

With ``census=True`` (the default), the buffers the forward's collectives fill or return are
watched, and when the backward that consumes the forward ends one ``sptrace.released::`` event
says who released each: the communication backend's thread, the model's, or nobody yet
(sptrace.census). This is the evidence a CPU trace lacks: gloo drops its reference to a
collective's buffer on a thread the profiler does not record, so a buffer the model kept and one
gloo freed look the same in the memory events (sptrace.detect.holders reads the census).

With ``source_lines=True`` (the default), the statement of the user's code that made each tensor
of the forward is noted (sptrace.makers) and written as one ``sptrace.made::`` event when the
root's forward returns: the source line each FAIL names.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.utils._python_dispatch import _disable_current_modes

from sptrace import census as released
from sptrace import offloading
from sptrace.makers import MakerLines
from sptrace.vocab import markers
from sptrace.vocab.markers import SavedTensor

if TYPE_CHECKING:
    from torch._ops import OpOverload
    from torch.utils.hooks import RemovableHandle

PreHook = Callable[[nn.Module, tuple[object, ...]], None]
PostHook = Callable[[nn.Module, tuple[object, ...], object], None]

_profiler_enabled = torch.autograd._profiler_enabled


def _kernel(op: OpOverload) -> Callable[..., object]:
    """An operator overload's C++ callable: calling it from a hook adds no Python frame that
    ``with_stack=True`` would record (``OpOverload.__call__`` is one)."""
    return getattr(op, "_op", op)


# record_function's own enter and exit, without the Python class around them: a module range is
# the same user_annotation event, opened and closed with one C call each instead of about ten
# recorded Python frames (benchmarks/bench_instrument.py measures the difference).
_range_enter = _kernel(torch.ops.profiler._record_function_enter_new.default)
_range_exit = _kernel(torch.ops.profiler._record_function_exit._RecordFunction)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_in_backward = torch._C._current_graph_task_id  # -1 outside autograd's backward


# The range ops go through the dispatcher, where a TorchDispatchMode counts them as ops of its
# region: selective activation checkpointing replays its region in backward and fails when the
# replay's ops differ from the forward's. Our ranges are no ops of the user's model, so under a
# mode they are opened and closed with the modes set aside (the hooks test _dispatch_modes, a C
# call, and call these only when one is active).
def _range_enter_unseen(name: str) -> object:
    with _disable_current_modes():
        return _range_enter(name, None)


def _range_exit_unseen(handle: object) -> None:
    with _disable_current_modes():
        _range_exit(handle)


def _profiling() -> bool:
    return _profiler_enabled()


def annotate(name: str) -> contextlib.AbstractContextManager[object]:
    """A record_function range named ``name`` while a profiler runs, else a no-op."""
    return record_function(name) if _profiling() else contextlib.nullcontext()


def phase(name: str) -> contextlib.AbstractContextManager[object]:
    """Mark a phase of the step: ``with sptrace.phase("backward"): loss.backward()``."""
    return annotate(markers.phase_name(name))


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds), else the tensor itself."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def describe_saved(tensor: torch.Tensor, module: str) -> SavedTensor:
    """What a pack hook records about one saved tensor. A DTensor is described by its local
    shard: that is what this rank keeps (its global shape says nothing about the rank)."""
    local = local_shard(tensor)
    ptr, storage_nbytes = _storage_or_none(local)
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

    def __init__(self, model: nn.Module, *, prefix: str = "", saved_tensors: bool = True, census: bool = True,
                 source_lines: bool = True) -> None:  # fmt: skip
        self.model = model
        self._makers = MakerLines() if source_lines else None
        self._makers_on = False
        self.prefix = prefix
        self.saved_tensors = saved_tensors
        self.census = census
        if census:
            released.install()
        # (qualname, open range's handle or None, open saved_tensors_hooks or None) per call
        self._stack: list[tuple[str, object, torch.autograd.graph.saved_tensors_hooks | None]] = []
        self._pending: list[tuple[str, torch.Tensor, str]] = []
        """Saved-tensor records of the forward running now, written when the root returns."""
        self._offloaded: list[tuple[str, torch.Tensor, int]] = []
        """The copies a user's pack hook kept in place of what autograd saved (module, copy, the
        saved tensor's storage pointer), written with the records."""
        offloading.install()
        self._handles: list[RemovableHandle] = []
        for name, module in model.named_modules():
            qualname = ".".join(p for p in (prefix, name) if p) or "<root>"
            # prepend: our range opens before other pre-hooks (FSDP2's parameter all-gather),
            # so their collectives are attributed to this module.
            self._handles.append(module.register_forward_pre_hook(self._make_pre(qualname), prepend=True))
            self._handles.append(module.register_forward_hook(self._make_post(), always_call=True))

    @property
    def current_module(self) -> str:
        return self._stack[-1][0] if self._stack else "<outside>"

    def _make_pre(self, qualname: str) -> PreHook:
        range_name = markers.module_name(qualname)

        # The hooks push with += and pop with del, which are no calls that with_stack records.
        def pre_hook(module: nn.Module, args: tuple[object, ...]) -> None:
            if not _profiler_enabled():
                self._stack += ((qualname, None, None),)
                return
            hooks = None
            # a forward replayed in backward (activation checkpointing) keeps nothing across
            # the boundary: its saves are not recorded
            if self.saved_tensors and not self._stack and _in_backward() == -1:
                # a user's hooks around the whole forward (save_on_cpu) keep working: ours call theirs
                outer = _top_hooks(False)
                hooks = (torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack_first) if outer is None
                         else offloading.chained(self, *outer))  # fmt: skip
                hooks.__enter__()
                offloading.ACTIVE[:] = [self]
            if self.census and not self._stack and _in_backward() == -1:
                released.begin()
            if self._makers is not None and not self._stack and _in_backward() == -1:
                self._makers.__enter__()
                self._makers_on = True
            handle = _range_enter_unseen(range_name) if _dispatch_modes() else _range_enter(range_name, None)
            self._stack += ((qualname, handle, hooks),)

        return pre_hook

    def _make_post(self) -> PostHook:
        def post_hook(module: nn.Module, args: tuple[object, ...], output: object) -> None:
            if not self._stack:
                return
            _, handle, hooks = self._stack[-1]
            del self._stack[-1]
            if handle is not None:
                _range_exit_unseen(handle) if _dispatch_modes() else _range_exit(handle)
            if hooks is not None:
                hooks.__exit__(None, None, None)
                offloading.ACTIVE.clear()
            if self._makers_on and not self._stack:
                self._makers_on = False
                self._makers.__exit__(None, None, None)
                _emit_name(self._makers.take_marker())
            if not self._stack and (self._pending or self._offloaded):
                self._flush()
            if not self._stack and self.census and _profiler_enabled() and _in_backward() == -1:
                watch = released._ACTIVE[0] if released._ACTIVE else None
                released.end()
                if watch is not None and watch.entries:
                    _report_at_backward_end(output, watch)

        return post_hook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        # The hot path. with_stack=True records every Python frame and every call a frame makes,
        # C methods included, so this makes no call and reads attributes only:
        # the storage, shape and dtype are read in bulk by _flush, when the root's forward
        # returns and every tensor kept here is still alive. Autograd keeps it until backward
        # anyway; only a graph dropped inside the forward has its saved tensors kept that long.
        # describe_saved is the readable equivalent. A DTensor is described by its local shard.
        local = tensor if tensor.__class__ in _PLAIN else getattr(tensor, "_local_tensor", tensor)
        base = tensor._base
        if base is not None and base.is_leaf and base.requires_grad:
            kind = "param"
        elif tensor.grad_fn is not None:
            kind = "activation"
        else:
            kind = "param" if tensor.requires_grad else "input"
        self._pending += ((self._stack[-1][0] if self._stack else "<outside>", local, kind),)
        if self._makers_on:
            self._makers.note_saved(local)  # (a Python call only while source lines are noted)
        return (tensor,)  # unpacked by _unpack_first, a C callable: no recorded frame in backward

    def _flush(self) -> None:
        """The forward's saved-tensor records as one profiler event, each starting with
        markers.SAVED (markers.SavedTensor.all_from_marker reads them).

        Each step runs over all tensors inside ``map``, whose calls the profiler's Python tracer
        does not see (it records calls made by Python code), so the event costs a few recorded
        calls whatever the number of tensors."""
        pending, self._pending = self._pending, []
        offloaded, self._offloaded = self._offloaded, []
        if not _profiler_enabled() or not (pending or offloaded):
            return
        texts = [SavedTensor(module, tuple(copy.shape), str(copy.dtype).removeprefix("torch."),
                             copy.numel() * copy.element_size(), *_storage_or_none(copy), "offloaded",
                             source).to_marker() for module, copy, source in offloaded]  # fmt: skip
        if pending:
            modules, tensors, kinds = zip(*pending)
            try:
                storages = list(map(_storage_of, tensors))
                ptrs, sizes = list(map(_storage_ptr, storages)), list(map(_storage_nbytes, storages))
            except (RuntimeError, NotImplementedError):  # a subclass without storage (fake, sparse)
                ptrs, sizes = zip(*map(_storage_or_none, tensors))
            dims = list(map("x".join, map(map, itertools.repeat(str), map(_shape_of, tensors))))
            dims = map(_SCALAR.get, dims, dims)  # "" (no dimension) -> "scalar"
            dtypes = map(_DTYPE_PREFIX, map(str, map(_dtype_of, tensors)))
            nbytes = map(_nbytes_of, tensors)
            texts.extend(map(_RECORD.format, modules, dims, dtypes, nbytes, ptrs, sizes, kinds))
        _emit_name(" ".join(texts))

    def note_offloaded(self, tensor: torch.Tensor, packed: object) -> bool:
        """Note the copy a user's pack hook made of ``tensor`` (``packed``: what the hook returned;
        save_on_cpu returns (device, copy)), if it made one. Returns whether it did."""
        copy = offloading.copy_in(packed)
        if copy is None or not _profiler_enabled():
            return False
        source, _ = _storage_or_none(local_shard(tensor))
        ptr, _ = _storage_or_none(copy)
        if not ptr or ptr == source:
            return False  # (the same storage: nothing was copied)
        self._offloaded += ((self._stack[-1][0] if self._stack else "<outside>", copy, source),)
        return True

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        if self._handles and self.census:
            released.uninstall()
        if self._handles:
            offloading.uninstall()
        self._handles.clear()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


_PLAIN = frozenset({torch.Tensor, nn.Parameter})
_storage_of = torch.Tensor.untyped_storage
_storage_ptr = torch.UntypedStorage.data_ptr
_storage_nbytes = torch.UntypedStorage.nbytes
_shape_of = operator.attrgetter("shape")
_dtype_of = operator.attrgetter("dtype")
_nbytes_of = operator.attrgetter("nbytes")
_DTYPE_PREFIX = operator.methodcaller("removeprefix", "torch.")
_SCALAR = {"": "scalar"}
_RECORD = markers.SAVED + "module={}|shape={}|dtype={}|bytes={}|ptr={:#x}|storage_bytes={}|kind={}"
"""markers.saved_marker's format (tests/unit/test_instrumentation.py checks that they agree)."""


def _storage_or_none(tensor: torch.Tensor) -> tuple[int, int]:
    """(storage pointer, storage bytes), or (0, 0) for a subclass without storage (fake, sparse)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return 0, 0


_unpack_first = operator.itemgetter(0)
"""Instrumentation's unpack hook: its pack hook keeps each tensor in a 1-tuple."""


def instrument(
    model: nn.Module, *, prefix: str = "", saved_tensors: bool = True, census: bool = True, source_lines: bool = True
) -> Instrumentation:
    """Add module markers, saved-tensor records and a census of who released each buffer the
    forward's collectives filled (``census``: sptrace.census) to ``model``; all active only while
    profiling.

    Call it after wrapping the model (``fully_shard``, DDP), as the reference models do, so that
    the wrapper's own collectives (FSDP2's parameter all-gathers) fall inside the module ranges.
    Use as a plain call or as a context manager that removes the hooks on exit.
    """
    return Instrumentation(model, prefix=prefix, saved_tensors=saved_tensors, census=census,
                           source_lines=source_lines)  # fmt: skip


# ---- the census of who released the collectives' buffers -------------------------------------


def _report_at_backward_end(output: object, watch: released.Watch) -> None:
    """When a backward reaches the root's output, queue the census's event for that backward's
    end (autograd's engine runs queued callbacks on its own thread once the graph is done)."""
    first = next((t for t in _tensors_in(output) if t.grad_fn is not None), None)
    if first is None:
        return
    fired: list[bool] = []

    def at_boundary(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:  # the gradients pass unchanged
        if fired or not _profiler_enabled():
            return
        fired.append(True)
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _emit(watch))

    first.grad_fn.register_prehook(at_boundary)


def _emit(watch: released.Watch) -> None:
    if _profiler_enabled():
        _emit_name(watch.census().to_marker())


def _emit_name(name: str | None) -> None:
    """One instant-long profiler range named ``name`` (a marker event), if any."""
    if not name:
        return
    if _dispatch_modes():
        _range_exit_unseen(_range_enter_unseen(name))
    else:
        _range_exit(_range_enter(name, None))


def _tensors_in(output: object) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors_in(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors_in(item)]
    return []
