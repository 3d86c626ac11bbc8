"""`sptrace report`: one self-contained HTML file over several runs; a broken run shows its
error and the others still render."""

from __future__ import annotations

import re

import pytest

from sptrace.cli import main

pytestmark = pytest.mark.distributed


def test_report_over_runs(profiled, tmp_path, capsys):
    from tests.suite import CORPUS

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rank0.json").write_text('{"traceEvents": [')
    out = tmp_path / "out" / "report.html"
    dlrm = CORPUS / "param_dlrm_kineto"
    args = [str(profiled("megatron")), str(profiled("megatron-stray-full-save")), str(broken)]
    args += [str(dlrm)] if dlrm.is_dir() else []
    assert main(["report", *args, "--html", str(out)]) == 0
    page = out.read_text()
    # the index as text (badges are coloured spans: green for MATCH/PASS, red for MISMATCH/FAIL)
    text = re.sub(r"<span [^>]*>([^<]*)</span>", r"\1", page)
    assert re.search(r'megatron</a>: collectives <span class="badge verdict-pass" style="background:#2f9e44"', page)
    assert 'class="badge verdict-fail" style="background:#e03131"' in page
    assert page.count("* plotly.js v") == 1  # plotly.js inlined once
    assert page.count('class="plotly-graph-div"') >= 3 * 2 + 1
    assert "megatron</a>: collectives MATCH; sharding PASS" in text
    assert "megatron-stray-full-save</a>: collectives MISMATCH; sharding FAIL" in text
    # a finding on every rank is one row with its rank set
    assert page.count("layers.1.mlp.fc1 keeps a full-sequence [256x96]") == 1 and "ranks 0-7" in page
    assert "communication" in page and "of transfer time" in page
    assert "layers.1.mlp.fc1 keeps a full-sequence [256x96]" in page
    if dlrm.is_dir():
        # a foreign run that declares nothing: its ranks are compared with each other, and the
        # sharding check does not run; each says so
        assert "param_dlrm_kineto</a>: collectives CONSISTENT; sharding NOT CHECKED" in text
        assert "the cost model was skipped: checking collectives against the cost model needs --scheme" in page
    assert "broken</a>: unusable" in page and "invalid JSON: truncated" in page
    assert not list(out.parent.glob(".*"))
    assert main(["report", str(tmp_path / "missing"), "--html", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    # nothing could be analysed: exit 2, and no report of errors is written
    lone = tmp_path / "lone.html"
    assert main(["report", str(broken), "--html", str(lone)]) == 2
    assert "no run could be analysed" in capsys.readouterr().err and not lone.exists()
