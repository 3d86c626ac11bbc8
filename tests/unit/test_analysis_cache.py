"""Whole analyses kept on disk for the dashboard (sptrace.analysis_cache): read back only while the
run, the options and the code are unchanged; a damaged entry is a miss; --no-cache keeps none."""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path

import pytest

from sptrace import analysis_cache
from sptrace.analysis import RunAnalysis
from sptrace.run.options import LoadOptions
from sptrace.vocab.shape import Declarations

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "runs" / "megatron"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    out = tmp_path / "megatron"
    shutil.copytree(GOLDEN, out)
    return out


def entries(cache: Path) -> list[Path]:
    return sorted((cache / analysis_cache.SUBDIR).glob("*.analysis"))


def test_an_analysis_is_kept_and_read_back(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    options = {"cache_dir": cache, "workers": 1}
    first = analysis_cache.analyse(run, load_options=options)
    assert isinstance(first, RunAnalysis) and len(entries(cache)) == 1
    # read back: analyse_run is not called again, and what comes back is the same analysis
    monkeypatch.setattr(analysis_cache, "analyse_run", lambda *a, **k: pytest.fail("analysed again"))
    again = analysis_cache.analyse(run, load_options=options)
    assert again is not first
    assert again.facts == first.facts and again.collectives.equals(first.collectives)
    assert again.sharding.verdict.line() == first.sharding.verdict.line()
    # no declaration is one key, however it is spelled (a command's flags left out, the API's None)
    empty = Declarations((("flags", {"seq": None, "dtype": None}),))
    assert analysis_cache.analyse(run, load_options=options, flags=empty).facts == first.facts


def test_sptrace_dash_reads_back_what_the_api_kept(run: Path) -> None:
    """`sptrace dash RUN` (its store's options from the command line) and analyse(RUN) share a key:
    a dashboard started again over a run finds what an earlier one, or a script, kept."""
    from sptrace.dashboards.store import VIEW_PARTS

    from sptrace.cli import build_parser
    from sptrace.cli.common import declarations, load_options

    args = build_parser().parse_args(["dash", str(run)])
    cli = analysis_cache.key_of(run, load_options(args), {"flags": analysis_cache._declared(declarations(args)),
                                                          "parts": VIEW_PARTS})  # fmt: skip
    api = analysis_cache.key_of(run, LoadOptions(), {"flags": analysis_cache._declared(None), "parts": VIEW_PARTS})
    assert cli is not None and cli == api


def test_a_changed_run_options_or_a_damaged_entry_is_a_miss(run: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    options = {"cache_dir": cache, "workers": 1}
    analysis_cache.analyse(run, load_options=options)
    (entry,) = entries(cache)
    # other declarations: another entry beside it
    analysis_cache.analyse(run, load_options=options, flags={"seq": 64})
    assert len(entries(cache)) == 2
    # a trace touched: a new version of the run replaces its entry
    trace = next(run.glob("rank0*"))
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    analysis_cache.analyse(run, load_options=options)
    assert entry not in entries(cache) and len(entries(cache)) == 2
    # a damaged entry is never unpickled: deleted, analysed again, kept again
    (newest,) = [e for e in entries(cache) if e.name.split("-")[0] == entry.name.split("-")[0]]
    data = bytearray(newest.read_bytes())
    data[-10] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert isinstance(analysis_cache.analyse(run, load_options=options), RunAnalysis)
    kept = entries(cache)
    assert len(kept) == 2 and all(zlib.crc32(e.read_bytes()) == int(e.name.split("-")[2][:8], 16) for e in kept)


def test_no_cache_keeps_nothing(run: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    analysis_cache.analyse(run, load_options={"cache_dir": cache, "cache": False, "workers": 1})
    assert entries(cache) == []
