"""Who released each buffer a collective filled: the evidence a CPU trace lacks, taken by
``sptrace.instrument`` (its ``census``).

gloo keeps a reference to a collective's tensors until its work completes, and drops it on its
own worker thread, which the profiler does not record. When that reference is the last one, the
buffer's free is missing from the trace, and a buffer the model kept and one gloo freed look the
same in the memory events. So while an instrumented model's forward runs under a profiler, the
buffers its collectives fill or return (an all-gather's output, a functional collective's
result, a receive's buffer) are watched through a weak reference to their storage, whose callback
runs on the thread that drops the last reference. When the backward that consumes the forward
ends, one ``sptrace.released::`` event says, for each watched buffer, who released it: the
``backend`` (another thread), the ``model``'s thread, or nobody yet (``alive``: the model still
holds it). sptrace.detect.holders reads it (markers.ReleasedCensus).

A finished call's last reference can still be the backend's for a moment after the call returns:
gloo's worker drops its work item only once it is scheduled again, which on a loaded machine can
be after a short backward has ended. So while a watched buffer is still held when the census is
taken, the census waits for releases, at most ``SETTLE_S`` (sleeping, so that the backend's thread
gets the interpreter): a buffer the backend let go in that time is the backend's, one still held
after it is the model's. A step with nothing left alive waits not at all; one whose model keeps a
watched buffer (a cache, a persistent buffer, a stray) pays ``SETTLE_S`` at each boundary, in the
profiled steps only.

The collectives are watched by wrapping torch.distributed's functions and the functional
collectives' (and the one function every functional collective hands its raw result to, so that
the buffer a collective made is watched, not what a caller joined it into) while an
instrumentation is installed (a call through a name bound before
``sptrace.instrument`` ran, ``from torch.distributed import all_gather_into_tensor``, is not seen:
its buffer stays undecided, never misjudged). Nothing is watched without a profiler running.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType

import torch

from sptrace.vocab.markers import ReleasedCensus

_OUTPUT_FIRST = ("all_gather_into_tensor", "_all_gather_base", "reduce_scatter_tensor", "_reduce_scatter_base",
                 "all_to_all_single", "broadcast", "all_reduce")  # fmt: skip
"""torch.distributed functions whose first argument is the buffer the call fills (an all-reduce's in
place). (Not ``recv`` nor
``irecv``: ``P2POp`` checks its op against them by identity, so they stay as they are, and a
receive's buffer is watched where ``batch_isend_irecv`` takes it.)"""
_OUTPUT_LIST_FIRST = ("all_gather", "all_to_all")
"""... whose first argument is a list of buffers the call fills."""
_RETURNING = ("all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
              "reduce_scatter_tensor_autograd", "all_to_all_single", "all_to_all_single_autograd",
              "all_gather_single", "reduce_scatter_single")  # fmt: skip
"""torch.distributed._functional_collectives functions whose result is the buffer the call made."""

SETTLE_S = 0.05
"""The longest the census waits for a backend's thread to drop a finished call's reference (a
thread that is runnable gets the CPU within a few scheduler periods, even on a loaded machine)."""
SETTLE_POLL_S = 0.0005

Watched = Callable[[tuple[object, ...], Mapping[str, object], object], list[object]]
"""What a wrapped function's call filled or made, from its (args, kwargs, result)."""


class Watch:
    """The buffers one forward's collectives filled, and who released each."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.entries: list[list[object]] = []  # [weakref, ptr, nbytes, released by ("backend", "model") or None]
        self._refs: set[weakref.ref[torch.UntypedStorage]] = set()

    def add(self, tensor: object) -> None:
        """Watch the storage of ``tensor`` (what the call filled or made: anything else is let be)."""
        tensor = getattr(tensor, "elem", tensor)  # an AsyncCollectiveTensor wraps its result
        if not isinstance(tensor, torch.Tensor):
            return
        tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard
        try:
            storage = tensor.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        if not ptr or any(e[1] == ptr and e[3] is None and e[0]() is not None for e in self.entries):
            return
        entry: list[object] = [None, ptr, nbytes, None]

        def released(ref: weakref.ref[torch.UntypedStorage], entry: list[object] = entry) -> None:
            entry[3] = "model" if threading.get_ident() == self.main else "backend"
            self._refs.discard(ref)

        entry[0] = weakref.ref(storage, released)
        self._refs.add(entry[0])
        self.entries.append(entry)

    def held(self) -> int:
        """How many watched buffers nobody has released yet."""
        return sum(1 for ref, _, _, who in self.entries if who is None and ref() is not None)

    def census(self, settle_s: float = SETTLE_S) -> ReleasedCensus:
        """Who released each watched buffer, once the backend's threads have had ``settle_s`` to
        drop what they still hold."""
        deadline = time.monotonic() + settle_s
        while self.held() and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL_S)
        return ReleasedCensus([(ptr, nbytes, who or ("alive" if ref() is not None else "backend"))
                               for ref, ptr, nbytes, who in self.entries])  # fmt: skip


_ACTIVE: list[Watch] = []
"""The watch of the instrumented forward running now (one at a time: the root's)."""
_INSTALLED: dict[tuple[ModuleType, str], Callable[..., object]] = {}
_USERS = [0]


def begin() -> Watch:
    watch = Watch()
    _ACTIVE[:] = [watch]
    return watch


def end() -> None:
    _ACTIVE.clear()


def install() -> None:
    """Wrap the collectives (once per process, however many instrumentations)."""
    _USERS[0] += 1
    if _INSTALLED:
        return
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    for name in (*_OUTPUT_FIRST, *_OUTPUT_LIST_FIRST):
        for module in (dist, getattr(dist, "distributed_c10d", dist)):
            _wrap(module, name, _filled_by(name))
    for name in _RETURNING:
        _wrap(funcol, name, _returned)
    # every functional collective hands its raw result to this one function before anything joins
    # it (all_gather_single along a dim other than 0 returns the cat of the chunks, not the buffer
    # the collective made: DTensor's redistribute of a sequence shard)
    _wrap(funcol, "_maybe_wrap_tensor", _first_argument)
    for module in (dist, getattr(dist, "distributed_c10d", dist)):
        _wrap(module, "batch_isend_irecv", _received)


def uninstall() -> None:
    _USERS[0] = max(_USERS[0] - 1, 0)
    if _USERS[0]:
        return
    for (module, name), original in _INSTALLED.items():
        setattr(module, name, original)
    _INSTALLED.clear()


def _wrap(module: ModuleType, name: str, watched: Watched) -> None:
    original = getattr(module, name, None)
    if original is None or (module, name) in _INSTALLED or getattr(original, "_sptrace_watched", False):
        return

    @functools.wraps(original)
    def wrapper(*args: object, **kwargs: object) -> object:
        result = original(*args, **kwargs)
        if _ACTIVE and torch.autograd._profiler_enabled():
            for tensor in watched(args, kwargs, result):
                _ACTIVE[0].add(tensor)
        return result

    wrapper._sptrace_watched = True  # type: ignore[attr-defined]
    _INSTALLED[(module, name)] = original
    setattr(module, name, wrapper)


def _filled_by(name: str) -> Watched:
    keyword = {"all_gather": "tensor_list", "all_to_all": "output_tensor_list", "broadcast": "tensor",
               "all_reduce": "tensor", "all_to_all_single": "output"}.get(name, "output_tensor")  # fmt: skip
    is_list = name in _OUTPUT_LIST_FIRST

    def watched(args: tuple[object, ...], kwargs: Mapping[str, object], result: object) -> list[object]:
        first = args[0] if args else kwargs.get(keyword, kwargs.get("output"))
        if first is None:
            return []
        return list(first) if is_list else [first]

    return watched


def _received(args: tuple[object, ...], kwargs: Mapping[str, object], result: object) -> list[object]:
    """The buffers a batch's receives fill."""
    import torch.distributed as dist

    ops = args[0] if args else kwargs.get("p2p_op_list", ())
    return [op.tensor for op in ops if getattr(op, "op", None) in (dist.irecv, dist.recv)]


def _first_argument(args: tuple[object, ...], kwargs: Mapping[str, object], result: object) -> list[object]:
    return [args[0]] if args else []


def _returned(args: tuple[object, ...], kwargs: Mapping[str, object], result: object) -> list[object]:
    return list(result) if isinstance(result, (list, tuple)) else [result]
