"""Names in a trace that detection keys on besides the collectives' own (which the table of
collective kinds holds: sptrace.vocab.collective_kinds): the launches kernels link to, autograd's
node ranges, the CPU ops of communication calls, what is no work. Shared by the per-rank index
(sptrace.detect.index), timing, the module clock, the work lane and retained tensors."""

from __future__ import annotations

from sptrace.vocab import collective_kinds


def is_comm_kernel(name: str) -> bool:
    """Whether a GPU kernel's name is a collective's (a kernel pattern of the table of kinds)."""
    return collective_kinds.kernel_kind(name) is not None


LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""CPU launches that NCCL kernels are linked to (by correlation)."""

AUTOGRAD_NODE = "autograd::engine::evaluate_function"
"""The CPU range autograd's engine records around each backward node it runs (torch >= 1.10):
``autograd::engine::evaluate_function: AddmmBackward0``."""

COMM_CALLS = ("c10d::", "_c10d_functional", "record_param_comms", "nccl:", "gloo:", "aten::wait",
              "_c10d_functional::wait")  # fmt: skip
"""Prefixes of the CPU ops a rank spends issuing or waiting on communication: never computation
(sptrace.detect.timing.detect_compute) nor work (sptrace.detect.work)."""

NOT_WORK = (*COMM_CALLS, "c10d_functional::wait")
"""CPU ops whose time is communication (issue or wait), never the rank's work (sptrace.detect.work)."""

NOT_THREAD_WORK = ("ProfilerStep#", "sptrace.")
"""CPU ranges around the whole step, and sptrace's markers: labels, not work of their own."""
