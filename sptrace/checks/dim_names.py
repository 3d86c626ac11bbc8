"""Naming each dimension of a kept tensor by what it is in the model (B, S, S/P, H, F/P, a/P, d,
...: ``SYMBOLS``), so that sptrace.checks.projection can scale it to a production shape:
``read_dims``. A dimension no name fits, one that several names fit with different production
values that neither the tensor's class nor its layout tells apart, and a name whose production
value is unknown leave the tensor unread, with the reason. Never a guess. The rules in full:
docs/check.md ("At production size").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from sptrace.vocab.shape import ModelShape

BASE = ("B", "S", "P", "H", "a", "g", "F")
_BASE_FIELD = {"B": "batch", "S": "seq", "P": "sp_size", "H": "hidden", "a": "heads", "g": "kv_heads", "F": "ffn"}
_BASE_KEY = {"B": "batch", "S": "seq", "P": "sp", "H": "hidden", "a": "heads", "g": "kv_heads", "F": "ffn"}


@dataclass(frozen=True)
class Symbol:
    """What a dimension can be: its name, the quantities it is a product of (``families``: a
    tensor has at most one batch, one head count, one d and one width, and at most two sequence
    dimensions), and its value from the model's base sizes."""

    name: str
    families: tuple[str, ...]
    needs: tuple[str, ...]
    formula: Callable[[Mapping[str, int]], Fraction]

    def value(self, base: Mapping[str, int | None]) -> Fraction | None:
        if any(base.get(k) is None for k in self.needs):
            return None
        return self.formula({k: int(base[k]) for k in self.needs})  # type: ignore[arg-type]


def _sym(name: str, families: str, needs: str, formula: Callable[[Mapping[str, int]], Fraction]) -> Symbol:
    return Symbol(name, tuple(families.split()), tuple(needs.split()), formula)


F_ = Fraction
SYMBOLS: tuple[Symbol, ...] = (
    _sym("B", "batch", "B", lambda v: F_(v["B"])),
    _sym("P*B", "batch", "P B", lambda v: F_(v["P"] * v["B"])),
    _sym("S", "seq", "S", lambda v: F_(v["S"])),
    _sym("S/P", "seq", "S P", lambda v: F_(v["S"], v["P"])),
    _sym("B*S", "batch seq", "B S", lambda v: F_(v["B"] * v["S"])),
    _sym("B*S/P", "batch seq", "B S P", lambda v: F_(v["B"] * v["S"], v["P"])),
    _sym("H", "width", "H", lambda v: F_(v["H"])),
    _sym("H/P", "width", "H P", lambda v: F_(v["H"], v["P"])),
    _sym("F", "width", "F", lambda v: F_(v["F"])),
    _sym("F/P", "width", "F P", lambda v: F_(v["F"], v["P"])),
    _sym("2F", "width", "F", lambda v: F_(2 * v["F"])),
    _sym("2F/P", "width", "F P", lambda v: F_(2 * v["F"], v["P"])),
    _sym("(a+2g)d", "width", "a g H", lambda v: F_((v["a"] + 2 * v["g"]) * v["H"], v["a"])),
    _sym("(a+2g)d/P", "width", "a g H P", lambda v: F_((v["a"] + 2 * v["g"]) * v["H"], v["a"] * v["P"])),
    _sym("a", "heads", "a", lambda v: F_(v["a"])),
    _sym("a/P", "heads", "a P", lambda v: F_(v["a"], v["P"])),
    _sym("g", "heads", "g", lambda v: F_(v["g"])),
    _sym("g/P", "heads", "g P", lambda v: F_(v["g"], v["P"])),
    _sym("B*a", "batch heads", "B a", lambda v: F_(v["B"] * v["a"])),
    _sym("B*a/P", "batch heads", "B a P", lambda v: F_(v["B"] * v["a"], v["P"])),
    _sym("B*g", "batch heads", "B g", lambda v: F_(v["B"] * v["g"])),
    _sym("B*g/P", "batch heads", "B g P", lambda v: F_(v["B"] * v["g"], v["P"])),
    _sym("d", "d", "H a", lambda v: F_(v["H"], v["a"])),
)
"""Every dimension a kept tensor of a sequence-parallel transformer layer has (P shards the
sequence, the heads, or a tensor-parallel width: S/P, a/P, H/P, F/P). A product of two (B*S/P) is
one symbol: the flattened [B*S, H] layouts."""
ONE = "1"
"""A dimension of 1 stays 1, unless it is the batch of a run with B = 1 (a head count of 1, g/P
where P == g, is read as 1: the measured run cannot tell it from a broadcast dimension)."""
_BY_NAME = {s.name: s for s in SYMBOLS}
_FULL_SEQ = frozenset({"S", "B*S"})
_SHARD_SEQ = frozenset({"S/P", "B*S/P"})
_SHARDED = frozenset({"a/P", "g/P", "B*a/P", "B*g/P", "H/P", "F/P", "2F/P", "(a+2g)d/P"})
_SEQ = frozenset({"S", "S/P"})


