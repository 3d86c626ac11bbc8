"""What the tests share beside fixtures (tests/conftest.py holds those; importing it from a test
would run it a second time): where the real-trace corpus is, the reference runs the ``profiled``
fixture profiles, and the rank count of each, for the tests that check per-rank facts."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# real GPU traces from public repositories, read in place (read-only): SPTRACE_CORPUS, else
# ../shared/corpus beside the checkout (as in CI); tests that need them skip without them
CORPUS = Path(os.environ.get("SPTRACE_CORPUS") or REPO.parent / "shared" / "corpus")
NO_CORPUS = f"no real-trace corpus at {CORPUS}: set SPTRACE_CORPUS=DIR to run the tests on real GPU traces"
# an independent generator of drawn models and its judge (../shared/oracles beside the checkout, as in CI)
ORACLES = Path(os.environ.get("SPTRACE_ORACLES") or REPO.parent / "shared" / "oracles")
NO_ORACLES = f"no shared oracle at {ORACLES}: set SPTRACE_ORACLES=DIR to score the gate on its drawn models"
WORLD = 8

# name -> a run of `sptrace profile --matrix` (the default model unless stated). The suite's
# reference runs come from three launches: the demo's three schemes (`sptrace demo`), the runs
# where eight ranks matter (cross-rank matching, rings, faults on every rank) and the single-use
# variants, on four ranks. Each launch starts on the first request of one of its runs.
RUNS: dict[str, dict] = {
    "megatron-stray-full-save": {"scheme": "megatron", "fault": "stray-full-save"},
    # profiled without Python stacks: modules named by sptrace's markers alone (compared with the
    # full profile above, so on as many ranks)
    "megatron-stray-full-save-lean": {"scheme": "megatron", "fault": "stray-full-save", "lean": True},
    "ulysses-stray-full-save": {"scheme": "ulysses", "fault": "stray-full-save", "fault_layer": 0},
    "megatron-missing-reduce-scatter": {"scheme": "megatron", "fault": "missing-reduce-scatter"},
    "hybrid-debug-hook": {"scheme": "hybrid", "fault": "debug-hook", "fault_layer": 0},
    # context parallelism: ring attention (zigzag) and Ulysses x ring (U = 2, rings of 4)
    "ring": {"scheme": "ring"},
    "usp": {"scheme": "usp", "ulysses_degree": 2},
    "ring-stray-full-save": {"scheme": "ring", "fault": "stray-full-save"},
    # causal ring attention without load balancing (contiguous chunks): rank P-1 does the most work
    "ring-contiguous": {"scheme": "ring", "cp_balance": "none", "seq": 512, "layers": 1, "lean": True},
    # single-use variants: four ranks say what eight would
    "megatron-gqa-recompute": {"scheme": "megatron", "kv_heads": 2, "recompute": "selective", "nproc": 4},
    "ulysses-zero3-gqa": {"scheme": "ulysses", "zero3": True, "kv_heads": 2, "recompute": "selective", "nproc": 4},
    "hybrid-zero3": {"scheme": "hybrid", "zero3": True, "nproc": 4},
    "ring-gqa-recompute": {"scheme": "ring", "kv_heads": 2, "recompute": "selective", "nproc": 4},
    # no sptrace markers or saved-tensor records: what a foreign framework's trace looks like
    "megatron-uninstrumented": {"scheme": "megatron", "instrument": False, "nproc": 4},
    "megatron-stray-full-save-uninstrumented": {
        "scheme": "megatron",
        "fault": "stray-full-save",
        "instrument": False,
        "nproc": 4,
    },
}


DEMO_SCHEMES = ("megatron", "ulysses", "hybrid")


def world_of(name: str) -> int:
    """The rank count a reference run of the suite was profiled on."""
    return WORLD if name in DEMO_SCHEMES else RUNS[name].get("nproc", WORLD)
