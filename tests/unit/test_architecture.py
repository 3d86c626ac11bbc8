"""The rules docs/architecture.md states, measured on the source: data goes one way through the
stages (no module imports a stage below its own, and no two stages import each other), no module
outside the decoder is over 400 lines, and at most 30 signatures outside the JSON edges take or
return a JSON object, a bare ``Any`` or a bare ``dict``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"sptrace": ROOT / "sptrace", "sptrace.dashboards": ROOT / "dashboards"}

STAGES: tuple[tuple[str, ...], ...] = (
    ("vocab",),
    ("jsonable", "fileio", "cachedir", "costmodel"),
    ("census", "offloading", "makers", "instrumentation"),
    ("load",),
    ("detect",),
    ("run",),
    ("reduce",),
    ("resolve",),
    ("checks",),
    ("analysis",),
    (
        "sweep",
        "timechange",
        "commchange",
        "keptchange",
        "diff",
        "baseline",
        "gpu",
        "lanes",
        "lane_window",
        "whatif",
        "analysis_cache",
    ),
    ("export", "export_events", "export_tracks"),
    ("report",),
    ("dashboards",),
    ("cli", "launch", "profiling", "__main__", "sptrace", "testing"),
)
"""The stages, first to last, as docs/architecture.md draws them: a unit is a top-level module or
package of sptrace (``sptrace`` is the package's own __init__, which re-exports lazily)."""

LEVEL = {unit: i for i, stage in enumerate(STAGES) for unit in stage}
VIEWS_MAY_NOT_IMPORT = ("load", "detect", "run", "reduce", "costmodel")
"""Figures render, they never compute: report/ and the dashboard read RunAnalysis (and the
other results above it), never the stages that compute."""

JSON_EDGES = ("sptrace/load/decode.py", "sptrace/export.py", "sptrace/export_events.py", "sptrace/export_tracks.py")
"""Where JSON-shaped values are the point: the trace decoder and the merged-trace writer (plus every
``to_*`` / ``from_*`` conversion, wherever it is)."""

MAX_LINES = 400
MAX_LOOSE_SIGNATURES = 30


def _modules() -> list[tuple[str, Path]]:
    out = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join([package, *parts]), path))
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "sptrace"


def _imports(path: Path) -> set[str]:
    """Every sptrace module the file imports, at any depth (inside functions and TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "sptrace":
                found |= {f"sptrace.{a.name}" for a in node.names}
            elif node.module.startswith("sptrace."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sptrace.")}
    return found


def test_every_unit_is_placed_in_a_stage() -> None:
    units = {_unit(m) for m, _ in _modules()}
    assert units <= set(LEVEL), f"place {sorted(units - set(LEVEL))} in STAGES and docs/architecture.md"


def test_no_module_imports_a_later_stage() -> None:
    upward = []
    for module, path in _modules():
        unit = _unit(module)
        for target in _imports(path):
            other = _unit(target)
            if other != unit and other in LEVEL and LEVEL[other] > LEVEL[unit]:
                upward.append(f"{path.relative_to(ROOT)} ({unit}) imports {target} ({other})")
    assert not upward, "\n".join(upward)


def test_views_never_import_the_stages_that_compute() -> None:
    computing = []
    for module, path in _modules():
        if _unit(module) in ("report", "dashboards"):
            computing += [f"{path.relative_to(ROOT)} imports {t}" for t in _imports(path)
                          if _unit(t) in VIEWS_MAY_NOT_IMPORT]  # fmt: skip
    assert not computing, "\n".join(computing)


def test_modules_are_small() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for _, p in _modules()}
    long = {path: n for path, n in sizes.items() if n > MAX_LINES and path != JSON_EDGES[0]}
    assert not long, long


def _loose(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation)
    if "JSONObject" in text:
        return True
    bare = {"Any", "dict", "Dict"}
    return any(part.strip() in bare for part in text.split("|"))


def loose_signatures() -> list[str]:
    """Functions (methods and nested ones too) outside the JSON edges that take or return a JSON
    object, a bare Any or a bare dict (``**kwargs: Any`` counts)."""
    out = []
    for _, path in _modules():
        rel = str(path.relative_to(ROOT))
        if rel in JSON_EDGES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if re.match(r"_?(to|from)_", node.name) or node.name in ("__getattr__", "__eq__"):
                continue
            a = node.args
            args = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            if any(_loose(x.annotation) for x in args) or _loose(node.returns):
                out.append(f"{rel}:{node.lineno} {node.name}")
    return out


def test_values_between_stages_are_typed() -> None:
    loose = loose_signatures()
    assert len(loose) <= MAX_LOOSE_SIGNATURES, f"{len(loose)} loose signatures:\n" + "\n".join(loose)


if __name__ == "__main__":  # python -m tests.unit.test_architecture: the list, for whoever types them
    print("\n".join(loose_signatures()))
    pytest.main([__file__, "-q"])
