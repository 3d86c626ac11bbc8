"""The signatures of collective ops, as a trace records them: which recorded argument is the
input, the output, the group size, the root or the peer, and what sizes follow from them.

Kineto records, per op argument, ``Input Dims`` (a shape, a list of shapes for a TensorList, or
``[]`` when it records nothing, as for a list of lists), ``Input type`` (a C++ type name, or
``TensorList`` / ``ScalarList`` / ``Scalar``) and ``Concrete Inputs`` (the value of scalars and
int lists as text; ``""`` for tensors and strings). Each op's layout is named in the table of
collective kinds (sptrace.vocab.collective_kinds) and read here; the layouts follow the c10d and
``_c10d_functional`` op schemas of PyTorch 2.x (torch/csrc/distributed/c10d/Ops.cpp,
Functional.cpp); a trace written by a PyTorch whose schema differs gets unknown sizes, never wrong
ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from sptrace.detect.args import get, is_shape, load_list, present
from sptrace.detect.intervals import EventRow
from sptrace.vocab import collective_kinds, dtypes


@dataclass(frozen=True)
class Form:
    kind: str
    layout: str
    """How the recorded arguments map to input and output; see ``sizes_from_op``."""
    group_size_arg: int | None = None
    """Position of an int argument holding the group size (functional collectives)."""
    root_arg: int | None = None
    """Position of the root (broadcast, reduce, gather, scatter) or peer (send, recv) rank."""


_forms: list = [-1, {}]  # [the table's version, op name -> Form]


def all_forms() -> dict[str, Form]:
    """Every collective op's Form, from the table of collective kinds, rebuilt when it changes."""
    if _forms[0] != collective_kinds.version():
        _forms[1] = {op.name: Form(k.name, op.layout, op.group_size_arg, op.root_arg)
                     for k in collective_kinds.kinds() for op in k.ops}  # fmt: skip
        _forms[0] = collective_kinds.version()
    return _forms[1]


def form_of(op_name: str) -> Form | None:
    return all_forms().get(op_name)


@dataclass(frozen=True)
class Sizes:
    """What one rank's collective moved, in elements; None = unknown (``why_*`` says why)."""

    in_elems: int | None = None
    out_elems: int | None = None
    dtype: str | None = None
    """As the trace spells it; sptrace.vocab.dtypes reads it."""
    group_size: int | None = None
    peer: int | None = None
    """Root of a rooted collective, or the other rank of a send/recv (rank in the group)."""
    is_root: bool | None = None
    out_per_member: int | None = None
    """Gathers whose output the trace does not record: elements each member contributes."""
    in_per_member: int | None = None
    """Scatters whose input the trace does not record: elements each member receives."""
    why_in: str | None = None
    why_out: str | None = None

    def merge(self, other: Sizes) -> Sizes:
        """Fill what this one does not know from ``other``."""
        values = {
            f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(other, f.name)
            for f in dataclasses.fields(self)
        }
        return Sizes(**values)

    def ratio_group_size(self, kind: str) -> int | None:
        """A gather's out/in ratio (a scatter's in/out) is its group size."""
        a, b = (self.out_elems, self.in_elems) if kind in ("all_gather",) else (self.in_elems, self.out_elems)
        if kind not in ("all_gather", "reduce_scatter") or not a or not b or a % b:
            return None
        return a // b

    def complete(self, kind: str, group_size: int | None) -> Sizes:
        """Derive the side the trace did not record from the group size, where the kind allows."""
        s = self
        if s.out_elems is None and s.out_per_member is not None:
            if group_size is not None:
                s = dataclasses.replace(s, out_elems=s.out_per_member * group_size)
            else:
                s = dataclasses.replace(
                    s, why_out=s.why_out or "the output list is not recorded and the group size is unknown"
                )
        if s.in_elems is None and s.in_per_member is not None:
            if group_size is not None:
                s = dataclasses.replace(s, in_elems=s.in_per_member * group_size)
            else:
                s = dataclasses.replace(
                    s, why_in=s.why_in or "the input list is not recorded and the group size is unknown"
                )
        if kind in ("all_reduce", "broadcast", "reduce", "send", "recv", "send_recv") and s.in_elems is not None:
            s = dataclasses.replace(s, out_elems=s.in_elems if s.out_elems is None else s.out_elems)
        if kind == "barrier":
            s = dataclasses.replace(s, in_elems=0, out_elems=0)
        return s


