"""The per-rank event table: one schema, defined once, for every trace generation.

Timestamps and durations are integer nanoseconds. Kineto writes microseconds, as integers
(older traces) or as floats with three decimals (newer ones): both convert without loss.
String columns are dictionary-encoded (names interned), so a 200k-event table stays small
and its Arrow IPC cache can be memory-mapped.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1
"""Bump when the table's columns or their meaning change: cached tables are keyed by it."""

_DICT = pa.dictionary(pa.int32(), pa.string())

# (column, arrow type, source keys in the event's "args", in order of preference)
ARG_COLUMNS: tuple[tuple[str, pa.DataType, tuple[str, ...]], ...] = (
    ("external_id", pa.int64(), ("External id", "external id")),
    ("correlation", pa.int64(), ("correlation",)),
    ("seq_num", pa.int64(), ("Sequence number",)),
    ("fwd_thread_id", pa.int64(), ("Fwd thread id",)),
    ("input_dims", pa.string(), ("Input Dims",)),  # JSON text: nested lists
    ("input_types", pa.string(), ("Input type",)),
    ("concrete_inputs", pa.string(), ("Concrete Inputs",)),
    # record_param_comms (NCCL) collective args
    ("coll_name", _DICT, ("Collective name",)),
    ("coll_dtype", _DICT, ("dtype",)),
    ("in_nelems", pa.int64(), ("In msg nelems",)),
    ("out_nelems", pa.int64(), ("Out msg nelems",)),
    ("group_size", pa.int64(), ("Group size",)),
    ("in_split", pa.string(), ("In split size",)),
    ("out_split", pa.string(), ("Out split size",)),
    ("pg_name", _DICT, ("Process Group Name",)),
    ("pg_desc", _DICT, ("Process Group Description",)),
    ("pg_ranks", _DICT, ("Process Group Ranks",)),
    ("comm_rank", pa.int64(), ("Rank",)),
    ("comm_seq", pa.int64(), ("Seq",)),
    # [memory] instant events
    ("mem_addr", pa.int64(), ("Addr",)),
    ("mem_bytes", pa.int64(), ("Bytes",)),
    ("mem_total_allocated", pa.int64(), ("Total Allocated",)),
    ("mem_total_reserved", pa.int64(), ("Total Reserved",)),
    ("device_type", pa.int64(), ("Device Type",)),
    ("device_id", pa.int64(), ("Device Id",)),
    ("ev_idx", pa.int64(), ("Ev Idx",)),
    # python_function events (with_stack)
    ("python_id", pa.int64(), ("Python id",)),
    ("python_parent_id", pa.int64(), ("Python parent id",)),
    # GPU activity
    ("stream", pa.int64(), ("stream",)),
    ("device", pa.int64(), ("device",)),
    # metadata events (process_name, thread_name, process_labels)
    ("meta", pa.string(), ("name", "labels")),
)

CORE_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("name", _DICT),
    ("cat", _DICT),  # normalised vocabulary, see CATEGORIES
    ("raw_cat", _DICT),  # as written in the trace
    ("ph", _DICT),
    ("ts_ns", pa.int64()),
    ("dur_ns", pa.int64()),
    ("pid", pa.int64()),
    ("tid", pa.int64()),
    ("thread_name", _DICT),
    ("flow_id", pa.int64()),
    ("flow_bp", _DICT),
)

SCHEMA = pa.schema([pa.field(n, t) for n, t in CORE_COLUMNS] + [pa.field(n, t) for n, t, _ in ARG_COLUMNS])

# Old Kineto (PyTorch <= 1.9) categories -> the current vocabulary
CATEGORIES = {
    "Operator": "cpu_op",
    "Kernel": "kernel",
    "Runtime": "cuda_runtime",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Trace": "trace",
    "Python": "python_function",
    "python_function": "python_function",
    "cpu_op": "cpu_op",
    "kernel": "kernel",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "gpu_memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cpu_instant_event": "cpu_instant_event",
    "ac2g": "ac2g",
    "fwdbwd": "fwdbwd",
}


def normalise_category(raw_cat: str | None, ph: str, name: str) -> str:
    """One vocabulary for both trace generations."""
    if raw_cat is not None:
        if raw_cat in CATEGORIES:
            return CATEGORIES[raw_cat]
        if raw_cat == "async" and name == "launch":  # old CPU -> GPU launch flows
            return "ac2g"
        return raw_cat.lower()
    if ph == "M":
        return "metadata"
    if name == "[memory]":  # old traces: memory instants without a category
        return "cpu_instant_event"
    return "other"
