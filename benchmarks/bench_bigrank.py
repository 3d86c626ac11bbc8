"""Big ranks: 8 ranks of 100, 250 and 500 MB of JSON each, every tool in fresh processes, side by
side with the floor (inflating the files), ratios printed.

    python benchmarks/bench_bigrank.py [--source RUN] [--sizes 100,250,500] [--runs DIR]
                                       [--tools floor,info,analyze,check,hta,tracelens] [--timeout 1800]

1. Lengthens each rank of a source run to about the size asked (``synth_run.py --repeat``: its
   profiled window repeated on shifted clocks, every id renumbered) and gzips it, as Kineto's
   writers do. ``--runs DIR`` keeps the runs there and reuses one already written at that size.
2. For each size, in a fresh process each (imports included, no cache), the wall time, the CPU
   time of the process tree and its peak RSS (summed over the processes alive at once, sampled
   every 20 ms; bench_scale's ``measure``):
   - the floor: ``gzip -dc`` of the rank files into /dev/null (reading each byte once);
   - ``sptrace info --no-cache`` (the parse), ``sptrace analyze --no-cache --format json`` and
     ``sptrace check --no-cache``;
   - HTA's ``TraceAnalysis(trace_dir=RUN)`` (its parse of every rank), and its temporal breakdown
     where the traces have GPU kernels;
   - TraceLens's ``TreePerfAnalyzer.from_file`` on each rank, where TraceLens is installed.
3. Prints each row, each tool's wall over the floor's and HTA's over sptrace's, what
   ``analyze`` and ``check`` cost past the parse (their CPU less ``info``'s, over ``info``'s: the
   map, and the checks, per unit of parse), the lines ``check`` printed (a verdict must fit a
   screen), and issue 51's targets beside them.

Source: an 8-rank run with memory events and a backward (what ``check`` judges). Default: the
corpus's first such run where one is there, else ``sptrace profile --scheme megatron --steps 1``
(about 40 s). Disk: each size's run, gzipped (about a tenth of its JSON), plus one rank's JSON
while it is written.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_scale import measure  # noqa: E402
from synth_run import write_lengthened  # noqa: E402

from sptrace.load.files import RUN_FILE, find_traces  # noqa: E402

TARGET_PEAK_GB, TARGET_OVER_FLOOR, TARGET_OVER_HTA = 4.0, 8.0, 5.0
TOOLS = ("floor", "info", "analyze", "check", "hta", "tracelens")


def source_run(scratch: Path, given: Path | None) -> Path:
    if given is not None:
        return given
    out = scratch / "source"
    cmd = [sys.executable, "-m", "sptrace", "profile", "--scheme", "megatron", "--steps", "1", "--out", str(out)]
    print("profiling an 8-rank source run:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def json_size(path: Path) -> int:
    """Bytes of the JSON a trace file holds (inflated where it is gzipped)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return sum(len(block) for block in iter(lambda: f.read(1 << 24), b""))
    return path.stat().st_size


def lengthened(source: Path, mb: int, where: Path) -> Path:
    """The source's ranks, each about ``mb`` MB of JSON, gzipped (reused when already written)."""
    run = where / f"rank{mb}mb"
    done = run / ".complete"
    if done.is_file():
        return run
    shutil.rmtree(run, ignore_errors=True)
    files, _ = find_traces(source)
    copies = max(1, math.ceil(mb * 1e6 / max(json_size(f) for f in files)))
    t0 = time.perf_counter()
    write_lengthened(source, copies, run)
    for f in sorted(run.glob("rank*.json")):
        subprocess.run(["gzip", "-f", "-6", str(f)], check=True)
    done.write_text(f"{copies}\n")
    print(f"  wrote {len(files)} ranks of {copies} windows ({mb} MB of JSON each) in {time.perf_counter() - t0:.0f} s",
          flush=True)  # fmt: skip
    return run


def commands(run: Path, tools: list[str], kernels: bool) -> dict[str, list[str]]:
    py = sys.executable
    files = [str(f) for f in sorted(run.glob("rank*.json.gz"))]
    hta = "import sys; from hta.trace_analysis import TraceAnalysis; ta = TraceAnalysis(trace_dir=sys.argv[1])"
    out: dict[str, list[str]] = {}
    if "floor" in tools:
        out["gzip -dc (floor)"] = ["sh", "-c", 'gzip -dc "$@" > /dev/null', "gzip", *files]
    for tool in ("info", "analyze", "check"):
        if tool in tools:
            extra = ["--format", "json"] if tool == "analyze" else []
            out[f"sptrace {tool}"] = [py, "-m", "sptrace", tool, str(run), "--no-cache", *extra]
    if "hta" in tools and importlib.util.find_spec("hta") is not None:
        out["HTA parse"] = [py, "-c", hta, str(run)]
        if kernels:
            out["HTA parse + temporal breakdown"] = [py, "-c", hta + "; ta.get_temporal_breakdown(visualize=False)",
                                                     str(run)]  # fmt: skip
    if "tracelens" in tools and importlib.util.find_spec("TraceLens") is not None:
        script = ("import sys; from TraceLens import TreePerfAnalyzer\n"
                  "for f in sys.argv[1:]: TreePerfAnalyzer.from_file(f)")  # fmt: skip
        out["TraceLens TreePerf"] = [py, "-c", script, *files]
    return out


