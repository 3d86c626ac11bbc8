"""The reference models' run configuration: the model, plus what only a reference run has
(injected faults, seed, gradient buckets). ``sptrace profile`` validates flags with it before
launching anything (no torch import here) and writes it to run.json. Analyses never read it:
they read the ModelShape it declares (``StepConfig.shape()``, sptrace.vocab.shape)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sptrace.vocab.dtypes import ACTIVATION_DTYPES, element_size
from sptrace.vocab.errors import ConfigError
from sptrace.vocab.shape import CP_BALANCE, RECOMPUTE, SCHEMES, ModelShape, seq_split_problem

DTYPES = ACTIVATION_DTYPES
REFERENCE_SCHEMES = SCHEMES
# Faults the reference models can inject (reference_models/faults.py implements them).
FAULTS = {
    "stray-full-save": (
        "one column-parallel linear keeps its all-gathered [B, S, H] input for backward, as "
        "PyTorch-native ColwiseParallel after SequenceParallel does, instead of re-gathering "
        "the saved shard"
    ),
    "missing-reduce-scatter": (
        "one MLP runs tensor-parallel WITHOUT sequence parallelism: all-reduce instead of "
        "reduce-scatter, so the residual and the norm input are replicated full-sequence "
        "[B, S, H] on every rank (megatron and hybrid only)"
    ),
    "debug-hook": (
        "a forward hook on one block all-gathers its output across the sequence to log an "
        "activation statistic with autograd on, keeping the full [B, S, H] tensor alive for the "
        "rest of the step"
    ),
}


@dataclass(kw_only=True, frozen=True, slots=True)
class StepConfig:
    """One transformer training step under sequence parallelism (SPEC.md §1 notation)."""

    scheme: str = "megatron"
    """megatron (TP = SP = P), ulysses (DeepSpeed DistributedAttention), hybrid (Ulysses
    attention + Megatron TP/SP MLP), ring (ring attention over P2P) or usp
    (Ulysses over ``ulysses_degree`` ranks, ring attention across P/U of them)."""
    sp_size: int = 8
    """P: the sequence/tensor-parallel group size (the whole world in the reference runs)."""
    layers: int = 2
    """L transformer blocks."""
    batch: int = 2
    """B micro-batch size."""
    seq: int = 128
    """S full sequence length; every rank holds S/P tokens at block boundaries."""
    hidden: int = 96
    """H model width; head_dim = H / heads."""
    heads: int = 16
    """a query heads."""
    kv_heads: int = 8
    """g key/value heads (GQA when g < a; g < P is handled as Megatron and DeepSpeed do)."""
    ffn: int = 160
    """F MLP width. The default keeps F/P != H and a*d/P != H so that no tensor-parallel
    shard has the shape of a full [B, S, H] activation (SPEC.md §5.6)."""
    dtype: str = "float32"
    """Parameter and activation dtype."""
    zero3: bool = False
    """Shard the replicated (Ulysses) parameters with FSDP2 fully_shard instead of
    all-reducing their gradients (ulysses: every parameter; hybrid: attention)."""
    recompute: str = "none"
    """'selective' recomputes core attention in backward (Korthikanti et al. §5)."""
    ulysses_degree: int = 1
    """usp: U, the ranks of one Ulysses group (a divisor of P); the ring spans P/U groups."""
    causal: bool = True
    """A causal attention mask (every scheme); False attends every token to every token."""
    cp_balance: str = "zigzag"
    """ring and usp: the ring's sequence layout, ``zigzag`` (rank r holds chunks r and 2R-1-r of
    2R, Megatron CP's load balancing) or ``none`` (the r-th of R contiguous chunks; R = P/U)."""
    fault: str | None = None
    """A fault from FAULTS injected into one layer, for testing the checks."""
    fault_layer: int | None = None
    """Layer index the fault is injected into (default: the last layer)."""
    grad_bucket_mib: float = 25.0
    """Ulysses gradient all-reduce bucket cap, fp32 MiB (DDP's and DeepSpeed's default)."""
    seed: int = 1234
    """Weights and inputs are drawn from this seed, identically on every rank."""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        need(
            self.scheme in REFERENCE_SCHEMES,
            f"unknown scheme {self.scheme!r}; choose one of {', '.join(REFERENCE_SCHEMES)}",
        )
        need(self.dtype in DTYPES, f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        need(self.recompute in RECOMPUTE, f"unknown recompute {self.recompute!r}; choose one of {', '.join(RECOMPUTE)}")
        for name in ("sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn"):
            need(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        P = self.sp_size
        need(self.hidden % self.heads == 0, f"hidden {self.hidden} is not divisible by heads {self.heads}")
        need(self.head_dim % 2 == 0, f"head dim {self.head_dim} (hidden/heads) must be even for RoPE")
        need(self.heads % self.kv_heads == 0, f"heads {self.heads} is not divisible by kv heads {self.kv_heads}")
        split = seq_split_problem(self.seq, P)
        if split:
            raise ConfigError(split)
        need(self.cp_balance in CP_BALANCE, f"unknown --cp-balance {self.cp_balance!r}; choose one of "
             f"{', '.join(CP_BALANCE)}")  # fmt: skip
        if self.scheme in ("ring", "usp"):  # heads sharded over U only; the zigzag layout: 2P/U chunks
            U = self.ulysses_degree if self.scheme == "usp" else 1
            need(U >= 1 and P % U == 0, f"--ulysses-degree {U} does not divide the sequence-parallel size {P}")
            if self.cp_balance == "zigzag":
                need(self.seq % (2 * P // U) == 0, f"seq {self.seq} is not divisible by 2P/U = {2 * P // U} (zigzag)")
            need(self.heads % U == 0, f"heads {self.heads} is not divisible by the Ulysses degree {U}")
            need(
                self.kv_heads % U == 0 or U % self.kv_heads == 0,
                f"kv heads {self.kv_heads} and Ulysses degree {U}: one must divide the other",
            )
        else:
            need(self.cp_balance == "zigzag", "--cp-balance applies to the ring's layout: --scheme ring or usp")
            need(self.heads % P == 0, f"heads {self.heads} is not divisible by the sequence-parallel size {P}")
            need(
                self.kv_heads % P == 0 or P % self.kv_heads == 0,
                f"kv heads {self.kv_heads} and P={P}: one must divide the other (Megatron and DeepSpeed require it)",
            )
        if self.scheme in ("megatron", "hybrid"):
            need(self.ffn % P == 0, f"ffn {self.ffn} is not divisible by the tensor-parallel size {P}")
        if self.zero3:
            need(
                self.scheme != "megatron",
                "--zero3 applies to ulysses, hybrid, ring and usp (Megatron's TP weights are already sharded)",
            )
        if self.fault is not None:
            need(self.fault in FAULTS, f"unknown fault {self.fault!r}; choose one of {', '.join(FAULTS)}")
            need(
                not (self.fault == "missing-reduce-scatter" and self.scheme in ("ulysses", "ring", "usp")),
                "fault missing-reduce-scatter needs a tensor-parallel MLP: use --scheme megatron or hybrid",
            )
            need(
                self.fault_layer is None or 0 <= self.fault_layer < self.layers,
                f"--fault-layer {self.fault_layer} is outside 0..{self.layers - 1}",
            )
        need(self.grad_bucket_mib > 0, "grad bucket size must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def dtype_bytes(self) -> int:
        size = element_size(self.dtype)
        assert size is not None  # validated in __post_init__
        return size

    def shape(self, source: str = "reference run") -> ModelShape:
        """The ModelShape this run declares: every field known."""
        values = {name: getattr(self, name) for name in (
            "scheme", "zero3", "sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "dtype",
            "recompute", "grad_bucket_mib", "ulysses_degree", "causal", "cp_balance",
        )}  # fmt: skip
        if self.scheme != "usp":  # only USP has a Ulysses degree
            del values["ulysses_degree"]
        if self.scheme not in ("ring", "usp"):  # only a ring has a layout to balance
            del values["cp_balance"]
        return ModelShape(**values, provenance={k: source for k in values})

    @property
    def faulty_layer(self) -> int | None:
        if self.fault is None:
            return None
        return self.layers - 1 if self.fault_layer is None else self.fault_layer

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown step config keys: {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_run_config(cls, data: dict[str, Any]) -> StepConfig:
        """From run.json's "config", which also holds what the run declared beyond the step
        (fault_modules, instrumented ...): those keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> StepConfig:
        return dataclasses.replace(self, **changes)