def base_sizes(model: ModelShape) -> dict[str, int | None]:
    return {k: getattr(model, _BASE_FIELD[k]) for k in BASE}


SCHEME_SHARDS: dict[str, frozenset[str]] = {
    "megatron": frozenset({"S/P", "B*S/P", "a/P", "g/P", "B*a/P", "B*g/P", "H/P", "F/P", "2F/P", "(a+2g)d/P"}),
    "hybrid": frozenset({"S/P", "B*S/P", "a/P", "g/P", "B*a/P", "B*g/P", "H/P", "F/P", "2F/P", "(a+2g)d/P"}),
    "ulysses": frozenset({"S/P", "B*S/P", "a/P", "g/P", "B*a/P", "B*g/P"}),
    "ring": frozenset({"S/P", "B*S/P"}),
}
"""What P divides in each scheme: the sequence always; the heads in Ulysses (and the hybrid); the
tensor-parallel widths in Megatron-LM SP (and the hybrid); nothing else in ring attention. A run
of no declared scheme (or usp, whose heads a Ulysses degree U divides) may have any of them."""
_DIVIDED = frozenset(s.name for s in SYMBOLS if "P" in s.needs and s.name != "P*B")


def symbol_values(base: Mapping[str, int | None], scheme: str | None = None) -> dict[str, int | None]:
    """Each symbol's value (None where a size it needs is unknown or it is not a whole number),
    leaving out the shards ``scheme`` does not make (SCHEME_SHARDS)."""
    shards = SCHEME_SHARDS.get(scheme or "", _DIVIDED)
    out: dict[str, int | None] = {}
    for s in SYMBOLS:
        if s.name in _DIVIDED and s.name not in shards:
            continue
        v = s.value(base)
        out[s.name] = int(v) if v is not None and v.denominator == 1 and v >= 1 else None
    return out


def why_unknown(symbol: str, base: Mapping[str, int | None]) -> str:
    """Why ``symbol`` has no production value: the size to give, or a division that is not whole."""
    s = _BY_NAME[symbol]
    missing = [k for k in s.needs if base.get(k) is None]
    if missing:
        keys = ", ".join(_BASE_KEY[k] for k in missing)
        return f"{symbol} needs {keys} at production (--at {_BASE_KEY[missing[0]]}=N)"
    return f"{symbol} is not a whole number at production ({s.value(base)})"


@dataclass(frozen=True)
class Reading:
    """What a kept tensor's dims are: ``labels`` (one symbol a dimension) and the element count at
    production (``numel``), or ``why`` it stays unprojected."""

    labels: tuple[str, ...] | None
    numel: int | None
    why: str | None = None


def read_dims(
    shape: Sequence[int], cls: str | None, measured: Mapping[str, int | None], production: Mapping[str, int | None],
    production_base: Mapping[str, int | None],
) -> Reading:  # fmt: skip
    """Name each dimension of ``shape`` (measured symbol values ``measured``) and project it
    (``production``). Every reading the families allow is kept; the tensor's class, then the
    layouts (``_canonical``), then a leading batch (``_batch_leads``) choose among them, each only
    where some reading agrees with it; the tensor is projected only when every reading left gives
    the same production element count, and every symbol in them has a production value."""
    candidates: list[list[str]] = []
    for dim in shape:
        names = [name for name, v in measured.items() if v == dim]
        if dim == 1:  # stays 1, or is the batch where B = 1 (the layout decides)
            names = [ONE, *(["B"] if "B" in names else [])]
        if not names:
            return Reading(None, None, f"{dim} is none of the model's dimensions ({_known_text(measured)})")
        candidates.append(names)
    readings = [r for r in itertools.product(*candidates) if _allowed(r)]
    if not readings:
        return Reading(None, None, "no reading of its dims as B, S, S/P, H, heads, d and a width (each once)")
    if cls == "ambiguous" and any(set(r) & _FULL_SEQ for r in readings) and any(set(r) & _SHARD_SEQ for r in readings):
        # the check could not tell a full sequence from a shard: no layout decides it here either
        mixed = _ambiguity(shape, readings)
        if len({_count(r, production) for r in readings}) > 1:
            return Reading(None, None, f"{mixed} (the check could not tell a full sequence from a shard)")
    for prefer in (lambda r: _class_agrees(r, cls), _canonical, _batch_leads):
        chosen = [r for r in readings if prefer(r)]
        readings = chosen or readings
    unknown = sorted({s for r in readings for s in r if s != ONE and production[s] is None})
    counts = {r: _count(r, production) for r in readings}
    ambiguous = _ambiguity(shape, readings) if len(set(counts.values())) > 1 else ""
    if unknown:
        why = "; ".join(why_unknown(s, production_base) for s in unknown)
        return Reading(None, None, why + (f"; {ambiguous}" if ambiguous else ""))
    if ambiguous:
        return Reading(None, None, ambiguous)
    return Reading(readings[0], counts[readings[0]])


