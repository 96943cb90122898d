"""The "tpu_dist" torch.distributed backend: a Python ProcessGroup whose collectives are XLA's.

torch.distributed calls these methods with the tensors of a collective; each one reads its
input as a flat array (a DeferAndFuse flush, cause `distributed_op`, runs what it depends on),
meets its peers (rendezvous.py), runs the program collectives.py keeps for it, and writes the
result into the output tensors as a recorded copy, so what follows fuses with it. Work is
returned complete, in the stream sense CUDA's is: its values are being computed in order.

CPU tensors are served too (a group made with tpu_dist alone gets them: object collectives,
`barrier`), through the device and back.

Group ranks are the group's own; `ranks` maps them to global ranks, which are JAX's process
indices (cluster.py starts JAX with process_id = RANK).
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceOptions, AllToAllOptions, BarrierOptions,
                                        BroadcastOptions, ReduceOptions, ReduceScatterOptions, ScatterOptions,
                                        _create_work_from_future)
from torch.futures import Future

from .. import cluster, pending, sources, spmd
from ..causes import Cause
from ..config import CONFIG
from ..target import NAME, jax_device
from ..tensor import from_concrete
from . import collectives, fsdp, region
from .rendezvous import Rendezvous

BACKEND = "tpu_dist"


def _done(result) -> dist.Work:
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _describe(kind: str, t: torch.Tensor, **attrs) -> str:
    extra = "".join(f" {k}={v}" for k, v in attrs.items())
    return f"{kind}{extra} {str(t.dtype).removeprefix('torch.')}[{t.numel()}]"


def _op_name(opts) -> str:
    op = opts.reduceOp.op.name
    if op == "PREMUL_SUM":
        raise NotImplementedError("deferfuse tpu_dist: ReduceOp.PREMUL_SUM is NCCL's alone; scale the tensor "
                                  "and use ReduceOp.SUM")
    return op


class TpuProcessGroup(dist.ProcessGroup):
    """One group of processes; its ranks' devices form the mesh its collectives run on."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, ranks: tuple, name: str):
        super().__init__(rank, size)
        self._ranks = ranks
        self._name = name
        self._timeout = timeout
        self._store = store
        self._meet = Rendezvous(dist.PrefixStore("deferfuse/", store), rank, size, timeout, name)
        self._pairs: dict[tuple, Rendezvous] = {}

    def getBackendName(self) -> str:
        return BACKEND

    @property
    def group_name(self) -> str:
        """The name torch.distributed registered the group under (DeviceMesh resolves groups by
        it; the C++ base keeps it on backends a Python group does not have)."""
        return self._name

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self.rank()}, size={self.size()}, ranks={list(self._ranks)})"

    # --- the steps every collective takes ----------------------------------------------------

    def _run(self, kind: str, what: str, flat: torch.Tensor, ranks=None, meet=None, **attrs) -> torch.Tensor:
        """Meet, then run collective `kind` on this rank's flat tpu tensor; the result, flat.
        Inside `spmd_safe()` (DeferAndFuse), record it instead (region.py)."""
        if region.active():
            return region.record(kind, ranks or self._ranks, flat, attrs)
        local = pending.concrete(flat, Cause.DISTRIBUTED_OP, sources.user_frame())
        if CONFIG.dist_check:
            (meet or self._meet).meet(what)
        out = collectives.run(kind, ranks or self._ranks, local, **attrs)
        return from_concrete(out, flat.dtype)

    # --- reductions -----------------------------------------------------------------------------

    def allreduce(self, tensors, opts=AllreduceOptions()):
        op = _op_name(opts)
        with torch.no_grad():
            for t in tensors:
                _check_reduce(op, t.dtype)
                _assign(t, self._run("all_reduce", _describe("all_reduce", t, op=op), _flat(t), op=op))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=AllreduceOptions()):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=ReduceOptions()):
        op = _op_name(opts)
        with torch.no_grad():
            for t in tensors:
                _check_reduce(op, t.dtype)
                out = self._run("all_reduce", _describe("reduce", t, op=op, root=opts.rootRank), _flat(t), op=op)
                if self.rank() == opts.rootRank:
                    _assign(t, out)
        return _done(tensors)

    def broadcast(self, tensors, opts=BroadcastOptions()):
        with torch.no_grad():
            for t in tensors:
                _assign(t, self._run("broadcast", _describe("broadcast", t, root=opts.rootRank), _flat(t),
                                     root=opts.rootRank))
        return _done(tensors)

    # --- gathers and scatters -------------------------------------------------------------------

    def allgather(self, output_lists, inputs, opts=AllgatherOptions()):
        with torch.no_grad():
            for outs, t in zip(output_lists, inputs):
                _split_into(outs, self._run("all_gather", _describe("all_gather", t), _flat(t)))
        return _done(output_lists)

    def _allgather_base(self, output, input, opts=AllgatherOptions()):
        with torch.no_grad():
            _assign(output, self._run("all_gather", _describe("all_gather", input), _flat(input)))
        return _done([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=AllgatherOptions()):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _done(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=ReduceScatterOptions()):
        with torch.no_grad():
            for out, ins in zip(outputs, input_lists):
                self._reduce_scatter_base(out, torch.cat([_flat(i) for i in ins]), opts)
        return _done(outputs)

    def _reduce_scatter_base(self, output, input, opts=ReduceScatterOptions()):
        op = _op_name(opts)
        _check_reduce(op, input.dtype)
        with torch.no_grad():
            _assign(output, self._run("reduce_scatter", _describe("reduce_scatter", input, op=op), _flat(input), op=op))
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=ReduceScatterOptions()):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _done(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(self, output_lists, inputs, opts=ScatterOptions()):
        with torch.no_grad():
            t = inputs[0]
            out = self._run("all_gather", _describe("gather", t, root=opts.rootRank), _flat(t))
            if self.rank() == opts.rootRank:
                _split_into(output_lists[0], out)
        return _done(output_lists)

    def scatter(self, outputs, input_lists, opts=ScatterOptions()):
        with torch.no_grad():
            out = outputs[0]
            if self.rank() == opts.rootRank:
                flat = torch.cat([_flat(i) for i in input_lists[0]])
            else:  # the program is the same on every rank: the others send zeros nobody keeps
                flat = torch.zeros(out.numel() * self.size(), dtype=out.dtype, device=NAME)
            _assign(out, self._run("scatter", _describe("scatter", out, root=opts.rootRank), flat, root=opts.rootRank))
        return _done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=AllToAllOptions()):
        with torch.no_grad():
            n = self.size()
            if not output_split_sizes and not input_split_sizes:
                _assign(output, self._run("all_to_all", _describe("all_to_all", input), _flat(input)))
                return _done([output])
            ins = list(input.split(input_split_sizes or [input.shape[0] // n] * n))
            outs = list(output.split(output_split_sizes or [output.shape[0] // n] * n))
            self._uneven_all_to_all(outs, ins)
        return _done([output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=AllToAllOptions()):
        with torch.no_grad():
            self._uneven_all_to_all(outputs, inputs)
        return _done(outputs)

    def _uneven_all_to_all(self, outs, ins) -> None:
        """Chunks of different sizes: pad every chunk to the largest any rank sends (one small
        all-reduce finds it), exchange evenly, and keep each chunk's own length."""
        longest = torch.tensor([max([i.numel() for i in ins] + [o.numel() for o in outs])], device=NAME)
        self.allreduce([longest], _reduce_options("MAX"))
        size = int(longest.item())
        flat = torch.cat([torch.nn.functional.pad(_flat(i), (0, size - i.numel())) for i in ins])
        got = self._run("all_to_all", _describe("all_to_all", flat), flat)
        for k, o in enumerate(outs):
            _assign(o, got[k * size:k * size + o.numel()])

    # --- point to point ------------------------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        return self._p2p(tensors, self.rank(), dst, tag)

    def recv(self, tensors, src, tag=0):
        return self._p2p(tensors, src, self.rank(), tag)

    def _p2p(self, tensors, src: int, dst: int, tag: int):
        """Sender and receiver run one program on the mesh of the two: a `ppermute` from one to
        the other. Each pair's sends and receives pair up in the order both sides issue them."""
        pair = (min(src, dst), max(src, dst))
        meet = self._pairs.get(pair)
        if meet is None:
            store = dist.PrefixStore(f"deferfuse-p2p/{pair[0]}-{pair[1]}/", self._store)
            meet = self._pairs[pair] = Rendezvous(store, pair.index(self.rank()), 2, self._timeout,
                                                  f"{self._name} ranks {pair}")
        ranks = tuple(self._ranks[r] for r in pair)
        with torch.no_grad():
            for t in tensors:
                what = _describe("send/recv", t, src=src, dst=dst, tag=tag)
                got = self._run("permute", what, _flat(t), ranks=ranks, meet=meet,
                                pairs=((pair.index(src), pair.index(dst)),))
                if self.rank() == dst:
                    _assign(t, got)
        return _done(tensors)

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("deferfuse tpu_dist: recv from any source; name the sending rank")

    def barrier(self, opts=BarrierOptions()):
        one = torch.ones(1, device=NAME)
        self.allreduce([one], AllreduceOptions())
        one.cpu()  # every rank has arrived: the sum is here
        return _done([one])


def _reduce_options(op: str) -> AllreduceOptions:
    opts = AllreduceOptions()
    opts.reduceOp = getattr(dist.ReduceOp, op)
    return opts


def _check_reduce(op: str, dtype: torch.dtype) -> None:
    """What gloo refuses, refused alike (an integer average has no one meaning: floor or trunc)."""
    if op == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"deferfuse tpu_dist: ReduceOp.AVG needs a floating point tensor, got {dtype}")
    if op in spmd.BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"deferfuse tpu_dist: ReduceOp.{op} needs an integer or bool tensor, got {dtype}")
    if op in ("MIN", "MAX") and dtype.is_complex:
        raise RuntimeError(f"deferfuse tpu_dist: ReduceOp.{op} is not defined for complex tensors ({dtype})")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t's elements in order, as a flat tensor on the device."""
    return (t if t.device.type == NAME else t.to(NAME)).reshape(-1)


def _assign(out: torch.Tensor, flat: torch.Tensor) -> None:
    value = flat.view(out.shape)
    out.copy_(value if out.device.type == NAME else value.cpu())


def _split_into(outs, flat: torch.Tensor) -> None:
    at = 0
    for o in outs:
        _assign(o, flat[at:at + o.numel()])
        at += o.numel()


def _create(opts, backend_options) -> TpuProcessGroup:
    """torch.distributed's factory for a group: the world, a `new_group`, a `DeviceMesh` dim."""
    cluster.start(opts.store, opts.group_rank, opts.group_size)
    jax_device()
    fsdp.patch()
    ranks = tuple(opts.global_ranks_in_group) or tuple(range(opts.group_size))
    return TpuProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks, opts.group_id)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[NAME])
