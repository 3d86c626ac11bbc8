"""The collective kinds sptrace knows, each declared once: the names a trace calls it by
(record_param_comms' "Collective name", the c10d and functional ops with their argument layout,
NCCL's and gloo's annotations, GPU kernels, symmetric-memory ops), the bytes one rank sends for it
(nccl-tests' ring model), its bus-bandwidth factor, whether every rank of the group passes the
same size, whether it works in place, and its colour. Detection (sptrace.detect), matching and the
time base (sptrace.reduce), the cost model and the reports all read this table; a kind it does not
name is unknown, and so are its wire bytes and bus factor (NaN, never 0 or 1).

A new kind is one ``register(CollectiveKind(...))`` call (tests/unit/test_collective_kinds.py adds
one and follows it through detection, matching and costing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

UNKNOWN = float("nan")
"""Wire bytes or a bus factor nobody knows: NaN, which every sum and report treats as unknown."""


@dataclass(frozen=True)
class Op:
    """A CPU op that issues the kind, and how its recorded arguments map to input and output
    (the layouts sptrace.detect.forms reads: ``out_in``, ``inplace``, ``f_gather`` ...)."""

    name: str
    layout: str
    group_size_arg: int | None = None
    """Position of an int argument holding the group size (functional collectives)."""
    root_arg: int | None = None
    """Position of the root (broadcast, reduce, gather, scatter) or peer (send, recv) rank."""


def _ring(n: int) -> float:
    return (n - 1) / n


@dataclass(frozen=True)
class CollectiveKind:
    name: str
    wire: Callable[[int, int, int], float] | None
    """Bytes one rank sends for one call, from (input bytes, output bytes, group size) on that
    rank; None: unknown."""
    bus_factor: Callable[[int], float] | None
    """nccl-tests' busbw / algbw for a group of n ranks; None: unknown."""
    same_size: bool = False
    """Every rank of the group passes an input of the same size (matching compares them)."""
    in_place: bool = False
    """The call writes its result into its input."""
    filled: bool = False
    """In place, and the buffer receives what others sent (an output, not an input)."""
    point_to_point: bool = False
    """Between two ranks, paired send with receive (sptrace.reduce.pairing), never matched by group."""
    color: str = "dark"
    """A name of sptrace.report.theme.COLORS."""
    record_names: tuple[str, ...] = ()
    """record_param_comms' "Collective name"s of this kind."""
    ops: tuple[Op, ...] = ()
    nccl: tuple[str, ...] = ()
    """NCCL's CPU annotations (``nccl:all_reduce``)."""
    gloo: tuple[str, ...] = ()
    """gloo's worker annotations that carry it (gloo has no real reduce-scatter: it all-reduces
    and keeps a chunk, so ``gloo:all_reduce`` serves both)."""
    kernels: tuple[str, ...] = ()
    """Regular expressions of its GPU kernels' names (searched, case-insensitive)."""
    symm_mem: tuple[str, ...] = ()
    """Regular expressions of symmetric-memory CPU ops (which bypass c10d)."""
    compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", tuple(re.compile(k, re.I) for k in self.kernels))

    def wire_bytes(self, in_bytes: int, out_bytes: int, group_size: int) -> float:
        return UNKNOWN if self.wire is None else float(self.wire(in_bytes, out_bytes, group_size))

    def bus(self, group_size: int | None) -> float:
        if self.bus_factor is None or not group_size:
            return UNKNOWN
        return float(self.bus_factor(group_size))


def _collective(factor: Callable[[int, int, int], float]) -> Callable[[int, int, int], float]:
    """A group collective: nothing moves in a group of one."""
    return lambda i, o, n: 0.0 if n <= 1 else factor(i, o, n)


_KINDS: dict[str, CollectiveKind] = {}
_version = [0]


def register(kind: CollectiveKind) -> CollectiveKind:
    """Add (or replace) a kind; every lookup below reads the table as it is now."""
    _KINDS[kind.name] = kind
    _changed()
    return kind


