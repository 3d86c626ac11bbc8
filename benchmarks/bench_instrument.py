"""What sptrace's instrumentation costs, side by side in one process.

    python benchmarks/bench_instrument.py [--repeats 30]

Times forward + backward of the dense reference transformer (L=4, B=2, S=512, H=256, fp32, CPU),
alternating between variants, in CPU time, and prints each variant's median and its ratio to
the plain model:
  plain             no hooks
  instrumented      sptrace.instrument(model), no profiler running (the claim: ~free)
  profiled          torch.profiler with sptrace's settings, not instrumented
  profiled+instr.   the same with sptrace.instrument (module ranges, saved-tensor records and the
                    statement lines of the tensors each forward makes: sptrace.makers)
  profiled+instr.-lines  the same with instrument(model, source_lines=False)
  lean              torch.profiler without Python stacks (sptrace profile --lean), not instrumented
  lean+instr.       the same with sptrace.instrument
All variants run on one model (hooks added and removed outside the timed region), in a shuffled
order each round. The instrumentation's overhead is each instrumented variant over its
uninstrumented one with the same profiler options, paired round by round (median and quartiles
of the per-round ratios, printed last); the target is <= 5%.
"""

from __future__ import annotations

import argparse
import random
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
    model = DenseTransformer(cfg)  # one model for every variant: two instances differ by noise alone
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden)
    hooks: list[tuple[bool, sptrace.Instrumentation]] = []  # (source lines?, the hooks on now)

    def step() -> None:
        model(x).square().mean().backward()
        model.zero_grad(set_to_none=True)

    def profiled(with_stack: bool = True) -> None:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                     with_stack=with_stack):  # fmt: skip
            step()

    # (instrumented: None, or with source lines or not; what runs); hooks go on and off outside
    # the timed region
    variants = {
        "plain": (None, step),
        "instrumented": (True, step),
        "profiled": (None, profiled),
        "profiled+instr.": (True, profiled),
        "profiled+instr.-lines": (False, profiled),
        "lean": (None, lambda: profiled(with_stack=False)),
        "lean+instr.": (True, lambda: profiled(with_stack=False)),
    }

    def run(name: str) -> float:
        lines, fn = variants[name]
        if hooks and hooks[0][0] is not lines:
            hooks.pop()[1].remove()
        if lines is not None and not hooks:
            hooks.append((lines, sptrace.instrument(model, source_lines=lines)))
        start = time.process_time()
        fn()
        return time.process_time() - start

    rng = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name in variants:
        run(name)  # warm up
    for _ in range(args.repeats):
        order = list(variants)
        rng.shuffle(order)  # no variant always runs after the same one
        for name in order:
            times[name].append(run(name))
    base = statistics.median(times["plain"])
    print(f"{'variant':<24}{'median CPU ms':>14}{'ratio':>8}")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:<24}{med * 1e3:>14.2f}{med / base:>8.3f}")
    # paired: each round's instrumented step over the same round's uninstrumented one, so that
    # the machine's slow and fast minutes cancel; median and quartiles over the rounds
    pairs = (("profiled+instr.", "profiled"), ("profiled+instr.-lines", "profiled"), ("lean+instr.", "lean"))
    for with_instr, without in pairs:
        ratios = [a / b - 1 for a, b in zip(times[with_instr], times[without])]
        q1, med, q3 = statistics.quantiles(ratios, n=4)
        print(f"{with_instr:<22} over {without:<9} {100 * med:+.1f}%  (quartiles {100 * q1:+.1f}%, "
              f"{100 * q3:+.1f}%; target <= 5%)")  # fmt: skip


if __name__ == "__main__":
    main()
