"""GIVEN sptrace.testing's pytest entry point (``check_sharding`` and the ``sptrace_check``
fixture): a model factory and a step function, spawned on gloo ranks, instrumented, profiled for
two steps and judged by the gate in this process
WHEN a model keeps a stray full-size tensor, keeps none, or a rank raises
THEN the call fails the test with the gate's FAIL lines naming the stray's module, passes a clean
model, or says in one message which rank raised what, with no rank process left running; and bad
arguments are refused before anything starts.

The factories and step functions are module-level functions (the ranks unpickle them by name)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # (a dev dependency)
import pytest

from sptrace.testing import ShardingCheckFailed, SptraceTestError, check_sharding
from sptrace.testing.reference import REFERENCE_SHAPE, reference_model, reference_step

P = 2
REFERENCE = REFERENCE_SHAPE
# PyTorch-native TP + SP (tests.user_models.models): every shard width differs from H
B, S, H, HEADS = 2, 32, 48, 8


# ---- the models the ranks build (module level: the ranks unpickle them by name) ------------------------


def native_tp_sp(rank: int, world_size: int, *, checkpointed: bool = False):
    """tests.user_models.models' Transformer under torchtitan's TP + SP plan (parallelize_module);
    ``checkpointed``: each block under activation checkpointing, which keeps only its input shard."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.checkpoint import checkpoint

    from tests.user_models import models

    torch.manual_seed(0)
    model = models.parallelize_tp_sp(models.Transformer(2, H, HEADS, 4 * H), init_device_mesh("cpu", (world_size,)))
    if checkpointed:
        for block in model.layers:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    model.x = torch.randn(B, S, H).chunk(world_size, dim=1)[rank].contiguous()  # [B, S/P, H]
    return model


def native_step(model, step: int) -> None:
    model(model.x).square().mean().backward()
    model.zero_grad(set_to_none=True)


def raise_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        raise ValueError("no weights for rank 1")
    return reference_model(rank, world_size)


def crash_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSEGV)  # a crash in native code, as gloo's or a kernel's
    return reference_model(rank, world_size)


def hang_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        time.sleep(3600)
    return reference_model(rank, world_size)


def left_running(psutil, run: Path) -> list:
    """Every process still marked as one of this run's ranks, or started by one (the marker
    SPTRACE_TESTING_RUN is inherited), wherever it was reparented."""
    left = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("SPTRACE_TESTING_RUN") == str(run) and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.cmdline())
    return left


# ---- launching ----------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_a_stray_fails_and_a_clean_reference_model_passes(tmp_path):
    # GIVEN the reference Megatron-SP model with the stray-full-save fault (one column-parallel
    # linear keeps its gathered [B, S, H] input) WHEN check_sharding runs it THEN the test fails with
    # the gate's FAIL line naming that linear's layer and module
    stray = functools.partial(reference_model, fault="stray-full-save")
    with pytest.raises(ShardingCheckFailed) as failed:
        check_sharding(stray, reference_step, world_size=P, shape=REFERENCE, out_dir=tmp_path / "stray")
    message = str(failed.value)
    assert "sptrace check said FAIL, expected PASS" in message
    fail_lines = [line for line in message.splitlines() if line.startswith("FAIL ")]
    assert fail_lines and any("layers.1" in line for line in fail_lines), message
    # with the statement that made the kept tensor: instrument notes it (sptrace.makers)
    assert all(re.search(r"; made at reference_models/\w+\.py:\d+ in \w+\(\), kept by layers\.1", line)
               for line in fail_lines), fail_lines  # fmt: skip
    assert message.splitlines()[-1].startswith("FAIL: "), message
    assert failed.value.result.exit_code == 1 and failed.value.result.fail_lines
    # AND the clean model passes, its temporary folder removed
    result = check_sharding(reference_model, reference_step, world_size=P, shape=REFERENCE)
    assert result.passed and result.verdict_line.startswith("PASS: ") and not result.fail_lines, result.text
    assert not result.run_dir.exists()


@pytest.mark.distributed
def test_native_tp_sp_through_the_fixture(sptrace_check):
    # GIVEN PyTorch-native TP + SP (parallelize_module, torchtitan's plan): the plain plan keeps each
    # ColwiseParallel linear's gathered input in every layer (a true stray, tests/user_models)
    shape = {"batch": B, "seq": S, "hidden": H, "heads": HEADS, "ffn": 4 * H, "layers": 2}
    result = sptrace_check(native_tp_sp, native_step, world_size=P, shape=shape, expect="fail")
    # THEN the gate fails, naming the colwise linears of both layers
    assert result.exit_code == 1 and result.run_dir.is_dir()
    fails = [line for line in result.fail_lines if line.startswith("FAIL ")]
    for module in ("attention.wq", "feed_forward.fc1"):
        assert {f"layers.{i}.{module}" for i in (0, 1)} <= {w.rstrip(":,") for f in fails for w in f.split()}, fails
    # AND under activation checkpointing each block keeps only its input shard: it passes
    sptrace_check(functools.partial(native_tp_sp, checkpointed=True), native_step, world_size=P, shape=shape)