def unregister(name: str) -> None:
    _KINDS.pop(name, None)
    _changed()


def _changed() -> None:
    _cache.clear()
    _version[0] += 1


def version() -> int:
    """Changes whenever the table does: what a module that derives its own lookup from the table
    compares to know when to rebuild it."""
    return _version[0]


def kinds() -> tuple[CollectiveKind, ...]:
    """Every kind, in declaration order (which is also the order kernel patterns are tried in)."""
    return tuple(_KINDS.values())


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def get(name: str) -> CollectiveKind | None:
    return _KINDS.get(name)


def wire_bytes(kind: str, in_bytes: int, out_bytes: int, group_size: int) -> float:
    """Bytes one rank sends for one collective under ring algorithms (nccl-tests' model); NaN for
    a kind the table does not know or whose wire bytes nobody knows."""
    k = _KINDS.get(kind)
    return UNKNOWN if k is None else k.wire_bytes(in_bytes, out_bytes, group_size)


def bus_factor(kind: str, group_size: int | None) -> float:
    """busbw / algbw; NaN for an unknown kind or group size."""
    k = _KINDS.get(kind)
    return UNKNOWN if k is None else k.bus(group_size)


# ---- lookups by trace name, built from the table (and rebuilt when it changes) --------------------

_cache: dict[str, object] = {}


def _cached(key: str, build: Callable[[], object]) -> object:
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]


def by_record_name() -> dict[str, str | None]:
    """record_param_comms "Collective name" -> kind (None: not a collective, e.g. work.wait())."""

    def build() -> dict[str, str | None]:
        out: dict[str, str | None] = {n: k.name for k in _KINDS.values() for n in k.record_names}
        return out | {"wait": None, "coalesced": None}

    return _cached("record", build)  # type: ignore[return-value]


def by_nccl_annotation() -> dict[str, str]:
    return _cached("nccl", lambda: {n: k.name for k in _KINDS.values() for n in k.nccl})  # type: ignore[return-value]


def by_gloo_annotation() -> dict[str, tuple[str, ...]]:
    """gloo annotation -> the kinds of op it can carry out, in declaration order."""

    def build() -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for k in _KINDS.values():
            for n in k.gloo:
                out[n] = (*out.get(n, ()), k.name)
        return out

    return _cached("gloo", build)  # type: ignore[return-value]


def by_op() -> dict[str, tuple[str, Op]]:
    """CPU op name -> (kind, Op)."""
    return _cached("ops", lambda: {op.name: (k.name, op) for k in _KINDS.values() for op in k.ops})  # type: ignore[return-value]


def kernel_patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    """(pattern, kind) of GPU collective kernels, in the order they are tried."""
    return _cached("kernels", lambda: tuple((p, k.name) for k in _KINDS.values() for p in k.compiled))  # type: ignore[return-value]


def kernel_kind(name: str) -> str | None:
    """The kind of a GPU kernel by its name (the first kernel pattern that matches), None when no
    collective's: each distinct name is matched once (a rank launches a few hundred kernels of a
    few dozen names; the patterns are tried in order)."""
    seen: dict[str, str | None] = _cached("kernel kind", dict)  # type: ignore[assignment]
    if name not in seen:
        seen[name] = next((k for p, k in kernel_patterns() if p.search(name)), None)
    return seen[name]


def symm_mem_patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    return _cached("symm", lambda: tuple((re.compile(p), k.name) for k in _KINDS.values() for p in k.symm_mem))  # type: ignore[return-value]


def where(flag: str) -> frozenset[str]:
    """The names of the kinds with a true ``flag`` (``same_size``, ``point_to_point`` ...)."""
    return _cached(f"where:{flag}", lambda: frozenset(k.name for k in _KINDS.values() if getattr(k, flag)))  # type: ignore[return-value]


