"""What the cost model is made of: collectives, their wire bytes, the estimate of a step, and the
Builder the scheme modules append to (SPEC.md §1-2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sptrace.vocab import collective_kinds
from sptrace.vocab.collective_kinds import wire_bytes
from sptrace.vocab.errors import UsageError
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import ModelShape

PHASES = ("forward", "backward")


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    """One collective a scheme issues, per layer (``per_layer``) or once per step."""

    phase: str  # forward | backward
    kind: str
    module: str  # where in the layer: "attn.qkv", "mlp.fc1", "grad_sync" ...
    what: str  # human description, e.g. "all-gather of the saved input shard (SPEC §1 row 6)"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_bytes: int
    out_bytes: int
    group_size: int
    per_layer: bool = True
    total_only: bool = False
    """Several collectives whose number the model cannot know (gradient buckets with no declared
    bucket cap): the observed ones are compared by their total bytes."""

    @property
    def wire_bytes(self) -> float:
        return wire_bytes(self.kind, self.in_bytes, self.out_bytes, self.group_size)


@dataclass(frozen=True)
class CommEstimate:
    """Everything a scheme communicates in one step."""

    scheme: str  # the label: megatron, ulysses[-zero3], hybrid[-zero3], ring[-zero3], usp[-zero3]
    cfg: ModelShape
    collectives: tuple[CollectiveSpec, ...]
    k: int  # ZeRO-3 parameter gathers per step
    notes: tuple[str, ...] = field(default=())
    grad_bytes: int | None = 4
    """The element size of the gradients replicated weights communicate; None when neither the
    user nor the trace said: their collectives are then compared by count, never by bytes."""

    @property
    def layers(self) -> int:
        return self.cfg.layers

    def count(self, kind: str | None = None, phase: str | None = None, per_layer_only: bool = False) -> int:
        total = 0
        for c in self.collectives:
            if (kind and c.kind != kind) or (phase and c.phase != phase) or (per_layer_only and not c.per_layer):
                continue
            total += self.layers if c.per_layer else 1
        return total

    def wire_per_layer(self, kind: str | None = None, phase: str | None = None) -> float:
        return sum(
            c.wire_bytes
            for c in self.collectives
            if c.per_layer and (not kind or c.kind == kind) and (not phase or c.phase == phase)
        )

    def wire_per_step(self, kind: str | None = None, phase: str | None = None) -> float:
        return sum(
            c.wire_bytes * (self.layers if c.per_layer else 1)
            for c in self.collectives
            if (not kind or c.kind == kind) and (not phase or c.phase == phase)
        )

    def to_dict(self) -> JSONObject:
        return {
            "scheme": self.scheme,
            "config": self.cfg.to_dict(),
            "k": self.k,
            "wire_bytes_per_layer": self.wire_per_layer(),
            "wire_bytes_per_step": self.wire_per_step(),
            "by_kind": {
                kind: {"count": self.count(kind), "wire_bytes": self.wire_per_step(kind)}
                for kind in collective_kinds.names()
                if self.count(kind)
            },
            "collectives": [
                {
                    "phase": c.phase,
                    "kind": c.kind,
                    "module": c.module,
                    "what": c.what,
                    "per_layer": c.per_layer,
                    "count_per_step": self.layers if c.per_layer else 1,
                    "in_shape": list(c.in_shape),
                    "out_shape": list(c.out_shape),
                    "in_bytes": c.in_bytes,
                    "out_bytes": c.out_bytes,
                    "wire_bytes": c.wire_bytes,
                    "group_size": c.group_size,
                }
                for c in self.collectives
            ],
            "notes": list(self.notes),
        }


@dataclass
class Builder:
    """The collectives and notes of one step, appended to in execution order by the scheme
    modules and by grads."""

    cfg: ModelShape
    collectives: list[CollectiveSpec] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(
        self,
        phase: str,
        kind: str,
        module: str,
        what: str,
        in_shape: tuple[int, ...],
        out_shape: tuple[int, ...],
        *,
        per_layer: bool = True,
        elem: int | None = None,
        group: int | None = None,
        total_only: bool = False,
    ) -> None:
        """Append one collective; ``elem`` defaults to the activation dtype's size and ``group``
        to the whole sequence-parallel group."""
        elem = self.cfg.dtype_bytes if elem is None else elem
        group = self.cfg.sp_size if group is None else group
        n_in = elem
        for x in in_shape:
            n_in *= x
        n_out = elem
        for x in out_shape:
            n_out *= x
        self.collectives.append(
            CollectiveSpec(phase, kind, module, what, in_shape, out_shape, n_in, n_out, group, per_layer, total_only)
        )

    def estimate(self, label: str, k: int, grad_bytes: int | None = 4) -> CommEstimate:
        return CommEstimate(label, self.cfg, tuple(self.collectives), k, tuple(self.notes), grad_bytes)


def params_per_layer(cfg: ModelShape) -> dict[str, int]:
    """Weights of one block by module, in elements (no biases; RMSNorm weights)."""
    H, F, a, g, d = cfg.hidden, cfg.ffn, cfg.heads, cfg.kv_heads, cfg.head_dim
    return {
        "norm1": H,
        "attn.qkv": (a + 2 * g) * d * H,
        "attn.proj": H * a * d,
        "norm2": H,
        "mlp.fc1": F * H,
        "mlp.fc2": H * F,
    }


NEEDS = ("scheme", "sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "dtype")
"""What the model of any scheme needs declared (F sizes the MLP's collectives or gradients)."""


def needs(scheme: str | None) -> tuple[str, ...]:
    """NEEDS plus what ``scheme`` alone needs (usp: its Ulysses degree)."""
    return (*NEEDS, "ulysses_degree") if scheme == "usp" else NEEDS


class DeclaresShape(Protocol):
    """Anything that declares a ModelShape (the reference models' StepConfig)."""

    def shape(self) -> ModelShape: ...


def as_shape(cfg: ModelShape | DeclaresShape) -> ModelShape:
    """A ModelShape, or anything that declares one (the reference models' StepConfig)."""
    return cfg if isinstance(cfg, ModelShape) else cfg.shape()


def validate(cfg: ModelShape) -> None:
    """The divisibility ``cfg.scheme`` needs (Megatron-Core's, DeepSpeed's, TransformerEngine's
    and long-context-attention's own checks); the first problem raises a UsageError."""
    P, S, a, g = cfg.sp_size, cfg.seq, cfg.heads, cfg.kv_heads
    split = cfg.seq_split_problem()
    problems = [
        (cfg.hidden % a, f"hidden {cfg.hidden} is not divisible by heads {a}"),
        (a % g, f"heads {a} is not divisible by kv heads {g}"),
        (split is not None, split),
    ]
    if cfg.scheme in ("megatron", "ulysses", "hybrid"):  # heads are split over all P ranks
        problems += [
            (a % P, f"heads {a} is not divisible by the sequence-parallel size {P}"),
            (g % P and P % g, f"kv heads {g} and P={P}: one must divide the other"),
            (cfg.scheme != "ulysses" and cfg.ffn % P, f"ffn {cfg.ffn} is not divisible by P={P}"),
        ]
    elif cfg.scheme == "ring":  # zigzag: 2P chunks of the sequence; heads stay whole
        zigzag = cfg.cp_balance != "none"
        problems.append((zigzag and S % (2 * P), f"seq {S} is not divisible by 2P={2 * P} (the ring's zigzag chunks)"))
    elif cfg.scheme == "usp":  # heads split over U ranks, the sequence zigzagged over R = P/U
        U = cfg.ulysses_degree
        problems.append((U < 1 or P % U, f"the Ulysses degree {U} does not divide the sequence-parallel size {P}"))
        if U >= 1 and not P % U:
            R = P // U
            problems += [
                (a % U, f"heads {a} is not divisible by the Ulysses degree {U}"),
                (g % U and U % g, f"kv heads {g} and the Ulysses degree {U}: one must divide the other"),
                (
                    cfg.cp_balance != "none" and S % (2 * R),
                    f"seq {S} is not divisible by 2R={2 * R} (the ring's zigzag chunks, R = P/U)",
                ),
            ]
    for bad, message in problems:
        if bad:
            raise UsageError(message)
