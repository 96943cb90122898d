"""DDP with deferfuse's tpu_dist against one process and against PyTorch's gloo on CPU tensors.

    python bench/distributed.py [--steps 20] [--nproc 2]

For the MLP and GPT workloads (bench/workloads.py's sizes, the batch per rank fixed), each
configuration is launched with torchrun: tpu tensors in DeferAndFuse on "tpu_dist", and CPU
tensors in CPU eager on "gloo", with 1 and with N processes. A step's time is the median over
windows of steps after warm-up (compiles excluded). Then the all-reduce of 1, 16 and 64 MiB:
milliseconds per call and per MiB, tpu_dist against gloo. Everything one run prints is from that
run; the figures kept are in docs/performance.md.

On our 2-core machines two processes share the two cores, so 2 processes cannot be faster than
one here: the ratio shows what distribution costs, not what it gains.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import deferfuse

    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import gpt_train

    # tpu_dist: a program per collective; spmd: inside spmd_safe(), with small buckets (several
    # per step) or one bucket (spmd_one)
    tpu = args.engine in ("tpu_dist", "spmd", "spmd_one")
    spmd = args.engine.startswith("spmd")
    dist.init_process_group(None if tpu else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    device = "tpu" if tpu else "cpu"
    out = {"engine": args.engine, "workload": args.workload, "nproc": n}
    if args.workload == "allreduce":
        results = {}
        for mib in (1, 16, 64):
            t = torch.ones(mib * 2 ** 18, device=device)
            times = []
            for rep in range(args.reps + 2):
                if tpu:
                    torch.tpu.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                t.sum().item()  # the value is here on this rank
                if rep >= 2:
                    times.append(time.perf_counter() - t0)
            results[mib] = statistics.median(times) * 1000
        out["ms"] = results
    else:
        torch.manual_seed(0)
        if args.workload == "mlp":
            model = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Linear(512, 512), torch.nn.GELU())],
                                        torch.nn.Linear(512, 10)).to(device)
            x, y = torch.randn(64, 512, device=device), torch.randint(0, 10, (64,), device=device)
        else:
            cfg = gpt_train.GPTConfig(layers=4, dim=128)
            model = gpt_train.GPT(cfg).to(device)
            data = next(gpt_train.batches(cfg, 8, seed=rank))
            x, y = data[0].to(device), data[1].to(device)
        cap = {"spmd": 1, "spmd_one": 1024}.get(args.engine, 25)  # MiB per bucket (25: DDP's default)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        ctx = deferfuse.mode("defer_and_fuse") if tpu else torch.enable_grad()
        region = deferfuse.distributed.spmd_safe() if spmd else contextlib.nullcontext()
        windows = []
        with ctx, region:
            for _ in range(2):  # warm-up: two windows as measured below, every program compiled
                for _ in range(args.steps):
                    loss = step()
                loss.item()
            deferfuse.reset_metrics()
            for _ in range(args.windows):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    loss = step()
                loss.item()
                windows.append((time.perf_counter() - t0) / args.steps * 1000)
        out["step_ms"] = statistics.median(windows)
        if tpu:
            m = deferfuse.metrics()
            out["flushes_per_step"] = m["flushes"] / (args.windows * args.steps)
            out["programs_per_step"] = m["execute_calls"] / (args.windows * args.steps)
            out["collectives"] = m["collectives"]
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def _launch(engine: str, workload: str, nproc: int, args) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.abspath(__file__), "--worker", "--engine", engine, "--workload", workload,
           "--steps", str(args.steps), "--windows", str(args.windows), "--reps", str(args.reps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, cwd=tempfile.gettempdir())
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{engine} {workload} x{nproc} failed:\n{(p.stdout + p.stderr)[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--engine", default="tpu_dist")
    p.add_argument("--workload", default="mlp")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    if args.worker:
        _worker(args)
        return
    n = args.nproc
    print(f"DDP step time, ms (median of {args.windows} windows of {args.steps} steps; batch per rank fixed)")
    print(f"{'workload':10} {'tpu_dist x1':>12} {f'tpu_dist x{n}':>12} {f'gloo x{n}':>10} "
          f"{f'x{n}/x1':>8} {f'tpu/gloo x{n}':>13}")
    for workload in ("mlp", "gpt"):
        one = _launch("tpu_dist", workload, 1, args)["step_ms"]
        many = _launch("tpu_dist", workload, n, args)
        gloo = _launch("gloo", workload, n, args)["step_ms"]
        print(f"{workload:10} {one:12.2f} {many['step_ms']:12.2f} {gloo:10.2f} {many['step_ms'] / one:8.2f} "
              f"{many['step_ms'] / gloo:13.2f}", flush=True)
    print(f"\nDDP GPT step in spmd_safe() (collectives fused into the step), x{n}: several buckets against one")
    several = _launch("spmd", "gpt", n, args)
    one = _launch("spmd_one", "gpt", n, args)
    per = _launch("tpu_dist", "gpt", n, args)
    for name, r in (("1 MiB buckets", several), ("one bucket", one), ("outside spmd_safe", per)):
        print(f"  {name:18} {r['step_ms']:8.2f} ms   programs/step {r['programs_per_step']:5.2f}   "
              f"flushes/step {r['flushes_per_step']:5.2f}   all_reduces {r['collectives'].get('all_reduce', 0)}")
    print(f"  several/one: {several['step_ms'] / one['step_ms']:.2f} (target <= 1.2)")
    print(f"\nall_reduce of float32 over {n} processes, ms per call (ms per MiB), median of {args.reps}")
    ours = _launch("tpu_dist", "allreduce", n, args)["ms"]
    theirs = _launch("gloo", "allreduce", n, args)["ms"]
    for mib in ours:
        print(f"  {mib:>3} MiB: tpu_dist {ours[mib]:8.2f} ({ours[mib] / int(mib):6.2f})   "
              f"gloo {theirs[mib]:8.2f} ({theirs[mib] / int(mib):6.2f})   ratio {ours[mib] / theirs[mib]:5.2f}")


if __name__ == "__main__":
    main()
