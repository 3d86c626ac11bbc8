"""Units for people: one byte formatter, one time formatter, one number formatter and the rank-set formatters (and their
parser) for every report."""

from __future__ import annotations

import math
from collections.abc import Iterable

from sptrace.vocab.errors import UsageError


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as the articles' "MB" are MiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def significant(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits as ``:.3g`` writes it below 1000 (no trailing zeros), but
    never in an exponent: 1234.7 -> '1235', 12.345 -> '12.3', 4.0 -> '4', 0.012345 -> '0.0123'
    (``:.3g`` writes 1234.7 as '1.23e+03', which no report shows)."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return f"{x:.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def human_ms(ms: float) -> str:
    """12.345 -> '12.3 ms', 0.0456 -> '0.046 ms': a tenth of a millisecond where that is precise
    enough, two significant digits below one (a small step's 0.04 ms is not '0.0 ms')."""
    return f"{ms:.1f} ms" if abs(ms) >= 1 or ms == 0 else f"{significant(ms, 2)} ms"


def rank_text(ranks: Iterable[int], none: str = "no rank") -> str:
    """The one name of a set of ranks every report and view uses: "rank 3", "ranks 0-3, 5";
    ``none`` for the empty set."""
    items = sorted({int(r) for r in ranks})
    if not items:
        return none
    return ("rank " if len(items) == 1 else "ranks ") + rank_ranges(items)


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    items = sorted(set(int(r) for r in ranks))
    out: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(out)


def parse_ranks(text: str) -> tuple[int, ...]:
    """'0-7,63' -> (0, 1, ..., 7, 63): the inverse of rank_ranges (spaces
    allowed). A malformed list is a UsageError naming it."""
    ranks: set[int] = set()
    for part in text.replace(" ", "").split(","):
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise UsageError(f"--ranks {text!r}: {part!r} is neither a rank nor a range such as 0-7") from None
        if first < 0 or last < first:
            raise UsageError(f"--ranks {text!r}: {part!r} is not a range of ranks (from low to high, from 0)")
        ranks.update(range(first, last + 1))
    return tuple(sorted(ranks))


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun that agrees with it: "1 rank", "8 ranks", "1 finding"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
