"""What a change did: two finished analyses (sptrace.analysis.RunAnalysis) compared by meaning,
never by event order. Communication by (layer, phase, kind), retained memory by module, time by
the ranks' spread, and the declared shape first: each compared in its own module
(sptrace.commchange, sptrace.keptchange, sptrace.timechange), gathered here in a RunDiff.
Rendering is sptrace.report.diff's.

When B or S differ, bytes and time are compared per token (B x S tokens a step) as well, and a
regression is judged per token.

A regression (exit 1) is a module keeping a full-size tensor the baseline did not keep, a layer
keeping more bytes across the forward/backward boundary than the baseline (what autograd or the
model keeps: no classification needed), more wire bytes a step than the baseline beyond
``bytes_tolerance``, or a slower step beyond ``time_tolerance`` and outside both runs' spread
across ranks. It fails closed: more bytes whose holder no evidence shows (sptrace.detect.holders:
undecided) than the baseline had is no verdict (exit 2), never a silent pass. What cannot be
judged (no model declared for the sharding classes, bytes a collective did not record) is said,
never guessed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sptrace.commchange import CommChange, comm_changes, comm_sides, module_wire, wire_per_rank_step
from sptrace.keptchange import KeptChange, kept_changes, kept_per_layer, retained_tensors, undecided_per_layer
from sptrace.timechange import TimeChange, module_time_changes, time_change
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import human_bytes

if TYPE_CHECKING:
    from sptrace.analysis import RunAnalysis

SHAPE_FIELDS = ("scheme", "batch", "seq", "hidden", "sp_size", "heads", "kv_heads", "ffn", "layers", "dtype")
"""ModelShape fields whose change is a change of the job itself, said before anything else."""


@dataclass
class RunDiff:
    base: str
    new: str
    shape_changes: list[tuple[str, object, object]]
    config_changes: list[tuple[str, object, object]]
    tokens: tuple[int | None, int | None]
    """B x S of each run (None: undeclared)."""
    comm: list[CommChange]
    wire: tuple[float | None, float | None]
    """Wire bytes per rank and step of each run (None: no collective recorded its size)."""
    kept: list[KeptChange]
    kept_layers: dict[int, tuple[float, float]]
    """Per layer: bytes the step kept (autograd, the model) at its largest rank and boundary, in
    each run."""
    undecided_layers: dict[int, tuple[float, float]]
    """Per layer (-1: outside layers): bytes alive at the boundary whose holder no evidence shows,
    in each run."""
    time: list[TimeChange]
    module_time: list[TimeChange]
    """Each module's own time, forward and backward (what: "forward layers.0.mlp.fc1"), the
    largest change outside the noise first."""
    module_wire: dict[str, tuple[float, float]]
    """Per module (the collectives' module, "(no module)" without one): wire bytes per rank and
    step in each run (0 where it issued none)."""
    classes: tuple[bool, bool]
    """Whether each run's retained tensors were classed (B, S and H declared)."""
    bytes_tolerance: float
    time_tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def per_token(self) -> bool:
        """B or S differ and both are known: bytes and time are judged per token."""
        a, b = self.tokens
        return a is not None and b is not None and a != b

    @property
    def wire_judged(self) -> tuple[float, float] | None:
        """(base, new) wire bytes per rank and step, per token when the shape changed."""
        a, b = self.wire
        if a is None or b is None:
            return None
        if self.per_token:
            return a / self.tokens[0], b / self.tokens[1]  # type: ignore[operator]
        return a, b

    @property
    def more_bytes(self) -> bool:
        judged = self.wire_judged
        if judged is None:
            return False
        base, new = judged
        return new > base * (1 + self.bytes_tolerance) + 1e-9 * max(base, 1.0)

    @property
    def comm_changed(self) -> list[CommChange]:
        """The collectives that changed, the most wire bytes added or saved first."""
        return sorted((c for c in self.comm if c.changed), key=lambda c: -abs(c.wire_delta))

    @property
    def kept_changed(self) -> list[KeptChange]:
        """The modules whose retained tensors changed: new full-size saves first, then the most
        bytes."""
        return sorted((k for k in self.kept if k.base != k.new), key=lambda k: (not k.became_full, -abs(k.bytes_delta)))

    @property
    def module_time_moved(self) -> list[TimeChange]:
        """Modules' own time changes beyond the noise, the largest first."""
        return [t for t in self.module_time if t.outside_noise]

    @property
    def new_full(self) -> list[KeptChange]:
        return [k for k in self.kept if k.became_full]

    @property
    def slower(self) -> list[TimeChange]:
        return [t for t in self.time if t.what == "step" and t.slower]

    @property
    def kept_more(self) -> list[tuple[int, float, float]]:
        """Layers keeping more bytes than the baseline (per token when B or S changed), beyond
        ``bytes_tolerance``: (layer, base, new)."""
        scale = (1 / self.tokens[0], 1 / self.tokens[1]) if self.per_token else (1.0, 1.0)  # type: ignore[operator]
        tolerance = 1 + self.bytes_tolerance
        return [(layer, b, n) for layer, (b, n) in self.kept_layers.items()
                if n * scale[1] > b * scale[0] * tolerance + 1e-9 * max(b * scale[0], 1.0)]  # fmt: skip

    @property
    def undecided(self) -> list[tuple[int, float, float]]:
        """Layers whose bytes of no known holder grew over the baseline's: (layer, base, new)."""
        return [(layer, b, n) for layer, (b, n) in self.undecided_layers.items() if n > b]

    @property
    def regressions(self) -> list[str]:
        out = [f"{k.module} keeps a full-size tensor the baseline did not" for k in self.new_full]
        unit = " a token" if self.per_token else ""
        out += [f"{'outside layers' if layer < 0 else f'layer {layer}'} keeps more across the forward/backward "
                f"boundary{unit}: {human_bytes(b)} -> {human_bytes(n)}" for layer, b, n in self.kept_more]  # fmt: skip
        if self.more_bytes:
            base, new = self.wire_judged  # type: ignore[misc]
            unit = " a token" if self.per_token else ""
            out.append(f"more wire bytes{unit} a step per rank: {human_bytes(base)} -> {human_bytes(new)}")
        out += [f"a slower {t.what}: {t.relative:+.1%}" for t in self.slower]
        return out

    @property
    def same(self) -> bool:
        """Nothing changed at all (a run against itself)."""
        return not (
            self.shape_changes or self.config_changes or any(c.changed for c in self.comm)
            or any(k.base != k.new for k in self.kept) or any(t.outside_noise for t in self.time)
            or bool(self.module_time_moved)
        )  # fmt: skip

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 2 if self.undecided else 0

    def to_dict(self) -> JSONObject:
        return {
            "base": self.base, "new": self.new, "regression": bool(self.regressions),
            "regressions": self.regressions, "same": self.same,
            "undecided": [{"layer": layer, "base": b, "new": n} for layer, b, n in self.undecided],
            "shape_changes": [{"field": f, "base": a, "new": b} for f, a, b in self.shape_changes],
            "config_changes": [{"key": k, "base": a, "new": b} for k, a, b in self.config_changes],
            "tokens": list(self.tokens), "per_token": self.per_token,
            "wire_bytes_per_rank_step": {"base": self.wire[0], "new": self.wire[1]},
            "communication": [c.to_dict() for c in self.comm if c.changed],
            "retained": [k.to_dict() for k in self.kept if k.base != k.new],
            "retained_per_layer": [{"layer": layer, "base": b, "new": n} for layer, (b, n) in self.kept_layers.items()],
            "time": [t.to_dict() for t in self.time],
            "module_time": [t.to_dict() for t in self.module_time_moved],
            "wire_bytes_per_module": [{"module": m, "base": b, "new": n} for m, (b, n) in self.module_wire.items()],
            "tolerances": {"bytes": self.bytes_tolerance, "time": self.time_tolerance},
            "notes": self.notes,
        }  # fmt: skip


def diff_runs(
    base: RunAnalysis, new: RunAnalysis, *, bytes_tolerance: float = 0.0, time_tolerance: float = 0.05
) -> RunDiff:
    notes: list[str] = []
    shape = [(f, getattr(base.model, f), getattr(new.model, f)) for f in SHAPE_FIELDS
             if getattr(base.model, f) != getattr(new.model, f)]  # fmt: skip
    tokens = (_tokens(base), _tokens(new))
    comm_base, comm_new = comm_sides(base), comm_sides(new)
    comm = comm_changes(comm_base, comm_new)
    retained_base, retained_new = retained_tensors(base, notes, "baseline"), retained_tensors(new, notes, "new run")
    kept_layers = kept_per_layer(retained_base, retained_new)
    undecided_layers = undecided_per_layer(retained_base, retained_new)
    kept = kept_changes(retained_base, retained_new)
    scale = (1 / tokens[0], 1 / tokens[1]) if None not in tokens and tokens[0] != tokens[1] else None
    time = [time_change(what, base, new, time_tolerance, scale) for what in ("step", "transfer", "exposed transfer")]
    wire = (wire_per_rank_step(base, comm_base), wire_per_rank_step(new, comm_new))
    if None in wire:
        notes.append("wire bytes: no collective of the " + ("baseline" if wire[0] is None else "new run") +
                     " recorded its size; bytes are not judged")  # fmt: skip
    if any(x is None for x in tokens) and shape:
        notes.append("B or S is undeclared in a run whose shape changed: bytes and time are compared as they are, "
                     "not per token")  # fmt: skip
    return RunDiff(
        base=base.name if base.path is None else str(base.path), new=new.name if new.path is None else str(new.path),
        shape_changes=shape, config_changes=_config_changes(base, new), tokens=tokens, comm=comm, wire=wire,
        kept=kept, kept_layers=kept_layers, undecided_layers=undecided_layers, time=[t for t in time if t is not None],
        module_time=module_time_changes(base, new, time_tolerance, scale),
        module_wire=module_wire(base, new),
        classes=(base.sharding is not None, new.sharding is not None), bytes_tolerance=bytes_tolerance,
        time_tolerance=time_tolerance, notes=notes,
    )  # fmt: skip


def _tokens(a: RunAnalysis) -> int | None:
    return a.model.batch * a.model.seq if a.model.batch and a.model.seq else None


def _config_changes(base: RunAnalysis, new: RunAnalysis) -> list[tuple[str, object, object]]:
    """run.json's declared configuration, key by key, where both runs have one."""
    a = (base.run.run_info or {}).get("config")
    b = (new.run.run_info or {}).get("config")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
