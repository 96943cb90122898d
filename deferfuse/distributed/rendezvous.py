"""Every rank of a group meets in the store before a collective runs: a dead, late or diverged
peer is an error naming the collective and the rank, never a hang.

Once XLA has launched a collective, a peer that never joins leaves it blocked until JAX's
heartbeat gives up and ends the process. So before launching, each rank writes what it is about
to run (`all_reduce SUM float32[1024]`) under the collective's sequence number and waits, up to
the group's timeout, for every other rank's entry:

- an entry missing at the deadline names the rank that did not arrive, and what it ran last;
- entries that differ name the ranks that diverged and what each called;

and in both cases no collective was launched, so the process can handle the error and exit;
at exit it does not wait for the failed peer in JAX's shutdown barrier, and its status is 1
(cluster.peer_failed), as for a process an uncaught exception ends.
The cost is three store round trips per collective (bench/distributed.py measures it);
DEFERFUSE_DIST_CHECK=0 skips it.
"""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from .. import cluster


class Rendezvous:
    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, group: str):
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.group = group
        self.seq = 0
        self.last = "nothing yet"

    def meet(self, what: str) -> None:
        """Wait until every rank of the group is about to run `what` (#seq), or raise."""
        self.seq += 1
        seq, store = self.seq, self.store
        keys = [f"{seq}/{r}" for r in range(self.size)]
        store.set(keys[self.rank], what)
        try:
            store.wait(keys, self.timeout)
        except dist.DistStoreError:
            cluster.peer_failed()
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise dist.DistBackendError(
                f"deferfuse tpu_dist: {what} (collective #{seq} on group {self.group}) timed out after "
                f"{self.timeout.total_seconds():g} s: rank(s) {missing} of {self.size} never reached it; "
                f"this rank ({self.rank}) last ran {self.last}. A peer died, is stuck, or took another "
                "path through the program.") from None
        seen = [v.decode() for v in store.multi_get(keys)]
        if len(set(seen)) > 1:
            cluster.peer_failed()
            calls = "; ".join(f"rank {r}: {v}" for r, v in enumerate(seen))
            raise dist.DistBackendError(
                f"deferfuse tpu_dist: the ranks of group {self.group} diverged at collective #{seq}: {calls}. "
                "Every rank must run the same collectives in the same order.")
        self.last = f"{what} (#{seq})"
        if seq > 2:  # every rank has read #seq-2's entries: it has written #seq-1's
            store.delete_key(f"{seq - 2}/{self.rank}")
