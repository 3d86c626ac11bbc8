"""The ``sptrace`` executable's process ends as soon as its command is done (sptrace.cli.command,
_leave): its output flushed whole, its atexit handlers run, its exit code kept, and nothing after
``command()`` runs; the interpreter's teardown is skipped.

Oracle: the same command run in-process (``main(argv)``), whose output is captured, and a marker
file an atexit handler writes."""

from __future__ import annotations

import json
import subprocess
import sys

from sptrace.cli import main
from tests.load.test_read_ahead import write_trace

PROGRAM = """
import atexit, sys
marker, argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(marker, "w").write("atexit ran"))
sys.argv = ["sptrace", *argv]
from sptrace.cli import command
command()
print("after the command")
"""


def run_cli(tmp_path, *argv):
    marker = tmp_path / "marker"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(marker), *argv], capture_output=True, text=True, timeout=300
    )
    return proc, marker.read_text() if marker.exists() else None


def test_the_output_is_whole_and_the_atexit_handlers_ran(tmp_path, capsys):
    trace = write_trace(tmp_path / "rank0.json.gz", copies=40)
    argv = ["collectives", "--no-cache", "--format", "json", str(trace)]
    assert main(argv) == 0
    here = capsys.readouterr().out
    proc, marker = run_cli(tmp_path, *argv)
    assert proc.returncode == 0 and marker == "atexit ran"
    assert proc.stdout == here and json.loads(proc.stdout)  # (flushed whole)
    assert "after the command" not in proc.stdout


def test_an_error_keeps_its_exit_code_and_message(tmp_path):
    proc, marker = run_cli(tmp_path, "info", str(tmp_path / "missing"))
    assert proc.returncode == 2 and marker == "atexit ran"
    assert proc.stderr.strip() == f"sptrace: error: {tmp_path / 'missing'}: no such file or directory"
    assert proc.stdout == ""
