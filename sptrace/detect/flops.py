"""How much arithmetic each module did on one rank: the floating-point operations of its matrix
products and attention kernels, from the shapes the profiler recorded (``record_shapes``' Input
Dims), per module and phase. What sptrace.reduce.balance compares across ranks beside their
compute time: time says what a rank paid, the operations say how much work it was given.

Only leaf ops are counted (``aten::mm``, ``aten::bmm``, ``aten::addmm``, ``aten::baddbmm`` and the
fused attention ops), never the composites that call them (``aten::matmul``, ``aten::linear``),
so nothing is counted twice. Each op is charged to the module running at its start on its
thread (sptrace.detect.module_clock), forward or backward as the work lane's phases say. On a GPU
trace the ops are the CPU side of the kernels they launch, with the same shapes.

A fused attention op's count assumes no mask (4·B·a·Sq·Sk·d forward, twice that backward): a
causal flag in its arguments is not read, so a causal SDPA counts its full square.
"""

from __future__ import annotations

import json
from math import prod

import numpy as np
import pandas as pd

from sptrace.detect.columns import empty_frame, sums_by
from sptrace.detect.index import RankIndex
from sptrace.detect.module_clock import ModuleClock
from sptrace.detect.work import phases_at

FLOPS_COLUMNS = ["rank", "module", "phase", "flops"]

_MATMUL_OPERANDS = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}
"""Leaf matrix products -> the index of their first matrix operand (addmm's 0 is the bias)."""
_ATTENTION = {
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 4,
    "aten::_scaled_dot_product_cudnn_attention": 4,
    "aten::_flash_attention_forward": 4,
    "aten::_efficient_attention_forward": 4,
    "aten::_scaled_dot_product_flash_attention_backward": 8,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 8,
    "aten::_scaled_dot_product_efficient_attention_backward": 8,
    "aten::_scaled_dot_product_cudnn_attention_backward": 8,
    "aten::_flash_attention_backward": 8,
    "aten::_efficient_attention_backward": 8,
}
"""Fused attention ops -> FLOPs per (batch x head x query x key x head-dim) element: two products
forward, four backward (2 FLOPs each)."""


def op_flops(name: str, dims_json: object) -> float:
    """The FLOPs of one op from its Input Dims (JSON text), 0 when it is none of the counted ops
    or its shapes are missing or not what the op takes."""
    if name not in _MATMUL_OPERANDS and name not in _ATTENTION:
        return 0.0
    try:
        dims = json.loads(dims_json) if isinstance(dims_json, str) else None
    except ValueError:
        return 0.0
    if not isinstance(dims, list):
        return 0.0
    try:
        if name in _ATTENTION:  # q [B, a, Sq, d], k [B, a, Sk, d]
            q, k = dims[0], dims[1]
            if len(q) != 4 or len(k) != 4:
                return 0.0
            return float(_ATTENTION[name] * prod(q) * k[2])
        first = _MATMUL_OPERANDS[name]
        a, b = dims[first], dims[first + 1]
        if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
            return 2.0 * a[0] * a[1] * b[1]
        if len(a) == 3 and len(b) == 3 and a[2] == b[1]:
            return 2.0 * a[0] * a[1] * a[2] * b[2]
    except (IndexError, TypeError):
        return 0.0
    return 0.0


def detect_flops(idx: RankIndex, clock: ModuleClock, rank: int) -> pd.DataFrame:
    """The rank's counted FLOPs per (module, phase): FLOPS_COLUMNS, empty when the trace recorded
    no shapes of a counted op."""
    events = idx.events
    if "input_dims" not in events:
        return empty_frame(FLOPS_COLUMNS)
    at = np.flatnonzero(idx.is_cpu & idx.by_name.one_of([*_MATMUL_OPERANDS, *_ATTENTION]))
    if not len(at):
        return empty_frame(FLOPS_COLUMNS)
    names, dims = idx.by_name.values, events["input_dims"].to_numpy()[at].tolist()
    flops = np.array([op_flops(names[c], d) for c, d in zip(idx.by_name.codes[at].tolist(), dims)])
    keep = flops > 0
    ts = events["ts_ns"].to_numpy(dtype=np.int64, na_value=0)[at][keep]
    tid = events["tid"].to_numpy(dtype=np.int64, na_value=-1)[at][keep]
    labels = clock.at(ts, tid)
    names_phases = [clock.labels[x] if x >= 0 else (None, "") for x in labels.tolist()]
    keys = {"rank": [rank] * len(ts), "module": [m for m, _ in names_phases],
            "phase": phases_at(idx, ts, [p for _, p in names_phases])}  # fmt: skip
    return sums_by(keys, flops[keep].tolist(), "flops")
