"""Just enough trace reading for the reference-model tests (the real loader is sptrace.load):
events of one rank, and for each c10d collective the sptrace markers that enclose it; and a
small GPU run the tests write themselves (no GPU needed)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from sptrace.vocab import markers


def read_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


@dataclass(frozen=True)
class Collective:
    op: str  # c10d::_allgather_base_ ...
    dims: list
    phase: str | None
    module: str | None
    role: str | None

    @property
    def layer(self) -> int | None:
        if self.module and self.module.startswith("layers."):
            return int(self.module.split(".")[1])
        return None


def _encloses(outer: dict, inner: dict) -> bool:
    return (
        outer["tid"] == inner["tid"]
        and outer["ts"] <= inner["ts"]
        and inner["ts"] + inner.get("dur", 0) <= outer["ts"] + outer.get("dur", 0)
    )


def collectives(events: list[dict]) -> list[Collective]:
    ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    phases = [e for e in ranges if e["name"].startswith(markers.PHASE)]
    comms = [e for e in ranges if e["name"].startswith(markers.COMM)]
    modules = [e for e in ranges if e["name"].startswith(markers.MODULE)]
    out = []
    for e in events:
        if e.get("cat") != "cpu_op" or not e["name"].startswith("c10d::"):
            continue
        phase = next((p["name"][len(markers.PHASE) :] for p in phases if _encloses(p, e)), None)
        comm = next((markers.parse_comm(c["name"]) for c in comms if _encloses(c, e)), None)
        if comm is None:  # e.g. FSDP2's own gathers: the innermost module range around it
            inner = [m for m in modules if _encloses(m, e)]
            if inner:
                comm = (max(inner, key=lambda m: m["ts"])["name"][len(markers.MODULE) :], None)
        role = comm[1].split("|")[0] if comm and comm[1] else None  # role|dtype=...|group=...: the role
        out.append(Collective(e["name"], e["args"].get("Input Dims"), phase, comm[0] if comm else None, role))
    return out


def saved_tensors(events: list[dict]) -> list[markers.SavedTensor]:
    names = [e["name"] for e in events if e["name"].startswith(markers.SAVED)]
    return [r for name in names for r in markers.SavedTensor.all_from_marker(name)]


# ---- a GPU run written by the tests ---------------------------------------------------------------


def gpu_trace(rank: int, world: int = 2, steps: int = 2) -> dict:
    """A small NCCL GPU trace, as a 2026 PyTorch writes one: per step and layer, a matmul kernel
    launched through the runtime, an all-reduce launched through the driver (NCCL >= 2.27) that
    runs 40-90 us (a half of it under the matmul), and a device copy."""
    ev = []
    corr = 1000
    t = 0.0
    pid_cpu, tid_cpu, gpu = 100 + rank, 200 + rank, rank
    ev += [
        {"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": f"GPU {rank}"}},
        {"ph": "M", "name": "process_name", "pid": pid_cpu, "tid": 0, "args": {"name": "python"}},
    ]
    for step in range(steps):
        start = t
        body = []
        for _layer in range(2):
            # a matmul: cpu op, runtime launch, compute kernel
            corr += 1
            body.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::mm",
                    "pid": pid_cpu,
                    "tid": tid_cpu,
                    "ts": t + 1,
                    "dur": 8,
                    "args": {
                        "External id": corr,
                        "Input Dims": [[256, 96], [96, 96]],
                        "Input type": ["c10::BFloat16", "c10::BFloat16"],
                    },
                }
            )
            body.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid_cpu,
                    "tid": tid_cpu,
                    "ts": t + 3,
                    "dur": 4,
                    "args": {"correlation": corr, "External id": corr},
                }
            )
            body.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "sm90_xmma_gemm_bf16bf16_bf16f32",
                    "pid": gpu,
                    "tid": 7,
                    "ts": t + 10,
                    "dur": 60,
                    "args": {"correlation": corr, "External id": corr, "stream": 7, "device": gpu},
                }
            )
            # an NCCL all-reduce: c10d op, record_param_comms, driver launch, comm kernel, half overlapped
            corr += 1
            body.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "c10d::allreduce_",
                    "pid": pid_cpu,
                    "tid": tid_cpu,
                    "ts": t + 12,
                    "dur": 10,
                    "args": {"External id": corr},
                }
            )
            body.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "record_param_comms",
                    "pid": pid_cpu,
                    "tid": tid_cpu,
                    "ts": t + 13,
                    "dur": 8,
                    "args": {
                        "External id": corr,
                        "Collective name": "allreduce",
                        "dtype": "BFloat16",
                        "In msg nelems": 24576,
                        "Out msg nelems": 24576,
                        "Group size": world,
                        "Process Group Name": "0",
                        "Process Group Ranks": json.dumps(list(range(world))),
                    },
                }
            )
            body.append(
                {
                    "ph": "X",
                    "cat": "cuda_driver",
                    "name": "cuLaunchKernelEx",
                    "pid": pid_cpu,
                    "tid": tid_cpu,
                    "ts": t + 15,
                    "dur": 3,
                    "args": {"correlation": corr},
                }
            )
            body.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                    "pid": gpu,
                    "tid": 20,
                    "ts": t + 40,
                    "dur": 50 + 5 * rank,
                    "args": {"correlation": corr, "External id": corr, "stream": 20, "device": gpu},
                }
            )
            # a copy
            corr += 1
            body.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaMemcpyAsync",
                    "pid": pid_cpu,
                    "tid": tid_cpu,
                    "ts": t + 25,
                    "dur": 3,
                    "args": {"correlation": corr},
                }
            )
            body.append(
                {
                    "ph": "X",
                    "cat": "gpu_memcpy",
                    "name": "Memcpy DtoD (Device -> Device)",
                    "pid": gpu,
                    "tid": 7,
                    "ts": t + 95,
                    "dur": 5,
                    "args": {"correlation": corr, "stream": 7, "device": gpu},
                }
            )
            t += 110
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": pid_cpu,
                "tid": tid_cpu,
                "ts": start,
                "dur": t - start + 2,
            }
        )
        ev += body
        t += 5
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150000000000}],
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": world,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": world, "ranks": list(range(world))}],
        },
        "traceEvents": ev,
        "baseTimeNanoseconds": 1700000000000000000,
    }


def write_gpu_run(root: Path, world: int = 2) -> Path:
    """``root/rank{r}.json`` for every rank of a small NCCL run (``gpu_trace``)."""
    root.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        (root / f"rank{r}.json").write_text(json.dumps(gpu_trace(r, world)))
    return root
