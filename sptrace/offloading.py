"""The copies a user's saved-tensor pack hooks keep in place of what autograd saves, as
``sptrace.instrument`` records them (``kind=offloaded`` saved-tensor records; docs/gate.md).

``torch.autograd.graph.save_on_cpu``, or any ``saved_tensors_hooks`` whose pack hook copies, keeps
a copy for backward instead of the tensor autograd saved. Only the innermost pair of hooks runs,
so an instrumented model meets them two ways:

* entered around the whole forward (``with save_on_cpu(): loss = model(x)``): the instrumentation's
  own hooks, entered when the root module starts, call the user's (``chained``), so the user's
  hooks keep working and the copy is recorded;
* entered inside the forward, over the instrumentation's: ``saved_tensors_hooks.__enter__`` is
  wrapped while an instrumentation is installed, and a pair entered during an instrumented
  forward under a profiler has its pack hook noted (``_noting``).

A pack hook that returns the tensor itself, or something that is no tensor (activation
checkpointing's holder), copies nothing: nothing is recorded for it here. The trace shows these
copies too where it was recorded with Python stacks (sptrace.detect.pack_copies); these records
are for the traces that were not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sptrace.instrumentation import Instrumentation

ACTIVE: list[Instrumentation] = []
"""The instrumentation whose forward runs now (one at a time: the root's)."""
_ENTER: list[Callable[[torch.autograd.graph.saved_tensors_hooks], None]] = []
_USERS = [0]
_profiler_enabled = torch.autograd._profiler_enabled
_in_backward = torch._C._current_graph_task_id


def install() -> None:
    """Wrap ``saved_tensors_hooks.__enter__`` (once per process, however many instrumentations)."""
    _USERS[0] += 1
    if _ENTER:
        return
    hooks_class = torch.autograd.graph.saved_tensors_hooks
    original = hooks_class.__enter__
    _ENTER.append(original)

    def __enter__(hooks: torch.autograd.graph.saved_tensors_hooks) -> None:
        instrumentation = ACTIVE[0] if ACTIVE else None
        if (instrumentation is not None and _profiler_enabled() and _in_backward() == -1
                and not getattr(hooks.pack_hook, "_sptrace", False)):  # fmt: skip
            hooks.pack_hook = _noting(instrumentation, hooks.pack_hook)
        return original(hooks)

    hooks_class.__enter__ = __enter__  # type: ignore[method-assign]


def uninstall() -> None:
    _USERS[0] = max(_USERS[0] - 1, 0)
    if _USERS[0] or not _ENTER:
        return
    torch.autograd.graph.saved_tensors_hooks.__enter__ = _ENTER.pop()  # type: ignore[method-assign]


def _noting(
    instrumentation: Instrumentation, pack: Callable[[torch.Tensor], object]
) -> Callable[[torch.Tensor], object]:
    def noted(tensor: torch.Tensor) -> object:
        packed = pack(tensor)
        instrumentation.note_offloaded(tensor, packed)
        return packed

    noted._sptrace = True  # type: ignore[attr-defined]
    return noted


def chained(
    instrumentation: Instrumentation, pack: Callable[[torch.Tensor], object], unpack: Callable[[object], torch.Tensor]
) -> torch.autograd.graph.saved_tensors_hooks:
    """The instrumentation's hooks over a user's pair: the user's pack runs, and what it kept is
    recorded (its copy, or the tensor itself where it kept that); the user's unpack restores it."""

    def noted(tensor: torch.Tensor) -> object:
        packed = pack(tensor)
        if not instrumentation.note_offloaded(tensor, packed) and copy_in(packed) is not None:
            instrumentation._pack(tensor)  # kept as it is (a holder that is no tensor keeps nothing)
        return packed

    noted._sptrace = True  # type: ignore[attr-defined]
    return torch.autograd.graph.saved_tensors_hooks(noted, unpack)


def copy_in(packed: object) -> torch.Tensor | None:
    """The tensor a pack hook kept: what it returned, or the first tensor of a tuple
    (save_on_cpu returns (device, copy))."""
    if isinstance(packed, torch.Tensor):
        return packed
    if isinstance(packed, tuple):
        return next((p for p in packed if isinstance(p, torch.Tensor)), None)
    return None