def _dims(event: EventRow, key: str = "input_dims") -> list:
    return load_list(get(event, key))


def _numel(arg: object) -> int | None:
    """Elements of one recorded argument: a shape, or a list of shapes (TensorList); None when
    nothing is recorded ([] for a TensorList, which Kineto writes for a list of lists)."""
    if is_shape(arg):
        return math.prod(arg) if arg else None  # [] is what Kineto writes when it records nothing
    if isinstance(arg, list) and arg and all(is_shape(s) for s in arg):
        return sum(math.prod(s) for s in arg)
    return None


def _shapes(arg: object) -> list | None:
    """The shapes of an argument: [shape] for a tensor, the shapes of a TensorList."""
    if isinstance(arg, list) and arg and all(is_shape(s) for s in arg):
        return arg
    if is_shape(arg) and arg:
        return [arg]
    return None


def _tensor_type(types: list, position: int | None = None) -> str | None:
    """The element type among an op's argument types (TensorList and Scalar say nothing)."""
    pool = [types[position]] if position is not None and position < len(types) else types
    for t in pool:
        if dtypes.canonical(t):
            return str(t)
    return None


def _int_arg(concrete: list, position: int | None) -> int | None:
    if position is None or position >= len(concrete):
        return None
    text = concrete[position]
    try:
        return int(text) if isinstance(text, str) and text.strip().lstrip("-").isdigit() else None
    except ValueError:
        return None


def _int_list(concrete: list, position: int) -> list[int] | None:
    if position >= len(concrete) or not isinstance(concrete[position], str):
        return None
    try:
        value = json.loads(concrete[position])
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def sizes_from_op(op_name: str, event: EventRow) -> Sizes:
    """Sizes from a c10d / functional op's own recorded arguments."""
    form = form_of(op_name)
    dims = _dims(event)
    types = _dims(event, "input_types")
    concrete = _dims(event, "concrete_inputs")
    if form is None:  # symm_mem:: and anything else: the first argument
        n = _numel(dims[0]) if dims else None
        # in place only for an all-reduce; another's output is not recorded, never taken for its
        # input (an out/in ratio of 1 would then read as a group of one)
        same = "all_reduce" in op_name or "allreduce" in op_name
        return Sizes(
            n, n if same else None, _tensor_type(types), why_in=None if n is not None else "no Input Dims recorded",
            why_out=None if same else f"{op_name} records its input only",
        )  # fmt: skip
    group_size = _int_arg(concrete, form.group_size_arg)
    peer = _int_arg(concrete, form.root_arg)
    layout = form.layout
    arg = lambda i: dims[i] if i < len(dims) else None  # noqa: E731
    if layout == "none":
        return Sizes(0, 0, None, group_size)
    if layout == "out_in":
        return Sizes(_numel(arg(1)), _numel(arg(0)), _tensor_type(types), group_size)
    if layout == "out_in_lists":
        inputs = arg(1)
        if form.kind == "all_to_all" and isinstance(inputs, list) and len(inputs) > 1 and group_size is None:
            group_size = len(inputs)  # alltoall_ takes one input tensor per member of the group
        return Sizes(_numel(inputs), _numel(arg(0)), _tensor_type(types), group_size)
    if layout == "gather_lists":  # (output list of lists: not recorded, input list)
        out = _numel(arg(0))
        n_in = _numel(arg(1))
        return Sizes(n_in, out, _tensor_type(types), group_size, out_per_member=n_in if out is None else None)
    if layout == "scatter_lists":  # (output list, input list of lists: not recorded)
        n_out = _numel(arg(0))
        n_in = _numel(arg(1))
        return Sizes(n_in, n_out, _tensor_type(types), group_size, in_per_member=n_out if n_in is None else None)
    if layout == "inplace":
        n = _numel(arg(0))
        return Sizes(n, n, _tensor_type(types, 0) or _tensor_type(types), group_size, peer,
                     why_in=None if n is not None else "no Input Dims recorded")  # fmt: skip
    if layout == "gather_root":  # (outputs: [[...]] on the root, [] elsewhere; inputs; pg; root)
        n_in = _numel(arg(1))
        root = not (concrete and concrete[0] == "[]")
        if not root:
            return Sizes(n_in, 0, _tensor_type(types), group_size, peer, is_root=False)
        out = _numel(arg(0))
        return Sizes(n_in, out, _tensor_type(types), group_size, peer, is_root=True,
                     out_per_member=n_in if out is None else None)  # fmt: skip
    if layout == "scatter_root":  # (outputs; inputs: [[...]] on the root, [] elsewhere; pg; root)
        n_out = _numel(arg(0))
        root = not (len(concrete) > 1 and concrete[1] == "[]")
        if not root:
            return Sizes(0, n_out, _tensor_type(types), group_size, peer, is_root=False)
        n_in = _numel(arg(1))
        return Sizes(n_in, n_out, _tensor_type(types), group_size, peer, is_root=True,
                     in_per_member=n_out if n_in is None else None)  # fmt: skip
    if layout == "f_gather":
        n_in = _numel(arg(0))
        out = n_in * group_size if n_in is not None and group_size else None
        return Sizes(n_in, out, _tensor_type(types), group_size,
                     out_per_member=n_in if out is None else None)  # fmt: skip
    if layout == "f_scatter":
        n_in = _numel(arg(0))
        out = n_in // group_size if n_in is not None and group_size and n_in % group_size == 0 else None
        return Sizes(n_in, out, _tensor_type(types), group_size,
                     why_out=None if out is not None else "the group size is unknown")  # fmt: skip
    if layout == "f_all_to_all":  # (input, output_split_sizes, input_split_sizes, group_name)
        shape = arg(0)
        n_in = _numel(shape)
        out_splits = _int_list(concrete, 1)
        n_out = n_in
        if out_splits and is_shape(shape) and shape and shape[0]:
            row = math.prod(shape[1:]) if len(shape) > 1 else 1
            n_out = sum(out_splits) * row
        size = len(out_splits) if out_splits else None
        return Sizes(n_in, n_out, _tensor_type(types), group_size or size)
    return Sizes()


