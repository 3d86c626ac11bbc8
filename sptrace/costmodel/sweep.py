"""The cost model swept over sequence lengths: each scheme's wire bytes per rank and step against
S, at one model's other settings (the first article's table). A run's analysis holds its own
(RunAnalysis.model_sweep), so the HTML report's section and the dashboard's Compare page draw the
same object.
"""

from __future__ import annotations

from dataclasses import dataclass

from sptrace.costmodel.comm import estimate_comm, needs
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import ModelShape

SWEPT_SCHEMES = ("megatron", "ulysses", "hybrid", "ring", "usp")
"""The schemes a model sweep draws, each at the swept model's other settings."""


@dataclass(frozen=True)
class ModelSweep:
    """The cost model's wire bytes per rank and step against sequence length, for each scheme
    at ``model``'s other settings."""

    model: ModelShape
    """The model swept: its every value but the scheme and S holds for every curve."""
    seqs: tuple[int, ...]
    wire_bytes: dict[str, tuple[float | None, ...]]
    """Per curve (USP's named with its Ulysses degree: "usp (U=2)"), per length in ``seqs``: the
    bytes, or None where the scheme cannot split that length (ring's zigzag needs 2P chunks)."""

    def describe(self) -> str:
        """What was swept: "megatron P=8 L=2 B=2 S=128 ... float32, S varied"."""
        return f"{self.model.label} {self.model.describe()}, S varied"


def sweep_model(model: ModelShape, schemes: tuple[str, ...] = SWEPT_SCHEMES) -> ModelSweep | None:
    """The cost model across sequence lengths at ``model``: S/4 to 32 S, those P divides; None
    when the model leaves a value the cost model needs undeclared (a sweep of guessed sizes
    would say nothing of the run). USP takes the model's Ulysses degree when it is a USP run,
    else 2 (1 at an odd P)."""
    if model.missing(needs(model.scheme)):
        return None
    S, P = model.seq or 1, model.sp_size or 1
    seqs = tuple(sorted(s for s in {S * 2**k // 4 for k in range(8)} if s >= P and s % P == 0))
    degree = model.ulysses_degree if model.scheme == "usp" and model.ulysses_degree else 2 if P % 2 == 0 else 1
    curves: dict[str, tuple[float | None, ...]] = {}
    for scheme in schemes:
        zero = "-zero3" if model.zero3 and scheme != "megatron" else ""
        extra = {"ulysses_degree": degree} if scheme == "usp" else {}
        name = f"usp (U={degree})" if scheme == "usp" else scheme
        curves[name] = tuple(_wire(model.override("sweep", scheme=scheme + zero, seq=s, **extra)) for s in seqs)
    return ModelSweep(model, seqs, curves)


def _wire(model: ModelShape) -> float | None:
    try:
        return estimate_comm(model).wire_per_step()
    except UsageError:  # this length does not split evenly for the scheme
        return None
