"""A run judged against a baseline instead of a model (``check``/``analyze RUN --baseline BASE``):
per module, a full-size tensor the baseline did not keep, more bytes kept across the
forward/backward boundary than the baseline's module kept, or more wire bytes than it sent (per
rank and step; per token when B or S changed). Read from a finished comparison
(sptrace.diff.RunDiff). It fails closed: retained bytes are compared whether or not the tensors
could be classed, and more bytes alive at the boundary with no holder the trace can show than the
baseline had is CANNOT DECIDE, never a PASS."""

from __future__ import annotations

from dataclasses import dataclass

from sptrace.diff import RunDiff
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import human_bytes


@dataclass(frozen=True)
class ModuleCase:
    """One module's case of the baseline gate (check/analyze --baseline)."""

    module: str
    failures: tuple[str, ...]

    def to_dict(self) -> JSONObject:
        return {"module": self.module, "ok": not self.failures, "failures": list(self.failures)}


@dataclass(frozen=True)
class BaselineGate:
    """A run against its baseline, per module: a full-size tensor the baseline did not keep, or
    more wire bytes than the baseline sent (per rank and step, per token when B or S changed).
    ``undecided``: what could not be judged (bytes of no known holder above the baseline's)."""

    diff: RunDiff
    cases: tuple[ModuleCase, ...]
    undecided: str | None

    @property
    def failed(self) -> list[ModuleCase]:
        return [c for c in self.cases if c.failures]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 2 if self.undecided else 0

    def line(self) -> str:
        if self.failed:
            return f"FAIL: {len(self.failed)} module(s) worse than the baseline: " + ", ".join(
                c.module for c in self.failed
            )
        if self.undecided:
            return f"CANNOT DECIDE: {self.undecided}"
        n = len(self.cases)
        return (
            f"PASS: no module keeps a full-size tensor, keeps more bytes or sends more bytes than the baseline "
            f"({n} modules)"
        )

    def to_dict(self) -> JSONObject:
        status = "fail" if self.failed else "undecided" if self.undecided else "pass"
        return {
            "status": status, "line": self.line(), "baseline": self.diff.base, "run": self.diff.new,
            "modules": [c.to_dict() for c in self.cases], "undecided": self.undecided,
            "shape_changes": [{"field": f, "base": a, "new": b} for f, a, b in self.diff.shape_changes],
            "notes": self.diff.notes,
        }  # fmt: skip


def baseline_gate(d: RunDiff) -> BaselineGate:
    failures: dict[str, list[str]] = {}
    scale = (1 / d.tokens[0], 1 / d.tokens[1]) if d.per_token else (1.0, 1.0)  # type: ignore[operator]
    unit = " a token" if d.per_token else ""
    for k in d.kept:
        failures.setdefault(k.module, [])
        if k.became_full and k.new is not None:
            shapes = ", ".join(k.new.full_shapes) or "shape unknown"
            failures[k.module].append(f"keeps {k.new.full} full-size tensor(s) ({shapes}) the baseline did not keep")
        b = (k.base.bytes if k.base else 0.0) * scale[0]
        n = (k.new.bytes if k.new else 0.0) * scale[1]
        if n > b * (1 + d.bytes_tolerance) + 1e-9 * max(b, 1.0):
            failures[k.module].append(
                f"keeps {human_bytes(k.new.bytes if k.new else 0.0)} across the forward/backward boundary, the "
                f"baseline {human_bytes(k.base.bytes if k.base else 0.0)}"
            )
    for module, (base, new) in d.module_wire.items():
        failures.setdefault(module, [])
        b, n = base * scale[0], new * scale[1]
        if n > b * (1 + d.bytes_tolerance) + 1e-9 * max(b, 1.0):
            failures[module].append(
                f"sends {human_bytes(new)} on the wire per rank and step, the baseline {human_bytes(base)}"
                + (f" ({n:.2f} B{unit} against {b:.2f} B)" if d.per_token else "")
            )
    undecided = None
    if None in d.wire:
        which = " and ".join(w for w, v in zip(("the baseline", "the run"), d.wire) if v is None)
        undecided = (f"the collectives of {which} record no sizes, so whether a module sends more bytes than the "
                     "baseline cannot be told; profile with record_shapes=True")  # fmt: skip
    elif d.undecided:
        where = ", ".join("outside layers" if layer < 0 else f"layer {layer}" for layer, _, _ in d.undecided)
        undecided = (f"{where} hold more bytes than the baseline whose holder the trace does not show (a buffer a "
                     "collective filled: the backend's or the model's); run the model under sptrace.instrument and "
                     "profile two steps")  # fmt: skip
    cases = tuple(ModuleCase(m, tuple(f)) for m, f in sorted(failures.items()))
    return BaselineGate(d, cases, undecided)
