"""How deferfuse serves each ATen op, and how much of PyTorch's OpInfo suite passes.

    python -m deferfuse.coverage                       # print the summary
    python -m deferfuse.coverage --markdown docs/ops.md --results '/tmp/opres.*.json'
    python -m deferfuse.coverage --markdown docs/ops.md --results ... --device-results '/tmp/tpu/opinfo*.json' \
        --device-label "TPU v5e, commit abc1234, 2026-12-06" --device-host-results '/tmp/cpu/opinfo*.json'

The serving table is computed from the dispatcher's own routing, so it cannot drift from what
actually happens. OpInfo pass counts come from a test run with DEFERFUSE_OPINFO_RESULTS=<prefix>
(each pytest worker writes <prefix>.<worker>.json).
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from collections import Counter, defaultdict

import torch

import deferfuse  # noqa: F401  (registers the device and the lowerings)
from .dispatch import HANDLERS
from .lowering import LOWERINGS
from .record import info_of
from .routes.data_dependent import EAGER

aten = torch.ops.aten

# Core ATen ops that deliberately have no lowering, and why. Everything else in the core set is
# lowered or decomposed (the report below checks that).
REASONS: dict[str, str] = {
    "aten._local_scalar_dense.default": "a host read: served by the sync path, not a program",
    "aten._pdist_forward.default": "rare; runs through the counted CPU fallback",
    "aten._adaptive_avg_pool2d_backward.default": "runs through the counted CPU fallback",
    "aten._adaptive_avg_pool3d.default": "runs through the counted CPU fallback",
    "aten.adaptive_avg_pool1d.default": "runs through the counted CPU fallback",
    "aten.nonzero.default": "data-dependent output shape: flushes, then runs eagerly in JAX",
    "aten.randperm.default": "lowered through the random family (factory without tensor inputs)",
    "aten.rand.default": "a factory: empty + uniform_ (both served)",
    "aten.randn.default": "a factory: empty + normal_ (both served)",
    "aten.scalar_tensor.default": "lowered",
    "aten.sym_numel.default": "metadata: answered by PyTorch from the wrapper's sizes",
    "aten.sym_size.int": "metadata: answered by PyTorch from the wrapper's sizes",
    "aten.sym_storage_offset.default": "metadata: answered by PyTorch from the wrapper's sizes",
    "aten.sym_stride.int": "metadata: answered by PyTorch from the wrapper's sizes",
}


def core_ops() -> list:
    out = []
    for packet_name in dir(aten):
        packet = getattr(aten, packet_name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                out.append(op)
    return sorted(out, key=str)


def served(op) -> tuple[str, str]:
    """(category, detail) for how an ATen overload runs on "tpu"."""
    if op in LOWERINGS:
        low = LOWERINGS[op]
        return "lowered", f"{low.family}: {low.fn.__module__.rsplit('.', 1)[-1]}.{low.fn.__name__}"
    if op in HANDLERS:
        return "special", HANDLERS[op].__name__
    route = info_of(op).route
    name = getattr(route, "inner", route).__name__
    if name in ("route_view", "route_as_strided", "route_alias"):
        return "view", "metadata over the shared storage; nothing computed"
    if name == "route_inplace_view":
        return "view", "in-place metadata change"
    if name == "route_mutating":
        functional = info_of(op).variant.functional
        return "mutation", f"{functional} ({served(functional)[0]}) then a write into the target"
    if name == "route_decomposed":
        return "decomposed", "torch._decomp"
    if name == "route_composite":
        return "decomposed", "CompositeImplicitAutograd"
    if name == "route_explicit":
        return "decomposed", "CompositeExplicitAutograd kernel"
    if name == "route_data_dependent":
        how = "eager JAX" if op in EAGER else "CPU fallback"
        return "data-dependent", f"flushes, then {how}"
    if name == "route_fallback":
        return "cpu-fallback", REASONS.get(str(op), "no lowering or decomposition")
    return "special", name


def opinfo_counts(pattern: str | None) -> dict:
    """{mode: {dtype: [passing, total]}} and per-op status from result files."""
    results: dict[str, str] = {}
    for path in sorted(glob.glob(pattern)) if pattern else []:
        with open(path) as f:
            results.update(json.load(f))
    table: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    per_op: dict = defaultdict(dict)
    entries: dict = defaultdict(lambda: defaultdict(dict))
    for key, status in results.items():
        name, variant, dtype, mode = key.split("|")
        col = "backward" if variant == "backward" else dtype
        entries[mode][col].setdefault(name, True)
        if status != "pass":
            entries[mode][col][name] = False
        per_op[name][f"{variant}/{dtype}/{mode}"] = status
    for mode, cols in entries.items():
        for col, ops in cols.items():
            table[mode][col] = [sum(ops.values()), len(ops)]
    # the headline: float32 entries passing in every mode that ran them
    every: dict = {}
    for mode in entries:
        for name, ok in entries[mode].get("float32", {}).items():
            every[name] = every.get(name, True) and ok
    if every:
        table["all three modes"]["float32"] = [sum(every.values()), len(every)]
    return {"table": {m: dict(c) for m, c in table.items()}, "per_op": per_op, "n_results": len(results)}


def load_xfails(paths) -> dict[str, str]:
    """Expected OpInfo failures from these JSON files (op|variant|dtype|mode -> reason); the
    test suite and docs/ops.md read them through this one loader."""
    out: dict[str, str] = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for k, v in data.items():
            if k.startswith("_comment"):  # keys may start with _ (_native_batch_norm_legit)
                continue
            if k in out:
                raise ValueError(f"{k} is listed twice (in {path} and another xfail file)")
            out[k] = v
    return out


def _mode_table(t: dict) -> list[str]:
    cols = ["float32", "float64", "bfloat16", "int64", "bool", "complex64", "backward"]
    lines = ["| mode | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for mode in ("all three modes", "defer_and_fuse", "strict", "debug"):
        if mode not in t:
            continue
        cells = []
        for c in cols:
            p, n = t[mode].get(c, [0, 0])
            cells.append(f"{p}/{n} ({100 * p / n:.1f} %)" if n else "-")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def device_section(device: dict, label: str, host: dict) -> list[str]:
    """The OpInfo counts of a run on an accelerator (the device profile's share of the
    entries), and each result that passes in `host`'s run and not on the device."""
    lines = [f"## OpInfo on {label}", "",
             "The device profile (`--device-profile`, docs/testing.md) runs a fixed seventh of the CI "
             f"profile's entries in one process on the chip; these counts come from {device['n_results']} "
             "test results of that run.", ""]
    lines += _mode_table(device["table"])
    worse = []
    for name, runs in sorted(device["per_op"].items()):
        for run, status in sorted(runs.items()):
            cpu = host["per_op"].get(name, {}).get(run)
            if status != "pass" and cpu == "pass":
                worse.append(f"| `{name}` | {run} | {status} |")
    lines += ["", f"Results that pass on CPU and not on the device: {len(worse)}"
              + ("" if host["n_results"] else " (no CPU results given to compare)") + ".", ""]
    if worse:
        lines += ["| entry | variant/dtype/mode | on the device |", "|---|---|---|", *worse, ""]
    return lines


