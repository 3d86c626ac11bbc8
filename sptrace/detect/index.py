"""One rank's index: the ranges of its trace that collectives, allocations and timings are placed
in (steps, phases, sptrace's markers, autograd's backward nodes, python frames, CPU ops, kernels,
launches and flows), and the layer a module path or python frame is. Built once per rank and
shared by every per-rank detection (collectives, timing, retained tensors)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from sptrace.detect.args import present
from sptrace.detect.intervals import EventRow, EventTable, Intervals
from sptrace.detect.kinds import AUTOGRAD_NODE, LAUNCH_CATEGORIES, is_comm_kernel
from sptrace.load.trace import RankTrace
from sptrace.vocab import collective_kinds, markers

_LAYER_IN_PATH = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block|decoder\.layers|encoder\.layers)\.(\d+)(?:\.|$)")
# python stacks name modules "nn.Module: <Class>_<k>" (k counts instances of the class): a class
# whose name ENDS in Layer or Block is a transformer layer (LlamaDecoderLayer, GPT2Block,
# TransformerBlock); LayerNorm_1 or BlockSparseAttention_0 are not
_LAYER_CLASS = re.compile(r"^nn\.Module: (\w*(?:Layer|Block))_(\d+)$")
_CONTAINERS = re.compile(r"^nn\.Module: (?:ModuleList|Sequential)_\d+$")


def layer_of(module: str | None) -> int | None:
    """The layer index of a module path, only inside a layer container (``layers.3.mlp``,
    ``h.3``, ``blocks.3``, ``decoder.layers.3``); None elsewhere."""
    if not module:
        return None
    match = _LAYER_IN_PATH.search(module)
    return int(match.group(1)) if match else None


def layers_of_paths(paths: Iterable[str]) -> dict[str, int]:
    """Module paths -> layer index, read from the paths together: a named layer container first
    (``layer_of``); else the outermost numbered child of a container (a path part that is a
    number: a ModuleList or Sequential index) that holds modules of its own, as ``0`` does in
    ``0.attn`` for ``nn.Sequential(*blocks)``. A Sequential MLP's ``mlp.0`` Linear holds none
    and is no layer (the same rule ``RankIndex.layer_frames`` applies to python stacks)."""
    paths = {p for p in paths if p}
    composite = {p.rsplit(".", 1)[0] for p in paths if "." in p}
    composite |= {c.rsplit(".", k)[0] for c in list(composite) for k in range(1, c.count(".") + 1)}
    out: dict[str, int] = {}
    for path in paths:
        n = layer_of(path)
        if n is None:
            parts = path.split(".")
            n = next((int(part) for i, part in enumerate(parts)
                      if part.isdigit() and ".".join(parts[: i + 1]) in composite), None)  # fmt: skip
        if n is not None:
            out[path] = n
    return out


def within(ranges: Intervals, points: np.ndarray) -> np.ndarray:
    """For each point: does a range (of any thread) contain it? Vectorised over the points:
    the latest range starting at or before the point, or any open range, must still run."""
    if not len(ranges) or not len(points):
        return np.zeros(len(points), dtype=bool)
    order = np.argsort(ranges.start, kind="stable")
    starts = ranges.start[order]
    running_end = np.maximum.accumulate(ranges.end[order])  # latest end among ranges begun so far
    pos = np.searchsorted(starts, points, side="right") - 1
    ok = pos >= 0
    result = np.zeros(len(points), dtype=bool)
    result[ok] = running_end[pos[ok]] >= points[ok]
    return result


def take_columns(frame: pd.DataFrame, rows: np.ndarray, columns: list[str]) -> pd.DataFrame:
    """``frame.loc[rows, columns]`` (``rows`` a boolean mask or positions), index kept: each
    column's array taken directly, without the label indexing (a few hundred microseconds a call,
    and a rank makes a dozen)."""
    at = np.flatnonzero(rows) if rows.dtype == bool else rows
    return pd.DataFrame({c: frame[c].array.take(at) for c in columns}, index=frame.index[at])


def is_one_of(column: pd.Series, values: Iterable[str]) -> np.ndarray:
    """Rows whose value is one of ``values``."""
    return Distinct(column).one_of(values)


def has_prefix(column: pd.Series, prefix: str | tuple[str, ...]) -> np.ndarray:
    """Rows whose value starts with ``prefix`` (or one of a tuple of them)."""
    return Distinct(column).prefix(prefix)


_AUTOGRAD_NODE = re.compile(r"[A-Za-z_]\w*Backward\d*")


def _is_autograd_node(name: str) -> bool:
    """An autograd node's own name (``AddmmBackward0``, ``CudnnConvolutionBackward``, a custom
    Function's ``_GatherSeqBackward``): what the engine records for each node it runs."""
    return _AUTOGRAD_NODE.fullmatch(name) is not None


