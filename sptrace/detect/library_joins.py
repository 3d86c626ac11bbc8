"""A collective's buffer that never left torch's own code: evidence, from the Python stacks, that
nothing but the backend held it once torch's function returned.

DTensor's redistribute of a sequence shard (``Shard(1) -> Replicate()``, PyTorch-native sequence
parallelism) gathers with a functional collective along dim 0, then ``all_gather_single`` chunks
the result and joins the chunks along the sequence (``aten::cat``) and returns the join. The
buffer the collective made is a local variable of torch's function and of nothing else; gloo's
work item holds it too, and drops it on its own thread, so its free is often missing from a CPU
trace (sptrace.detect.holders: undecided). Where the trace's Python stacks show the collective
called from a function of torch's own package, a join inside that same call reading exactly the
buffer's bytes after it, and that call ended before the boundary, the model never had the buffer:
the backend held the last reference.

Only torch's own functions are read this way (their frames are named ``torch/...py(N): name``):
a framework's or the user's function that makes a buffer may keep it (Megatron-Core's global
memory buffer is one), and nothing is assumed of them. A trace without Python stacks shows no
frames, and the rule says nothing.
"""

from __future__ import annotations

import math
import re

from sptrace.detect.args import is_shape, load_list
from sptrace.detect.handed import Handed
from sptrace.detect.intervals import Intervals

_TORCH_FRAME = re.compile(r"^torch/[\w/]+\.py\(\d+\): (?P<function>\w+)$")
_GATEWAYS = ("torch/nn/modules/module.py(", "torch/autograd/function.py(", "torch/utils/checkpoint.py(")
"""torch frames that call the user's code back (a module's forward, a Function's, a checkpointed
block): a buffer made below one of them may have been handed to the user."""
_SHIMS = ("<built-in ", "torch/_ops.py(", "sptrace/census.py(")
"""Frames between a function and the op it calls: the dispatcher's, and sptrace's own census."""
_JOINS = frozenset({"aten::cat", "aten::_cat", "aten::stack", "aten::clone", "aten::contiguous", "aten::_to_copy"})
_ELEMENT_SIZES = (1, 2, 4, 8)


class LibraryJoins:
    """Reads one rank's Python frames and ops for a buffer torch joined and let go."""

    def __init__(self, python: Intervals, ops: Intervals) -> None:
        self.python = python
        self.ops = ops

    def evidence(self, call: Handed, nbytes: int, boundary_ns: int) -> str | None:
        """Why the backend held the last reference to the ``nbytes`` buffer ``call`` returned or
        filled, where torch's own function joined it and returned before ``boundary_ns``; else None."""
        if not len(self.python) or not call.call_end_ns:
            return None
        frames = self.python.enclosing(call.call_ns, call.call_end_ns, call.tid)
        names = [self.python.name(int(i)) for i in frames]
        k = len(names) - 1
        while k >= 0 and names[k].startswith(_SHIMS):
            k -= 1
        if k < 0 or names[k].startswith(_GATEWAYS):
            return None
        caller = _TORCH_FRAME.match(names[k])
        if caller is None:
            return None
        frame = int(frames[k])
        end = int(self.python.end[frame])
        if end >= boundary_ns:
            return None
        for j in self.ops.inside(call.call_end_ns, end, call.tid):
            name = self.ops.name(int(j))
            if name in _JOINS and _reads(self.ops.row(int(j)).get("input_dims"), nbytes):
                return (f"the tensor {call.collective} returned to torch's own {caller['function']}, which joined it "
                        f"into a new tensor ({name}) and returned before the boundary: nothing but the backend held "
                        "it then, and gloo and NCCL drop their reference on a thread the profiler does not "
                        "record")  # fmt: skip
        return None


def _reads(dims_text: object, nbytes: int) -> bool:
    """Does an op's first argument (a tensor, or a list of them) hold exactly ``nbytes``, at some
    element size?"""
    dims = load_list(dims_text)
    if not dims:
        return False
    first = dims[0]
    shapes = [first] if is_shape(first) else [s for s in first if is_shape(s)] if isinstance(first, list) else []
    elements = sum(math.prod(s) for s in shapes)
    return bool(elements) and any(elements * size == nbytes for size in _ELEMENT_SIZES)
