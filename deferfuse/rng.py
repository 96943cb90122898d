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
    return _seed, c


def get_rng_state(device=None) -> torch.Tensor:
    return torch.tensor([_seed, _counter], dtype=torch.int64).view(torch.uint8)


def set_rng_state(state: torch.Tensor, device=None) -> None:
    global _seed, _counter
    s, c = state.view(torch.int64).tolist()
    _seed, _counter = int(s), int(c)


def key(seed_value, counter):
    """The JAX key for (seed, counter); traced, so it costs nothing at dispatch time."""
    return jax.random.fold_in(jax.random.key(seed_value), counter)