# ---- the kinds ------------------------------------------------------------------------------------
# Order matters where kernel patterns overlap: send_recv before send and recv, ReduceScatter before
# Reduce_ (whose underscore keeps it apart anyway), the generic NCCL kernel ("other") last.

_NCCL = r"nccl(?:Dev)?Kernel_"

register(CollectiveKind(
    "all_reduce", _collective(lambda i, o, n: 2 * i * _ring(n)), lambda n: 2 * _ring(n), same_size=True,
    in_place=True, color="red",
    record_names=("allreduce", "all_reduce", "allreduce_coalesced"),
    ops=(Op("c10d::allreduce_", "inplace"), Op("c10d::allreduce_coalesced_", "inplace"),
         Op("_c10d_functional::all_reduce", "inplace"), Op("_c10d_functional::all_reduce_", "inplace"),
         Op("_c10d_functional::all_reduce_coalesced", "inplace"),
         Op("_c10d_functional::all_reduce_coalesced_", "inplace")),
    nccl=("nccl:all_reduce", "nccl:allreduce_coalesced"), gloo=("gloo:all_reduce",),
    kernels=(_NCCL + "AllReduce", r"(?:one_shot|two_shot|multimem).*all_reduce"),
    symm_mem=(r"^symm_mem::.*all_reduce",),
))  # fmt: skip
register(CollectiveKind(
    "all_gather", _collective(lambda i, o, n: o * _ring(n)), _ring, same_size=True, color="blue",
    record_names=("allgather", "all_gather", "_allgather_base", "allgather_into_tensor_coalesced",
                  "all_gather_into_tensor", "allgather_coalesced"),
    ops=(Op("c10d::_allgather_base_", "out_in"), Op("c10d::allgather_into_tensor_coalesced_", "out_in_lists"),
         Op("c10d::allgather_", "gather_lists"), Op("c10d::allgather_coalesced_", "gather_lists"),
         Op("_c10d_functional::all_gather_into_tensor", "f_gather", group_size_arg=1),
         Op("_c10d_functional::all_gather_into_tensor_out", "f_gather", group_size_arg=1),
         Op("_c10d_functional::all_gather_into_tensor_coalesced", "f_gather", group_size_arg=1),
         Op("_c10d_functional_autograd::all_gather_into_tensor", "f_gather", group_size_arg=1)),
    nccl=("nccl:all_gather", "nccl:_all_gather_base", "nccl:all_gather_into_tensor_coalesced"),
    gloo=("gloo:all_gather",),
    kernels=(_NCCL + "AllGather", r"(?:multimem|symm).*all_gather"),
    symm_mem=(r"^symm_mem::.*(all_gather|allgather)",),
))  # fmt: skip
register(CollectiveKind(
    "reduce_scatter", _collective(lambda i, o, n: i * _ring(n)), _ring, same_size=True, color="orange",
    record_names=("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reducescatter"),
    ops=(Op("c10d::_reduce_scatter_base_", "out_in"), Op("c10d::reduce_scatter_tensor_coalesced_", "out_in_lists"),
         Op("c10d::reduce_scatter_", "scatter_lists"),
         Op("_c10d_functional::reduce_scatter_tensor", "f_scatter", group_size_arg=2),
         Op("_c10d_functional::reduce_scatter_tensor_out", "f_scatter", group_size_arg=2),
         Op("_c10d_functional::reduce_scatter_tensor_coalesced", "f_scatter", group_size_arg=2),
         Op("_c10d_functional_autograd::reduce_scatter_tensor", "f_scatter", group_size_arg=2)),
    nccl=("nccl:reduce_scatter", "nccl:_reduce_scatter_base", "nccl:reduce_scatter_tensor_coalesced"),
    gloo=("gloo:all_reduce", "gloo:reduce_scatter"),
    kernels=(_NCCL + "ReduceScatter",),
    symm_mem=(r"^symm_mem::.*reduce_scatter",),
))  # fmt: skip
register(CollectiveKind(
    "all_to_all", _collective(lambda i, o, n: i * _ring(n)), _ring, color="teal",
    record_names=("all_to_all", "alltoall", "alltoall_base", "all_to_allv"),
    ops=(Op("c10d::alltoall_base_", "out_in"), Op("c10d::alltoall_", "out_in_lists"),
         Op("_c10d_functional::all_to_all_single", "f_all_to_all"),
         Op("_c10d_functional_autograd::all_to_all_single", "f_all_to_all")),
    nccl=("nccl:all_to_all", "nccl:all_to_allv"), gloo=("gloo:all_to_all",),
    symm_mem=(r"^symm_mem::.*all_to_all",),
))  # fmt: skip
register(CollectiveKind(
    "broadcast", _collective(lambda i, o, n: float(i)), lambda n: 1.0, same_size=True, in_place=True, filled=True,
    color="violet", record_names=("broadcast",),
    ops=(Op("c10d::broadcast_", "inplace", root_arg=2), Op("_c10d_functional::broadcast", "inplace", root_arg=1),
         Op("_c10d_functional::broadcast_", "inplace", root_arg=1)),
    nccl=("nccl:broadcast",), gloo=("gloo:broadcast",), kernels=(_NCCL + "Broadcast",),
))  # fmt: skip
register(CollectiveKind(
    "reduce", _collective(lambda i, o, n: float(i)), lambda n: 1.0, in_place=True, color="indigo",
    record_names=("reduce",), ops=(Op("c10d::reduce_", "inplace", root_arg=3),), nccl=("nccl:reduce",),
    gloo=("gloo:reduce",), kernels=(_NCCL + "Reduce_",),
))  # fmt: skip
register(CollectiveKind(
    # a gather's non-roots send their input, the root (whose output is not 0) sends nothing
    "gather", _collective(lambda i, o, n: 0.0 if o else float(i)), _ring, color="lime", record_names=("gather",),
    ops=(Op("c10d::gather_", "gather_root", root_arg=3),), nccl=("nccl:gather",), gloo=("gloo:gather",),
))  # fmt: skip
register(CollectiveKind(
    # a scatter's root has the whole input (the others 0) and keeps its own chunk
    "scatter", _collective(lambda i, o, n: i * _ring(n)), _ring, color="cyan", record_names=("scatter",),
    ops=(Op("c10d::scatter_", "scatter_root", root_arg=3),), nccl=("nccl:scatter",), gloo=("gloo:scatter",),
))  # fmt: skip
register(CollectiveKind(
    "send_recv", _collective(lambda i, o, n: float(i)), lambda n: 1.0, color="grape", kernels=(_NCCL + "SendRecv",),
))  # fmt: skip
register(CollectiveKind(
    "send", lambda i, o, n: float(i), lambda n: 1.0, in_place=True, point_to_point=True, color="grape",
    record_names=("send",), ops=(Op("c10d::send", "inplace", root_arg=2),), nccl=("nccl:send",), gloo=("gloo:send",),
    kernels=(_NCCL + "Send",),
))  # fmt: skip
register(CollectiveKind(
    "recv", lambda i, o, n: 0.0, lambda n: 1.0, in_place=True, filled=True, point_to_point=True, color="pink",
    record_names=("recv",), ops=(Op("c10d::recv_", "inplace", root_arg=2), Op("c10d::recv_any_source_", "inplace")),
    nccl=("nccl:recv",), gloo=("gloo:recv",), kernels=(_NCCL + "Recv",),
))  # fmt: skip
register(CollectiveKind(
    "barrier", lambda i, o, n: 0.0, None, color="gray", record_names=("barrier",), ops=(Op("c10d::barrier", "none"),),
    nccl=("nccl:barrier",), gloo=("gloo:barrier",),
))  # fmt: skip
register(CollectiveKind(
    # a collective the trace names without saying which: its bytes on the wire are unknown
    "other", None, None, color="dark", kernels=(_NCCL + "Generic|ncclKernel",), symm_mem=(r"^symm_mem::",),
))  # fmt: skip