def sizes_from_record(args: EventRow) -> Sizes:
    """record_param_comms args (or the copy NCCL kernels carry): exact element counts."""
    name = get(args, "coll_dtype")
    n_in, n_out = get(args, "in_nelems"), get(args, "out_nelems")
    in_elems = int(n_in) if present(n_in) else None
    out_elems = int(n_out) if present(n_out) else None
    return Sizes(in_elems, out_elems, str(name) if present(name) else None)


def sizes_from_annotation(kind: str, event: EventRow) -> Sizes:
    """An nccl:* or gloo:* annotation's Input Dims: the tensor(s) this rank sent."""
    dims = _dims(event)
    types = _dims(event, "input_types")
    n = _numel(dims) if dims and all(is_shape(d) for d in dims) else None
    dtype = _tensor_type(types)
    if n is None:
        return Sizes(dtype=dtype)
    if kind == "all_gather":
        return Sizes(n, None, dtype, out_per_member=n)
    if kind in ("all_reduce", "broadcast", "reduce", "send", "recv"):
        return Sizes(n, n, dtype)
    if kind in ("scatter", "all_to_all") and len(dims) > 1:  # one tensor per member of the group
        return Sizes(n, None, dtype, group_size=len(dims), why_out="the annotation records the input only")
    return Sizes(n, None, dtype, why_out="the annotation records the input only")


def input_shapes(op_name: str, event: EventRow) -> list | None:
    """The shapes of what an op sends, where recorded (for matching worker annotations)."""
    form = form_of(op_name)
    dims = _dims(event)
    if form is None or not dims:
        return None
    if form.layout in ("out_in", "out_in_lists", "gather_lists", "scatter_lists", "gather_root", "scatter_root"):
        return _shapes(dims[1]) if len(dims) > 1 else None
    return _shapes(dims[0])


def output_shapes(op_name: str, event: EventRow) -> list | None:
    form = form_of(op_name)
    dims = _dims(event)
    if form is None or not dims:
        return None
    return _shapes(dims[0])
