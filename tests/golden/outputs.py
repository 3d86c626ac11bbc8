"""What the golden set records of a run: the JSON that `sptrace info`, `collectives`, `analyze`
and `check` print for it, and their exit codes, as ``sptrace.cli.main([...])`` computes them in
this process (never replayed from the result cache: an in-process call always computes).

Only what legitimately differs between machines and checkouts is normalised: the run's path
(``<RUN>``; a single trace file's folder, which ``info`` names, ``<RUN>/..``) and the parsed-trace
cache's (``<CACHE>``). Nothing is rounded or dropped: none of these outputs holds a wall-clock
time (only ``check --format junit`` does, which is not recorded)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sptrace.cli import main

COMMANDS = ("info", "collectives", "analyze", "check")
"""Each run with ``--format json`` and nothing else: a run's own run.json declares its model."""


def outputs(run: Path, cache_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """{command: {"exit_code": int, "output": its parsed JSON, or the error line}} of one run (a
    folder of rank traces or one trace file). ``cache_dir``: where the traces parsed by the first
    command are cached for the others (default: a fresh folder, removed afterwards), so that every
    call parses cold first and then reads its own cache, whatever ran before."""
    run = Path(run).absolute()
    scratch = None
    if cache_dir is None:
        cache_dir = scratch = Path(tempfile.mkdtemp(prefix="sptrace-golden-"))
    try:
        recorded = {command: _one(command, run, cache_dir) for command in COMMANDS}
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return normalise(recorded, _replacements(run, cache_dir))


def _one(command: str, run: Path, cache_dir: Path) -> dict[str, Any]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([command, str(run), "--format", "json", "--cache-dir", str(cache_dir)])
    if stdout.getvalue().strip():
        return {"exit_code": code, "output": json.loads(stdout.getvalue())}
    lines = stderr.getvalue().strip().splitlines()
    # no JSON: a usage or trace error (exit 2), said in one line, the last on stderr
    if code != 2 or not lines or not lines[-1].startswith("sptrace: error: "):
        raise AssertionError(
            f"`sptrace {command} {run}` printed no JSON and no error (exit {code}):\n{stderr.getvalue()}"
        )
    return {"exit_code": code, "output": lines[-1]}


def _replacements(run: Path, cache_dir: Path) -> list[tuple[str, str]]:
    """(path, placeholder), the longest first: a path inside another is replaced before it."""
    pairs = {str(cache_dir): "<CACHE>", str(cache_dir.resolve()): "<CACHE>", str(run): "<RUN>"}
    pairs[str(run.resolve())] = "<RUN>"
    if run.is_file():  # info names the folder of a single trace file
        pairs.setdefault(str(run.parent), "<RUN>/..")
        pairs.setdefault(str(run.resolve().parent), "<RUN>/..")
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def normalise(value: Any, replacements: list[tuple[str, str]]) -> Any:
    """``value`` with the paths in every string (keys too) replaced; everything else as it is."""
    if isinstance(value, str):
        for path, placeholder in replacements:
            value = value.replace(path, placeholder)
        return value
    if isinstance(value, dict):
        return {normalise(k, replacements): normalise(v, replacements) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, replacements) for v in value]
    return value


def dumps(value: Any) -> bytes:
    """The stored form: sorted keys, one line (gzip compresses it; the test compares values)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def differences(old: Any, new: Any, path: str = "$", limit: int = 8) -> list[str]:
    """Up to ``limit`` JSON paths where ``new`` differs from ``old``, with both values. Stricter than
    ``==``: 1, 1.0 and True differ (their JSON does), and NaN equals NaN (its JSON does)."""
    found: list[str] = []
    _diff(old, new, path, found, limit)
    return found


def _diff(old: Any, new: Any, path: str, found: list[str], limit: int) -> None:
    if len(found) >= limit:
        return
    if type(old) is not type(new):
        found.append(f"{path}: {_short(old)} -> {_short(new)}")
    elif isinstance(old, dict):
        for key in sorted(old.keys() | new.keys()):
            if key not in new:
                found.append(f"{path}.{key}: removed (was {_short(old[key])})")
            elif key not in old:
                found.append(f"{path}.{key}: added ({_short(new[key])})")
            else:
                _diff(old[key], new[key], f"{path}.{key}", found, limit)
            if len(found) >= limit:
                return
    elif isinstance(old, list):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(a, b, f"{path}[{i}]", found, limit)
        if len(old) != len(new) and len(found) < limit:
            found.append(f"{path}: {len(old)} items -> {len(new)}")
    elif isinstance(old, float) and math.isnan(old) and math.isnan(new):
        return
    elif old != new:
        found.append(f"{path}: {_short(old)} -> {_short(new)}")


def _short(value: Any, width: int = 100) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."
