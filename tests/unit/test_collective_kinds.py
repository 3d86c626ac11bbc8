"""GIVEN the table of collective kinds (sptrace.vocab.collective_kinds), and a kind added to it
and nowhere else: a quantized all-reduce that sends half of a ring all-reduce's bytes, with its
own c10d op, record_param_comms name and NCCL kernel
WHEN a 4-rank NCCL run that issues it is analysed, and the cost model prices it
THEN it is detected (kind, bytes, transfer), matched across the ranks with its bus bandwidth,
counted by `analyze`, costed with the table's formula and coloured; and a kind the table does
not know has unknown wire bytes and bus factor, never 0 or 1."""

from __future__ import annotations

import json
import math

import pytest

from sptrace.analysis import analyse_run
from sptrace.costmodel import CollectiveSpec, CommEstimate
from sptrace.report.theme import COLORS, kind_color
from sptrace.vocab import collective_kinds
from sptrace.vocab.collective_kinds import CollectiveKind, Op
from sptrace.vocab.shape import ModelShape
from tests.trace_helpers import gpu_trace

WORLD = 4
ELEMS = 24576  # bf16: 48 KiB per call (gpu_trace's all-reduces)

QUANTIZED = CollectiveKind(
    "all_reduce_quantized",
    wire=lambda i, o, n: i * (n - 1) / n if n > 1 else 0.0,
    bus_factor=lambda n: (n - 1) / n,
    same_size=True,
    in_place=True,
    color="yellow",
    record_names=("allreduce_quantized",),
    ops=(Op("c10d::allreduce_quantized_", "inplace"),),
    kernels=(r"ncclDevKernel_QuantizedAllReduce",),
)


@pytest.fixture
def quantized():
    collective_kinds.register(QUANTIZED)
    yield QUANTIZED
    collective_kinds.unregister(QUANTIZED.name)


def _quantized_run(root):
    """gpu_trace's run with every all-reduce issued as the new kind (op, record name, kernel)."""
    root.mkdir()
    rename = {"c10d::allreduce_": "c10d::allreduce_quantized_"}
    for rank in range(WORLD):
        trace = gpu_trace(rank, WORLD)
        for e in trace["traceEvents"]:
            e["name"] = rename.get(e["name"], e["name"])
            if e["name"].startswith("ncclDevKernel_AllReduce"):
                e["name"] = "ncclDevKernel_QuantizedAllReduce_bf16_RING(ncclDevComm*)"
            if e.get("args", {}).get("Collective name") == "allreduce":
                e["args"]["Collective name"] = "allreduce_quantized"
        (root / f"rank{rank}.json").write_text(json.dumps(trace))
    return root


def test_a_kind_added_to_the_table_is_detected_matched_and_costed(quantized, tmp_path):
    run = _quantized_run(tmp_path / "run")
    analysis = analyse_run(run, parts=("collectives",), load_options={"cache": False})
    c = analysis.collectives
    assert len(c) == WORLD * 4 and set(c["kind"]) == {"all_reduce_quantized"}  # 2 steps x 2 layers per rank
    assert set(c["in_bytes"]) == {2 * ELEMS} and c["transfer_dur_us"].notna().all()  # the kernel is its transfer
    assert set(c["wire_bytes"]) == {2 * ELEMS * 3 / 4}  # the table's formula: half a ring all-reduce's
    matched = analysis.matching.matched
    assert len(matched) == 4 and set(matched["kind"]) == {"all_reduce_quantized"}
    assert (matched["n_ranks"] == WORLD).all() and analysis.matching.unmatched == 0
    bus = matched["busbw_gbps"] / matched["algbw_gbps"]
    assert bus.notna().all() and bus.round(6).eq(0.75).all()
    assert analysis.facts.wire_bytes == 2 * (2 * ELEMS * 3 / 4)  # per rank and step: two layers
    # the cost model prices a collective of the kind with the same formula, and lists it
    spec = CollectiveSpec("forward", "all_reduce_quantized", "mlp.fc2", "a quantized all-reduce", (ELEMS,), (ELEMS,),
                          2 * ELEMS, 2 * ELEMS, WORLD)  # fmt: skip
    assert spec.wire_bytes == 2 * ELEMS * 3 / 4
    shape = ModelShape.from_mapping({"layers": 2}, "test")
    by_kind = CommEstimate("test", shape, (spec,), k=2).to_dict()["by_kind"]
    assert by_kind == {"all_reduce_quantized": {"count": 2, "wire_bytes": 2 * (2 * ELEMS * 3 / 4)}}
    assert kind_color("all_reduce_quantized") == COLORS["yellow"]


def test_without_the_table_entry_the_same_run_has_no_such_collective(tmp_path):
    run = _quantized_run(tmp_path / "run")
    analysis = analyse_run(run, parts=("collectives",), load_options={"cache": False})
    assert "all_reduce_quantized" not in set(analysis.collectives["kind"])


def test_an_unknown_kind_has_unknown_wire_bytes_and_bus_factor():
    for kind in ("no_such_kind", "other"):
        assert math.isnan(collective_kinds.wire_bytes(kind, 1024, 1024, 8))
        assert math.isnan(collective_kinds.bus_factor(kind, 8))
    assert kind_color("no_such_kind") == COLORS["dark"]
    # the known ones, nccl-tests' ring model
    assert collective_kinds.wire_bytes("all_reduce", 1024, 1024, 8) == 2 * 1024 * 7 / 8
    assert collective_kinds.wire_bytes("all_gather", 128, 1024, 8) == 1024 * 7 / 8
    assert collective_kinds.wire_bytes("all_gather", 128, 1024, 1) == 0.0
    assert collective_kinds.bus_factor("all_reduce", 8) == 2 * 7 / 8


def test_every_kind_is_declared_once_with_distinct_trace_names():
    """No op, record name or NCCL annotation is claimed by two kinds (the lookups would hide one)."""
    for field in ("record_names", "nccl"):
        names = [n for k in collective_kinds.kinds() for n in getattr(k, field)]
        assert len(names) == len(set(names)), field
    ops = [op.name for k in collective_kinds.kinds() for op in k.ops]
    assert len(ops) == len(set(ops))
    assert all(k.color in COLORS for k in collective_kinds.kinds())