def has_kernels(run: Path) -> bool:
    """Whether the traces hold GPU kernels (HTA's temporal breakdown reads nothing else)."""
    first = sorted(run.glob("rank*.json.gz"))[0]
    with gzip.open(first, "rb") as f:
        head = f.read(1 << 26)
    return b'"cat": "kernel"' in head or b'"cat":"kernel"' in head


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, help="an 8-rank run with memory events (default: profile one)")
    ap.add_argument("--sizes", default="100,250,500", help="MB of JSON per rank")
    ap.add_argument("--runs", type=Path, help="keep the lengthened runs here (and reuse those already there)")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"which of {', '.join(TOOLS)}")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before a tool is given up")
    args = ap.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        print(f"--tools: unknown {', '.join(unknown)} (known: {', '.join(TOOLS)})", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="sptrace-bench-bigrank-"))
    rows: list[dict] = []
    verdicts: dict[int, str] = {}
    try:
        source = source_run(scratch, args.source)
        print(f"source: {source} ({os.cpu_count()} cores)", flush=True)
        for mb in [int(v) for v in args.sizes.split(",")]:
            run = lengthened(source, mb, args.runs or scratch)
            if (source / RUN_FILE).is_file() and not (run / RUN_FILE).is_file():
                shutil.copy(source / RUN_FILE, run / RUN_FILE)
            for tool, cmd in commands(run, tools, has_kernels(run)).items():
                r = measure(cmd, args.timeout)
                printed = r.pop("out")
                if tool == "sptrace check":
                    verdicts[mb] = printed.decode(errors="replace")
                rows.append({"MB": mb, "tool": tool, **r})
                wall = "timeout" if r["wall"] is None else f"{r['wall']:.1f} s"
                cpu = "" if r["cpu"] is None else f"{r['cpu']:.1f} s"
                print(f"  {mb:>4} MB/rank  {tool:<32} wall {wall:>9}  cpu {cpu:>9}  peak {r['rss'] / 2**20:>7.0f} MB"
                      f"  exit {r['rc']}", flush=True)  # fmt: skip
                if r["rc"] not in (0, 1, "timeout"):
                    print(f"    failed: {r.get('err', '')}")
            if not args.runs:
                shutil.rmtree(run)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, verdicts)
    return 0


def report(rows: list[dict], verdicts: dict[int, str]) -> None:
    print(f"\n{'MB/rank':>8} {'tool':<32}{'wall s':>9}{'cpu s':>9}{'peak MB':>9}{'x floor':>9}{'HTA / this':>11}"
          f"{'map / parse':>12}")  # fmt: skip
    for r in rows:
        floor = next((b for b in rows if b["MB"] == r["MB"] and b["tool"] == "gzip -dc (floor)"), None)
        hta = next((b for b in rows if b["MB"] == r["MB"] and b["tool"] == "HTA parse"), None)
        wall = "timeout" if r["wall"] is None else f"{r['wall']:.1f}"
        cpu = "" if r["cpu"] is None else f"{r['cpu']:.1f}"
        ran = r["wall"] and r["rc"] in (0, 1)  # (a tool that stopped on an error has no ratio)
        over = f"{r['wall'] / floor['wall']:.1f}" if ran and floor and floor["wall"] else ""
        mine = ran and r["tool"].startswith("sptrace")
        vs = f"{hta['wall'] / r['wall']:.1f}" if mine and hta and hta["wall"] else ""
        # what the map (and the checks) cost past the parse, in CPU: (this - info) / info
        parse = next((b for b in rows if b["MB"] == r["MB"] and b["tool"] == "sptrace info"), None)
        beyond = mine and parse and parse["cpu"] and r is not parse and r["cpu"] is not None
        map_cost = f"{(r['cpu'] - parse['cpu']) / parse['cpu']:.2f}" if beyond else ""
        print(f"{r['MB']:>8} {r['tool']:<32}{wall:>9}{cpu:>9}{r['rss'] / 2**20:>9.0f}{over:>9}{vs:>11}{map_cost:>12}")
    for mb, text in verdicts.items():
        lines = text.splitlines()
        print(f"\n`sptrace check` at {mb} MB/rank printed {len(lines)} lines ({len(text.encode())} bytes); its last:")
        print("\n".join(f"  {line[:160]}" for line in lines[-3:]))
    print(f"\ntargets (issue 51, at 500 MB/rank): analyze and check peak <= {TARGET_PEAK_GB:.0f} GB, wall <= "
          f"{TARGET_OVER_FLOOR:.0f}x the floor and >= {TARGET_OVER_HTA:.0f}x faster than HTA's parse; the verdict in "
          "at most a screen")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
