"""What each rank runs in the multi-process tests: `torchrun ... workers.py CASE OUT [MODE]`.

Each case saves what the test compares to OUT/rank<r>.pt; the oracle is computed in the same
process (gloo on CPU tensors, or one process on the whole batch on CPU).
"""
from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import deferfuse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool, torch.bfloat16]
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def _data(rank: int, shape, dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 7, shape, generator=g).to(dtype)


def _outcome(fn):
    """What a collective gave: its tensors, or the type of the exception it raised."""
    try:
        return fn()
    except Exception as e:  # compared by type with gloo's
        return type(e).__name__


def collectives(out: str, mode: str) -> None:
    """Every collective on tpu tensors (default group, tpu_dist) and on CPU tensors (a gloo
    group): both results are saved, keyed alike."""
    dist.init_process_group()
    gloo = dist.new_group(backend="gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    results: dict = {}
    for device, group in (("tpu", None), ("cpu", gloo)):
        def on(t):
            return t.to(device, copy=True)  # gloo writes into CPU inputs: never the source data
        res = results[device] = {}
        with deferfuse.mode(mode):
            for dtype in DTYPES:
                for op in OPS:
                    def reduce(dtype=dtype, op=op):
                        t = on(_data(rank, (5, 3), dtype))
                        dist.all_reduce(t, getattr(dist.ReduceOp, op), group=group)
                        return t.cpu()
                    res[f"all_reduce {op} {dtype}"] = _outcome(reduce)
            for dtype in (torch.float32, torch.int64, torch.bool):
                x = _data(rank, (4, 3), dtype, 1)
                # non-contiguous input, a 0-d tensor
                t = on(x).t()
                dist.broadcast(t, 1, group=group)
                res[f"broadcast {dtype}"] = t.cpu()
                s = on(x[0, 0].clone())
                dist.broadcast(s, 0, group=group)
                res[f"broadcast 0-d {dtype}"] = s.cpu()
                outs = [on(torch.zeros(4, 3, dtype=dtype)) for _ in range(n)]
                dist.all_gather(outs, on(x), group=group)
                res[f"all_gather {dtype}"] = [o.cpu() for o in outs]
                big = on(torch.zeros(4 * n, 3, dtype=dtype))
                dist.all_gather_into_tensor(big, on(x), group=group)
                res[f"all_gather_into_tensor {dtype}"] = big.cpu()
                g = [on(torch.zeros(4, 3, dtype=dtype)) for _ in range(n)] if rank == 1 else None
                dist.gather(on(x), g, dst=1, group=group)
                res[f"gather {dtype}"] = [o.cpu() for o in g] if g else None
                o = on(torch.zeros(2, 3, dtype=dtype))
                dist.scatter(o, [on(_data(k, (2, 3), dtype, 2)) for k in range(n)] if rank == 0 else None, src=0,
                             group=group)
                res[f"scatter {dtype}"] = o.cpu()
            for op in ("SUM", "MAX", "PRODUCT"):
                x = _data(rank, (2 * n, 3), torch.float32, 3)
                o = on(torch.zeros(2, 3))
                res[f"reduce_scatter_tensor {op}"] = _outcome(lambda: (dist.reduce_scatter_tensor(
                    o, on(x), getattr(dist.ReduceOp, op), group=group), o.cpu())[1])
                lo = on(torch.zeros(2, 3))
                res[f"reduce_scatter {op}"] = _outcome(lambda: (dist.reduce_scatter(
                    lo, [on(c) for c in x.chunk(n)], getattr(dist.ReduceOp, op), group=group), lo.cpu())[1])
                r = on(x.clone())
                res[f"reduce {op}"] = _outcome(lambda: (dist.reduce(r, 0, getattr(dist.ReduceOp, op), group=group),
                                                        r.cpu() if rank == 0 else None)[1])
            x = _data(rank, (2 * n, 3), torch.float32, 4)
            o = on(torch.zeros(2 * n, 3))
            dist.all_to_all_single(o, on(x), group=group)
            res["all_to_all_single even"] = o.cpu()
            ins = [1 + rank, 2] if n == 2 else None
            outs = [1, 2] if rank == 0 else [2, 2]
            xi = _data(rank, (sum(ins), 3), torch.float32, 5)
            o = on(torch.zeros(sum(outs), 3))
            dist.all_to_all_single(o, on(xi), outs, ins, group=group)
            res["all_to_all_single uneven"] = o.cpu()
            ins = [on(_data(rank, (3,), torch.int64, 6 + k)) for k in range(n)]
            outs = [on(torch.zeros(3, dtype=torch.int64)) for _ in range(n)]
            dist.all_to_all(outs, ins, group=group)
            res["all_to_all lists"] = [t.cpu() for t in outs]
            if device == "tpu":  # chunks of different sizes: gloo refuses them; the oracle is the data sent
                ins = [on(_data(rank, (k + 1 + rank,), torch.int64, 6 + k)) for k in range(n)]
                outs = [on(torch.zeros(rank + 1 + k, dtype=torch.int64)) for k in range(n)]
                dist.all_to_all(outs, ins)
                res["all_to_all uneven lists"] = [t.cpu() for t in outs]
                res["all_to_all uneven lists expected"] = [_data(k, (k + 1 + rank,), torch.int64, 6 + rank)
                                                          for k in range(n)]
            p = on(_data(rank, (3,), torch.float32, 7))
            if rank == 0:
                dist.send(p, 1, group=group)
            else:
                dist.recv(p, 0, group=group)
            res["send/recv"] = p.cpu()
            dist.barrier(group=group)
            objs = [None] * n
            dist.all_gather_object(objs, {"rank": rank, "t": (rank, "x")}, group=group)
            res["all_gather_object"] = objs
            lst = [f"from {rank}", rank * 10]
            dist.broadcast_object_list(lst, src=1, group=group)
            res["broadcast_object_list"] = lst
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4))


