"""The per-token widths a rank's weights give its products, read off the matmuls of its forwards:
the widths a full-sequence tensor-parallel shard can have, before any flag declares F or the
heads (sptrace.checks.sharding's Judge reads them).

A linear layer's weight is an argument of its matmul, and Kineto records every argument's dims:
``aten::linear`` takes [N, K], ``aten::mm`` and ``aten::addmm`` take [K, N] (an ``x @ W.t()``).
Against the declared hidden size H:

* a weight that contracts H into N != H makes N-wide products: a column-parallel linear's
  [F/P, H] (N = F/P), a fused projection's [3*a*d/P, H], a replicated MLP's [F, H];
* a weight that makes H out of K != H takes K-wide inputs: a row-parallel linear's [H, F/P]
  (K = F/P), an attention output projection's [H, a*d/P].

Either width is one a tensor may have on the whole sequence and still be a shard of something
this rank holds a 1/P share of; no other width is (H itself is no weight's evidence: a square
weight is a replicated projection as often as a shard at F/P == H).

Hand-written: no library reads layer widths out of a profiler trace.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from sptrace.detect.args import is_shape, load_list

_WEIGHT_ARG = {"aten::linear": (1, True), "aten::mm": (1, False), "aten::addmm": (2, False), "aten::matmul": (1, False)}
"""matmul -> (the argument that is the weight, whether it is laid out [N, K] as linear's is)."""
MATMULS = tuple(_WEIGHT_ARG)


def weight_widths(names: np.ndarray, dims: np.ndarray, hidden: int | None) -> dict[int, str]:
    """{width: where it was read} for the matmuls ``names`` (with their Input Dims texts ``dims``)."""
    if hidden is None:
        return {}
    out: dict[int, str] = {}
    for name, text in dict.fromkeys(zip(names.tolist(), dims.tolist())):
        if not isinstance(text, str) or name not in _WEIGHT_ARG:
            continue
        found = _width(name, text, hidden)
        if found is not None:
            out.setdefault(*found)
    return out


@functools.lru_cache(maxsize=1 << 12)
def _width(name: str, text: str, hidden: int) -> tuple[int, str] | None:
    at, transposed = _WEIGHT_ARG[name]
    args = load_list(text)
    if len(args) <= at or not is_shape(args[at]) or len(args[at]) != 2:
        return None
    weight = args[at]
    k, n = (weight[1], weight[0]) if transposed else (weight[0], weight[1])
    width = weight_width(n, k, hidden)
    if width is None:
        return None
    what = "wide products of H" if width == n else "wide inputs that it sums into H"
    return width, f"the [{'x'.join(map(str, weight))}] weight {name} took ({width} {what})"


def weight_width(n: int, k: int, hidden: int) -> int | None:
    """The per-token width a weight that maps K to N gives beside H: N where it contracts H
    (N != H), K where it makes H (K != H), else None (a square weight tells nothing)."""
    if k == hidden and n != hidden:
        return n
    if n == hidden and k != hidden:
        return k
    return None


def widths_of_frame(ops: pd.DataFrame, hidden: int | None) -> dict[int, str]:
    """``weight_widths`` of a frame of ops (``name``, ``input_dims``). The names are read as the
    column's own objects: ``astype(str)`` turned every category of the column into text (a tenth
    of a small rank's map)."""
    if ops.empty:
        return {}
    return weight_widths(ops["name"].to_numpy(dtype=object), ops["input_dims"].to_numpy(dtype=object), hidden)
