"""Trace loading: HolisticTraceAnalysis's parser against sptrace's, side by side.

    python benchmarks/bench_load.py [--repeats 5] [--sizes 1,2,4,8] [--trace PATH]

0. The JSON decoders, on the decompressed text alone: json, orjson (when installed), msgspec
   untyped, msgspec into sptrace's typed Structs (the fallback), and sptrace's native decoder
   (sptrace/load/_kineto.c, straight to columns; what sptrace uses when it is built).
1. CPU time, in one process, alternating: HTA's ``hta.common.trace.parse_trace_file`` (default
   config), ``sptrace.load_trace(..., cache=False)`` (cold), the same with the native decoder
   off (SPTRACE_DECODER=msgspec: an install without a C compiler) and ``sptrace.load_trace``
   from its table cache (warm), each warmed up once first; medians and ratios to HTA.
2. Peak RSS of each, in a fresh process per variant (the memory above the process's size after
   imports is printed too).
3. Growth: synthetic traces of 2x, 4x, 8x the events (the real events replicated, shifted in
   time) loaded cold in fresh processes: CPU time, peak RSS, and the table they produce.
4. What a user waits for, imports included: ``sptrace info --no-cache TRACE`` in a fresh
   Python process (with and without the native decoder) against a fresh process that imports
   HTA and runs ``parse_trace_file``; user
   + system CPU of the whole child, medians, alternating. Both run with their bytecode cached
   (one warm-up each first), as an installed package does.

Default trace: df_index_resolver.json.gz from a corpus of real traces when one is there
(SPTRACE_CORPUS, or ../shared/corpus beside the checkout: rank 1 of 2, 2x V100, 216k events,
53.7 MB of JSON); otherwise a synthetic trace of the same size and mix of events, written here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = Path(os.environ.get("SPTRACE_CORPUS") or HERE.parent.parent / "shared/corpus")
CORPUS_TRACE = CORPUS / "hta_tests_data/df_index_resolver/df_index_resolver.json.gz"


def synthetic_trace(path: Path, events: int = 216_000) -> Path:
    """A gzip Kineto trace with a real trace's mix of events: CPU ops with shapes, runtime launches
    and their kernels with ac2g flows, memory instants, python frames, NCCL all-reduces."""
    import gzip
    import random

    rng = random.Random(0)
    ev: list[dict] = []
    t = 1_700_000_000_000.0
    corr = 0
    while len(ev) < events:
        corr += 1
        t += rng.uniform(5, 40)
        shape = [rng.choice([256, 512, 1024]), rng.choice([768, 1024, 4096])]
        ev.append(
            {
                "ph": "X",
                "cat": "python_function",
                "name": "nn.Module: Linear_3",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": 30.5,
                "args": {"Python id": corr, "Python parent id": corr - 1},
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": t + 1.25,
                "dur": 20.125,
                "args": {
                    "External id": corr,
                    "Sequence number": corr,
                    "Fwd thread id": 0,
                    "Input Dims": [shape, shape[::-1]],
                    "Input type": ["float", "float"],
                },
            }
        )
        ev.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": t + 2,
                "s": "t",
                "args": {
                    "Addr": 2**40 + corr * 4096,
                    "Bytes": shape[0] * shape[0] * 4,
                    "Total Allocated": corr,
                    "Total Reserved": 2**30,
                    "Device Type": 1,
                    "Device Id": 0,
                    "Ev Idx": corr,
                },
            }
        )
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": t + 3,
                "dur": 4.5,
                "args": {"External id": corr, "correlation": corr},
            }
        )
        ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": t + 3})
        name = "ncclKernel_AllReduce_RING_LL_Sum_float" if corr % 50 == 0 else "ampere_sgemm_128x64_nn"
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": t + 9,
                "dur": 25.75,
                "args": {"External id": corr, "correlation": corr, "stream": 7, "device": 0, "grid": [80, 1, 1]},
            }
        )
        ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": t + 9, "bp": "e"})
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
           "traceEvents": ev[:events]}  # fmt: skip
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    """VmHWM: this process's peak RSS since its exec (ru_maxrss would include the parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _quiet_hta() -> None:
    logging.disable(logging.CRITICAL)


def run_hta(path: Path) -> object:
    from hta.common.trace import parse_trace_file
    from hta.configs.parser_config import ParserConfig

    return parse_trace_file(str(path), ParserConfig.get_default_cfg())


def run_cold(path: Path) -> object:
    import sptrace

    return sptrace.load_trace(path, cache=False)