class Distinct:
    """A column's distinct values, read once for the tests made on it. Each test runs once per
    distinct value, in Python: an event table has a few hundred distinct names among 200k events,
    so this is far cheaper than turning every row into a Python string, and cheaper too than a
    pandas string method over the distinct values (its set-up alone costs more than a few hundred
    calls)."""

    def __init__(self, column: pd.Series) -> None:
        array = column.array
        if isinstance(array, pd.Categorical):  # the table's own dictionary: no factorize
            self.codes, uniques = array.codes, array.categories
        else:
            self.codes, found = pd.factorize(column, use_na_sentinel=True)
            uniques = pd.Index(found)
        self.values = uniques.tolist() if uniques.dtype == object else [str(u) for u in uniques]

    def passes(self, test: Callable[[str], bool], within: np.ndarray | None = None) -> np.ndarray:
        """``test`` of each row's value (a str; missing values are False), as a numpy bool array;
        ``within``: only these rows (a mask) can pass, and only their values are tested."""
        codes, values = self.codes, self.values
        if within is None:
            ok = np.fromiter((isinstance(v, str) and test(v) for v in values), dtype=bool, count=len(values))
        else:
            ok = np.zeros(len(values), dtype=bool)
            seen = np.unique(codes[within])
            for c in seen[seen >= 0].tolist():
                v = values[c]
                ok[c] = isinstance(v, str) and test(v)
        hit = np.where(codes >= 0, ok[np.maximum(codes, 0)], False) if len(ok) else np.zeros(len(codes), bool)
        return hit if within is None else hit & within

    def one_of(self, values: Iterable[str]) -> np.ndarray:
        """Rows whose value is one of ``values`` (looked up, not tested one by one)."""
        return self._rows_of([self._position[v] for v in set(values) if v in self._position])

    def prefix(self, prefix: str | tuple[str, ...]) -> np.ndarray:
        """Rows whose value starts with ``prefix`` (or one of a tuple of them): the values that
        do are one run of the sorted values, found by bisection."""
        keys, order = self._sorted
        found: list[int] = []
        for p in (prefix,) if isinstance(prefix, str) else prefix:
            lo = bisect.bisect_left(keys, p)
            hi = bisect.bisect_left(keys, p + "\U0010ffff", lo)
            found.extend(order[lo:hi])
        return self._rows_of(found)

    def _rows_of(self, codes: list[int]) -> np.ndarray:
        ok = np.zeros(len(self.values), dtype=bool)
        ok[codes] = True
        if not len(ok):
            return np.zeros(len(self.codes), dtype=bool)
        return np.where(self.codes >= 0, ok[np.maximum(self.codes, 0)], False)

    @cached_property
    def _position(self) -> dict[str, int]:
        return {v: i for i, v in enumerate(self.values) if isinstance(v, str)}

    @cached_property
    def _sorted(self) -> tuple[list[str], list[int]]:
        order = sorted((i for i, v in enumerate(self.values) if isinstance(v, str)), key=self.values.__getitem__)
        return [self.values[i] for i in order], order


