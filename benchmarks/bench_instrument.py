"""What sptrace's instrumentation costs, side by side in one process.

    python benchmarks/bench_instrument.py [--repeats 30]

Times forward + backward of the dense reference transformer (L=4, B=2, S=512, H=256, fp32, CPU),
alternating between variants, in CPU time, and prints each variant's median and its ratio to
the plain model:
  plain             no hooks
  instrumented      sptrace.instrument(model), no profiler running (the claim: ~free)
  profiled          torch.profiler with sptrace's settings, not instrumented
  profiled+instr.   the same with sptrace.instrument (module ranges + saved-tensor records)
  lean              torch.profiler without Python stacks (sptrace profile --lean), not instrumented
  lean+instr.       the same with sptrace.instrument
The instrumentation's overhead is each instrumented variant over its uninstrumented one, with
the same profiler options (printed last); the target is <= 5%.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import DenseTransformer
from torch.profiler import ProfilerActivity, profile

import sptrace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = StepConfig(scheme="megatron", sp_size=1, layers=4, batch=2, seq=512, hidden=256, heads=8, kv_heads=4, ffn=704)
    plain, instrumented = DenseTransformer(cfg), DenseTransformer(cfg)
    sptrace.instrument(instrumented)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden)

    def step(model):
        model(x).square().mean().backward()

    def profiled(model, with_stack=True):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                     with_stack=with_stack):  # fmt: skip
            step(model)

    variants = {
        "plain": lambda: step(plain),
        "instrumented": lambda: step(instrumented),
        "profiled": lambda: profiled(plain),
        "profiled+instr.": lambda: profiled(instrumented),
        "lean": lambda: profiled(plain, with_stack=False),
        "lean+instr.": lambda: profiled(instrumented, with_stack=False),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm up
    for _ in range(args.repeats):
        for name, fn in variants.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    base = statistics.median(times["plain"])
    print(f"{'variant':<18}{'median CPU ms':>14}{'ratio':>8}")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:<18}{med * 1e3:>14.2f}{med / base:>8.3f}")
    for with_instr, without in (("profiled+instr.", "profiled"), ("lean+instr.", "lean")):
        over = statistics.median(times[with_instr]) / statistics.median(times[without]) - 1
        print(f"instrumentation overhead, {without:<9} {100 * over:+.1f}%  (target <= 5%)")


if __name__ == "__main__":
    main()
