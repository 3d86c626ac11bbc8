"""Shared fixtures. An 8-rank torchrun on 2 CPU cores spends most of its time importing torch
eight times, so each configuration is launched at most once per test session, on first use,
and its traces are shared by every test that needs them."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.suite import CORPUS, DEMO_SCHEMES, NO_CORPUS, REPO, RUNS, WORLD, world_of

# The suite leaves nothing behind: parsed-trace caches (of this process and every process it
# starts) and hypothesis's files go to a scratch folder removed when the session ends.
_SCRATCH = tempfile.mkdtemp(prefix="sptrace-tests-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = os.path.join(_SCRATCH, "cache")
os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.path.join(_SCRATCH, "hypothesis")


class Launches:
    """The suite's torchrun launches, started in the background in the order the tests need them
    (the demo, the 8-rank and 4-rank matrices, the verify job, the user-model job), one at a
    time. Tests that need no launch run first (see pytest_collection_modifyitems): most of them
    use one core, and the launches take the other. A fixture waits for its launch's result.
    Each launch is a subprocess with its output kept, so nothing it prints reaches a test's
    captured output. Only the launches the selected tests need are started."""

    ORDER = ("demo", "ranks8", "ranks4", "user_models", "frameworks", "framework_matrix", "generated")

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="launches-", dir=_SCRATCH))
        self._proc: subprocess.Popen[str] | None = None
        atexit.register(self.stop)
        self._results: dict[str, subprocess.CompletedProcess[str]] = {}
        self._done = {name: threading.Event() for name in self.ORDER}
        self._wanted: set[str] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}  # each launch's wall time, for the summary

    def start(self, wanted: set[str]) -> None:
        with self._lock:
            self._wanted |= wanted
            if self._thread is None and self._wanted:
                self._thread = threading.Thread(target=self._run_all, name="sptrace-launches", daemon=True)
                self._thread.start()

    def _run_all(self) -> None:
        for name in self.ORDER:
            if name in self._wanted:
                self._run(name)

    def _run(self, name: str) -> None:
        if self._done[name].is_set():
            return
        started = time.monotonic()
        try:
            self._results[name] = getattr(self, f"_{name}")()
        except BaseException as exc:  # reported to the test that waits for it
            self._results[name] = subprocess.CompletedProcess([name], 1, "", f"{type(exc).__name__}: {exc}")
        self.seconds[name] = time.monotonic() - started
        self._done[name].set()

    def run(self, cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
        """subprocess.run, in a session of its own that stop() can end with every rank."""
        timeout = kwargs.pop("timeout", None)
        kwargs.pop("capture_output", None)
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                              **kwargs) as proc:  # fmt: skip
            self._proc = proc
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                out, err = proc.communicate()
            finally:
                self._proc = None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def stop(self) -> None:
        """End a launch still running (the session is over, or it ran past its time)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def result(self, name: str) -> subprocess.CompletedProcess[str]:
        self.start({name})
        if not self._done[name].wait(timeout=1800):
            raise TimeoutError(f"the {name} launch did not finish in 30 minutes")
        return self._results[name]

    def out(self, name: str) -> Path:
        return self.root / name

    def _demo(self) -> subprocess.CompletedProcess[str]:
        # one profiled step: the reference runs' tests count one step's collectives and tensors (the
        # default of two is tested on its own, tests/distributed/test_two_steps.py)
        cmd = [sys.executable, "-m", "sptrace", "demo", "--out", str(self.out("demo")), "--warmup", "1", "--steps", "1",
               "--no-serve"]  # fmt: skip
        return self.run(cmd, cwd=REPO, text=True, timeout=900)

    def _matrix(self, world: int) -> subprocess.CompletedProcess[str]:
        group = {n: spec for n, spec in RUNS.items() if world_of(n) == world}
        matrix = self.root / f"matrix{world}.json"
        matrix.write_text(json.dumps({"defaults": {"nproc": world}, "runs": group}, indent=1))
        cmd = [sys.executable, "-m", "sptrace", "profile", "--matrix", str(matrix), "--out",
               str(self.out(f"ranks{world}")), "--warmup", "1", "--steps", "1"]  # fmt: skip
        return self.run(cmd, cwd=REPO, text=True, timeout=900)

    def _ranks8(self) -> subprocess.CompletedProcess[str]:
        return self._matrix(8)

    def _ranks4(self) -> subprocess.CompletedProcess[str]:
        return self._matrix(4)

    def _user_models(self) -> subprocess.CompletedProcess[str]:
        """The user models, after sptrace.reference_models.verify's equivalence and CommDebugMode
        counts, in one 8-rank launch (the eight torch imports are most of a launch's time)."""
        self.out("user_models").mkdir(parents=True, exist_ok=True)
        self.out("verify").mkdir(parents=True, exist_ok=True)
        return _torchrun("tests.user_models.job", self.out("user_models"), self.run,
                         args=("--verify-out", str(self.out("verify"))))  # fmt: skip

    def _frameworks(self) -> subprocess.CompletedProcess[str]:
        """The real Megatron-Core and DeepSpeed-Ulysses layers on 4 gloo ranks (one launch)."""
        self.out("frameworks").mkdir(parents=True, exist_ok=True)
        return _torchrun("tests.user_models.frameworks.job", self.out("frameworks"), self.run, nproc=4)

    def _framework_matrix(self) -> subprocess.CompletedProcess[str]:
        """The real-framework matrix (tests.user_models.frameworks.matrix) on 8 gloo ranks: the
        suite's share, or every framework at P = 2, 4 and 8 where SPTRACE_FRAMEWORK_MATRIX=full
        (CI)."""
        self.out("framework_matrix").mkdir(parents=True, exist_ok=True)
        full = ("--full",) if os.environ.get("SPTRACE_FRAMEWORK_MATRIX") == "full" else ()
        return _torchrun("tests.user_models.frameworks.matrix", self.out("framework_matrix"), self.run, args=full)

    def _generated(self) -> subprocess.CompletedProcess[str]:
        self.out("generated").mkdir(parents=True, exist_ok=True)
        # inductor's cache inside the launch's folder: the compiled draws compile once per launch
        env = {"TORCHINDUCTOR_CACHE_DIR": str(self.out("generated") / "inductor")}
        proc = _torchrun("tests.user_models.generated.job", self.out("generated"), self.run, nproc=8, env=env)
        if proc.returncode != 0:
            return proc
        # the checks of the draws here too, in this thread: they overlap the tests running
        # meanwhile instead of following them
        judged = self.run([sys.executable, "-m", "tests.user_models.generated.judge", str(self.out("generated"))],
                          cwd=REPO, text=True, timeout=900)  # fmt: skip
        return subprocess.CompletedProcess(proc.args, judged.returncode, proc.stdout + judged.stdout,
                                           proc.stderr + judged.stderr)  # fmt: skip