def render(counts: dict, core: list, xfails: dict | None = None, device: list[str] | None = None) -> str:
    lines = ["# Op coverage", "", "Generated by `python -m deferfuse.coverage --markdown docs/ops.md`; do not edit.", ""]
    cats = Counter(served(op)[0] for op in core)
    lines += [f"## Core ATen ({len(core)} overloads)", "", "| served as | overloads |", "|---|---:|"]
    lines += [f"| {c} | {n} |" for c, n in cats.most_common()]
    lines.append("")
    t = counts["table"]
    if t:
        lines += ["## OpInfo entries passing every sample", "",
                  "An entry is one OpInfo (op and variant name); it passes when every sample of every tested "
                  "variant (function, method, in-place, out=) matches CPU PyTorch. What each mode and dtype "
                  "runs (the CI profile of `tests/test_opinfo.py`) is described in that file's docstring; "
                  f"these counts come from {counts['n_results']} test results.", ""]
        lines += _mode_table(t)
        lines.append("")
    lines += device or []
    lines += ["## Every Core ATen overload", "", "| op | served as | how |", "|---|---|---|"]
    for op in core:
        c, d = served(op)
        lines.append(f"| `{op}` | {c} | {d} |")
    if xfails:
        lines += ["", f"## Expected OpInfo failures ({len(xfails)})", "",
                  "From `tests/opinfo_xfail*.json` (op | variant | dtype | mode, `*` matches any). Each raises a "
                  "named error or runs through the counted CPU fallback; none gives a wrong number silently.", "",
                  "| entry | reason |", "|---|---|"]
        for k, v in sorted(xfails.items()):
            lines.append(f"| `{k}` | {v.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=None, help="glob of OpInfo result files (DEFERFUSE_OPINFO_RESULTS)")
    p.add_argument("--markdown", default=None, help="write the full table to this file")
    p.add_argument("--xfails", default="tests/opinfo_xfail*.json", help="glob of expected-failure files to list")
    p.add_argument("--device-results", default=None,
                   help="glob of OpInfo result files from a device profile run on an accelerator")
    p.add_argument("--device-label", default="a TPU", help="what ran them: chip, commit, date")
    p.add_argument("--device-host-results", default=None,
                   help="glob of result files of the same selection on CPU, to list what passes only there")
    args = p.parse_args(argv)
    core = core_ops()
    counts = opinfo_counts(args.results)
    cats = Counter(served(op)[0] for op in core)
    print(f"Core ATen overloads: {len(core)}")
    for c, n in cats.most_common():
        print(f"  {c:15s} {n}")
    fallback = [str(op) for op in core if served(op)[0] == "cpu-fallback"]
    if fallback:
        print("  on the CPU fallback: " + ", ".join(fallback))
    for mode, cols in counts["table"].items():
        print(f"OpInfo {mode}: " + ", ".join(f"{c} {p}/{n}" for c, (p, n) in sorted(cols.items())))
    if args.markdown:
        xfails = load_xfails(sorted(glob.glob(args.xfails)))
        device = None
        if args.device_results:
            device = device_section(opinfo_counts(args.device_results), args.device_label,
                                    opinfo_counts(args.device_host_results or args.results))
        with open(args.markdown, "w") as f:
            f.write(render(counts, core, xfails, device))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