def _count(reading: tuple[str, ...], production: Mapping[str, int | None]) -> int | None:
    """The elements of a reading at production (None when a symbol of it has no production value)."""
    if any(s != ONE and production[s] is None for s in reading):
        return None
    return math.prod(1 if s == ONE else int(production[s] or 0) for s in reading)


def _known_text(measured: Mapping[str, int | None]) -> str:
    """'B=2, S=64, S/P=16, H=24, a=4, g=4, d=6, F=32, F/P=8' (what the measured run declares)."""
    names = ("B", "S", "S/P", "H", "a", "g", "d", "F", "F/P")
    return ", ".join(f"{n}={measured[n]}" for n in names if measured.get(n) is not None)


def _allowed(reading: tuple[str, ...]) -> bool:
    """At most one batch, one head count, one d and one width, at most two sequence dims; a width
    is never beside heads or d."""
    families: dict[str, int] = {}
    for name in reading:
        for fam in _BY_NAME[name].families if name != ONE else ():
            families[fam] = families.get(fam, 0) + 1
    if any(n > 1 for fam, n in families.items() if fam != "seq") or families.get("seq", 0) > 2:
        return False
    return not (families.get("width") and (families.get("heads") or families.get("d")))


def _class_agrees(reading: tuple[str, ...], cls: str | None) -> bool:
    """The sharding check's class of the tensor: a full one holds the whole sequence (S), a
    sequence-sharded one S/P, a head-sharded one the whole sequence and a 1/P share of the heads or
    of a width."""
    names = set(reading)
    full, shard = bool(names & _FULL_SEQ), bool(names & _SHARD_SEQ)
    if cls == "full":
        return full and not shard
    if cls == "seq-sharded":
        return shard and not full
    if cls == "head-sharded":
        return full and not shard and bool(names & _SHARDED)
    return True


_BATCHED = frozenset(s.name for s in SYMBOLS if "batch" in s.families)


def _canonical(reading: tuple[str, ...]) -> bool:
    """The layouts a layer's tensors take: [B, S', W], [S', B, W], [B*S', W], [B, h, S', d],
    [B, S', h, d], [S', B, h, d], [B*h, S', d], [B, h, S', S'], [B*h, S', S'], [B, h, S'] (S' the
    sequence, full or a shard; W a width; h a head count): the batch first (or second, after the
    sequence), a width or d last, two sequence dims last and only beside a head count."""
    n = len(reading)
    for i, name in enumerate(reading):
        fams = _BY_NAME[name].families if name != ONE else ()
        if ("width" in fams or "d" in fams) and i != n - 1:
            return False
        if name in _BATCHED and not (i == 0 or (i == 1 and name == "B" and n > 2 and reading[0] in _SEQ)):
            return False
    seq = [i for i, name in enumerate(reading) if name in _SEQ]
    if len(seq) == 2:
        heads = any("heads" in _BY_NAME[x].families for x in reading if x != ONE)
        return heads and seq == [n - 2, n - 1]
    return True


def _batch_leads(reading: tuple[str, ...]) -> bool:
    """The batch leads the layout ([B, ...], [B*S', ...], [S', B, ...]): an activation of the
    layer has a batch dimension; only a table shared by the batch (a rotary table) has none."""
    return bool(reading) and (reading[0] in _BATCHED or (len(reading) > 2 and reading[0] in _SEQ and reading[1] == "B"))


def _ambiguity(shape: Sequence[int], readings: Sequence[tuple[str, ...]]) -> str:
    """'32 could be S or B*S/P' for each dimension the readings left name differently."""
    parts: dict[int, list[str]] = {}
    for i, dim in enumerate(shape):
        names = list(dict.fromkeys(r[i] for r in readings))
        if len(names) > 1 and dim not in parts:
            parts[dim] = names
    return "; ".join(f"{dim} could be {' or '.join(names)}" for dim, names in parts.items())
