"""What an analysis knows about the model and the run: ``ModelShape``.

Every field is either declared (by run.json's ``config``, a flag, or read off the trace) or
unknown, and remembers where its value came from. Nothing is filled in from the reference
models' defaults: an analysis that needs a value the user did not declare names the flag to
pass (``ModelShape.require``). The reference models' own run configuration, with its faults,
seeds and buckets, is ``sptrace.reference_models.config.StepConfig``; it declares a full ModelShape.

The rule every scheme shares lives here once: P divides S (``seq_split_problem``, the one sentence
that says it does not), and each rank holds S/P tokens (``ModelShape.local_seq``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from sptrace.vocab.dtypes import ACTIVATION_DTYPES, element_size
from sptrace.vocab.errors import UsageError
from sptrace.vocab.jsontypes import JSONObject

if TYPE_CHECKING:
    from typing_extensions import Unpack

SCHEMES = ("megatron", "ulysses", "hybrid", "ring", "usp")
SCHEME_CHOICES = (
    "megatron", "ulysses", "ulysses-zero3", "hybrid", "hybrid-zero3", "ring", "ring-zero3", "usp", "usp-zero3",
)  # fmt: skip
RECOMPUTE = ("none", "selective")
CP_BALANCE = ("none", "zigzag")
"""Context parallelism's sequence layout: ``none``, rank r holds the r-th of P contiguous chunks;
``zigzag``, chunks r and 2P-1-r of 2P (Megatron CP's load balancing for causal masks)."""

# field -> (flag, what it is)
FIELDS: dict[str, tuple[str, str]] = {
    "scheme": ("--scheme", "megatron, ulysses, hybrid, ring or usp (the -zero3 variants set zero3)"),
    "zero3": ("--scheme ...-zero3", "replicated weights sharded by ZeRO-3 / FSDP2"),
    "sp_size": ("--sp", "P, the sequence-parallel group size"),
    "layers": ("--layers", "L transformer layers"),
    "batch": ("--batch", "B micro-batch"),
    "seq": ("--seq", "S full sequence length"),
    "hidden": ("--hidden", "H model width"),
    "heads": ("--heads", "a query heads"),
    "kv_heads": ("--kv-heads", "g key/value heads (equal to --heads without GQA)"),
    "ffn": ("--ffn", "F MLP width"),
    "dtype": ("--dtype", "activation dtype"),
    "recompute": ("--recompute", "none or selective"),
    "grad_bucket_mib": ("--grad-bucket-mib", "gradient all-reduce bucket cap (DDP's bucket_cap_mb)"),
    "ulysses_degree": ("--ulysses-degree", "U, the ranks of one Ulysses group (usp; the ring spans P/U)"),
    "causal": ("--causal / --no-causal", "whether attention has a causal mask"),
    "cp_balance": ("--cp-balance", "ring and usp: the sequence layout, zigzag (load-balanced) or none (contiguous)"),
}
INT_FIELDS = ("sp_size", "layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "ulysses_degree")
# other spellings a config file may use for a field (run.json's keys are the field names)
ALIASES = {"sp": "sp_size", "kv": "kv_heads", "grad_bucket_mb": "grad_bucket_mib"}


def seq_split_problem(seq: int, sp_size: int) -> str | None:
    """The S % P rule, which every scheme shares: each of the P ranks holds S/P tokens of the
    sequence at block boundaries, so P must divide S. Its one sentence, or None when it holds."""
    if seq % sp_size:
        return f"seq {seq} is not divisible by the sequence-parallel size {sp_size}"
    return None


class ShapeValues(TypedDict, total=False):
    """Declared ModelShape fields by name (a config file's, the flags', what a trace shows):
    the keyword arguments ``ModelShape.override`` takes. None: not declared."""

    scheme: str | None
    zero3: bool | None
    sp_size: int | None
    layers: int | None
    batch: int | None
    seq: int | None
    hidden: int | None
    heads: int | None
    kv_heads: int | None
    ffn: int | None
    dtype: str | None
    recompute: str | None
    grad_bucket_mib: float | None
    ulysses_degree: int | None
    causal: bool | None
    cp_balance: str | None


def config_values(data: object, source: str) -> ShapeValues:
    """The ModelShape fields of a config document: run_info's keys (``seq``, ``sp_size`` ...,
    dashes or underscores, ``sp`` for sp_size), flat or under ``config`` as run.json holds them.
    A key that is no field is an error naming it (a misspelt key must not be silently unknown)."""
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of run_info keys (seq: 4096, hidden: 4096, ...), "
                         f"got {type(data).__name__}")  # fmt: skip
    values: ShapeValues = {}
    unknown = []
    for key, value in data.items():
        name = str(key).replace("-", "_")
        name = ALIASES.get(name, name)
        if name == "production":  # the shape to project to (sptrace.checks.projection), not the run's
            continue
        if name not in FIELDS:
            unknown.append(str(key))
        elif value is not None:
            values[name] = value
    if unknown:
        raise UsageError(f"{source}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(FIELDS)})")  # fmt: skip
    return values


@dataclass(frozen=True)
class Declarations:
    """What the user declared beside run.json, in order (a later layer wins): a config file's
    values, then the flags. Each value keeps its source for the model's provenance.
    ``production``: the shape to project the kept bytes to, in the same order (a config file's
    ``production:`` block, then ``--at``; sptrace.checks.projection)."""

    layers: tuple[tuple[str, ShapeValues], ...]
    production: tuple[tuple[str, ShapeValues], ...] = ()

    def apply(self, model: ModelShape) -> ModelShape:
        for source, values in self.layers:
            model = model.override(source, **values)
        return model


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The analysis configuration (SPEC notation): declared values, or None when unknown."""

    scheme: str | None = None
    zero3: bool | None = None
    sp_size: int | None = None
    layers: int | None = None
    batch: int | None = None
    seq: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    dtype: str | None = None
    recompute: str | None = None
    grad_bucket_mib: float | None = None
    ulysses_degree: int | None = None
    causal: bool | None = None
    cp_balance: str | None = None
    provenance: Mapping[str, str] = field(default_factory=dict)
    """field -> where its value came from ('run.json', '--seq', 'the run's only process group')."""

    def __post_init__(self) -> None:
        if self.scheme is not None and self.scheme not in SCHEMES:
            raise UsageError(f"unknown scheme {self.scheme!r}; choose one of {', '.join(SCHEME_CHOICES)}")
        if self.dtype is not None and self.dtype not in ACTIVATION_DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(ACTIVATION_DTYPES)}")
        if self.recompute is not None and self.recompute not in RECOMPUTE:
            raise UsageError(f"unknown recompute {self.recompute!r}; choose one of {', '.join(RECOMPUTE)}")
        for name in INT_FIELDS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise UsageError(f"{FIELDS[name][0]} must be a positive integer, got {value!r}")
        if self.grad_bucket_mib is not None and not self.grad_bucket_mib > 0:
            raise UsageError("--grad-bucket-mib must be positive")
        if self.causal is not None and not isinstance(self.causal, bool):
            raise UsageError(f"causal must be true or false, got {self.causal!r}")
        if self.cp_balance is not None and self.cp_balance not in CP_BALANCE:
            raise UsageError(f"unknown --cp-balance {self.cp_balance!r}; choose one of {', '.join(CP_BALANCE)}")

    # ---- building ---------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: JSONObject | ShapeValues | None, source: str) -> ModelShape:
        """From run.json's ``config`` (or any dict): known keys are taken, the rest ignored.
        A scheme spelled ``ulysses-zero3`` sets zero3."""
        values: ShapeValues = {}
        for key, value in (data or {}).items():  # dashes or underscores, and the aliases (sp)
            name = str(key).replace("-", "_")
            name = ALIASES.get(name, name)
            if name in FIELDS and value is not None:
                values[name] = value
        if isinstance(values.get("scheme"), str) and values["scheme"].endswith("-zero3"):
            values["scheme"] = values["scheme"].removesuffix("-zero3")
            values["zero3"] = True
        if "scheme" in values and "zero3" not in values:
            values["zero3"] = False  # a scheme named without -zero3 declares no ZeRO-3
        return cls(**values, provenance={k: source for k in values})

    def override(self, source: str, **values: Unpack[ShapeValues]) -> ModelShape:
        """A copy with ``values`` (None entries ignored) declared by ``source``; source "flags"
        labels each value with its own flag (``--seq``). A scheme ``ulysses-zero3`` sets zero3."""
        given = {k: v for k, v in values.items() if v is not None}
        if isinstance(given.get("scheme"), str):
            scheme, _, zero = given["scheme"].partition("-")
            given["scheme"], given["zero3"] = scheme, bool(zero)
        labels = {k: (FIELDS[k][0] if source == "flags" else source) for k in given}
        return dataclasses.replace(self, **given, provenance={**self.provenance, **labels})

    def with_read(self, read: Mapping[str, tuple[object, str]]) -> ModelShape:
        """A copy with the values read off the traces (field -> (value, where it was read)) for the
        fields still unknown: a declared value is never replaced."""
        unknown = {name: value for name, value in read.items() if getattr(self, name) is None}
        if not unknown:
            return self
        values = {name: value for name, (value, _) in unknown.items()}
        sources = {name: source for name, (_, source) in unknown.items()}
        return dataclasses.replace(self, **values, provenance={**self.provenance, **sources})

    # ---- reading ----------------------------------------------------------------------------
    def known(self, name: str) -> bool:
        return getattr(self, name) is not None

    def missing(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if getattr(self, n) is None]

    def require(self, names: Iterable[str], purpose: str) -> None:
        """Raise one line naming the flags to pass when any of ``names`` is unknown."""
        missing = self.missing(names)
        if missing:
            flags = ", ".join(FIELDS[n][0] for n in missing)
            raise UsageError(f"{purpose} needs {flags}, which neither run.json, --config nor a flag declares")

    def why_missing(self, names: Iterable[str], purpose: str) -> str | None:
        missing = self.missing(names)
        if not missing:
            return None
        flags = ", ".join(FIELDS[n][0] for n in missing)
        return f"{purpose} needs {flags}, which neither run.json, --config nor a flag declares"

    @property
    def label(self) -> str:
        if self.scheme is None:
            return "unknown scheme"
        return self.scheme + ("-zero3" if self.zero3 else "")

    @property
    def head_dim(self) -> int | None:
        if self.hidden is None or self.heads is None or self.hidden % self.heads:
            return None
        return self.hidden // self.heads

    @property
    def local_seq(self) -> int | None:
        """S/P, the tokens each rank holds at block boundaries (None unless S and P are declared
        and P divides S)."""
        if self.seq is None or self.sp_size is None or self.seq_split_problem():
            return None
        return self.seq // self.sp_size

    def seq_split_problem(self) -> str | None:
        """The S % P rule's sentence when S and P are declared and P does not divide S, else None."""
        if self.seq is None or self.sp_size is None:
            return None
        return seq_split_problem(self.seq, self.sp_size)

    @property
    def dtype_bytes(self) -> int | None:
        return element_size(self.dtype) if self.dtype else None

    def describe(self) -> str:
        """'P=8 B=2 S=128 H=96 a=16 g=8 F=? float32' (unknown values as '?')."""

        def v(name: str) -> str:
            value = getattr(self, name)
            return "?" if value is None else str(value)

        usp = f" U={v('ulysses_degree')}" if self.scheme == "usp" else ""
        return (
            f"P={v('sp_size')} L={v('layers')} B={v('batch')} S={v('seq')} H={v('hidden')} a={v('heads')} "
            f"g={v('kv_heads')} F={v('ffn')} {v('dtype')}{usp}"
        )

    def to_dict(self) -> JSONObject:
        out = {name: getattr(self, name) for name in FIELDS}
        out["provenance"] = dict(self.provenance)
        return out