def run_cold_msgspec(path: Path) -> object:
    """The cold load with the native decoder turned off (what an install without a C compiler does)."""
    import sptrace

    os.environ["SPTRACE_DECODER"] = "msgspec"
    try:
        return sptrace.load_trace(path, cache=False)
    finally:
        del os.environ["SPTRACE_DECODER"]


def run_cached(path: Path, cache_dir: Path) -> object:
    import sptrace

    return sptrace.load_trace(path, cache_dir=cache_dir)


def child(variant: str, path: Path, cache_dir: Path) -> None:
    """One variant in this fresh process; prints a JSON line."""
    _quiet_hta()
    if variant == "hta":
        import hta.common.trace  # noqa: F401  (imports before the baseline)
    else:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401

        import sptrace.load  # noqa: F401
    base = _rss_mb()
    start = time.process_time()
    result = {
        "hta": lambda: run_hta(path),
        "cold": lambda: run_cold(path),
        "cold-msgspec": lambda: run_cold_msgspec(path),
        "cached": lambda: run_cached(path, cache_dir),
    }[variant]()
    cpu = time.process_time() - start
    peak = _peak_rss_mb()
    table_mb = result.table.nbytes / 2**20 if hasattr(result, "table") else None
    events = result.num_events if hasattr(result, "num_events") else None
    print(json.dumps({"cpu_s": cpu, "base_mb": base, "peak_mb": peak, "table_mb": table_mb, "events": events}))


