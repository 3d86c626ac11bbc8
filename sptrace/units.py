"""Units for people: one byte formatter for every report."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as the articles' "MB" are MiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
