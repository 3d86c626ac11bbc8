"""GIVEN the package's source folders
WHEN setuptools builds a wheel from pyproject.toml's explicit package list
THEN every folder of Python modules under sptrace/ (and the two installed as sptrace.dashboards
and sptrace.reference_models) is in that list: an editable install finds a folder left out, a
wheel does not ship it."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    dirs = setuptools.get("package-dir", {})
    found = set()
    for name, root in [("sptrace", REPO / "sptrace"), *((n, REPO / d) for n, d in dirs.items())]:
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), f"not in pyproject.toml's packages: {sorted(found - listed)}"