LAUNCHES = Launches()


class RunFactory:
    """Hands out a named reference run's directory once its launch is done: the three clean runs
    come from one `sptrace demo` (the README's main job), whose output is kept; the others from
    one `sptrace profile --matrix` launch per rank count (tests/suite.py lists them)."""

    def __init__(self, launches: Launches) -> None:
        self.launches = launches

    def demo(self) -> subprocess.CompletedProcess[str]:
        result = self.launches.result("demo")
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    def __call__(self, name: str) -> Path:
        if name in DEMO_SCHEMES:
            self.demo()
            return self.launches.out("demo") / name
        launch = f"ranks{world_of(name)}"
        result = self.launches.result(launch)
        assert result.returncode == 0, f"profiling the {launch} runs failed:\n{result.stderr[-3000:]}"
        return self.launches.out(launch) / name


@pytest.fixture(scope="session")
def private_cache() -> Path:
    """Where the suite caches parsed traces (never the user's cache)."""
    return Path(os.environ["XDG_CACHE_HOME"])


@pytest.fixture(scope="session")
def profiled() -> RunFactory:
    return RunFactory(LAUNCHES)


@pytest.fixture(scope="session")
def verify_reports() -> list[dict]:
    """One 8-rank run of sptrace.reference_models.verify: equivalence and CommDebugMode counts."""
    proc = LAUNCHES.result("user_models")  # verify runs first in the user-model launch
    out = LAUNCHES.out("verify")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.loads((out / f"verify_rank{r}.json").read_text()) for r in range(WORLD)]


