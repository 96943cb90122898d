"""RNG for "tpu" tensors: a (seed, counter) pair, turned into a JAX key inside the program.

Every random op takes the next counter value. Both numbers are *program inputs*, never
constants, so the same program gives fresh values on every call (dropout in a loop does not
recompile), and the values depend only on the seed and the op's position in the random stream,
not on how ops were fused: Strict, Debug and DeferAndFuse produce identical numbers.
"""
from __future__ import annotations

import random as _pyrandom

import jax
import torch

from .config import CONFIG
from .target import NAME, device_index, jax_device

_DEFAULT_SEED = 67280421310721  # torch's default CPU seed, so an unseeded run is still reproducible
_seed = _DEFAULT_SEED
_counter = 0


def _signed64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= (1 << 63) else x


def manual_seed(seed: int) -> None:
    global _seed, _counter
    _seed = _signed64(int(seed))
    _counter = 0


def seed() -> None:
    manual_seed(_pyrandom.getrandbits(63))


def initial_seed() -> int:
    return _seed & ((1 << 64) - 1)


def next_key() -> tuple[int, int]:
    """(seed, counter) for one random op; both are passed to the program as scalars."""
    global _counter
    c = _counter
    _counter = c + 1
    if _marking:
        return Seed(_seed), Counter(c)
    return _seed, c


# While a compiled graph records (deferfuse/compiler), keys are drawn as the int subclasses below:
# they mark their places among the graph's scalars, so each replay of the graph's program puts
# fresh ones there, and dropout draws new values every call, the values Strict draws.
_marking = False


class Seed(int):
    pass


class Counter(int):
    pass


def marking(on: bool) -> int:
    """Start (or stop) marking drawn keys; returns the counter at that moment."""
    global _marking
    _marking = on
    return _counter


def counter() -> int:
    """How many keys the global stream has drawn (a step replay checks that an op drew none)."""
    return _counter


def rewind(c: int) -> None:
    """Take the stream back to counter c: what was drawn since was never run (a compiled
    graph recorded dry, compiler/dry_record.py), so the call that runs draws those keys."""
    global _counter
    _counter = c


def reserve(n: int) -> tuple[int, int]:
    """(seed, first counter) of n consecutive counters taken from the stream at once."""
    global _counter
    c = _counter
    _counter = c + n
    return _seed, c


def get_rng_state(device=None) -> torch.Tensor:
    _check_device(device)
    return torch.tensor([_seed, _counter], dtype=torch.int64).view(torch.uint8)


def set_rng_state(state: torch.Tensor, device=None) -> None:
    global _seed, _counter
    _check_device(device)
    s, c = state.view(torch.int64).tolist()
    _seed, _counter = int(s), int(c)


def _check_device(device) -> None:
    """torch.cuda's RNG state functions index a tuple of per-device generators: an index past the
    last device is an IndexError there (a negative one, torch.device's RuntimeError)."""
    if isinstance(device, int):
        device = torch.device(NAME, device)
    if device_index(device) != 0:
        raise IndexError(f"deferfuse: there is one tpu device (tpu:0), got {device} (tuple index out of range)")


def key(seed_value, counter):
    """The JAX key for (seed, counter); traced, so it costs nothing at dispatch time."""
    return jax.random.fold_in(jax.random.key(seed_value, impl=implementation()), counter)


def implementation() -> str | None:
    """The JAX PRNG implementation of the keys (CONFIG.prng; None: JAX's default). Part of every
    program's key in deferfuse's own store, as each setting is (cache/stored.py)."""
    name = CONFIG.prng
    if name == "auto":
        return "rbg" if jax_device().platform != "cpu" else None
    return name


# --- torch.Generator(device="tpu") ---------------------------------------------------------------
# A Python backend cannot give PyTorch a generator of its own kind (the Python PrivateUse1 hooks
# have no getNewGenerator), so `torch.Generator(device="tpu")` makes a CPU generator that reports
# the tpu device. A random op given one draws its key's seed from it: reseeding the generator
# repeats the op's values, as on CUDA (the values themselves are not CUDA's or CPU's).


class TpuGenerator(torch._C.Generator):
    @property
    def device(self) -> torch.device:
        return torch.device(NAME, 0)


def key_from(gen) -> tuple[int, int]:
    """(seed, counter) for one random op given `generator=gen`. CUDA would refuse a CPU generator
    for a cuda op; here every generator reaching an op is a CPU one (PyTorch re-wraps it on the
    way, so a TpuGenerator cannot be told apart), and each is honoured."""
    seed = int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64, generator=gen))
    return seed, 0


def key_for(kwargs) -> tuple[int, int]:
    """The key of a random op called with these keyword arguments: from its generator if it was
    given one, else the next of the global stream."""
    gen = kwargs.get("generator") if kwargs else None
    return next_key() if gen is None else key_from(gen)


class _GeneratorType(type(torch._C.Generator)):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    """torch.Generator, which also takes device="tpu": every generator, CPU ones included, is
    still an instance of it."""

    def __new__(cls, device=None):
        if device is not None and torch.device(device).type == NAME:
            return TpuGenerator("cpu")
        return torch._C.Generator() if device is None else torch._C.Generator(device)


def install_generator() -> None:
    torch.Generator = Generator
