"""Names of the ``record_function`` markers sptrace writes into traces, defined once.

Kineto keeps a record_function's name but not its arguments (SPEC.md §4), so data travels
in the name. Writers (``sptrace.instrument``, the reference models) and readers (the
analyzers) both use this module; no torch import here.

    sptrace.phase::forward                     a phase of the step (forward, backward, optimizer)
    sptrace.module::layers.1.mlp.fc1           one module call (forward, and recomputation)
    sptrace.comm::layers.1.mlp.fc1::ag_input   a collective issued on behalf of a module
    sptrace.saved::k=v|k=v|...                 one tensor saved for backward (see SavedTensor)
    sptrace.released::ptr:bytes:who,...        who released each buffer a forward's collectives
                                               filled (see ReleasedCensus)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PREFIX = "sptrace."
PHASE = "sptrace.phase::"
MODULE = "sptrace.module::"
COMM = "sptrace.comm::"
SAVED = "sptrace.saved::"
RELEASED = "sptrace.released::"
MADE = "sptrace.made::"
PHASES = ("forward", "backward", "optimizer")


def phase_name(phase: str) -> str:
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; choose one of {', '.join(PHASES)}")
    return PHASE + phase


def module_name(qualname: str) -> str:
    return MODULE + (qualname or "<root>")


def comm_name(module: str, role: str) -> str:
    return f"{COMM}{module}::{role}"


def parse_comm(name: str) -> tuple[str, str] | None:
    """``sptrace.comm::layers.1.mlp.fc1::ag_input`` -> ("layers.1.mlp.fc1", "ag_input")."""
    if not name.startswith(COMM):
        return None
    module, _, role = name[len(COMM) :].partition("::")  # module paths never contain "::"
    return module, role


@dataclass(frozen=True, slots=True)
class SavedTensor:
    """One tensor packed by autograd for backward, as the pack hook saw it."""

    module: str
    """Qualified name of the innermost module running when it was saved."""
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    """numel * element size of the saved tensor (a view counts only its own elements)."""
    storage_ptr: int
    """data_ptr of the underlying storage: joins the record to ``[memory]`` events by Addr."""
    storage_nbytes: int
    """Size of the whole storage that saving keeps alive (larger than nbytes for views)."""
    kind: str
    """'activation', 'param' (a leaf that requires grad), 'input' (a leaf without grad), or
    'offloaded' (a copy a saved-tensor pack hook kept in the saved tensor's place)."""
    source_ptr: int = 0
    """For an offloaded copy: the storage of the tensor it copies (0 otherwise)."""

    def to_marker(self) -> str:
        return saved_marker(self.module, self.shape, self.dtype, self.nbytes, self.storage_ptr, self.storage_nbytes,
                            self.kind, self.source_ptr)  # fmt: skip

    @classmethod
    def all_from_marker(cls, name: str) -> list[SavedTensor]:
        """Every record of a marker event (sptrace.instrument writes a forward's records as one
        event, each starting with SAVED: the profiler's export drops newlines), well-formed
        ones only."""
        chunks = name.split(SAVED)[1:] if name.startswith(SAVED) else []
        return [r for chunk in chunks if (r := cls.from_marker(SAVED + chunk.strip())) is not None]

    @classmethod
    def from_marker(cls, name: str) -> SavedTensor | None:
        """Parse a marker name; None if it is not a well-formed saved-tensor marker."""
        if not name.startswith(SAVED):
            return None
        try:
            fields = dict(part.split("=", 1) for part in name[len(SAVED) :].split("|"))
            shape_text = fields["shape"]
            shape = () if shape_text == "scalar" else tuple(int(d) for d in shape_text.split("x"))
            return cls(
                module=fields["module"],
                shape=shape,
                dtype=fields["dtype"],
                nbytes=int(fields["bytes"]),
                storage_ptr=int(fields["ptr"], 16),
                storage_nbytes=int(fields["storage_bytes"]),
                kind=fields["kind"],
                source_ptr=int(fields.get("source", "0"), 16),
            )
        except (KeyError, ValueError):
            return None


def saved_marker(
    module: str, shape: Iterable[int], dtype: str, nbytes: int, storage_ptr: int, storage_nbytes: int, kind: str,
    source_ptr: int = 0,
) -> str:  # fmt: skip
    """One saved tensor's record (SavedTensor.from_marker reads it back)."""
    dims = "x".join(map(str, shape)) or "scalar"
    return (
        f"{SAVED}module={module}|shape={dims}|dtype={dtype}|bytes={nbytes}"
        f"|ptr={storage_ptr:#x}|storage_bytes={storage_nbytes}|kind={kind}"
        + (f"|source={source_ptr:#x}" if source_ptr else "")
    )


@dataclass(frozen=True, slots=True)
class ReleasedCensus:
    """Who released each buffer one instrumented forward's collectives filled or returned
    (sptrace.census), said when the backward that consumes the forward ends: (storage data
    pointer, bytes, who) with who ``backend`` (another thread dropped the last reference: the
    communication backend's), ``model`` (the model's thread) or ``alive`` (nobody yet: the model
    still holds it)."""

    entries: list[tuple[int, int, str]]

    def to_marker(self) -> str:
        return RELEASED + ",".join(f"{ptr:x}:{n}:{who}" for ptr, n, who in self.entries)

    def who(self, ptr: int) -> str | None:
        """Who released the latest buffer watched at ``ptr`` (None: not watched)."""
        hit = [who for p, _, who in self.entries if p == ptr]
        return hit[-1] if hit else None

    @classmethod
    def from_marker(cls, name: str) -> ReleasedCensus | None:
        if not name.startswith(RELEASED):
            return None
        entries: list[tuple[int, int, str]] = []
        for item in name[len(RELEASED) :].split(","):
            if not item.strip():
                continue
            parts = item.split(":")
            if len(parts) != 3 or parts[2] not in ("backend", "model", "alive"):
                return None  # a truncated or foreign name: no census rather than a wrong one
            try:
                entries.append((int(parts[0], 16), int(parts[1]), parts[2]))
            except ValueError:
                return None
        return cls(entries)


def made_marker(ptr: int, line: int, function: str, file: str) -> str:
    """Where the tensor at one storage was made, as sptrace.instrument saw it (made_lines reads it
    back): ``sptrace.made::0x7f..@52@forward@model.py``, the file last (it may hold any character
    but the prefix)."""
    return f"{MADE}{ptr:#x}@{line}@{function}@{file}"


def made_lines(name: str) -> dict[int, tuple[str, int, str]]:
    """storage pointer -> (file, line, function) of an event's records (sptrace.instrument writes
    a forward's records in one event, each starting with MADE), well-formed ones only."""
    out: dict[int, tuple[str, int, str]] = {}
    for chunk in name.split(MADE)[1:] if name.startswith(MADE) else ():
        parts = chunk.rstrip(" ").split("@", 3)
        if len(parts) == 4:
            try:
                out.setdefault(int(parts[0], 16), (parts[3], int(parts[1]), parts[2]))
            except ValueError:
                continue
    return out