def in_child(variant: str, path: Path, cache_dir: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", variant, "--trace", str(path), "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def replicate(path: Path, copies: int, out: Path) -> Path:
    """A trace with ``copies`` times the events of ``path``, shifted so that they follow each other."""
    import msgspec

    from sptrace.load.decode import read_bytes

    doc = msgspec.json.decode(read_bytes(path))
    events = doc.pop("traceEvents")
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    shift = max(stamps) - min(stamps) + 1000
    with open(out, "wb") as f:
        f.write(msgspec.json.encode(doc)[:-1] + b', "traceEvents": [')
        for j in range(copies):
            batch = []
            for e in events:
                if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M":
                    e = {**e, "ts": e["ts"] + j * shift}
                elif j:
                    continue  # metadata once
                batch.append(e)
            body = msgspec.json.encode(batch)[1:-1]
            f.write((b"," if j else b"") + body)
        f.write(b"]}")
    return out


HTA_SCRIPT = """
import logging, sys
logging.disable(logging.CRITICAL)
from hta.common.trace import parse_trace_file
from hta.configs.parser_config import ParserConfig
parse_trace_file(sys.argv[1], ParserConfig.get_default_cfg())
"""


def fresh_processes(path: Path, repeats: int) -> None:
    """Section 4: whole fresh processes, imports included: user + system CPU of each child, and
    its wall time (sptrace reads the rank on a thread while it imports: sptrace.load.native)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # cache bytecode, as installs do
    info = [sys.executable, "-m", "sptrace", "info", "--no-cache", str(path)]
    commands = {  # name: (command, its environment)
        "HTA parse_trace_file": ([sys.executable, "-c", HTA_SCRIPT, str(path)], env),
        "sptrace info --no-cache": (info, env),
        "the same, msgspec only": (info, {**env, "SPTRACE_DECODER": "msgspec"}),
    }

    def cost_of(cmd: list[str], child_env: dict[str, str]) -> tuple[float, float]:
        """(CPU s, wall s) of one run."""
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(cmd, env=child_env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall

    for cmd, child_env in commands.values():
        cost_of(cmd, child_env)  # warm-up: writes the bytecode caches
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, (cmd, child_env) in commands.items():
            samples[name].append(cost_of(cmd, child_env))
    hta_cpu = statistics.median(cpu for cpu, _ in samples["HTA parse_trace_file"])
    hta_wall = statistics.median(wall for _, wall in samples["HTA parse_trace_file"])
    print(f"\nfresh process, imports included: user + system CPU seconds and wall, median of {repeats}, alternating")
    print(f"{'command':<26}{'CPU s':>8}{'min':>8}{'max':>8}{'HTA / this':>12}{'wall s':>8}{'HTA / this':>12}")
    for name, values in samples.items():
        cpu = statistics.median(c for c, _ in values)
        wall = statistics.median(w for _, w in values)
        low, high = min(c for c, _ in values), max(c for c, _ in values)
        print(f"{name:<26}{cpu:>8.2f}{low:>8.2f}{high:>8.2f}{hta_cpu / cpu:>12.1f}{wall:>8.2f}{hta_wall / wall:>12.1f}")


def decoders(path: Path, repeats: int) -> None:
    import msgspec

    from sptrace.load.decode import _TYPED_TOP, _kineto, read_bytes

    data = read_bytes(path)
    candidates = {
        "json (stdlib)": json.loads,
        "msgspec untyped": msgspec.json.decode,
        "msgspec typed (sptrace)": _TYPED_TOP.decode,
    }
    if _kineto is not None:
        candidates["sptrace native, to columns"] = _kineto.decode
    try:
        import orjson

        candidates["orjson"] = orjson.loads
    except ImportError:
        pass
    print(f"decoding {len(data) / 2**20:.1f} MB of JSON, CPU seconds (median of {repeats})")
    for name, fn in candidates.items():
        samples = []
        for _ in range(repeats):
            start = time.process_time()
            fn(data)
            samples.append(time.process_time() - start)
        print(f"  {name:<26}{statistics.median(samples):>7.3f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace", type=Path, help="default: the corpus's df_index_resolver, else a synthetic trace of its size"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="1,2,4,8", help="replication factors for the growth table ('' to skip)")
    parser.add_argument("--fresh-only", action="store_true", help="only section 4 (fresh processes)")
    parser.add_argument("--child", choices=("hta", "cold", "cold-msgspec", "cached"), help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.trace, args.cache_dir)
        return
    _quiet_hta()
    keep = tempfile.TemporaryDirectory(prefix="sptrace-bench-trace-")
    path = args.trace or (CORPUS_TRACE if CORPUS_TRACE.is_file() else None)
    if path is None:
        path = synthetic_trace(Path(keep.name) / "synthetic.json.gz")
        print(f"no corpus ({CORPUS_TRACE} is absent): a synthetic trace of 216k events, {path}")
    size_mb = path.stat().st_size / 2**20
    if args.fresh_only:
        fresh_processes(path, args.repeats)
        return
    decoders(path, args.repeats)
    with tempfile.TemporaryDirectory(prefix="sptrace-bench-") as tmp:
        cache_dir = Path(tmp) / "cache"
        variants = {
            "hta": lambda: run_hta(path),
            "cold": lambda: run_cold(path),
            "cold-msgspec": lambda: run_cold_msgspec(path),
            "cached": lambda: run_cached(path, cache_dir),
        }
        for fn in variants.values():
            fn()  # warm up (and fill the cache)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                start = time.process_time()
                fn()
                times[name].append(time.process_time() - start)
        print(
            f"{path.name} ({size_mb:.1f} MB gzip): load to a table, CPU seconds, median of {args.repeats}, alternating"
        )
        hta = statistics.median(times["hta"])
        print(f"{'variant':<26}{'CPU s':>9}{'HTA / this':>12}")
        labels = {
            "hta": "HTA parse_trace_file",
            "cold": "sptrace cold (no cache)",
            "cold-msgspec": "  the same, msgspec only",
            "cached": "sptrace cached",
        }
        for name, samples in times.items():
            med = statistics.median(samples)
            print(f"{labels[name]:<26}{med:>9.3f}{hta / med:>12.1f}")

        print("\npeak RSS, one fresh process per variant (MB)")
        print(f"{'variant':<26}{'peak':>8}{'after imports':>15}{'load adds':>11}")
        for name in ("hta", "cold", "cold-msgspec", "cached"):
            r = in_child(name, path, cache_dir)
            print(f"{labels[name]:<26}{r['peak_mb']:>8.0f}{r['base_mb']:>15.0f}{r['peak_mb'] - r['base_mb']:>11.0f}")

        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        if sizes:
            from sptrace.load.decode import read_bytes

            print("\ngrowth: sptrace cold load of replicated traces (fresh process each)")
            print(
                f"{'copies':>6}{'decoder':>9}{'JSON MB':>9}{'events':>10}{'CPU s':>8}{'peak MB':>9}{'load adds':>11}"
                f"{'table MB':>10}{'adds/table':>12}"
            )
            for k in sizes:
                big = path if k == 1 else replicate(path, k, Path(tmp) / f"x{k}.json")
                json_mb = (len(read_bytes(big)) if k == 1 else big.stat().st_size) / 2**20
                for variant, decoder in (("cold", "native"), ("cold-msgspec", "msgspec")):
                    r = in_child(variant, big, cache_dir)
                    adds = r["peak_mb"] - r["base_mb"]
                    print(
                        f"{k:>6}{decoder:>9}{json_mb:>9.0f}{r['events']:>10}{r['cpu_s']:>8.2f}{r['peak_mb']:>9.0f}"
                        f"{adds:>11.0f}{r['table_mb']:>10.0f}{adds / r['table_mb']:>12.1f}"
                    )
                if k != 1:
                    big.unlink()
    fresh_processes(path, args.repeats)


if __name__ == "__main__":
    main()
