"""A cache of parsed event tables: Arrow IPC files, memory-mapped on read.

Keyed by the trace's absolute path, size, mtime and SCHEMA_VERSION, so an edited or replaced
trace, or a new table layout, is parsed again. Entries live in the user's cache directory
(traces are often on read-only storage), are written to a temporary file and renamed, and an
unreadable entry is treated as a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from sptrace.load.schema import SCHEMA_VERSION

_META_KEY = b"sptrace.metadata"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "sptrace"


def _entry(cache_dir: Path, path: Path) -> tuple[Path, str]:
    resolved = path.resolve()
    st = resolved.stat()
    prefix = hashlib.sha1(str(resolved).encode()).hexdigest()[:20]
    return cache_dir / f"{prefix}-{st.st_size}-{st.st_mtime_ns}-v{SCHEMA_VERSION}.arrow", prefix


def read_cached(cache_dir: Path, path: Path) -> tuple[dict[str, Any], pa.Table] | None:
    try:
        entry, _ = _entry(cache_dir, path)
        if not entry.exists():
            return None
        with pa.memory_map(str(entry), "r") as source:
            table = ipc.open_file(source).read_all()
        raw = (table.schema.metadata or {}).get(_META_KEY)
        metadata = json.loads(raw) if raw else {}
        return metadata, table.replace_schema_metadata(None)
    except (OSError, pa.ArrowException, ValueError):
        return None  # a damaged entry is a miss; it is overwritten below


def write_cached(cache_dir: Path, path: Path, metadata: dict[str, Any], table: pa.Table) -> Path | None:
    """Write the entry atomically; returns its path, or None when the cache is not writable."""
    try:
        entry, prefix = _entry(cache_dir, path)
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".tmp-", suffix=".arrow")
        try:
            with os.fdopen(fd, "wb") as sink:
                schema = table.schema.with_metadata({_META_KEY: json.dumps(metadata).encode()})
                with ipc.new_file(sink, schema) as writer:
                    writer.write_table(table.replace_schema_metadata(schema.metadata))
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        for stale in cache_dir.glob(f"{prefix}-*.arrow"):  # older versions of the same trace
            if stale != entry:
                stale.unlink(missing_ok=True)
        return entry
    except OSError:
        return None
