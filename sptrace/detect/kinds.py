"""The names collectives go by in a trace, and the kind each names: record_param_comms'
"Collective name", NCCL's and gloo's annotations, GPU kernels, symmetric-memory ops. Shared by the
per-rank index (sptrace.detect.index) and collective detection (sptrace.detect.collectives)."""

from __future__ import annotations

import re

# record_param_comms "Collective name" -> kind (None: not a collective, e.g. work.wait())
COLL_NAME_KINDS = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather", "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reducescatter": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
    "broadcast": "broadcast", "send": "send", "recv": "recv", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter", "reduce": "reduce", "wait": None, "coalesced": None,
}  # fmt: skip
NCCL_ANNOTATION_KINDS = {
    "nccl:all_reduce": "all_reduce", "nccl:all_gather": "all_gather", "nccl:_all_gather_base": "all_gather",
    "nccl:all_gather_into_tensor_coalesced": "all_gather", "nccl:reduce_scatter": "reduce_scatter",
    "nccl:_reduce_scatter_base": "reduce_scatter", "nccl:reduce_scatter_tensor_coalesced": "reduce_scatter",
    "nccl:all_to_all": "all_to_all", "nccl:all_to_allv": "all_to_all", "nccl:broadcast": "broadcast",
    "nccl:send": "send", "nccl:recv": "recv", "nccl:barrier": "barrier", "nccl:gather": "gather",
    "nccl:scatter": "scatter", "nccl:reduce": "reduce", "nccl:allreduce_coalesced": "all_reduce",
}  # fmt: skip
# gloo worker annotations -> the kinds of op they can carry out (gloo has no real reduce-scatter:
# it all-reduces and keeps a chunk, so gloo:all_reduce also serves reduce-scatters)
GLOO_KINDS = {
    "gloo:all_gather": ("all_gather",), "gloo:all_reduce": ("all_reduce", "reduce_scatter"),
    "gloo:all_to_all": ("all_to_all",), "gloo:reduce_scatter": ("reduce_scatter",),
    "gloo:broadcast": ("broadcast",), "gloo:barrier": ("barrier",), "gloo:scatter": ("scatter",),
    "gloo:gather": ("gather",), "gloo:reduce": ("reduce",), "gloo:send": ("send",), "gloo:recv": ("recv",),
}  # fmt: skip
# GPU kernels of collectives: kind from the name when nothing better is known
KERNEL_PATTERNS = (
    (re.compile(r"nccl(?:Dev)?Kernel_AllReduce", re.I), "all_reduce"),
    (re.compile(r"nccl(?:Dev)?Kernel_AllGather", re.I), "all_gather"),
    (re.compile(r"nccl(?:Dev)?Kernel_ReduceScatter", re.I), "reduce_scatter"),
    (re.compile(r"nccl(?:Dev)?Kernel_Broadcast", re.I), "broadcast"),
    (re.compile(r"nccl(?:Dev)?Kernel_Reduce_", re.I), "reduce"),
    (re.compile(r"nccl(?:Dev)?Kernel_SendRecv", re.I), "send_recv"),
    (re.compile(r"nccl(?:Dev)?Kernel_Send", re.I), "send"),
    (re.compile(r"nccl(?:Dev)?Kernel_Recv", re.I), "recv"),
    (re.compile(r"(?:one_shot|two_shot|multimem).*all_reduce", re.I), "all_reduce"),
    (re.compile(r"(?:multimem|symm).*all_gather", re.I), "all_gather"),
    (re.compile(r"nccl(?:Dev)?Kernel_Generic|ncclKernel", re.I), "other"),
)


def is_comm_kernel(name: str) -> bool:
    """Whether a kernel's name is one of KERNEL_PATTERNS'. Every pattern needs "nccl", "all_reduce"
    or "all_gather" somewhere: a substring test rules out a compute kernel's long template name
    before any pattern scans it."""
    low = name.lower()
    if "nccl" not in low and "all_reduce" not in low and "all_gather" not in low:
        return False
    return any(p.search(name) for p, _ in KERNEL_PATTERNS)


SYMM_MEM_KINDS = (  # CPU ops of collectives that bypass c10d
    (re.compile(r"^symm_mem::.*all_reduce"), "all_reduce"),
    (re.compile(r"^symm_mem::.*(all_gather|allgather)"), "all_gather"),
    (re.compile(r"^symm_mem::.*reduce_scatter"), "reduce_scatter"),
    (re.compile(r"^symm_mem::.*all_to_all"), "all_to_all"),
    (re.compile(r"^symm_mem::"), "other"),
)
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""CPU launches that NCCL kernels are linked to (by correlation)."""

AUTOGRAD_NODE = "autograd::engine::evaluate_function"
"""The CPU range autograd's engine records around each backward node it runs (torch >= 1.10):
``autograd::engine::evaluate_function: AddmmBackward0``."""

COMM_CALLS = ("c10d::", "_c10d_functional", "record_param_comms", "nccl:", "gloo:", "aten::wait",
              "_c10d_functional::wait")  # fmt: skip
"""Prefixes of the CPU ops a rank spends issuing or waiting on communication: never computation
(sptrace.detect.timing.detect_compute) nor work (sptrace.detect.work)."""
