"""What a rank's forwards show of the model beside its allocations: every shape their ops took
(and the element type each was taken in), the widths their weights give (sptrace.detect.weights),
and the layers the python stacks show running. sptrace.detect.allocations collects them into a
Retention."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from sptrace.detect.args import is_shape, load_list
from sptrace.detect.columns import take_columns
from sptrace.detect.index import RankIndex
from sptrace.detect.weights import MATMULS, widths_of_frame
from sptrace.detect.windows import in_any
from sptrace.vocab import dtypes


def shapes_seen(
    cpu: pd.DataFrame, fwd: int | np.ndarray, bwd: int | np.ndarray | None,
    dtypes_of: dict[tuple[int, ...], set[str]] | None = None,
) -> set[tuple[int, ...]]:  # fmt: skip
    """Every tensor shape the window's ops took (or the windows' ops: ``fwd`` and ``bwd`` arrays of
    each forward's start and its backward's); ``dtypes_of`` (shape -> element types) collects
    the type each shape was taken with, where the op records one per argument."""
    ts = cpu["ts_ns"].to_numpy(dtype=np.int64, na_value=0)
    present = cpu["ts_ns"].notna().to_numpy()  # a missing time is in no window
    if bwd is None:
        inside = present & (ts >= fwd)
    else:
        inside = present & in_any(ts, np.atleast_1d(fwd), np.atleast_1d(bwd))
    dims, types = cpu["input_dims"].to_numpy()[inside], cpu["input_types"].to_numpy()[inside]
    # (no JSON text, no shapes: a missing value, NA or NaN, is no str)
    pairs = {(d, t): None for d, t in zip(dims.tolist(), types.tolist()) if isinstance(d, str)}
    seen: set[tuple[int, ...]] = set()
    for text, kinds_text in pairs:
        shapes, typed = _arg_shapes(text, kinds_text if isinstance(kinds_text, str) else None)
        seen.update(shapes)
        if dtypes_of is not None:
            for shape, dtype in typed:
                dtypes_of.setdefault(shape, set()).add(dtype)
    return seen


Shape = tuple[int, ...]


@functools.lru_cache(maxsize=1 << 15)
def _arg_shapes(text: str, kinds_text: str | None) -> tuple[tuple[Shape, ...], tuple[tuple[Shape, str], ...]]:
    """The shapes an op's Input Dims hold (an argument's, or a tensor list's), and the element type
    of each argument that is one shape: a pure function of the two texts, parsed once per worker
    (the ranks of a job repeat them)."""
    args, kinds = load_list(text), load_list(kinds_text)
    shapes: list[Shape] = []
    typed: list[tuple[Shape, str]] = []
    for k, arg in enumerate(args):
        found = [arg] if is_shape(arg) else [s for s in arg if is_shape(s)] if isinstance(arg, list) else []
        shapes.extend(tuple(s) for s in found)
        dtype = dtypes.canonical(kinds[k]) if is_shape(arg) and k < len(kinds) else None
        if dtype:
            typed.append((tuple(arg), dtype))
    return tuple(shapes), tuple(typed)


def forward_weight_widths(
    ev: pd.DataFrame, idx: RankIndex, is_op: np.ndarray, forwards: np.ndarray, backwards: np.ndarray,
    hidden: int | None,
) -> dict[int, str]:  # fmt: skip
    """sptrace.detect.weights' widths, of the matmuls inside the forwards (each from ``forwards``
    to its ``backwards``: a backward's matmuls take gradients and activations, not weights)."""
    mm = take_columns(ev, is_op & idx.by_name.one_of(MATMULS), ["name", "ts_ns", "input_dims"])
    ts = mm["ts_ns"].to_numpy(dtype=np.int64, na_value=-1)
    return widths_of_frame(mm[in_any(ts, forwards, backwards)], hidden)


def layers_seen(idx: RankIndex) -> set[int]:
    seen = set(idx.marker_layers.values())
    if not seen:
        seen = idx.python_layers()
    return seen
