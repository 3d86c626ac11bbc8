"""GIVEN the committed 2-rank gloo ring run, whose ring attention computes each block while K,V
travel (an async ``batch_isend_irecv``: gloo's send and receive annotations span from the issue
to the wait, with the block's ops inside them)
WHEN sptrace builds each rank's work lane
THEN the ops that ran inside those annotations are work (the lane covers them), and the lane's
time inside the annotations is no more than those ops' (waiting there is not work); the FLOPs
each rank was handed are counted from the recorded shapes, per module."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sptrace.detect.collectives import detect_collectives
from sptrace.detect.flops import detect_flops
from sptrace.detect.index import RankIndex
from sptrace.detect.module_clock import module_clock
from sptrace.detect.timing import merge_intervals, subtract_length
from sptrace.detect.work import detect_work
from sptrace.load.trace import load_trace

RING = Path(__file__).resolve().parents[1] / "golden" / "runs" / "ring"


def _union(frame) -> list[tuple[float, float]]:
    s = frame["ts_ns"].to_numpy(dtype=float)
    return merge_intervals(s, s + frame["dur_ns"].to_numpy(dtype=float))


def _covered(keep: list[tuple[float, float]], by: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in keep) - subtract_length(keep, by)


def test_ops_inside_an_async_transfer_are_work_and_the_wait_is_not(private_cache):
    for rank in (0, 1):
        trace = load_trace(RING / f"rank{rank}.pt.trace.json.gz", cache_dir=private_cache)
        idx = RankIndex(trace)
        clock = module_clock(idx)
        lane = detect_work(trace, idx, detect_collectives(trace, idx, for_reduce=True), clock=clock)
        ev = idx.events
        names = ev["name"].astype(str)
        cpu = ev[idx.is_cpu]
        marks = _union(cpu[names[idx.is_cpu].str.match(r"gloo:(send|recv)$").to_numpy()])
        blocks = _union(cpu[names[idx.is_cpu].isin(["aten::bmm", "aten::exp", "aten::logsumexp"]).to_numpy()])
        inside = [(max(a, c), min(b, d)) for a, b in blocks for c, d in marks if min(b, d) > max(a, c)]
        inside = merge_intervals(np.array([a for a, _ in inside]), np.array([b for _, b in inside]))
        assert sum(e - s for s, e in inside) > 0, "the run's blocks no longer run during a transfer"
        s = lane["start_us"].to_numpy() * 1e3
        worked = merge_intervals(s, s + lane["dur_us"].to_numpy() * 1e3)
        assert _covered(inside, worked) >= 0.95 * sum(e - s for s, e in inside)
        # inside the annotations the lane holds the ops (and the Python between them), not the wait
        comm = names[idx.is_cpu].str.startswith(("c10d", "gloo", "RingAttention")).to_numpy()
        ops = _union(cpu[(cpu["cat"].astype(str) == "cpu_op").to_numpy() & ~comm])
        in_marks = [(max(a, c), min(b, d)) for a, b in worked for c, d in marks if min(b, d) > max(a, c)]
        ops_in_marks = [(max(a, c), min(b, d)) for a, b in ops for c, d in marks if min(b, d) > max(a, c)]
        assert sum(e - s for s, e in in_marks) <= 1.05 * sum(e - s for s, e in ops_in_marks) + 1e5
        flops = detect_flops(idx, clock, rank)
        attention = flops[flops["module"] == "layers.0.attn"]
        assert set(attention["phase"]) == {"forward", "backward"} and (attention["flops"] > 0).all()
        linear = flops[flops["module"] == "layers.0.mlp.fc1"].set_index("phase")["flops"]
        # fc1: [B*S/P, H] x [H, F] forward; backward twice that (input and weight gradients)
        assert linear["forward"] == 2 * 2 * 16 * 48 * 64 and linear["backward"] == 2 * linear["forward"]
