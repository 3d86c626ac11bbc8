"""The production shape ``sptrace check --at`` projects the kept bytes to (sptrace.checks.
projection): ``--at seq=131072,hidden=8192,layers=80`` or a ``production:`` block of the same keys
in the --config file or in run.json's config, a later one winning key by key. Batch, P and dtype
stay the measured run's unless given; every other size is unknown unless given (never a guess).
"""

from __future__ import annotations

from sptrace.vocab.dtypes import ACTIVATION_DTYPES, canonical
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import ALIASES, ModelShape, ShapeValues

PRODUCTION_KEYS = ("seq", "hidden", "layers", "batch", "heads", "kv_heads", "ffn", "sp_size", "dtype")
"""What ``--at`` and a ``production:`` block may set (``sp`` and ``kv`` as aliases)."""
KEPT_AS_MEASURED = ("batch", "sp_size", "dtype")
"""The production values that stay the measured run's when not given; heads, kv_heads and ffn not
given are unknown at production (a tensor that needs them stays unprojected, and says so)."""
_SCHEME_FIELDS = ("scheme", "zero3", "recompute", "causal", "cp_balance", "ulysses_degree")
"""What the production shape inherits from the measured run, besides KEPT_AS_MEASURED: how it is
parallelised and recomputed, which Korthikanti's setting reads."""

Production = tuple[tuple[str, ShapeValues], ...]
"""The production values as declared, in order, a later layer winning: (source, values)."""


def parse_at(text: str, source: str = "--at") -> ShapeValues:
    """``seq=131072,hidden=8192,layers=80`` -> the production values; a bad item is a UsageError
    of one line (exit 2)."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UsageError(f"{source}: expected key=value items separated by commas, got {item.strip()!r} "
                             "(e.g. --at seq=131072,hidden=8192,layers=80)")  # fmt: skip
        name = _key(key.strip())
        if name in pairs:
            raise UsageError(f"{source}: {name} given twice")
        pairs[name] = value.strip()
    return production_values(pairs, source)


def production_values(data: object, source: str) -> ShapeValues:
    """A production block's values (a mapping of PRODUCTION_KEYS), checked: integers >= 1, an
    activation dtype. Anything else is a UsageError naming ``source``."""
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of {', '.join(KEY_NAMES)} (seq: 131072, ...), "
                         f"got {type(data).__name__}")  # fmt: skip
    values: ShapeValues = {}
    for key, value in data.items():
        name = _key(str(key))
        if name not in PRODUCTION_KEYS:
            raise UsageError(f"{source}: unknown key {key!r} (known: {', '.join(KEY_NAMES)})")
        if name == "dtype":
            dtype = canonical(value)
            if dtype not in ACTIVATION_DTYPES:
                raise UsageError(f"{source}: dtype {value!r} is not an activation dtype "
                                 f"({', '.join(ACTIVATION_DTYPES)})")  # fmt: skip
            values["dtype"] = dtype
            continue
        number = _integer(value)
        if number is None or number < 1:
            raise UsageError(f"{source}: {key} must be a positive integer, got {value!r}")
        values[name] = number  # type: ignore[literal-required]
    return values


KEY_NAMES = ("seq", "hidden", "layers", "batch", "heads", "kv_heads", "ffn", "sp", "dtype")


def _key(key: str) -> str:
    name = key.strip().lower().replace("-", "_")
    return ALIASES.get(name, name)


def _integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def production_block(document: object) -> object | None:
    """A config document's (or run.json's) ``production:`` block: at its top, or under
    ``config:`` as run.json holds it; None when it has none."""
    if not isinstance(document, dict):
        return None
    if "production" in document:
        return document["production"]
    inner = document.get("config")
    return inner.get("production") if isinstance(inner, dict) else None


def production_declared(run_info: object, given: Production = ()) -> Production:
    """run.json's production block, then ``given`` (a --config file's block, then --at)."""
    block = production_block(run_info)
    layers: list[tuple[str, ShapeValues]] = []
    if block is not None:
        layers.append(("run.json production", production_values(block, "run.json: production")))
    return (*layers, *given)


def production_shape(measured: ModelShape, production: Production) -> ModelShape:
    """The production shape: ``production``'s values, a later layer winning; batch, P and dtype
    the measured run's where none gives them, and its scheme and recompute; every other size
    unknown unless given."""
    kept = {name: getattr(measured, name) for name in (*KEPT_AS_MEASURED, *_SCHEME_FIELDS)}
    target = ModelShape(**{k: v for k, v in kept.items() if v is not None},
                        provenance={k: f"measured ({measured.provenance.get(k, 'the run')})"
                                    for k, v in kept.items() if v is not None})  # fmt: skip
    for source, values in production:
        target = target.override(source, **values)
    return target
