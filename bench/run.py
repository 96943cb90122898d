"""deferfuse's benchmark suite: every workload under every engine, side by side, in one run.

    python -m bench [--reps 5] [--window-ms 500] [--json FILE] [--workloads mlp,gpt]

In-process engines (cpu, strict, debug, defer_and_fuse, jit, compiled) are prepared once and then measured
A/B interleaved, several repetitions each; the tables quote medians. torchax runs in a process of
its own (see torchax_runner.py) right after. Peak memory is the process's resident-set high-water
mark (Linux VmHWM, reset before each measured run) minus its resident set at the start of the
run: JAX's CPU buffers live in the process, where tracemalloc cannot see them.

A repetition times a run of steps between two syncs. An engine that defers or dispatches
asynchronously starts each such run with nothing in flight, so the host's work for the first step
overlaps nothing; a run of five MLP steps put about a fifth of a step's recording on every step,
which is the cost of a loop that syncs every five steps, not a steady state. Each run therefore
lasts at least --window-ms for the slowest in-process engine (the same step count for every
engine of a workload), and the workloads that end in `.item()` show the loop that syncs every step.

The same command runs where JAX's default device is an accelerator. There the child processes
(torchax, the compile-scaling runs) cannot open the chip this process holds, so they are skipped
and shown as "-" (run bench/torchax_runner.py on its own instead); they are told the platform
(JAX_PLATFORMS), so none of them falls back to the CPU unnoticed. An engine that does not apply to
a workload (NotImplementedError, or torchax not installed) shows "-"; one that raised shows
"fails", and both are listed under the tables with their reasons.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import deferfuse  # noqa: E402
import mfu  # noqa: E402
from workloads import WORKLOADS, selected, steps_for  # noqa: E402

IN_PROCESS = ("cpu", "strict", "debug", "defer_and_fuse", "jit", "compiled", "jax")


def default_engines() -> tuple[str, ...]:
    return IN_PROCESS + (("torchax",) if importlib.util.find_spec("torchax") else ())


def _child_env(**extra) -> dict:
    """The parent's environment, with JAX pinned to the parent's platform: a child that cannot
    get the accelerator must fail, not measure the CPU instead."""
    import jax

    return {"JAX_PLATFORMS": jax.default_backend(), **os.environ, **extra}


# --- memory ----------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# --- measuring ---------------------------------------------------------------------------------------


def measure_workload(name: str, engines, warm: int, steps: int, reps: int, window_ms: float = 0.0) -> dict:
    make = WORKLOADS[name]
    runners, res, slowest = {}, {}, 0.0
    for e in engines:
        if e == "torchax":
            continue
        r = res[e] = {"engine": e}
        misses0 = deferfuse.metrics()["cache_misses"]
        t0 = time.perf_counter()
        try:
            runner = make(e)
            runner.step()
            runner.sync()
            r["first_ms"] = (time.perf_counter() - t0) * 1e3
            for _ in range(warm):
                runner.step()
            runner.sync()
        except NotImplementedError as exc:
            r["error"], r["na"] = str(exc), True
            continue
        except Exception as exc:  # noqa: BLE001 - one engine's failure is a table cell, not the run's end
            r["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        r["compiled_warmup"] = deferfuse.metrics()["cache_misses"] - misses0 + runner.programs
        r["flops"], r["xla_flops"] = runner.flops, runner.xla_flops
        r["step_ms"], r["peak_mb"], r["compiled_steady"] = [], [], 0
        runners[e] = runner
        t0 = time.perf_counter()
        runner.step()
        runner.sync()
        slowest = max(slowest, (time.perf_counter() - t0) * 1e3)
    steps = steps_for(window_ms, slowest, steps)
    for r in res.values():
        r["steps_per_run"] = steps
    for _ in range(reps):
        for e, runner in runners.items():
            r = res[e]
            misses0 = deferfuse.metrics()["cache_misses"]
            rss0 = _status_kb("VmRSS")
            _reset_peak()
            t0 = time.perf_counter()
            for _ in range(steps):
                runner.step()
            runner.sync()
            r["step_ms"].append((time.perf_counter() - t0) / steps * 1e3)
            r["peak_mb"].append(max(0, _status_kb("VmHWM") - rss0) / 1024)
            r["compiled_steady"] += deferfuse.metrics()["cache_misses"] - misses0
    del runners
    if "torchax" in engines:
        res["torchax"] = _torchax(name, warm, steps, reps, window_ms)
    return res


def _torchax(name: str, warm: int, steps: int, reps: int, window_ms: float) -> dict:
    import jax

    if not importlib.util.find_spec("torchax"):
        return {"engine": "torchax", "error": "torchax is not installed", "na": True}
    if jax.default_backend() != "cpu":
        return {"engine": "torchax", "na": True,
                "error": "needs the accelerator this process holds: run bench/torchax_runner.py on its own"}
    cmd = [sys.executable, os.path.join(HERE, "torchax_runner.py"), name, str(warm), str(steps), str(reps),
           str(window_ms)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=_child_env())
    except subprocess.TimeoutExpired:
        return {"engine": "torchax", "error": "timed out"}
    for line in out.stdout.splitlines():
        if line.startswith("TORCHAX_RESULT "):
            return json.loads(line[len("TORCHAX_RESULT "):])
    return {"engine": "torchax", "error": (out.stderr or out.stdout)[-300:]}


def tiny_ops(reps: int, n: int = 2000) -> dict:
    """µs per op for an 8-element add chain, and DeferAndFuse's recording cost.

    Two floors frame the recording row: a bare TorchDispatchMode (the issue's yardstick), and a
    bare tensor subclass that makes a fresh output wrapper per op, which is what any engine
    built on wrapper subclasses pays before it records anything."""
    import jax
    import jax.numpy as jnp
    from torch.utils._python_dispatch import TorchDispatchMode

    a = torch.ones(8).to("tpu")

    class Bare(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return a

    class Floor(torch.Tensor):
        """The least a wrapper-subclass engine pays per op: the `__torch_dispatch__` call and a
        fresh output wrapper on the tpu device, with nothing recorded."""

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return torch.Tensor._make_wrapper_subclass(cls, (8,), dtype=torch.float32, device=a.device)

    floor = torch.Tensor._make_wrapper_subclass(Floor, (8,), dtype=torch.float32, device=a.device)

    def chain(x, b):
        for _ in range(n):
            x = x + b
        return x

    cpu = torch.ones(8)
    ja = jnp.ones(8, jnp.float32)
    jadd = jax.jit(lambda x, y: x + y)

    def run_cpu():
        t0 = time.perf_counter()
        chain(cpu, cpu)
        return time.perf_counter() - t0

    def run_bare():
        with Bare():
            t0 = time.perf_counter()
            chain(a, a)
            return time.perf_counter() - t0

    def run_floor():
        t0 = time.perf_counter()
        chain(floor, floor)
        return time.perf_counter() - t0

    def run_mode(kind):
        def go():
            with deferfuse.mode(kind):
                t0 = time.perf_counter()
                y = chain(a, a)
                dt = time.perf_counter() - t0
            y.cpu()
            return dt
        return go

    def run_jit():
        x = ja
        t0 = time.perf_counter()
        for _ in range(n):
            x = jadd(x, ja)
        x.block_until_ready()
        return time.perf_counter() - t0

    runs = {"cpu eager": run_cpu, "bare TorchDispatchMode": run_bare, "bare subclass, fresh output tensor": run_floor,
            "defer_and_fuse (recording)": run_mode("defer_and_fuse"),
            "strict": run_mode("strict"), "debug": run_mode("debug"), "jitted JAX call": run_jit}
    for fn in runs.values():
        fn()
    out = {k: [] for k in runs}
    for _ in range(reps):
        for k, fn in runs.items():
            out[k].append(fn() / n * 1e6)
    return out


def compile_scaling() -> dict:
    """First-step compile seconds of the GPT at 2 and 12 layers, each in a fresh process."""
    code = (
        "import sys, time; sys.path.insert(0, %r); import deferfuse, workloads\n"
        "r = workloads.gpt('defer_and_fuse', layers=%d); r.step(); r.sync()\n"
        "print('COMPILE', deferfuse.metrics()['compile_seconds'], deferfuse.metrics()['cache_misses'])\n"
    )
    out = {}
    # default: the fuser gives each repeated layer its own program, shared by all of them;
    # "fused whole": DEFERFUSE_FUSE_BLOCK_OPS=0, every flush one program (what compile time was)
    for cuts, env in (("default", {}), ("fused whole", {"DEFERFUSE_FUSE_BLOCK_OPS": "0"})):
        for layers in (2, 12):
            p = subprocess.run([sys.executable, "-c", code % (HERE, layers)], capture_output=True, text=True,
                               timeout=3600, env=_child_env(**env))
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("COMPILE")), None)
            out[f"{layers}|{cuts}"] = {"seconds": float(line.split()[1]), "programs": int(line.split()[2])} if line else {
                "error": p.stderr[-300:]}
    return out


# --- reporting -----------------------------------------------------------------------------------------


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def render(results: dict, engines) -> str:
    lines = []
    tiny = results.get("tiny")
    if tiny:
        bare = _med(tiny["bare TorchDispatchMode"])
        lines += ["## Tiny-op latency (8-element add)", "", "| engine | median µs/op | × bare mode |", "|---|---:|---:|"]
        for k, xs in tiny.items():
            lines.append(f"| {k} | {_med(xs):.1f} | {_med(xs) / bare:.2f} |")
        lines.append("")
    lines += ["## Steady-state step time (ms, median)", "",
              "| workload | " + " | ".join(engines) + " | defer vs strict | defer vs jit | compiled vs jit "
              "| compiled vs defer | jit vs jax |", "|---|" + "---:|" * (len(engines) + 5)]
    for name, res in results["workloads"].items():
        cells = []
        for e in engines:
            r = res.get(e, {})
            cells.append(f"{_med(r['step_ms']):.1f}" if r.get("step_ms") else _missing(r))
        d = res.get("defer_and_fuse", {}).get("step_ms")
        s = res.get("strict", {}).get("step_ms")
        j = res.get("jit", {}).get("step_ms")
        c = res.get("compiled", {}).get("step_ms")
        x = res.get("jax", {}).get("step_ms")
        vs_s = f"{_med(s) / _med(d):.2f}× faster" if d and s else "-"
        vs_j = f"{_med(d) / _med(j):.2f}× slower" if d and j else "-"
        c_j = f"{_med(c) / _med(j):.2f}× slower" if c and j else "-"
        c_d = _ratio(_med(c), _med(d)) if c and d else "-"
        j_x = _ratio(_med(j), _med(x)) if j and x else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {vs_s} | {vs_j} | {c_j} | {c_d} | {j_x} |")
    lines += render_mfu(results, engines)
    lines += ["", "## First step (ms, includes compiling) / programs compiled in warm-up / in steady state / "
              "peak memory MB", "", "| workload | " + " | ".join(engines) + " |", "|---|" + "---|" * len(engines)]
    for name, res in results["workloads"].items():
        cells = []
        for e in engines:
            r = res.get(e, {})
            if r.get("error") or "first_ms" not in r:
                cells.append("-")
                continue
            peak = f"{_med(r['peak_mb']):.0f}" if r.get("peak_mb") else "-"
            cells.append(f"{r['first_ms']:.0f} / {r.get('compiled_warmup', '-')} / {r.get('compiled_steady', '-')} / {peak}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    scaling = results.get("compile_scaling")
    if scaling:
        lines += ["", "## Compile time vs depth (GPT first step, DeferAndFuse, fresh process each)", "",
                  "| layers | cuts | compile s | programs |", "|---:|---|---:|---:|"]
        for key, r in scaling.items():
            layers, cuts = str(key).split("|") if "|" in str(key) else (key, "default")
            lines.append(f"| {layers} | {cuts} | {r.get('seconds', float('nan')):.1f} | {r.get('programs', '-')} |")
    for title, na in (("Engines that could not run a workload", False), ("Engines that do not apply", True)):
        errors = [(n, e, r["error"]) for n, res in results["workloads"].items() for e, r in res.items()
                  if r.get("error") and bool(r.get("na")) == na]
        if errors:
            lines += ["", f"## {title}", ""]
            lines += [f"- {e} on {n}: {err}" for n, e, err in errors]
    return "\n".join(lines) + "\n"


def _missing(r: dict) -> str:
    return "fails" if r.get("error") and not r.get("na") else "-"


def render_mfu(results: dict, engines) -> list[str]:
    """The MFU table, for the workloads that count their FLOPs; "-" where the peak is unknown (a
    CPU) and for the cpu engine, which runs on the host, not on JAX's device."""
    rows = {n: res for n, res in results["workloads"].items() if any(r.get("flops") for r in res.values())}
    if not rows:
        return []
    env = results.get("env", {})
    peak = env.get("peak_flops", 0.0)
    where = (f"peak {peak / 1e12:.0f} TFLOP/s bf16 ({env.get('device_kind')})" if peak
             else f"peak unknown for {env.get('device_kind', 'this device')}: no MFU")
    shown = [e for e in engines if e != "cpu"]
    lines = ["", "## MFU (analytic FLOPs per step / median step time / peak)", "",
             f"{where}; float32 matmul precision {env.get('precision', '?')}: \"highest\" runs about six bf16 "
             "passes, so its MFU against the bf16 peak is low by design (bench/mfu.py).", "",
             "| workload | GFLOP/step | XLA's GFLOP/step (jax) | " + " | ".join(shown) + " |",
             "|---|---:|---:|" + "---:|" * len(shown)]
    for name, res in rows.items():
        flops = max(r.get("flops") or 0.0 for r in res.values())
        xla = res.get("jax", {}).get("xla_flops")
        cells = []
        for e in shown:
            r = res.get(e, {})
            u = mfu.mfu(flops, _med(r["step_ms"]), peak) if r.get("step_ms") else None
            cells.append(f"{u:.1%}" if u is not None else ("fails" if r.get("error") and not r.get("na") else "-"))
        lines.append(f"| {name} | {flops / 1e9:.3g} | {f'{xla / 1e9:.3g}' if xla else '-'} | " + " | ".join(cells) + " |")
    return lines


def _ratio(a: float, b: float) -> str:
    """a against b as "N× faster" or "N× slower" (a time: smaller is faster)."""
    return f"{b / a:.2f}× faster" if a <= b else f"{a / b:.2f}× slower"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="the fewest steps in a timed run")
    p.add_argument("--window-ms", type=float, default=500.0,
                   help="a timed run lasts at least this long for the workload's slowest engine")
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--workloads", default="", help="comma-separated name prefixes (default: all)")
    p.add_argument("--engines", default=",".join(default_engines()),
                   help="comma-separated (default: every in-process engine, and torchax where installed)")
    p.add_argument("--json", default=None)
    p.add_argument("--no-scaling", action="store_true", help="skip the 2- vs 12-layer compile measurement")
    p.add_argument("--no-tiny", action="store_true", help="skip the tiny-op latency table")
    p.add_argument("--precision", choices=("highest", "high", "medium"), default=None,
                   help="torch.set_float32_matmul_precision for every engine (default: PyTorch's, highest)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's peak, where mfu.py has none")
    args = p.parse_args(argv)
    if args.precision:
        torch.set_float32_matmul_precision(args.precision)
    engines = [e for e in args.engines.split(",") if e]
    wanted = [w for w in args.workloads.split(",") if w]
    platform, kind, peak = mfu.device()
    names = selected(wanted, platform)
    skipped = [n for n in WORKLOADS if any(n.startswith(w) for w in wanted or [""]) and n not in names]
    if skipped:
        print(f"... skipped on {platform}: {', '.join(skipped)} (select it alone to run it here)", file=sys.stderr)
    results = {"engines": engines, "workloads": {}, "env": {
        "torch": torch.__version__, "jax": __import__("jax").__version__, "cpus": os.cpu_count(),
        "platform": platform, "device_kind": kind, "peak_flops": args.peak_tflops * 1e12 or peak,
        "precision": torch.get_float32_matmul_precision()}}
    if not args.no_tiny:
        results["tiny"] = tiny_ops(args.reps)
    for name in names:
        print(f"... {name}", file=sys.stderr, flush=True)
        results["workloads"][name] = measure_workload(name, engines, args.warm, args.steps, args.reps,
                                                           args.window_ms)
    if not args.no_scaling and platform != "cpu":
        print("... compile scaling skipped: its fresh processes cannot open the device this one holds",
              file=sys.stderr)
    elif not args.no_scaling:
        results["compile_scaling"] = compile_scaling()
    text = render(results, engines)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