class RankIndex:
    """The ranges of one rank's trace that collectives and allocations are placed in."""

    def __init__(self, trace: RankTrace) -> None:
        ev = trace.events
        names, cat = ev["name"], ev["cat"]

        # the distinct values of name, cat and ph, kept for the rank's other detections to test
        self.by_name, self.by_cat = by_name, by_cat = Distinct(names), Distinct(cat)
        by_ph = Distinct(ev["ph"])
        self.is_x = is_x = by_ph.one_of(["X"])

        def starts(prefix: str) -> np.ndarray:
            return by_name.prefix(prefix)

        def named(values: Iterable[str]) -> np.ndarray:
            return by_name.one_of(values)

        def of_cat(values: Iterable[str]) -> np.ndarray:
            return by_cat.one_of(values)

        self.events = ev
        self.table = table = EventTable(ev)
        self.phase_markers = Intervals.of(table, is_x & starts(markers.PHASE))
        self.comm_markers = Intervals.of(table, is_x & starts(markers.COMM))
        self.module_markers = Intervals.of(table, is_x & starts(markers.MODULE))
        self.steps = Intervals.of(table, is_x & starts("ProfilerStep#"))
        nodes = is_x & starts(AUTOGRAD_NODE)
        if not nodes.any():  # torch <= 1.9: the node's own range, unwrapped (CudnnConvolutionBackward)
            nodes = is_x & of_cat(["cpu_op"]) & by_name.passes(_is_autograd_node, is_x)
        self.backward_nodes = Intervals.of(table, nodes)
        self.optimizer = Intervals.of(table, is_x & (starts("Optimizer.step") | starts("Optimizer.zero_grad")))
        self.python = Intervals.of(table, is_x & of_cat(["python_function"]))
        self._is_gloo = is_x & named(collective_kinds.by_gloo_annotation())
        self.is_cpu = is_cpu = is_x & of_cat(["cpu_op", "user_annotation"])
        self.rpc = Intervals.of(table, is_cpu & named(["record_param_comms"]))
        self.nccl_annotations = Intervals.of(table, is_cpu & named(collective_kinds.by_nccl_annotation()))
        is_kernel = is_x & of_cat(["kernel"])
        is_comm = by_name.passes(is_comm_kernel, is_kernel)
        self._is_comm_kernel = is_kernel & is_comm
        self.is_compute_kernel = is_kernel & ~is_comm
        self._is_launch = is_x & of_cat(LAUNCH_CATEGORIES) & ev["correlation"].notna().to_numpy()
        # ac2g flows: the start ("s") sits on the launch, the end ("f") on the kernel
        is_flow = of_cat(["ac2g"]) & ev["flow_id"].notna().to_numpy()
        self._is_flow_start = is_flow & by_ph.one_of(["s"])
        self._is_flow_end = is_flow & by_ph.one_of(["f"])
        with_seq = is_cpu & ev["seq_num"].notna().to_numpy() & ~starts("autograd::engine")
        # forward ops by autograd sequence number (for backward attribution)
        in_backward = with_seq & within(self.backward_nodes, table.start)
        self.backward_ops = Intervals.of(table, in_backward)
        forward = np.flatnonzero(with_seq & ~in_backward)
        # ops that create no autograd node (aten::to ...) record the current number too: the one
        # that created the node is the last to carry it
        seqs = ev["seq_num"].to_numpy(dtype=np.int64, na_value=0)[forward]
        last = len(seqs) - 1 - np.unique(seqs[::-1], return_index=True)[1]
        self._forward_rows = forward[np.sort(last)]
        self._forward_at = {int(s): i for i, s in enumerate(seqs[np.sort(last)])}
        first_bwd = {}
        for i in range(len(self.steps) or 1):
            lo, hi = (self.steps.start[i], self.steps.end[i]) if len(self.steps) else (-(2**62), 2**62)
            inside = (self.backward_nodes.start >= lo) & (self.backward_nodes.start <= hi)
            if inside.any():
                first_bwd[i] = int(self.backward_nodes.start[inside].min())
        self.first_backward = first_bwd
        self._python_parents: dict[int, int] | None = None

    def frame(self, rows: np.ndarray) -> pd.DataFrame:
        """The events at ``rows`` (a boolean mask or positions), 0..n-1."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else rows
        return self.events.iloc[rows].reset_index(drop=True)

    def rows(self, positions: np.ndarray) -> list[EventRow]:
        """The events at ``positions``, each read as it is asked (no table is taken)."""
        return [EventRow(self.events, int(i), self.table.columns) for i in positions]

    @cached_property
    def gloo(self) -> list[EventRow]:
        """gloo's worker annotations, in time order."""
        at = np.flatnonzero(self._is_gloo)
        return self.rows(at[np.argsort(self.table.start[at], kind="stable")])

    @cached_property
    def comm_kernels(self) -> np.ndarray:
        """Positions of the communication kernels."""
        return np.flatnonzero(self._is_comm_kernel)

    @cached_property
    def compute_kernels(self) -> pd.DataFrame:
        """Kernels that are no communication: when they ran."""
        return take_columns(self.events, self.is_compute_kernel, ["ts_ns", "dur_ns"]).reset_index(drop=True)

    def launched(self, kernels: np.ndarray) -> dict[int, tuple[int, int]]:
        """correlation -> (ts, tid) of the CPU launch of each of ``kernels`` (positions) that
        names its correlation, the first launch where several carry one."""
        corr = self.events["correlation"].to_numpy(dtype=np.int64, na_value=0)
        wanted = corr[kernels][self.events["correlation"].notna().to_numpy()[kernels]]
        at = np.flatnonzero(self._is_launch & np.isin(corr, wanted))
        out: dict[int, tuple[int, int]] = {}
        for c, ts, tid in zip(corr[at].tolist(), self.table.start[at].tolist(), self.table.tid[at].tolist()):
            out.setdefault(c, (ts, tid))
        return out

    def flowed(self, kernels: np.ndarray) -> dict[tuple[int, int], tuple[int, int]]:
        """(kernel ts, stream tid) -> (ts, tid) of the launch an ac2g flow links to it, for
        ``kernels`` (positions); the last flow where several end at one kernel."""
        fid = self.events["flow_id"].to_numpy(dtype=np.int64, na_value=0)
        start, tid = self.table.start, self.table.tid
        ends = np.flatnonzero(self._is_flow_end & np.isin(start, start[kernels]))
        begins = np.flatnonzero(self._is_flow_start & np.isin(fid, fid[ends]))
        source = dict(zip(fid[begins].tolist(), zip(start[begins].tolist(), tid[begins].tolist())))
        to = dict(zip(zip(start[ends].tolist(), tid[ends].tolist()), fid[ends].tolist()))
        return {kernel: source[f] for kernel, f in to.items() if f in source}

    def forward_ops(self, seqs: Iterable[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, ts_ns, tid) of the forward op that created the autograd node of each sequence
        number in ``seqs`` (None or NaN: none), read off the table's arrays."""
        rows = np.array([self._forward_at.get(int(s), -1) if present(s) else -1 for s in seqs], dtype=np.int64)
        found = rows >= 0
        at = self._forward_rows[rows[found]]
        return found, self.table.start[at], self.table.tid[at]

    @cached_property
    def forward_by_seq(self) -> pd.DataFrame:
        """The forward op that created each autograd node, by sequence number."""
        return self.frame(self._forward_rows)

    def step_of(self, ts: int) -> int | None:
        if not len(self.steps):
            return None
        idx = self.steps.enclosing(ts, ts)
        if not len(idx):
            return None
        name = self.steps.name(int(idx[-1]))
        number = name.split("#", 1)[1]
        return int(number) if number.isdigit() else None

    def phase_of(self, start: int, end: int, tid: int) -> str:
        i = self.phase_markers.innermost(start, start)  # any thread: backward may run elsewhere
        if i is not None:
            return self.phase_markers.name(i)[len(markers.PHASE) :]
        if self.optimizer.innermost(start, end) is not None:
            return "optimizer"
        if self.backward_nodes.innermost(start, end, tid) is not None:
            return "backward"
        step_idx = 0
        if len(self.steps):
            idx = self.steps.enclosing(start, start)
            step_idx = int(idx[-1]) if len(idx) else -1
        first = self.first_backward.get(step_idx)
        if first is not None and start >= first:
            return "backward"
        return "forward"

    def module_of(self, start: int, end: int, tid: int) -> tuple[str | None, str | None, str]:
        """(module, role, how) for work done in [start, end] on thread tid."""
        i = self.comm_markers.innermost(start, end, tid)
        if i is not None:
            parsed = markers.parse_comm(self.comm_markers.name(i))
            if parsed:
                return parsed[0], parsed[1], "sptrace.comm marker"
        i = self.module_markers.innermost(start, end, tid)
        if i is not None:
            return self.module_markers.name(i)[len(markers.MODULE) :], None, "sptrace.module marker"
        node = self.backward_nodes.innermost(start, end, tid)
        if node is not None:
            # the node's own op (XBackward0 inside "evaluate_function: XBackward0") carries the
            # Sequence number of the forward op it differentiates
            node_row = self.backward_nodes.row(node)
            seq = node_row["seq_num"]
            if not present(seq):
                lo, hi = int(self.backward_nodes.start[node]), int(self.backward_nodes.end[node])
                inner = self.backward_ops.inside(lo, hi, tid)
                if len(inner):
                    own = str(node_row["name"]).rpartition(": ")[2]
                    ops = self.backward_ops.subset(inner).frame.sort_values("ts_ns", kind="stable")
                    named = ops[ops["name"].astype(str) == own]
                    seq = (named if len(named) else ops).iloc[0]["seq_num"]
            at = self._forward_at.get(int(seq)) if present(seq) else None
            if at is not None:
                op = EventRow(self.events, int(self._forward_rows[at]), self.table.columns)
                fstart, fend = int(op["ts_ns"]), int(op["ts_ns"] + (op["dur_ns"] if present(op["dur_ns"]) else 0))
                ftid = int(op["tid"]) if present(op["tid"]) else None
                j = self.module_markers.innermost(fstart, fend, ftid)
                if j is not None:
                    name = self.module_markers.name(j)[len(markers.MODULE) :]
                    return name, None, "Sequence number"
                module = self.python_module(fstart, fend, ftid)
                if module:
                    return module, None, "Sequence number + python stack"
        module = self.python_module(start, end, tid)
        if module:
            return module, None, "python stack"
        return None, None, "none"

    @cached_property
    def marker_layers(self) -> dict[str, int]:
        """The layer of each module path the instrumentation's markers name (layers_of_paths)."""
        names = {self.module_markers.name(i) for i in range(len(self.module_markers))}
        return layers_of_paths(n[len(markers.MODULE) :] for n in names)

    def layer_of(self, module: str | None) -> int | None:
        """A module's layer: its path's named container, else its place among the marked paths."""
        n = layer_of(module)
        return n if n is not None or not module else self.marker_layers.get(module)

    @cached_property
    def layer_frames(self) -> dict[str, int]:
        """Module frames of the python stacks that are transformer layers -> layer index.

        Python stacks name modules by class and a per-class counter (``nn.Module: Block_3``), not
        by attribute path, so a layer is recognised by what it is:
          * a class named *Layer or *Block (LlamaDecoderLayer, GPT2Block, TransformerLayer);
          * a child of a Sequential / ModuleList that was called (the container's own frame) and
            holds modules of its own (an MLP's Linear inside a block's Sequential is no layer);
          * one of several instances of a composite module (one with modules inside) called from
            the same parent: the stack of layers a ``for layer in self.layers`` loop runs.
        Its index is the class counter: the k-th instance of the layer class."""
        if not len(self.python):
            return {}
        ids = self.python.column("python_id")
        names = dict(zip(ids, (self.python.name(i) for i in range(len(self.python)))))
        parents = dict(zip(ids, self.python.column("python_parent_id")))

        def module_parent(pid: Any) -> Any:
            parent = parents.get(pid)
            for _ in range(64):
                if parent is None or not present(parent) or parent not in names:
                    return None
                if names[parent].startswith("nn.Module: "):
                    return parent
                parent = parents.get(parent)
            return None

        modules = [pid for pid, name in names.items() if name.startswith("nn.Module: ")]
        parent_of = {pid: module_parent(pid) for pid in modules}
        composite = {names[p] for p in parent_of.values() if p is not None}
        siblings: dict[Any, dict[str, set[str]]] = {}
        for pid in modules:
            name = names[pid]
            cls = name[len("nn.Module: ") :].rpartition("_")[0]
            siblings.setdefault(parent_of[pid], {}).setdefault(cls, set()).add(name)
        layers: set[str] = set()
        for pid in modules:
            name = names[pid]
            parent = parent_of[pid]
            if _CONTAINERS.match(name):
                continue
            # a container's child is a layer only if it holds modules of its own: the Linear and
            # GELU of an nn.Sequential MLP inside a block are not layers
            if _LAYER_CLASS.match(name) or (
                parent is not None and _CONTAINERS.match(names[parent]) and name in composite
            ):
                layers.add(name)
        for group in siblings.values():
            for same in group.values():
                if len(same) >= 2 and all(n in composite and not _CONTAINERS.match(n) for n in same):
                    layers |= same
        out = {}
        for name in layers:
            number = name.rsplit("_", 1)[1]
            if number.isdigit():
                out[name] = int(number)
        return out

    def python_layers(self) -> set[int]:
        """Layer indices the python stacks show running."""
        return set(self.layer_frames.values())

    def python_module(self, start: int, end: int, tid: int | None) -> str | None:
        """The module running at [start, end], from python stacks: ``layers.3.Linear_7`` inside a
        layer (``layer_frames``), else the innermost module's class (``Linear_7``)."""
        if not len(self.python):
            return None
        idx = self.python.enclosing(start, end, tid)
        frames = [self.python.name(int(i)) for i in idx]
        modules = [n for n in frames if n.startswith("nn.Module: ")]
        if not modules:
            return None
        inner = modules[-1][len("nn.Module: ") :]
        layer_frames = self.layer_frames
        hits = [(depth, layer_frames[name]) for depth, name in enumerate(modules) if name in layer_frames]
        if not hits:
            return inner
        depth, n = hits[0]  # the outermost: a layer's own sub-blocks are not layers of the model
        return f"layers.{n}" + ("" if depth == len(modules) - 1 else f".{inner}")
