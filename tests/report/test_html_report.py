"""`sptrace report`: one self-contained HTML file over several runs; a broken run shows its
error and the others still render."""

from __future__ import annotations

import pytest

from sptrace.cli import main

pytestmark = pytest.mark.distributed


def test_report_over_runs(profiled, corpus, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rank0.json").write_text('{"traceEvents": [')
    out = tmp_path / "out" / "report.html"
    args = [
        str(profiled("megatron")),
        str(profiled("megatron-stray-full-save")),
        str(corpus / "param_dlrm_kineto"),
        str(broken),
    ]
    assert main(["report", *args, "--html", str(out)]) == 0
    page = out.read_text()
    assert page.count("* plotly.js v") == 1  # plotly.js inlined once
    assert page.count('class="plotly-graph-div"') >= 3 * 2 + 1
    assert "megatron</a>: collectives MATCH; sharding PASS" in page
    assert "megatron-stray-full-save</a>: collectives MISMATCH (8 findings); sharding FAIL (8 full-size saves)" in page
    assert "layers.1.mlp.fc1 keeps a full-sequence [256x96]" in page
    assert "param_dlrm_kineto</a>: no run.json" in page
    assert "broken</a>: unusable" in page and "invalid JSON: truncated" in page
    assert not list(out.parent.glob(".*"))
    assert main(["report", str(tmp_path / "missing"), "--html", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
