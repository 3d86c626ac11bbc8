"""``sptrace info`` in a fresh process imports only what it needs: the heavy libraries a user
would wait for (pandas, pyarrow.compute's Python wrappers, torch, the dashboard) stay out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trace_helpers import write_gpu_run

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "pyarrow.compute", "torch", "dash", "plotly", "hta")

SCRIPT = """
import json, sys
from sptrace.cli import main
code = main(["info", "--no-cache", "--format", "json", sys.argv[1]])
print(json.dumps({"code": code, "heavy": sorted(m for m in sys.argv[2:] if m in sys.modules)}))
"""


def test_info_imports_no_heavy_library(tmp_path):
    run = write_gpu_run(tmp_path / "run")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run), *HEAVY], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    info = json.loads(out[: out.rindex("\n{")])  # info's own JSON, then the script's line
    result = json.loads(out[out.rindex("\n{") + 1 :])
    assert info["world_size"] == 2 and len(info["per_rank"]) == 2  # the command did its work
    assert result == {"code": 0, "heavy": []}
