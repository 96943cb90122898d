"""Triage runner (not a test): run OpInfo samples and write a JSON of outcomes.

    python tests/opinfo_triage.py --dtype float32 --mode defer_and_fuse --out /tmp/f32.json [--ops add,mul]
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import opinfo_support as S  # noqa: E402


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float32")
    p.add_argument("--mode", default="defer_and_fuse")
    p.add_argument("--variants", default="function,method,inplace,out")
    p.add_argument("--ops", default="")
    p.add_argument("--shard", default="0/1")
    p.add_argument("--out", required=True)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    k, n = map(int, args.shard.split("/"))
    dtype = S.DTYPES[args.dtype]
    wanted = set(args.ops.split(",")) if args.ops else None
    results = {}
    signal.signal(signal.SIGALRM, _alarm)
    t_all = time.time()
    for i, op in enumerate(S.op_db):
        name = S.full_name(op)
        if wanted and name not in wanted and op.name not in wanted:
            continue
        if i % n != k:
            continue
        if dtype not in op.supported_dtypes("cpu"):
            continue
        if args.backward and not op.supports_autograd:
            continue
        t0 = time.time()
        vs = ["backward"] if args.backward else [v for v in S.variants(op) if v in args.variants.split(",")]
        for v in vs:
            key = f"{name}|{v}|{args.dtype}|{args.mode}"
            status, detail, nsamp = "pass", "", 0
            signal.alarm(120)
            try:
                with S.quiet():
                    ss = S.samples(op, dtype, requires_grad=args.backward, limit=args.limit or (3 if args.backward else None))
                for s in ss:
                    nsamp += 1
                    if args.backward:
                        S.run_backward(op, s, args.mode)
                    elif S.is_random(op) and v == "function":
                        S.run_sample(op, s, v, args.mode)
                        S.run_random_determinism(op, s, args.mode)
                    else:
                        S.run_sample(op, s, v, args.mode)
            except Timeout:
                status, detail = "timeout", "over 120 s"
            except NotImplementedError as e:
                status, detail = "fail", f"NotImplementedError: {str(e)[:300]}"
            except Exception as e:  # noqa: BLE001
                tb = traceback.extract_tb(e.__traceback__)
                where = next((f"{f.filename.split('/')[-1]}:{f.lineno}" for f in reversed(tb) if "deferfuse" in f.filename), "")
                status, detail = "fail", f"{type(e).__name__}: {str(e)[:300]} @ {where}"
            finally:
                signal.alarm(0)
            results[key] = {"status": status, "detail": detail, "samples": nsamp, "seconds": round(time.time() - t0, 2)}
            print(f"{status:7s} {key} {detail[:150]}", flush=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=0)
    fails = sum(1 for r in results.values() if r["status"] != "pass")
    print(f"done: {len(results)} entries, {fails} failing, {time.time() - t_all:.0f}s")


if __name__ == "__main__":
    main()
