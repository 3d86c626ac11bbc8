"""A --matrix file of ``sptrace profile``: named runs, each a StepConfig and how it is launched
and recorded, every value checked before anything launches."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

from sptrace.cli.reference_flags import config_values
from sptrace.reference_models.config import StepConfig
from sptrace.vocab.errors import UsageError
from sptrace.vocab.jsontypes import JSONObject

# What a --matrix run may set, beside StepConfig's fields: how it is launched and recorded.
_RUN_KEYS = ("nproc", "instrument", "lean")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


_FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "float": float, "bool": bool, "str": str}.get(str(f.type).split(" |")[0], object)
    for f in dataclasses.fields(StepConfig)
}


def _is(value: object, want: type) -> bool:
    if want is bool or isinstance(value, bool):
        return isinstance(value, want)
    return isinstance(value, int if want is int else (int, float) if want is float else want)


def matrix_runs(path: Path, args: argparse.Namespace) -> list[tuple[str, StepConfig, bool, bool]]:
    """(name, config, instrument, lean) of each run of a --matrix file, every value checked."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--matrix {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--matrix {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict) or not data["runs"]:
        raise UsageError(f'--matrix {path}: expected {{"runs": {{"NAME": {{...}}, ...}}}} with at least one run')
    unknown_top = sorted(set(data) - {"runs", "defaults"})
    if unknown_top:
        raise UsageError(f"--matrix {path}: unknown key {unknown_top[0]!r} (expected runs, defaults)")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise UsageError(f"--matrix {path}: defaults must be an object")
    fields = {f.name for f in dataclasses.fields(StepConfig)} - {"sp_size"}
    out = []
    for name, spec in data["runs"].items():
        where = f"--matrix {path}: run {name!r}"
        if not _NAME.fullmatch(name):
            raise UsageError(f"{where}: a run's name is a folder name (letters, digits, . _ + -)")
        if not isinstance(spec, dict):
            raise UsageError(f"{where}: expected an object of flags")
        merged: JSONObject = {}  # the run's keys over the defaults', as the file holds them
        for key, value in [*defaults.items(), *spec.items()]:
            key = key.replace("-", "_")
            if key not in fields and key not in _RUN_KEYS:
                raise UsageError(f"{where}: unknown key {key!r}")
            merged[key] = value
        if "scheme" not in merged:
            raise UsageError(f"{where}: no scheme")
        for key, value in merged.items():
            want = _FIELD_TYPES.get(key)
            if want is not None and value is not None and not _is(value, want):
                raise UsageError(f"{where}: {key} must be {want.__name__}, got {value!r}")
        nproc = merged.pop("nproc", args.nproc)
        instrument = merged.pop("instrument", not args.no_instrument)
        lean = merged.pop("lean", args.lean)
        if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
            raise UsageError(f"{where}: nproc must be an integer >= 1")
        for flag, value in (("instrument", instrument), ("lean", lean)):
            if not isinstance(value, bool):
                raise UsageError(f"{where}: {flag} must be true or false")
        try:
            cfg = StepConfig(**{**config_values(args, str(merged["scheme"]), nproc), **merged})
        except TypeError as exc:
            raise UsageError(f"{where}: {exc}") from None
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        out.append((name, cfg, instrument, lean))
    return out
