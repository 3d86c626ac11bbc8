"""Copies that a saved-tensor pack hook keeps in place of what autograd saves: offloaded
activations (``torch.autograd.graph.save_on_cpu``, or any ``saved_tensors_hooks`` pack hook that
copies, pinned or not, to another device or in another dtype).

Autograd calls the pack hook for each tensor an op saves, inside that op, after the op computed:
the trace shows the hook's Python frame nested in the saving op's range (``aten::mm``, ``aten::
gelu``), and in it the copy: a bare allocator then ``aten::copy_`` (save_on_cpu), or ``aten::
clone`` / ``aten::_to_copy``. What the copy holds is what the original held; the original may be
freed right after the forward, the copy is what the step keeps for backward (the memory is the
copy's, whatever device it is on). Kineto records the copy's source dims (``copy_``'s second
argument, ``clone``'s first), so the copy's shape is known, and its source is the saving op's input
of those dims (an op saves its inputs) or, where none has them, its output.

Read from Python frames: a trace recorded without stacks shows no hook, and its copies read as
the saving op's own allocations (docs/gate.md says what that misses).

Hand-written: no library reads saved-tensor hooks out of a profiler trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from sptrace.detect.args import is_shape, load_list
from sptrace.detect.intervals import Intervals
from sptrace.detect.provenance import FACTORIES
from sptrace.vocab import dtypes

_COPIES = frozenset({"aten::clone", "aten::_to_copy", "aten::to", "aten::contiguous"})
"""Ops that allocate a copy of their first argument."""


@dataclass(frozen=True, slots=True)
class PackCopy:
    """A copy a pack hook made of a tensor autograd saves."""

    saver: str
    """The op that saved the tensor (its pack hook ran inside it)."""
    saver_start_ns: int
    hook: str
    """The hook's Python frame (``torch/autograd/graph.py(403): pack_to_cpu``)."""
    shape: tuple[int, ...]
    """The copy's dims (its source's)."""
    source_dtype: str | None
    """The source's element type, where the copy op records it."""
    dtype: str | None
    """The copy's element type, where the copy op records it."""
    an_input: bool
    """Whether the saving op took a tensor of the copy's dims (then that input is the source)."""

    def describe(self) -> str:
        return f"a copy that the saved-tensor pack hook {self.hook} made inside {self.saver}"


class PackCopies:
    """One rank's pack-hook copies, told by its ops and Python frames."""

    def __init__(self, python: Intervals, ops: Intervals) -> None:
        self.python = python
        self.ops = ops

    def of(self, alloc_ns: int, tid: int | None) -> PackCopy | None:
        """The pack-hook copy an allocation at ``alloc_ns`` on ``tid`` is, or None."""
        if not len(self.python):
            return None
        chain = [int(i) for i in self.ops.enclosing(alloc_ns, alloc_ns, tid)]
        names = [self.ops.name(i) for i in chain]
        k = len(chain) - 1
        while k >= 0 and (names[k] in FACTORIES or names[k] in _COPIES):
            k -= 1
        if k < 0 or k == len(chain) - 1 or not names[k].startswith("aten::"):
            return None  # no bare allocator or copy made it, or nothing saved around it
        saver = chain[k]
        lo, hi = int(self.ops.start[saver]), int(self.ops.end[saver])
        frames = [int(f) for f in self.python.enclosing(alloc_ns, alloc_ns, tid)]
        hooks = [f for f in frames if lo <= int(self.python.start[f]) and int(self.python.end[f]) <= hi
                 and not self.python.name(f).startswith("<built-in")]  # fmt: skip
        if not hooks:
            return None  # no Python ran inside the op: its own allocation
        hook = hooks[0]  # the outermost: the hook itself (what it calls runs inside it)
        copied = self._copied(chain[k + 1 :], alloc_ns, tid, int(self.python.end[hook]))
        if copied is None:
            return None
        shape, source_dtype, dtype = copied
        inputs = [tuple(d) for d in load_list(self.ops.row(saver).get("input_dims")) if is_shape(d)]
        return PackCopy(names[k], lo, self.python.name(hook), shape, source_dtype, dtype, shape in inputs)

    def _copied(
        self, inner: list[int], alloc_ns: int, tid: int | None, hook_end: int
    ) -> tuple[tuple[int, ...], str | None, str | None] | None:
        """(dims, source dtype, copy dtype) of the copy an allocation is: the copy op around it,
        else the first ``aten::copy_`` after it in the hook."""
        for i in inner:
            if self.ops.name(i) in _COPIES:
                dims = load_list(self.ops.row(i).get("input_dims"))
                types = load_list(self.ops.row(i).get("input_types"))
                if dims and is_shape(dims[0]):
                    source = dtypes.canonical(types[0]) if types else None
                    return tuple(dims[0]), source, None
        after = [int(j) for j in self.ops.inside(alloc_ns, hook_end, tid) if self.ops.name(int(j)) == "aten::copy_"]
        if not after:
            return None
        first = min(after, key=lambda j: int(self.ops.start[j]))
        dims = load_list(self.ops.row(first).get("input_dims"))
        types = load_list(self.ops.row(first).get("input_types"))
        if len(dims) < 2 or not is_shape(dims[1]):
            return None
        canon = [dtypes.canonical(t) if isinstance(t, str) else None for t in types[:2]]
        return tuple(dims[1]), (canon[1] if len(canon) > 1 else None), canon[0]