def _torchrun(
    module: str,
    out: Path,
    run=subprocess.run,
    nproc: int = WORLD,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """An 8-rank gloo job, run again once if a rank died of SIGSEGV: the user-model job crashed so
    once, in one of several full runs on 2 cores, and the rerun and every other run passed (a
    crash in native code, gloo's or the profiler's threads; not reproduced). A crash that repeats,
    and any other failure, fails the test. PYTHONFAULTHANDLER puts a crashed rank's Python stack
    in the output, and the first attempt's output is kept beside the run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", module, "--out", str(out), *args]  # fmt: skip
    proc = run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and "Signal 11 (SIGSEGV)" in proc.stdout + proc.stderr:
        (out.parent / f"{out.name}.first-attempt.log").write_text(proc.stdout + proc.stderr)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        proc = run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return proc


@pytest.fixture(scope="session")
def user_runs() -> Path:
    """One 8-rank run of tests.user_models.job: models written the way users write them (no
    sptrace markers), profiled with plain torch.profiler, each with its oracle beside it."""
    proc = LAUNCHES.result("user_models")
    out = LAUNCHES.out("user_models")
    assert proc.returncode == 0 and (out / "done").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def framework_runs() -> Path:
    """One 4-rank run of tests.user_models.frameworks.job: the real Megatron-Core and
    DeepSpeed-Ulysses layers, clean and with a planted stray, each with its census."""
    proc = LAUNCHES.result("frameworks")
    out = LAUNCHES.out("frameworks")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def matrix_runs() -> Path:
    """One 8-rank run of tests.user_models.frameworks.matrix: real framework layers (Megatron-Core,
    DeepSpeed-Ulysses, PyTorch-native TP + SP, FSDP2 + TP) at colliding shapes, clean and with a
    stray, each with torch's record of what was kept."""
    proc = LAUNCHES.result("framework_matrix")
    out = LAUNCHES.out("framework_matrix")
    assert proc.returncode == 0 and (out / "done").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def generated_runs() -> Path:
    """One 8-rank run of tests.user_models.generated.job: the drawn models (draw.default_count), each with its truth
    and `sptrace check`'s verdict on it (tests.user_models.generated.judge)."""
    proc = LAUNCHES.result("generated")
    out = LAUNCHES.out("generated")
    assert proc.returncode == 0 and (out / "done").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (out / "checks" / "done").exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
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


# Fixtures that launch torchrun jobs (or gloo ranks: sptrace_check, sptrace's own pytest fixture): a
# test that uses one (directly or through another fixture) is marked `distributed`, and every browser
# test `browser`, so that `make test-fast` can leave both out by marker (pytest -m "not distributed
# and not browser").
_LAUNCHING = frozenset({"profiled", "verify_reports", "user_runs", "framework_runs", "matrix_runs", "generated_runs",
                        "sptrace_check"})  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _LAUNCHING & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.distributed)
        if item.nodeid.startswith("tests/browser/"):
            item.add_marker(pytest.mark.browser)

    # the tests that need no launch first, while the launches run; the generator's tests last,
    # so that the tests of earlier launches run while its launch and its checks do (stable: file
    # order otherwise)
    def key(item: pytest.Item) -> tuple[bool, bool]:
        return (item.get_closest_marker("distributed") is not None,
                "generated_runs" in getattr(item, "fixturenames", ()))  # fmt: skip

    items.sort(key=key)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the launches the selected tests need (after -m and -k have deselected)."""
    wanted: set[str] = set()
    for item in session.items:
        used = set(getattr(item, "fixturenames", ()))
        if "profiled" in used:
            wanted |= {"demo", "ranks8", "ranks4"}
        if "user_runs" in used or "verify_reports" in used:
            wanted.add("user_models")
        if "framework_runs" in used:
            wanted.add("frameworks")
        if "matrix_runs" in used:
            wanted.add("framework_matrix")
        if "generated_runs" in used:
            wanted.add("generated")
    if wanted and not session.config.option.collectonly:
        LAUNCHES.start(wanted)


def pytest_terminal_summary(terminalreporter) -> None:
    """How long each launch took: the suite's critical path runs through them."""
    if LAUNCHES.seconds:
        terminalreporter.write_line(
            "launches (background, in order): " + ", ".join(f"{n} {s:.0f} s" for n, s in LAUNCHES.seconds.items())
        )
