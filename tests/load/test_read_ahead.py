"""One rank read ahead on a thread (sptrace.load.native.read_ahead): the next load of the same file
takes its columns instead of reading again; a load of another file, or of the file changed since,
reads for itself; a broken file's error reaches the load. The decoder reads with the GIL released
(the point of the thread), and the command line reads its run's first rank ahead unless the cache
may answer for it.

Oracle: the same file read where it is loaded (``native._columns``), compared column for column."""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import time

import pytest

from sptrace.cli import main
from sptrace.load import native
from sptrace.vocab.errors import TraceError
from tests.load.test_native import kineto_trace
from tests.load.test_native_pieces import plain


@pytest.fixture(autouse=True)
def built():
    if native._kineto is None:
        pytest.skip("the native decoder is not built (no C compiler at install): nothing is read ahead")
    yield
    native.drop_read_ahead()


@pytest.fixture
def reads(monkeypatch):
    """Every reading of a file (``native._columns``), with the thread that made it."""
    made = []
    real = native._columns

    def spy(path, *args, **kwargs):
        made.append((os.path.basename(path), threading.current_thread().name))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(native, "_columns", spy)
    return made


def write_trace(path, copies=1, gz=True, rank=0):
    doc = kineto_trace()
    doc["traceEvents"] = doc["traceEvents"] * copies
    doc["distributedInfo"] = {"rank": rank, "world_size": 3}
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text, 1) if gz else text)
    return path


def test_a_read_ahead_is_taken_by_the_next_load_of_its_file(tmp_path, reads):
    path = write_trace(tmp_path / "rank0.json.gz", copies=50)
    expected = plain(native._columns(path, native.PIECE_BYTES))
    assert native.read_ahead(path)
    assert plain(native.native_columns(tmp_path / "." / "rank0.json.gz")) == expected  # (the same file, another path)
    assert reads == [("rank0.json.gz", "MainThread"), ("rank0.json.gz", "sptrace-read-ahead")]
    native.native_columns(path)  # taken once: the next load reads again
    assert reads[-1] == ("rank0.json.gz", "MainThread")


def test_a_load_of_another_file_drops_the_read_ahead(tmp_path, reads):
    first, second = write_trace(tmp_path / "rank0.json.gz", 20), write_trace(tmp_path / "rank1.json", 3, gz=False)
    native.read_ahead(first)
    assert plain(native.native_columns(second)) == plain(native._columns(second, native.PIECE_BYTES))
    assert native._pending is None
    native.native_columns(first)
    assert [name for name, thread in reads if thread == "MainThread"] == ["rank1.json", "rank1.json", "rank0.json.gz"]


def test_a_file_changed_since_is_read_again(tmp_path, reads):
    path = write_trace(tmp_path / "rank0.json", 5, gz=False)
    native.read_ahead(path)
    native._pending.thread.join()
    write_trace(path, 7, gz=False)  # (another size: another file to the read-ahead)
    assert native.native_columns(path)["n"] == 7 * len(kineto_trace()["traceEvents"])
    assert reads[-1] == ("rank0.json", "MainThread")


def test_a_broken_file_read_ahead_raises_where_it_is_loaded(tmp_path):
    path = write_trace(tmp_path / "rank0.json.gz", 5)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(TraceError) as direct:
        native._columns(path, native.PIECE_BYTES)
    native.read_ahead(path)
    with pytest.raises(TraceError) as ahead:
        native.native_columns(path)
    assert str(ahead.value) == str(direct.value) and "truncated gzip stream" in str(ahead.value)


def test_the_decoder_reads_a_piece_without_the_gil(monkeypatch):
    """With a switch interval longer than the test, a thread that held the GIL through ``feed``
    would keep this one from running until it returned: this one counts while it reads (and
    yields the GIL at each count, sleep(0), for the thread to end)."""
    doc = kineto_trace()
    doc["traceEvents"] = doc["traceEvents"] * 20_000  # (M events and top-level keys too: noted in C)
    text = json.dumps(doc).encode()
    decoder = native._kineto.Decoder()
    reading = threading.Event()
    used = []

    def read() -> None:
        reading.set()
        used.append(decoder.feed(text, last=True))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    try:
        thread = threading.Thread(target=read)
        thread.start()
        reading.wait()
        counted = 0
        while thread.is_alive():
            counted += 1
            time.sleep(0)
        thread.join()
    finally:
        sys.setswitchinterval(old)
    assert used == [len(text)] and decoder.finish()["n"] == len(doc["traceEvents"])
    assert counted > 1000


def test_a_decoder_reads_in_one_thread_at_a_time():
    decoder = native._kineto.Decoder()
    doc = kineto_trace()
    doc["traceEvents"] = doc["traceEvents"] * 20_000
    text = json.dumps(doc).encode()
    errors = []
    thread = threading.Thread(target=lambda: decoder.feed(text, last=True))
    thread.start()
    while thread.is_alive():
        try:
            decoder.feed(b"")
        except RuntimeError as exc:
            errors.append(str(exc))
            break
    thread.join()
    assert errors in ([], ["the decoder is reading a piece in another thread"])  # ([]: the read won the race)
    assert decoder.finish()["n"] == len(doc["traceEvents"])


def test_the_command_line_reads_the_first_rank_ahead(tmp_path, reads, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for rank in range(3):
        write_trace(run / f"rank{rank}.pt.trace.json.gz", 4, rank=rank)
    assert main(["info", "--no-cache", str(run)]) == 0
    assert reads == [
        ("rank0.pt.trace.json.gz", "sptrace-read-ahead"),
        ("rank1.pt.trace.json.gz", "MainThread"),
        ("rank2.pt.trace.json.gz", "MainThread"),
    ]
    read_here = capsys.readouterr().out
    reads.clear()
    cache = tmp_path / "cache"
    assert main(["info", "--cache-dir", str(cache), str(run)]) == 0  # a cold cache: read ahead
    assert reads[0] == ("rank0.pt.trace.json.gz", "sptrace-read-ahead") and len(reads) == 3
    assert capsys.readouterr().out == read_here
    reads.clear()
    assert main(["info", "--cache-dir", str(cache), str(run)]) == 0  # the cache answers: nothing read
    assert reads == [] and native._pending is None
