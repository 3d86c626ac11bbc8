"""The checks only a GPU shows, in one short run for a lent GPU machine (one GPU):

    python benchmarks/device_check.py --out OUT [--seconds 480]

1. Each reference scheme (megatron, ulysses, hybrid, ring, usp) profiled on CUDA with one rank:
   the CUDA caching allocator's memory events, compute-kernel streams, and the sharding check and
   collectives' verdicts on them (one GPU allows one NCCL rank: multi-rank NCCL needs more).
2. PyTorch's own ``context_parallel`` (torch.distributed.tensor.experimental), which runs only on
   CUDA SDPA kernels, profiled with plain torch.profiler as a third-party CP implementation.
3. What each analysis says of those traces: ``sptrace info``, ``analyze`` and ``check``, as JSON.

Everything goes to OUT (traces, the commands' outputs, ``summary.json``); a step that fails is
recorded with its error and the next one runs. The time budget stops launching new steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCHEMES = ("megatron", "ulysses", "hybrid", "ring", "usp")

CONTEXT_PARALLEL = r"""
import os, sys, torch, torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
dist.init_process_group("nccl")
torch.cuda.set_device(0)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
B, H, S, D = 2, 16, 4096, 64
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
def step():
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
step(); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, profile_memory=True) as p:
    step(); torch.cuda.synchronize()
p.export_chrome_trace(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"))
dist.destroy_process_group()
"""


def run(cmd: list[str], log: Path, timeout: float) -> dict:
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1))
        log.write_text(proc.stdout + proc.stderr)
        return {"cmd": cmd, "rc": proc.returncode, "seconds": round(time.time() - start, 1)}
    except subprocess.TimeoutExpired:
        return {"cmd": cmd, "rc": "timeout", "seconds": round(time.time() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "device-out")))
    parser.add_argument("--seconds", type=float, default=480, help="stop launching steps after this long")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.seconds
    summary: list[dict] = []
    py = [sys.executable, "-m", "sptrace"]
    for scheme in SCHEMES:
        if time.time() > deadline:
            break
        run_dir = out / scheme
        cmd = [*py, "profile", "--scheme", scheme, "--nproc", "1", "--device", "cuda", "--force", "--out", str(run_dir)]
        step = run([*cmd, "--warmup", "1"], out / f"{scheme}.profile.log", deadline - time.time())
        summary.append({"step": f"profile {scheme}", **step})
        for command in ("info", "analyze", "check"):
            if step["rc"] == 0 and time.time() < deadline:
                log = out / f"{scheme}.{command}.json"
                summary.append(
                    {
                        "step": f"{command} {scheme}",
                        **run([*py, command, str(run_dir), "--format", "json"], log, deadline - time.time()),
                    }
                )
    if time.time() < deadline:
        cp_dir = out / "torch_context_parallel"
        cp_dir.mkdir(exist_ok=True)
        script = out / "context_parallel.py"
        script.write_text(CONTEXT_PARALLEL)
        step = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(script),
                    str(cp_dir)], out / "context_parallel.log", deadline - time.time())  # fmt: skip
        summary.append({"step": "torch context_parallel", **step})
        if step["rc"] == 0:
            for command in ("info", "analyze"):
                summary.append({"step": f"{command} context_parallel",
                                **run([*py, command, str(cp_dir), "--format", "json"],
                                      out / f"context_parallel.{command}.json", deadline - time.time())})  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for s in summary:
        print(f"{s['step']:<34} rc={s['rc']} {s['seconds']} s")


if __name__ == "__main__":
    main()
