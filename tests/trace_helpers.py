"""Just enough trace reading for the reference-model tests (the real loader is sptrace.load):
events of one rank, and for each c10d collective the sptrace markers that enclose it."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from sptrace import markers


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
        out.append(
            Collective(
                e["name"], e["args"].get("Input Dims"), phase, comm[0] if comm else None, comm[1] if comm else None
            )
        )
    return out


def saved_tensors(events: list[dict]) -> list[markers.SavedTensor]:
    records = (markers.SavedTensor.from_marker(e["name"]) for e in events if e["name"].startswith(markers.SAVED))
    return [r for r in records if r is not None]
