"""The one name for a JSON object as read or written: a trace's metadata as Kineto wrote it,
run.json, a cache entry's header, a report's ``to_dict()``. Only such boundaries use it; what
sptrace passes between its own functions has a real type (a dataclass, a NamedTuple, a TypedDict)."""

from __future__ import annotations

from typing import Any

JSONObject = dict[str, Any]
"""A JSON object as read or written: keys are strings, values whatever JSON holds."""
