"""Units for people: one byte formatter and one rank-set formatter for every report."""

from __future__ import annotations

from collections.abc import Iterable


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as the articles' "MB" are MiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


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


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun that agrees with it: "1 rank", "8 ranks", "1 finding"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
