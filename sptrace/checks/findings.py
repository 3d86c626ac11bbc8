"""What a check found, in one shape for every check and every output format."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str
    """error: the run breaks the scheme's contract; warning: worth a look; info: context."""
    check: str
    """Which check: "collectives", "sharding" ..."""
    code: str
    """Stable identifier: missing-collective, extra-collective, wrong-size, wrong-phase ..."""
    message: str
    rank: int | None = None
    layer: int | None = None
    module: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
