"""The shape of a tensor from the op that allocated it, when the trace has no saved-tensor record.

Kineto records the shapes of an op's inputs (``Input Dims``) and the values of its int-list
arguments (``Concrete Inputs``), never its outputs. The output shape follows from the op's
semantics for the ops that allocate activations: factories (sizes in Concrete Inputs), matrix
products, concatenation, and elementwise ops, norms and copies (an input's shape). A candidate
counts only when its bytes equal the allocation's (or, on CUDA, fit the caching allocator's
block with at most ``slack`` to spare): a shape is never guessed from bytes alone.

Hand-written because no library maps aten ops to output shapes from recorded inputs (torch's
meta functions need the inputs themselves, which a trace does not hold).
"""

from __future__ import annotations

import math

from sptrace.detect.args import is_shape, load_list
from sptrace.detect.intervals import EventRow
from sptrace.vocab import dtypes

# factory ops: position of the size list, and of the dtype (a c10::ScalarType code) in Concrete Inputs
_FACTORIES = {
    "aten::empty": (0, 1), "aten::zeros": (0, 1), "aten::ones": (0, 1), "aten::full": (0, 2),
    "aten::rand": (0, 1), "aten::randn": (0, 1), "aten::empty_strided": (0, 2),
    "aten::new_empty": (1, 2), "aten::new_zeros": (1, 2), "aten::new_ones": (1, 2), "aten::new_full": (1, 3),
    "aten::new_empty_strided": (1, 3),
}  # fmt: skip


def candidate_shapes(op: EventRow) -> list[tuple[tuple[int, ...], str | None]]:
    """(shape, dtype) candidates for what ``op`` allocated, most specific first."""
    name = str(op.get("name"))
    dims = load_list(op.get("input_dims"))
    types = load_list(op.get("input_types"))
    concrete = load_list(op.get("concrete_inputs"))
    first_type = next((str(t) for t in types if dtypes.canonical(t)), None)
    out: list[tuple[tuple[int, ...], str | None]] = []
    if name in _FACTORIES:
        size_at, dtype_at = _FACTORIES[name]
        if size_at < len(concrete):
            sizes = load_list(concrete[size_at]) if isinstance(concrete[size_at], str) else []
            dtype = dtypes.from_scalar_type_code(concrete[dtype_at]) if dtype_at < len(concrete) else None
            if is_shape(sizes):
                out.append((tuple(sizes), dtype or (first_type if name.startswith("aten::new_") else None)))
        return out
    shapes = [tuple(d) for d in dims if is_shape(d)]
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"):
        mats = shapes[-2:] if name in ("aten::addmm", "aten::baddbmm") and len(shapes) >= 3 else shapes[:2]
        if len(mats) == 2:
            a, b = mats
            if name == "aten::linear" and len(b) == 2:
                out.append(((*a[:-1], b[0]), first_type))
            elif len(a) >= 2 and len(b) >= 2:
                batch = a[:-2] if len(a) >= len(b) else b[:-2]
                out.append(((*batch, a[-2], b[-1]), first_type))
            elif len(a) >= 1 and len(b) == 2:
                out.append(((*a[:-1], b[-1]), first_type))
    if name == "aten::cat" and dims and isinstance(dims[0], list) and all(is_shape(s) for s in dims[0]):
        parts = dims[0]
        axis = int(concrete[1]) if len(concrete) > 1 and str(concrete[1]).lstrip("-").isdigit() else 0
        rank = len(parts[0])
        if rank and all(len(p) == rank for p in parts):
            axis %= rank
            shape = list(parts[0])
            shape[axis] = sum(p[axis] for p in parts)
            out.append((tuple(shape), first_type))
    # elementwise ops, norms, softmax, copies and views made contiguous: an input's shape (the
    # largest first: broadcasting makes the output as large as the largest input)
    for shape in sorted(shapes, key=math.prod, reverse=True):
        out.append((shape, first_type))
    return out


def infer_shape(
    op: EventRow, nbytes: int, default_element_size: int | None, slack: int = 0
) -> tuple[tuple[int, ...], str | None] | None:
    """(shape, dtype) of the ``nbytes`` that ``op`` allocated, or None when no candidate's bytes
    fit. ``slack``: bytes a CUDA caching-allocator block may exceed the request by."""
    best: tuple[int, tuple[int, ...], str | None] | None = None
    for shape, dtype in candidate_shapes(op):
        # the op's own element type, else the declared one, else (a TensorList op such as cat,
        # which records none) every element size: the shape counts only if exactly one fits
        sizes = (
            [dtypes.element_size(dtype) or default_element_size] if (dtype or default_element_size) else [1, 2, 4, 8]
        )
        fits = [(nbytes - math.prod(shape) * size, size) for size in sizes if size]
        fits = [(spare, size) for spare, size in fits if 0 <= spare <= slack]
        if len(fits) != 1:
            continue
        spare = fits[0][0]
        if best is None or spare < best[0]:
            best = (spare, shape, dtypes.canonical(dtype) if dtype else None)
    return None if best is None else (best[1], best[2])
