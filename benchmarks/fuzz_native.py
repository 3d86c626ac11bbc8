"""The native decoder (sptrace/load/_kineto.c) under AddressSanitizer and UndefinedBehaviorSanitizer.

It parses untrusted files, so it is built here a second time with ``-fsanitize=address,undefined``
and fed, for ``--seconds``, documents drawn by hypothesis (tests/load/test_native.py's event
strategy) and mutations of real traces (byte flips, cuts, inserted JSON tokens, splices, repeated
spans). Any sanitizer report stops the run with its exit code, and so does an exception that the
decoder lets out (it returns columns or declines with None; a bad trace is never a crash).

    python benchmarks/fuzz_native.py --seconds 90            # what CI runs (.ci/run)
    python benchmarks/fuzz_native.py --seconds 3600 --seeds ../shared/corpus   # a longer hunt

Exit 0: no report. 1: a report or a crash (the input is saved beside --keep). 2: cannot run here
(no C compiler, no sanitizer runtime). Needs gcc or clang with their sanitizer runtimes, and
Linux (the runtime is preloaded into a child Python: the interpreter itself is not sanitized).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "sptrace" / "load" / "_kineto.c"
ASAN_EXIT, UBSAN_EXIT = 86, 87
# tokens a JSON reader must get right at any position
TOKENS = [b'"', b"\\", b"\\u", b"\\ud800", b"{", b"}", b"[", b"]", b",", b":", b"-", b".", b"e", b"E+", b"0",
          b"123456789012345678901234567890", b"1e999", b"-0.0001", b"null", b"true", b"\xff", b"\xc3", b"\x00",
          b'"ts":', b'"args":{', b'"ph":"X"', b'"Input Dims":[[', b" " * 64]  # fmt: skip


def build(source: Path, out_dir: Path, cc: str) -> Path:
    """The extension, with both sanitizers, no recovery: the first report aborts."""
    target = out_dir / ("_kineto" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [cc, "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
           "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
           f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target)]  # fmt: skip
    subprocess.run(cmd, check=True)
    return target


def runtime(cc: str, name: str) -> str | None:
    found = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if found and os.path.isabs(found) and os.path.exists(found) else None


def seeds(dirs: list[Path], rng: random.Random, count: int = 400) -> list[bytes]:
    """Small documents cut from real traces: each trace's metadata with a window of up to 64 of its
    events, in Kineto's own key order and layout (whole traces decode too slowly under ASan to be
    mutated often)."""
    import gzip

    traces = []
    for d in dirs:
        for path in sorted(d.rglob("*")):
            if path.name.endswith((".json", ".json.gz")):
                data = path.read_bytes()
                doc = json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)
                if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]:
                    traces.append(doc)
    out = []
    for _ in range(count if traces else 0):
        doc = rng.choice(traces)
        evs = doc["traceEvents"]
        start = rng.randrange(len(evs))
        window = {
            **{k: v for k, v in doc.items() if k != "traceEvents"},
            "traceEvents": evs[start : start + rng.randint(1, 64)],
        }
        out.append(json.dumps(window, indent=rng.choice([None, 1, 2])).encode())
    return out


def mutate(rng: random.Random, doc: bytes, other: bytes) -> bytes:
    data = bytearray(doc)
    for _ in range(rng.randint(1, 6)):
        if not data:
            data = bytearray(rng.choice(TOKENS))
        at = rng.randrange(len(data))
        op = rng.randrange(6)
        if op == 0:  # flip bits
            data[at] ^= rng.randint(1, 255)
        elif op == 1:  # cut
            del data[at:]
        elif op == 2:  # insert a token
            data[at:at] = rng.choice(TOKENS)
        elif op == 3:  # delete a span
            del data[at : at + rng.randint(1, 64)]
        elif op == 4 and other:  # splice another document in
            s = rng.randrange(len(other))
            data[at:at] = other[s : s + rng.randint(1, 4096)]
        else:  # repeat a span
            data[at:at] = data[at : at + rng.randint(1, 256)] * rng.randint(1, 8)
    return bytes(data)


def child(args: argparse.Namespace) -> int:
    """Runs with the sanitizer runtime preloaded: feed documents until the time is up."""
    maps = Path("/proc/self/maps").read_text()
    if "libasan" not in maps or "libubsan" not in maps:
        print("fuzz_native: the sanitizer runtimes are not loaded", file=sys.stderr)
        return 2
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("_kineto", args.module)
    spec = importlib.util.spec_from_file_location("_kineto", args.module, loader=loader)
    assert spec is not None
    native = importlib.util.module_from_spec(spec)
    loader.exec_module(native)
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from sptrace.load import decode
    from sptrace.vocab.errors import TraceError
    from tests.load.test_native import events, kineto_trace
    from tests.load.test_native_pieces import in_pieces, plain  # (through decode._kineto: the sanitized build)

    decode._kineto = native  # decode_native's column conversion runs on the sanitized buffers too
    path = Path(args.keep)
    fed = {"drawn": 0, "mutated": 0}

    def feed(data: bytes) -> None:
        path.write_bytes(data)  # written first: a crash leaves the input behind
        try:
            decode.decode_native(path, data)
        except TraceError:
            pass  # read, and found wanting (an event without ts ...), as the msgspec path says
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(1, 6)))
        if plain(in_pieces(data, cuts)) != plain(native.decode(data)):
            raise AssertionError(f"fuzz_native: read in pieces at {cuts}, {path} decodes otherwise than whole")

    deadline = time.monotonic() + args.seconds
    rng = random.Random(args.seed)
    corpus = [json.dumps(kineto_trace(), indent=i).encode() for i in (None, 2)]
    if args.seed_file:  # cut by the parent, which is not slowed by the sanitizers
        corpus += pickle.loads(Path(args.seed_file).read_bytes())

    @settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(events(), min_size=1, max_size=40), st.sampled_from([None, 0, 2]), st.booleans())
    def drawn(evs, indent, ascii_only):
        feed(json.dumps({"traceEvents": evs}, indent=indent, ensure_ascii=ascii_only).encode())
        fed["drawn"] += 1

    drawn_until = time.monotonic() + args.seconds * 0.4  # 40% drawn, the rest mutated
    while time.monotonic() < drawn_until:
        drawn()  # an exception the decoder lets out fails the run (after hypothesis shrinks it)
    while time.monotonic() < deadline:
        base, other = rng.choice(corpus), rng.choice(corpus)
        feed(mutate(rng, base, other))
        fed["mutated"] += 1
    print(f"fuzz_native: {fed['drawn']} drawn and {fed['mutated']} mutated documents, no sanitizer report", flush=True)
    path.unlink(missing_ok=True)
    return 0


PLANT_AFTER = "    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;\n"
PLANT = (
    "    if (view.len % 5 == 3) {\n"
    "        char *c = malloc(view.len); memcpy(c, view.buf, view.len); c[view.len] = 1; free(c);\n"
    "    }\n"
)


def planted_overflow_fails(args: argparse.Namespace) -> bool:
    """A copy of the decoder that writes one byte past a heap buffer on some inputs: a run on it
    must fail with ASan's report within a few seconds."""
    source = Path(args.source).read_text()
    if PLANT_AFTER not in source:
        raise SystemExit(f"fuzz_native: {args.source} has changed; update PLANT_AFTER")
    with tempfile.TemporaryDirectory(prefix="fuzz-native-plant-") as tmp:
        planted = Path(tmp) / "_kineto_planted.c"
        planted.write_text(source.replace(PLANT_AFTER, PLANT_AFTER + PLANT, 1))
        cmd = [sys.executable, __file__, "--seconds", "10", "--source", str(planted), "--keep", str(Path(tmp) / "in"),
               "--cc", args.cc]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
    caught = proc.returncode == 1 and "AddressSanitizer: heap-buffer-overflow" in proc.stderr
    print(f"fuzz_native: self-check: a planted heap overflow is {'reported' if caught else 'NOT reported'}", flush=True)
    return caught


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--seeds", nargs="*", default=[], help="folders of traces to mutate (e.g. ../shared/corpus)")
    p.add_argument("--seed", type=int, default=int(time.time()), help="the mutation generator's seed")
    p.add_argument("--source", default=str(SOURCE), help="the C file to build (default: the decoder)")
    p.add_argument("--keep", default="fuzz-native-input.bin", help="where a crashing input is left")
    p.add_argument("--cc", default=os.environ.get("CC", "gcc"))
    p.add_argument(
        "--self-check", action="store_true",
        help="first show that a planted heap overflow fails the run (the sanitizers are really on)",
    )  # fmt: skip
    p.add_argument("--module", help=argparse.SUPPRESS)  # (the child's: the sanitized build)
    p.add_argument("--seed-file", help=argparse.SUPPRESS)  # (the child's: documents cut from --seeds)
    args = p.parse_args()
    if args.module:
        return child(args)
    if shutil.which(args.cc) is None:
        print(f"fuzz_native: no C compiler {args.cc!r}", file=sys.stderr)
        return 2
    asan, ubsan = runtime(args.cc, "libasan.so"), runtime(args.cc, "libubsan.so")
    if not asan or not ubsan:
        print(f"fuzz_native: {args.cc} has no sanitizer runtime (libasan.so, libubsan.so)", file=sys.stderr)
        return 2
    if args.self_check and not planted_overflow_fails(args):
        print("fuzz_native: the self-check's planted overflow went unreported: the sanitizers are off", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="fuzz-native-") as tmp:
        module = build(Path(args.source), Path(tmp), args.cc)
        env = dict(
            os.environ,
            LD_PRELOAD=f"{asan}:{ubsan}",
            PYTHONMALLOC="malloc",  # Python's buffers come from malloc, where ASan sees their bounds
            ASAN_OPTIONS=f"detect_leaks=0:exitcode={ASAN_EXIT}:abort_on_error=0",
            UBSAN_OPTIONS=f"print_stacktrace=1:halt_on_error=1:exitcode={UBSAN_EXIT}",
            PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        )
        cut = seeds([Path(d) for d in args.seeds], random.Random(args.seed))
        seed_file = Path(tmp) / "seeds.pickle"
        seed_file.write_bytes(pickle.dumps(cut))
        print(f"fuzz_native: {Path(args.source).name} built with ASan and UBSan; {args.seconds:.0f} s, "
              f"seed {args.seed}, {len(cut)} documents cut from {len(args.seeds)} folders", flush=True)  # fmt: skip
        keep = str(Path(args.keep).resolve())
        cmd = [sys.executable, __file__, "--module", str(module), "--seconds", str(args.seconds),
               "--seed", str(args.seed), "--keep", keep, "--seed-file", str(seed_file)]  # fmt: skip
        code = subprocess.run(cmd, env=env, cwd=REPO).returncode
    if code == 0:
        return 0
    what = {ASAN_EXIT: "AddressSanitizer", UBSAN_EXIT: "UndefinedBehaviorSanitizer"}.get(code, f"exit code {code}")
    print(f"fuzz_native: FAILED ({what}); the input is in {Path(args.keep).resolve()}", file=sys.stderr)
    return 1 if code != 2 else 2


if __name__ == "__main__":
    sys.exit(main())
