"""Writing outputs so that no reader ever sees half a file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write next to the destination, then rename."""
    write_atomic_chunks(path, (data,))


def write_atomic_chunks(path: Path, chunks: Iterable[bytes]) -> int:
    """write_atomic for a stream of chunks (no more than one is held): the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                size += len(chunk)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size
