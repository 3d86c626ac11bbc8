"""Shared fixtures. An 8-rank torchrun on 2 CPU cores spends most of its time importing torch
eight times, so each configuration is launched at most once per test session, on first use,
and its traces are shared by every test that needs them."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sptrace.cli import main as sptrace_main
from tests.suite import CORPUS, DEMO_SCHEMES, NO_CORPUS, REPO, RUNS, WORLD, world_of

# The suite leaves nothing behind: parsed-trace caches (of this process and every process it
# starts) and hypothesis's files go to a scratch folder removed when the session ends.
_SCRATCH = tempfile.mkdtemp(prefix="sptrace-tests-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = os.path.join(_SCRATCH, "cache")
os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.path.join(_SCRATCH, "hypothesis")


class RunFactory:
    """Profiles a named configuration on first request and hands out its directory: the three
    clean runs come from one `sptrace demo` (the README's main job), whose output is kept; the
    others from one `sptrace profile --matrix` launch per rank count, all of whose runs are
    profiled on the first request of one of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, Path] = {}
        self.demo_output: subprocess.CompletedProcess[str] | None = None

    def demo(self) -> subprocess.CompletedProcess[str]:
        if self.demo_output is None:
            out = self.root / "demo"
            cmd = [sys.executable, "-m", "sptrace", "demo", "--out", str(out), "--warmup", "1", "--no-serve"]
            self.demo_output = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
            assert self.demo_output.returncode == 0, self.demo_output.stderr[-3000:]
            for scheme in DEMO_SCHEMES:
                self._done[scheme] = out / scheme
        return self.demo_output

    def __call__(self, name: str) -> Path:
        if name in DEMO_SCHEMES:
            self.demo()
        if name not in self._done:
            world = world_of(name)
            group = {n: spec for n, spec in RUNS.items() if world_of(n) == world}
            out = self.root / f"ranks{world}"
            matrix = self.root / f"matrix{world}.json"
            matrix.write_text(json.dumps({"defaults": {"nproc": world}, "runs": group}, indent=1))
            code = sptrace_main(["profile", "--matrix", str(matrix), "--out", str(out), "--warmup", "1"])
            assert code == 0, f"profiling the {world}-rank runs failed; see {out}/*/logs"
            self._done.update({n: out / n for n in group})
        return self._done[name]


@pytest.fixture(scope="session")
def private_cache() -> Path:
    """Where the suite caches parsed traces (never the user's cache)."""
    return Path(os.environ["XDG_CACHE_HOME"])


@pytest.fixture(scope="session")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> RunFactory:
    return RunFactory(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="session")
def verify_reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One 8-rank run of sptrace.reference_models.verify: equivalence and CommDebugMode counts."""
    out = tmp_path_factory.mktemp("verify")
    proc = _torchrun("sptrace.reference_models.verify", out)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.loads((out / f"verify_rank{r}.json").read_text()) for r in range(WORLD)]


def _torchrun(module: str, out: Path) -> subprocess.CompletedProcess[str]:
    """An 8-rank gloo job, run again once if a rank died of SIGSEGV: the user-model job crashed so
    once, in one of several full runs on 2 cores, and the rerun and every other run passed (a
    crash in native code, gloo's or the profiler's threads; not reproduced). A crash that repeats,
    and any other failure, fails the test. PYTHONFAULTHANDLER puts a crashed rank's Python stack
    in the output, and the first attempt's output is kept beside the run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           "-m", module, "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and "Signal 11 (SIGSEGV)" in proc.stdout + proc.stderr:
        (out.parent / f"{out.name}.first-attempt.log").write_text(proc.stdout + proc.stderr)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return proc


@pytest.fixture(scope="session")
def user_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 8-rank run of tests.user_models.job: models written the way users write them (no
    sptrace markers), profiled with plain torch.profiler, each with its oracle beside it."""
    out = tmp_path_factory.mktemp("user_models")
    proc = _torchrun("tests.user_models.job", out)
    assert proc.returncode == 0 and (out / "done").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        if os.environ.get("SPTRACE_REQUIRE_CORPUS"):  # CI: the corpus must be there
            pytest.fail(NO_CORPUS)
        pytest.skip(NO_CORPUS)
    return CORPUS


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A private table cache, so tests never touch the user's ~/.cache."""
    return tmp_path / "cache"


# Fixtures that launch torchrun jobs: a test that uses one (directly or through another fixture)
# is marked `distributed`, and every browser test `browser`, so that `make test-fast` can leave
# both out by marker (pytest -m "not distributed and not browser").
_LAUNCHING = frozenset({"profiled", "verify_reports", "user_runs"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _LAUNCHING & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.distributed)
        if item.nodeid.startswith("tests/browser/"):
            item.add_marker(pytest.mark.browser)
