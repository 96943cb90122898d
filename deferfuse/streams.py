"""torch.tpu.Stream, Event, current_stream, stream: CUDA's stream API over one in-order queue.

deferfuse runs a device's programs in the order the host issues them (JAX's dispatch order), so
there is one stream, and every ordering a stream or event asks for already holds: waiting on an
event or another stream is free, and recording one marks a point in that single order. Code
written for CUDA streams (FSDP2 overlaps its all-gathers on streams of their own, DDP and
checkpointing ask for the current stream) runs unchanged and means the same thing.
`synchronize` waits for the device, as torch.tpu.synchronize does; an event's elapsed time is
host time between its synchronised records.
"""
from __future__ import annotations

import contextlib
import time

import torch

from .api import sync
from .causes import Cause
from .target import NAME


class Stream:
    """The device's one queue; every Stream object is the same stream."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device(NAME, 0)
        self.priority = priority

    def wait_event(self, event: "Event") -> None:
        """Nothing to wait for: the event's work was issued earlier to the same queue."""

    def wait_stream(self, stream: "Stream") -> None:
        """Nothing to wait for: there is one queue."""

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        sync(cause=Cause.SYNCHRONIZE, depth=3)

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return hash(Stream)

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device={NAME}:0 (the one in-order queue)>"


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._at = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        """Work after this point is issued after the recorded work, to the same queue."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        sync(cause=Cause.SYNCHRONIZE, depth=3)

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds of host time between the two records."""
        if self._at is None or end._at is None:
            raise RuntimeError("deferfuse: both events must be recorded before elapsed_time")
        return (end._at - self._at) * 1000.0


_STREAM = Stream()


def current_stream(device=None) -> Stream:
    return _STREAM


def default_stream(device=None) -> Stream:
    return _STREAM


def set_stream(stream: Stream) -> None:
    """Every stream is the one queue: nothing changes."""


@contextlib.contextmanager
def stream(s: Stream | None):
    yield


def install(mod) -> None:
    """Give torch.tpu (install.py) the stream API."""
    for name in ("Stream", "Event", "current_stream", "default_stream", "set_stream", "stream"):
        setattr(mod, name, globals()[name])
