"""GIVEN any input at all: truncated at a random byte (inside the gzip stream or the JSON), bytes
flipped, fields of the wrong type, numbers beyond 64 bits, NaN and Infinity literals, traceEvents
that is no list, duplicate or out-of-range ranks, empty or non-gzip .gz files, symlink loops
WHEN any command that reads traces runs on it
THEN it exits 0, 1 or 2 (the gate on a truncated trace: 2, never a verdict); an error is one line
naming the file and the problem; never a traceback."""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import os
import socket
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sptrace.cli import main

SHAPE = ["--batch", "2", "--seq", "8", "--hidden", "4", "--sp", "2"]
MODEL = ["--scheme", "megatron", "--layers", "1", "--heads", "2", "--kv-heads", "2", "--ffn", "8", "--dtype",
         "float32"]  # fmt: skip
COMMANDS = (["info"], ["collectives"], ["collectives", "--format", "json"], ["check", *SHAPE],
            ["check", *SHAPE, "--format", "junit"], ["analyze", *SHAPE, *MODEL])  # fmt: skip


def valid_trace(rank: int = 0, world: int = 2) -> dict:
    """A small trace with what every analysis reads: a ProfilerStep, a collective with its gloo
    worker, a memory allocation saved across the boundary, a backward node."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::_allgather_base_", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"Input Dims": [[8, 2, 4], [4, 2, 4]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_gather", "pid": 1, "tid": 9, "ts": 11, "dur": 20,
         "args": {"Input Dims": [[4, 2, 4]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 40, "dur": 3,
         "args": {"Input Dims": [[2, 4, 4], [2, 4, 4]], "Input type": ["float", "float"]}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 41, "s": "t",
         "args": {"Addr": 4096, "Bytes": 128, "Total Allocated": 128, "Device Type": 0, "Device Id": -1}},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MulBackward0", "pid": 1,
         "tid": 1, "ts": 60, "dur": 10},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 65, "s": "t",
         "args": {"Addr": 4096, "Bytes": -128, "Total Allocated": 0, "Device Type": 0, "Device Id": -1}},
    ]  # fmt: skip
    return {"traceEvents": ev, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}}


def run_all(path: Path, gate: tuple[int, ...] = (0, 1, 2)) -> None:
    """Every reading command on ``path``: exit codes 0-2, errors one line naming the path;
    ``gate``: the exit codes `check` may give (a truncated trace is never a PASS, nor a FAIL)."""
    for cmd in COMMANDS:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([cmd[0], str(path), "--no-cache", *cmd[1:]])
        assert code in ((0, 1, 2) if cmd[0] != "check" else gate), (cmd, code)
        errors = [line for line in err.getvalue().splitlines() if line.startswith("sptrace: error:")]
        assert len(errors) <= 1 and "Traceback" not in err.getvalue(), (cmd, err.getvalue())
        if errors:
            assert (code == 2 and str(path.name) in errors[0]) or str(path.parent.name) in errors[0], (cmd, errors)


def write(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    path.write_bytes(data)
    return path


# database=None: no example database (the conftest sends hypothesis's other files to a scratch folder)
# SPTRACE_FUZZ_EXAMPLES=2000 for a long hunt before a release. Each run draws new cases: make test
# 10 per test (it has a time budget), CI (.ci/run) 25
FUZZ = settings(
    max_examples=int(os.environ.get("SPTRACE_FUZZ_EXAMPLES", "10")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
DOC = json.dumps(valid_trace()).encode()


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(DOC) - 1), gz=st.booleans())
def test_truncated_anywhere(cut, gz):
    with tempfile.TemporaryDirectory() as d:
        data = gzip.compress(DOC) if gz else DOC
        name = "rank0.json.gz" if gz else "rank0.json"
        run_all(write(Path(d), name, data[: cut * len(data) // len(DOC)]), gate=(2,))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(DOC) - 1), st.integers(1, 255)), min_size=1, max_size=8),
       gz=st.booleans())  # fmt: skip
@example(flips=[(289, 128)], gz=False)  # invalid UTF-8 inside an args string that the fast path keeps raw
def test_flipped_bytes(flips, gz):
    data = bytearray(gzip.compress(DOC) if gz else DOC)
    for at, mask in flips:
        data[at % len(data)] ^= mask
    with tempfile.TemporaryDirectory() as d:
        run_all(write(Path(d), "rank0.json.gz" if gz else "rank0.json", bytes(data)))


WRONG = st.one_of(
    st.none(), st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["NaN", "Infinity", "-Infinity", "1e30"]),
)  # fmt: skip
FIELDS = ["ts", "dur", "args", "name", "ph", "cat", "pid", "tid", "Input Dims", "Input type", "Addr", "Bytes",
          "Concrete Inputs", "Total Allocated"]  # fmt: skip


@FUZZ
@given(changes=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(FIELDS), WRONG), min_size=1, max_size=4))
@example(changes=[(0, "ts", 1.797693134862316e305), (0, "dur", False)])  # a ts whose ns overflow a double
def test_fields_of_the_wrong_type(changes):
    doc = copy.deepcopy(valid_trace())
    literals = {}
    for i, field, value in changes:
        event = doc["traceEvents"][i]
        target = (
            event if field in ("ts", "dur", "args", "name", "ph", "cat", "pid", "tid") else event.setdefault("args", {})
        )
        if not isinstance(target, dict):
            continue
        if value in ("NaN", "Infinity", "-Infinity", "1e30"):  # non-JSON literals, written verbatim
            token = f"__LITERAL_{len(literals)}__"
            literals[token] = value
            value = token
        target[field] = value
    text = json.dumps(doc)
    for token, literal in literals.items():
        text = text.replace(f'"{token}"', literal)
    with tempfile.TemporaryDirectory() as d:
        run_all(write(Path(d), "rank0.json", text.encode()))


@FUZZ
@given(top=st.one_of(WRONG, st.just([1, 2])), world=WRONG, rank=WRONG)
def test_the_top_level_of_the_wrong_type(top, world, rank):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        run_all(write(root, "rank0.json", json.dumps({"traceEvents": top}).encode()))
        doc = valid_trace()
        doc["distributedInfo"].update(world_size=world, rank=rank)
        run_all(write(root, "rank1.json", json.dumps(doc).encode()))


def test_runs_that_do_not_add_up(tmp_path):
    cases = {
        "duplicate": [("rank0.json", valid_trace(0)), ("rank1.json", valid_trace(0))],  # two claim rank 0
        "outside": [("rank0.json", valid_trace(0)), ("rank5.json", valid_trace(5))],  # world of 2
        "worlds": [("rank0.json", valid_trace(0, 2)), ("rank1.json", valid_trace(1, 4))],
        "huge": [("rank0.json", valid_trace(0, 2**60))],  # listing its missing ranks would never end
        "none": [("rank0.json", valid_trace(0, 0))],
    }
    for name, files in cases.items():
        root = tmp_path / name
        root.mkdir()
        for fname, doc in files:
            write(root, fname, json.dumps(doc).encode())
        for cmd in COMMANDS:
            assert main([cmd[0], str(root), "--no-cache", *cmd[1:]]) == 2, (name, cmd)
    # empty, and not gzip at all, behind a .gz name
    for fname, data in (("rank0.json.gz", b""), ("rank1.json.gz", b"{}not gzip")):
        root = tmp_path / fname.replace(".", "_")
        root.mkdir()
        run_all(write(root, fname, data))
        assert main(["info", str(root / fname), "--no-cache"]) == 2


def test_symlink_loops_and_unreadable_files(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.mkdir()
    os.symlink(loop / "rank0.json", loop / "rank0.json")  # points at itself
    assert main(["info", str(loop), "--no-cache"]) == 2
    assert main(["info", str(loop / "rank0.json"), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("sptrace: error:") == 2 and "Traceback" not in err
    # a file no one may read: mode 0, or (root reads every file) a socket, which open() refuses to all
    locked = tmp_path / "locked"
    locked.mkdir()
    path = locked / "rank0.json"
    if os.geteuid() == 0:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
        assert main(["info", str(path), "--no-cache"]) == 2
    else:
        write(locked, "rank0.json", DOC).chmod(0)
        assert main(["info", str(locked), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "rank0.json" in err and err.count("sptrace: error:") == 1 and "Traceback" not in err
