"""One rank's index: the ranges of its trace that collectives, allocations and timings are placed
in (steps, phases, sptrace's markers, autograd's backward nodes, python frames, CPU ops, kernels,
launches and flows), and what runs where: the step, phase, module and layer of a time on a thread.
Built once per rank and shared by every per-rank detection (collectives, timing, retained tensors)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cached_property

import numpy as np
import pandas as pd

from sptrace.detect.args import present
from sptrace.detect.columns import Distinct, notna_rows, take_columns
from sptrace.detect.intervals import EventRow, EventTable, Intervals, within
from sptrace.detect.kinds import AUTOGRAD_NODE, LAUNCH_CATEGORIES, NOT_THREAD_WORK, NOT_WORK, is_comm_kernel
from sptrace.detect.layers import layer_of, layers_of_paths, python_layer_frames
from sptrace.load.trace import RankTrace
from sptrace.vocab import collective_kinds, markers

_AUTOGRAD_NODE = re.compile(r"[A-Za-z_]\w*Backward\d*")


def _is_autograd_node(name: str) -> bool:
    """An autograd node's own name (``AddmmBackward0``, ``CudnnConvolutionBackward``, a custom
    Function's ``_GatherSeqBackward``): what the engine records for each node it runs."""
    return _AUTOGRAD_NODE.fullmatch(name) is not None


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
        self._is_launch = is_x & of_cat(LAUNCH_CATEGORIES) & notna_rows(ev["correlation"])
        # ac2g flows: the start ("s") sits on the launch, the end ("f") on the kernel
        is_flow = of_cat(["ac2g"]) & notna_rows(ev["flow_id"])
        self._is_flow_start = is_flow & by_ph.one_of(["s"])
        self._is_flow_end = is_flow & by_ph.one_of(["f"])
        with_seq = is_cpu & notna_rows(ev["seq_num"]) & ~starts("autograd::engine")
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
        self._python_parents: dict[int, int] | None = None

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
    def cpu_ops(self) -> pd.DataFrame:
        """The CPU ops and annotations (tid, name, ts_ns, dur_ns, cat), in table order: what the
        module clock and the work lane read (taken once for both)."""
        return take_columns(self.events, self.is_cpu, ["tid", "name", "ts_ns", "dur_ns", "cat"])

    @cached_property
    def cpu_op_is_comm(self) -> np.ndarray:
        """Of ``cpu_ops``, those issuing or waiting on communication (kinds.NOT_WORK)."""
        return self.by_name.prefix(NOT_WORK)[self.is_cpu]

    @cached_property
    def cpu_op_is_label(self) -> np.ndarray:
        """Of ``cpu_ops``, the step's own ranges and sptrace's markers (kinds.NOT_THREAD_WORK)."""
        return self.by_name.prefix(NOT_THREAD_WORK)[self.is_cpu]

    @cached_property
    def compute_kernels(self) -> tuple[np.ndarray, np.ndarray]:
        """Kernels that are no communication: when they started and ended (us), in table order."""
        at = np.flatnonzero(self.is_compute_kernel)
        starts = self.events["ts_ns"].to_numpy(dtype=np.int64, na_value=0)[at] / 1e3
        return starts, starts + self.events["dur_ns"].to_numpy(dtype=np.int64, na_value=0)[at] / 1e3

    def launched(self, kernels: np.ndarray) -> dict[int, tuple[int, int]]:
        """correlation -> (ts, tid) of the CPU launch of each of ``kernels`` (positions) that
        names its correlation, the first launch where several carry one."""
        corr = self.events["correlation"].to_numpy(dtype=np.int64, na_value=0)
        wanted = corr[kernels][notna_rows(self.events["correlation"])[kernels]]
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

    def forward_ops(self, seqs: Iterable[object]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, ts_ns, tid) of the forward op that created the autograd node of each sequence
        number in ``seqs`` (None or NaN: none), read off the table's arrays."""
        rows = np.array([self._forward_at.get(int(s), -1) if present(s) else -1 for s in seqs], dtype=np.int64)
        found = rows >= 0
        at = self._forward_rows[rows[found]]
        return found, self.table.start[at], self.table.tid[at]

    @cached_property
    def forward_by_seq(self) -> pd.DataFrame:
        """The forward op that created each autograd node, by sequence number: its time,
        duration and number (what the boundaries and the step window read; not the table's 40
        columns)."""
        return take_columns(self.events, self._forward_rows, ["ts_ns", "dur_ns", "seq_num"]).reset_index(drop=True)

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
        return "backward" if self.in_backward(np.array([start]))[0] else "forward"

    @cached_property
    def _iterations(self) -> tuple[np.ndarray, np.ndarray]:
        """Each backward's start, in time order, and when the next forward starts after that
        backward's end (+inf for none): the span that is backward (sptrace.detect.boundaries:
        sptrace.phase markers, else autograd's own links). The next forward starts at the first op
        after the end that either made an autograd node some backward visits or is not a
        communication op: a send of the gradients after the last node (a pipeline stage's, a
        hand-rolled gradient sync) carries a sequence number too, and is still this backward's."""
        from sptrace.detect.boundaries import find_boundaries  # (it reads this index)

        first = self.events["ts_ns"].min()
        bounds = sorted(find_boundaries(self, int(first) if pd.notna(first) else 0), key=lambda b: b.backward_ns)
        starts = np.array([b.backward_ns for b in bounds], dtype=np.int64)
        ends = np.array([b.backward_end_ns for b in bounds], dtype=np.int64)
        forward = self.forward_by_seq
        visited = self.backward_nodes.column("seq_num").to_numpy(dtype=float, na_value=np.nan)
        linked = np.isin(forward["seq_num"].to_numpy(dtype=np.int64), visited[~np.isnan(visited)].astype(np.int64))
        communicates = self.by_name.one_of(collective_kinds.by_op())[self._forward_rows]
        begins = forward["ts_ns"].to_numpy(dtype=np.int64)[linked | ~communicates]
        forward_ops = np.sort(begins)
        if not len(forward_ops):
            return starts, np.full(len(starts), np.inf)
        k = np.searchsorted(forward_ops, ends, side="right")
        next_forward = np.where(k < len(forward_ops), forward_ops[np.minimum(k, len(forward_ops) - 1)], np.inf)
        return starts, next_forward.astype(np.float64)

    def _step_positions(self, times: np.ndarray) -> np.ndarray:
        """The ProfilerStep range each time falls in (its position in ``steps``; -1 for none)."""
        steps = self.steps
        order = np.argsort(steps.start, kind="stable")
        i = np.searchsorted(steps.start[order], times, side="right") - 1
        inside = (i >= 0) & (times <= steps.end[order][np.maximum(i, 0)])
        return np.where(inside, order[np.maximum(i, 0)], -1)

    def in_backward(self, times: np.ndarray) -> np.ndarray:
        """For each time, is it in its iteration's backward: from a backward's start until the
        next forward's first op (the gradient sync after the last node included), within one
        ProfilerStep where the trace marks steps? A window of several iterations without markers
        is split at each forward, not labelled backward from its first backward on."""
        starts, next_forward = self._iterations
        times = np.asarray(times, dtype=np.int64)
        if not len(starts):
            return np.zeros(len(times), dtype=bool)
        j = np.searchsorted(starts, times, side="right") - 1
        at = np.maximum(j, 0)
        out = (j >= 0) & (times < next_forward[at])
        if len(self.steps):  # a backward of another step (or of no step) is not this time's
            mine = self._step_positions(times)
            out &= (mine >= 0) & (mine == self._step_positions(starts)[at])
        return out

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
        """Module frames of the python stacks that are transformer layers -> layer index
        (sptrace.detect.layers.python_layer_frames)."""
        return python_layer_frames(self.python)

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