def _batch(step: int, rank: int, n: int):
    """Step `step`'s whole batch (x, y) and this rank's slice of it."""
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(8 * n, 8, generator=g), torch.randn(8 * n, 4, generator=g)
    return x, y, slice(8 * rank, 8 * rank + 8)


def _reference_step(ref: torch.nn.Module, opt: torch.optim.Optimizer, x, y) -> None:
    """The oracle's step: one CPU process on the whole batch."""
    torch.nn.functional.mse_loss(ref(x), y).backward()
    opt.step()
    opt.zero_grad()


def ddp(out: str, mode: str) -> None:
    """DDP on the MLP: each rank trains on its half of each batch; the oracle is one CPU process
    on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    ref = _mlp()
    model = DDP(copy.deepcopy(ref).to("tpu"), bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    losses, grads = [], []
    # "spmd_safe": DeferAndFuse with the collectives recorded into the step (no mid-step reads)
    spmd = mode == "spmd_safe"
    for step in range(4):
        if step == 2:  # steady state: DDP has rebuilt its buckets (a host read) in step 1
            deferfuse.reset_metrics()
        x, y, mine = _batch(step, rank, n)
        with deferfuse.mode("defer_and_fuse" if spmd else mode), \
                deferfuse.distributed.spmd_safe() if spmd else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(model(x[mine].to("tpu")), y[mine].to("tpu"))
            loss.backward()
            if not spmd:
                grads.append([p.grad.cpu() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        _reference_step(ref, ref_opt, x, y)
    metrics = deferfuse.metrics()  # the steps' own, before the reads below
    torch.save({"grads": grads, "params": [p.detach().cpu() for p in model.parameters()],
                "ref_params": [p.detach() for p in ref.parameters()], "losses": losses,
                "metrics": metrics}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def fsdp(out: str, mode: str) -> None:
    """FSDP2 (`fully_shard` per layer and at the root), 3 AdamW steps; the oracle is one CPU
    process on the whole batch."""
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    ref = _mlp()
    model = copy.deepcopy(ref).to("tpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    losses = []
    for step in range(3):
        x, y, mine = _batch(step, rank, n)
        with deferfuse.mode(mode):
            loss = torch.nn.functional.mse_loss(model(x[mine].to("tpu")), y[mine].to("tpu"))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        _reference_step(ref, ref_opt, x, y)
    full = [p.full_tensor().cpu() for p in model.parameters()]
    torch.save({"params": full, "ref_params": [p.detach() for p in ref.parameters()], "losses": losses,
                "types": [type(p).__name__ for p in model.parameters()]}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def dtensor(out: str, mode: str) -> None:
    """DTensor: distribute_tensor, a matmul of a row-sharded and a replicated tensor,
    redistribute to replicated; on a 1-D mesh of all ranks, or a 2x2 mesh with 4 processes
    (sharded over one dim, replicated over the other)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    shape = (2, 2) if n == 4 else (n,)
    mesh = init_device_mesh("tpu", shape)
    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(6, 5)
    with deferfuse.mode(mode):
        placements = [Shard(0)] + [Replicate()] * (len(shape) - 1)
        da = distribute_tensor(a.to("tpu"), mesh, placements)
        db = distribute_tensor(b.to("tpu"), mesh, [Replicate()] * len(shape))
        dc = da @ db
        whole = dc.redistribute(mesh, [Replicate()] * len(shape)).to_local().cpu()
        local = da.to_local().cpu()
        if len(shape) == 2:  # a sum over the second mesh dimension's group alone
            col = mesh.get_group(1)
            t = torch.full((3,), float(rank), device="tpu")
            dist.all_reduce(t, group=col)
            local_sum = t.cpu()
        else:
            local_sum = None
    torch.save({"whole": whole, "expected": a @ b, "local": local, "a": a, "col_sum": local_sum,
                "col_ranks": dist.get_process_group_ranks(mesh.get_group(1)) if len(shape) == 2 else None},
               os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def stuck_peer(out: str, mode: str) -> None:
    """Rank 1 never reaches the all-reduce (a peer stuck elsewhere): rank 0 must raise within the
    group's timeout, naming the collective and the rank, and exit."""
    dist.init_process_group(timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)  # both ranks: fine
    if rank == 1:
        time.sleep(60)
    t0 = time.time()
    try:
        dist.all_reduce(t)
    except dist.DistBackendError as e:
        with open(os.path.join(out, "rank0.txt"), "w") as f:
            f.write(f"{time.time() - t0:.1f}\n{e}\n{t.cpu().tolist()}")
        raise


def _failing_now(out: str) -> None:
    """When this rank fails: the test times the job's end from it, not from a startup that
    takes from 10 to 30 s on a busy 2-core machine."""
    with open(os.path.join(out, "failed_at.txt"), "w") as f:
        f.write(repr(time.time()))


def raises_mid_step(out: str, mode: str) -> None:
    """Rank 1 raises between two all-reduces of a step, with the default timeout (30 min), while
    rank 0 waits for it in the second: the job must end promptly with rank 1's error."""
    dist.init_process_group()
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    with deferfuse.mode(mode):
        dist.all_reduce(t)
        if rank == 1:
            _failing_now(out)
            raise ValueError("rank 1 fails mid-step")
        dist.all_reduce(t)


def raises_in_collective(out: str, mode: str) -> None:
    """DDP with a comm hook that refuses non-finite gradients before all-reducing a bucket. Rank
    1's batch holds a NaN, so rank 1 raises inside its bucket's collective while rank 0 waits in
    the same one (default timeout): the job must end promptly with rank 1's error."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    def finite_allreduce(group, bucket):
        if not torch.isfinite(bucket.buffer()).all():
            _failing_now(out)
            raise FloatingPointError(f"rank {dist.get_rank()}: non-finite gradient in bucket {bucket.index()}")
        return allreduce_hook(group, bucket)

    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    model = DDP(_mlp().to("tpu"))
    model.register_comm_hook(None, finite_allreduce)
    x, y, mine = _batch(0, rank, n)
    x, y = x[mine], y[mine]
    if rank == 1:
        x[0, 0] = float("nan")
    with deferfuse.mode(mode):
        torch.nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu")).backward()


def diverged(out: str, mode: str) -> None:
    """Rank 0 all-reduces while rank 1 broadcasts: both ranks raise, naming what each called."""
    dist.init_process_group(timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    t = torch.ones(4, device="tpu")
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, 0)
    except dist.DistBackendError as e:
        with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
            f.write(str(e))
        raise


if __name__ == "__main__":
    case, out = sys.argv[1], sys.argv[2]
    globals()[case](out, sys.argv[3] if len(sys.argv) > 3 else "strict")
