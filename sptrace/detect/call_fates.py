"""Where each collective call of a forward stands, and what became of the tensors it was handed:
the facts the cross-rank holder rule reads (sptrace.checks.sharding_peers). The same call (the
same collective at the same place in its forward) hands every rank and every step the same
buffer; its fate on the others tells what the code does with it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sptrace.detect.boundaries import Boundary
from sptrace.detect.handed import HandedTensors
from sptrace.detect.holders import HolderRules
from sptrace.detect.windows import containing

CALL_FATE_COLUMNS = ["step", "micro_batch", "key", "fate"]
"""``Retention.call_fates``: for every tensor a collective call of a forward was handed or
returned, where that call stands in its forward (``key``: the call's name, its ordinal among the
forward's calls of that name, the tensor's role and its ordinal among the call's tensors of that
role) and what the trace shows of its fate at the boundary (``FATES``)."""
FATES = ("released", "kept", "unknown")
"""released: freed before the boundary, by anyone, or freed unrecorded (its address allocated
again: the backend dropped the last reference, so the model had let go before it); kept: freed
after the boundary, on a recorded thread outside the backend's annotations (the step held it);
unknown: no free in the trace and its address never allocated again."""


def call_fates(
    handed: HandedTensors, bounds: list[Boundary], ledger: pd.DataFrame, rules: HolderRules
) -> tuple[dict[tuple[int, int], str], pd.DataFrame]:
    """Each collective call's tensors in each forward window, keyed by where the call stands in
    that forward (CALL_FATE_COLUMNS), with their fates (FATES); and (boundary, ledger row) -> key."""
    free = ledger["free_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    lost = ledger["lost_free"].to_numpy(dtype=bool)
    free_tid = ledger["free_tid"].to_numpy(dtype=np.float64, na_value=np.nan)
    calls = sorted(handed.by_row.items(), key=lambda item: (item[1].call_ns, item[0]))
    keys: dict[tuple[int, int], str] = {}
    fates: list[tuple[int | None, int, str, str]] = []
    at, window = containing(np.array([call.call_ns for _, call in calls], dtype=np.int64),
                            np.array([b.forward_ns for b in bounds], dtype=np.int64),
                            np.array([b.window_end_ns for b in bounds], dtype=np.int64))  # fmt: skip
    current = -1
    for position, k in zip(at.tolist(), window.tolist()):  # each window's calls, in time order
        if k != current:
            current, b = k, bounds[k]
            ordinal: dict[str, int] = {}
            seen: dict[tuple[str, int], int] = {}
            roles: dict[tuple[str, int, str], int] = {}
        row, call = calls[position]
        n = seen.get((call.collective, call.call_ns))
        if n is None:
            n = seen[(call.collective, call.call_ns)] = ordinal.get(call.collective, 0)
            ordinal[call.collective] = n + 1
        j = roles.get((call.collective, n, call.role), 0)
        roles[(call.collective, n, call.role)] = j + 1
        key = f"{call.collective}#{n}:{call.role}#{j}"
        keys[(k, row)] = key
        if lost[row]:
            fate = "released"
        elif np.isnan(free[row]):
            fate = "unknown"
        elif free[row] < b.backward_ns:
            fate = "released"
        else:
            fate = "released" if rules.backend_annotation(int(free[row]), free_tid[row]) is not None else "kept"
        fates.append((b.step, b.micro_batch, key, fate))
    return keys, pd.DataFrame(fates, columns=CALL_FATE_COLUMNS)