@pytest.mark.distributed
def test_a_rank_that_raises_is_one_message_and_nothing_is_left_running(tmp_path):
    started = time.monotonic()
    with pytest.raises(SptraceTestError) as raised:
        check_sharding(raise_on_rank_one, reference_step, world_size=P, shape=REFERENCE, out_dir=tmp_path)
    message = str(raised.value)
    here = f"{Path(__file__)}:"
    assert message.startswith(f"rank 1 raised ValueError: no weights for rank 1 in model_factory at {here}"), message
    assert "the other ranks (0) were stopped" in message and "rank1.log" in message and "\n" not in message
    # rank 0 was blocked in a collective when rank 1 raised: it was stopped, at once
    assert not left_running(psutil, tmp_path)
    assert time.monotonic() - started < 120


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["crash", "timeout"])
def test_a_crashed_or_hung_rank_is_one_message_and_nothing_is_left_running(how, tmp_path):
    factory = crash_on_rank_one if how == "crash" else hang_on_rank_one
    with pytest.raises(SptraceTestError) as raised:
        check_sharding(factory, reference_step, world_size=P, shape=REFERENCE, out_dir=tmp_path,
                       timeout=5 if how == "timeout" else 300)  # fmt: skip
    message = str(raised.value)
    if how == "crash":  # faulthandler's dump names the line
        assert message.startswith(f"rank 1 died of signal SIGSEGV at {Path(__file__)}:"), message
    else:
        assert message.startswith("the ranks ran past the timeout of 5 s: "), message
        assert "1 still running, stopped" in message
    assert "\n" not in message and not left_running(psutil, tmp_path)


# ---- no launch --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ({"batch": 2, "hidden": 48}, "shape lacks 'seq'"),
        ({"batch": 2, "seq": 64}, "shape lacks 'hidden'"),
        ({"batch": 2, "seq": 63, "hidden": 48}, "seq 63 is not divisible by the sequence-parallel size 2"),
        ({"batch": 2, "seq": 64, "hiden": 48}, "'hiden', which is no model field"),
        ({"batch": 2, "seq": 64, "hidden": 0}, "shape['hidden'] must be a positive integer"),
    ],
)
def test_a_bad_shape_is_refused_before_launching(shape, words, tmp_path):
    with pytest.raises(SptraceTestError) as raised:
        check_sharding(reference_model, reference_step, world_size=P, shape=shape, out_dir=tmp_path)
    assert words in str(raised.value)
    assert not os.listdir(tmp_path)  # nothing started, nothing written


def test_an_unpicklable_factory_is_refused_before_launching(tmp_path):
    def nested(rank, world_size):  # not importable by name from another process
        return None

    for factory, name in ((lambda rank, world_size: None, "<lambda>"), (nested, "nested")):
        with pytest.raises(SptraceTestError) as raised:
            check_sharding(factory, reference_step, world_size=P, shape=REFERENCE, out_dir=tmp_path)
        message = str(raised.value)
        assert "model_factory" in message and name in message and "module level" in message, message
    with pytest.raises(SptraceTestError, match=r"step_fn .* cannot be pickled"):
        check_sharding(reference_model, lambda model, i: None, world_size=P, shape=REFERENCE, out_dir=tmp_path)
    assert not os.listdir(tmp_path)


def test_the_fixture_comes_with_the_installed_package(pytestconfig):
    # the pytest11 entry point registers sptrace's plugin in every session; it imports no torch
    assert pytestconfig.pluginmanager.has_plugin("sptrace")
    import subprocess
    import sys

    code = "import sys, sptrace.testing.pytest_plugin; print(sorted({'torch', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_failure_message_is_the_reports_fail_lines_and_verdicts():
    from sptrace.testing import _fail_lines, _verdict_line

    report = "\n".join([
        "RUN: P=2 L=2 B=2 S=64 H=96 (run.json); 2 of 2 ranks", "",
        "FAIL ranks 0-1: layers.1.mlp.fc1 keeps a full-sequence [128x96] float32 tensor; made at model.py:52",
        "    in forward(), kept by layers.1.mlp (MmBackward0)",  # a continuation stays with its line
        "note: a note", "FAIL: 1 full-size tensor kept for backward", "",
        "Collectives (comm):", "  FAIL ranks 0: a missing all-gather", "  FAIL: 1 mismatch",
    ])  # fmt: skip
    assert _fail_lines(report) == [
        "FAIL ranks 0-1: layers.1.mlp.fc1 keeps a full-sequence [128x96] float32 tensor; made at model.py:52",
        "    in forward(), kept by layers.1.mlp (MmBackward0)",
        "  FAIL ranks 0: a missing all-gather",
    ]
    verdicts = "FAIL: 1 full-size tensor kept for backward\nCollectives (comm): FAIL: 1 mismatch"
    assert _verdict_line(report, "") == verdicts
    assert _verdict_line("", "sptrace: error: RUN: no trace") == "sptrace: error: RUN: no trace"


@pytest.mark.distributed
def test_the_readmes_pytest_example_runs_as_written(tmp_path):
    # GIVEN the README's sharding test file, copied as it is into a folder outside the repository
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("**In a pytest suite") :]
    code = section[
        section.index("```python\n") + len("```python\n") : section.index("```\n", section.index("```python"))
    ]
    (tmp_path / "test_sharding.py").write_text(code)
    # WHEN pytest runs it (the installed package brings the sptrace_check fixture)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sharding.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    # THEN both of its tests pass: the clean model passes the gate, the stray fails it as expected
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
