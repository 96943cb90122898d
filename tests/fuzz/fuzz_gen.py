"""Random straight-line programs for the differential fuzzer, as Python source.

A program is a list of statements over named tensors (`a0..` inputs, `v0..` results, `r0..`
host reads) and the device name `d`, so a failing case prints as a script anyone can run. It is
generated while it runs on CPU: every choice (a dim, an index, a partner of a broadcastable
shape) is made against the tensors as they are, which keeps most calls valid while still making
the invalid ones CPU rejects (a wrong broadcast, a bool subtraction, an in-place write through an
overlapping view) that must fail the same way on tpu. Shapes come from a small fixed set so that
the programs of a run keep reusing the same compiled per-op programs.
"""
from __future__ import annotations

import random
import warnings

import torch
import torch.nn.functional as F

from fuzz_ops import FAMILIES

SHAPES = [(), (0,), (3,), (3,), (1, 3), (2, 1), (2, 3), (2, 3), (2, 3), (0, 3), (3, 3), (3, 3), (2, 3, 3)]
DTYPES = [torch.float32] * 6 + [torch.float64, torch.bfloat16, torch.bfloat16, torch.int64, torch.int64,
                                 torch.bool, torch.complex64]
MAX_NUMEL = 64
MAX_DIM = 4


def inp(shape, dtype, seed):
    """A tensor of small exact values (multiples of 0.5, small integers) on CPU, moved to `d`'s
    device by the caller: exact values keep sums and products free of rounding differences, so
    a disagreement is a bug, not noise."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(-6, 7, shape, generator=g)
    if dtype == torch.bool:
        return k > 0
    if dtype.is_complex:
        return torch.complex(k.float() / 2, torch.randint(-4, 5, shape, generator=g).float() / 2).to(dtype)
    if dtype.is_floating_point:
        return (k.double() / 2).to(dtype)
    return k.to(dtype)


def namespace(device: str) -> dict:
    return {"torch": torch, "F": F, "inp": inp, "d": device}


class Gen:
    """Generator state: the CPU namespace the statements so far ran in, and the program."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.ns = namespace("cpu")
        self.stmts: list[str] = []
        self.count = 0
        self.copies: set[str] = set()  # names whose storage is a dtype-reinterpreting view (no writes)
        # storages with a dtype-reinterpreting view (`.real`, view_as_real): deferfuse's view is a
        # copy that a later write into its base would not reach (docs/limits.md), so no writes
        self.frozen: set[int] = set()

    # --- choices ---------------------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def choice(self, seq):
        return self.rng.choice(seq)

    def names(self, pred=None, writable=False) -> list[str]:
        out = []
        for k, v in self.ns.items():
            if isinstance(v, torch.Tensor) and k[0] in "av" and (pred is None or pred(v)):
                if not (writable and (k in self.copies or v.untyped_storage().data_ptr() in self.frozen)):
                    out.append(k)
        return sorted(out)

    def pick(self, pred=None, writable=False):
        names = self.names(pred, writable)
        return self.choice(names) if names else None

    def t(self, name: str) -> torch.Tensor:
        return self.ns[name]

    def new_seed(self) -> int:
        return self.rng.randrange(1000)

    def dtype(self):
        return self.choice(DTYPES)

    def scalar(self, like=None) -> str:
        """A Python number, usually of `like`'s kind, sometimes of another (bool, complex) to
        probe type promotion and CPU's refusals."""
        kinds = ["int", "float", "bool", "complex"]
        if like is not None and self.chance(0.7):
            kind = ("bool" if like.dtype == torch.bool else "complex" if like.is_complex()
                    else "float" if like.dtype.is_floating_point else "int")
        else:
            kind = self.choice(kinds + ["int", "float"])
        if kind == "int":
            return repr(self.choice([-2, -1, 0, 1, 2, 3]))
        if kind == "float":
            return repr(self.choice([0.5, -1.5, 2.0, 0.25, -0.0, 3.0]))
        if kind == "bool":
            return repr(self.choice([True, False]))
        return repr(self.choice([1j, 0.5 - 1j, 2 + 0j, -1 + 0.5j]))

    def operand(self, shape, like=None, allow_scalar=True) -> str:
        """Something to combine with a tensor of `shape`: a live tensor that broadcasts with it,
        a fresh input of a broadcastable shape, or a Python number."""
        r = self.rng.random()
        if allow_scalar and r < 0.3:
            return self.scalar(like)
        if r < 0.65:
            name = self.pick(lambda v: _broadcasts(v.shape, shape) or self.chance(0.05))
            if name is not None:
                return name
        dt = like.dtype if like is not None and self.chance(0.6) else self.dtype()
        return f"inp({self.partner_shape(shape)!r}, {dt}, {self.new_seed()}).to(d)"

    def partner_shape(self, shape) -> tuple:
        shape = tuple(shape)
        r = self.rng.random()
        if r < 0.4 or not shape:
            return shape if r < 0.9 else self.choice(SHAPES)
        if r < 0.6:
            return shape[1:]
        if r < 0.8:
            return tuple(1 if self.chance(0.5) else n for n in shape)
        return (2,) + shape if len(shape) < 3 and self.chance(0.5) else self.choice(SHAPES)

    def dim(self, t: torch.Tensor, allow_none=False):
        if t.dim() == 0 or (allow_none and self.chance(0.2)):
            return None if allow_none else self.choice([0, -1])
        d = self.rng.randrange(-t.dim(), t.dim())
        return d if not self.chance(0.03) else t.dim() + 1  # sometimes out of range: IndexError

    def index_list(self, n: int, k: int, unique=False) -> list[int]:
        if n == 0:
            return []
        if unique:
            picks = self.rng.sample(range(n), min(k, n))
        else:
            picks = [self.rng.randrange(n) for _ in range(k)]
        return [p - n if self.chance(0.2) else p for p in picks]

    def index_tensor(self, shape, dim: int, n: int, unique: bool) -> str:
        """A literal index tensor of `shape` with values below `n` along `dim`, distinct along
        `dim` when `unique` (scatter and index_copy with repeated indices are unordered)."""
        if not shape or n == 0:
            return f"torch.zeros({tuple(shape)!r}, dtype=torch.int64, device=d)"
        g = torch.Generator().manual_seed(self.new_seed())
        full = list(shape)
        full[dim] = n
        if unique:
            idx = torch.rand(full, generator=g).argsort(dim).narrow(dim, 0, min(shape[dim], n))
        else:
            idx = torch.randint(0, n, shape, generator=g)
        return f"torch.tensor({idx.tolist()!r}, device=d)"

    def fresh(self, prefix="v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    # --- running ---------------------------------------------------------------------------
    def run(self, stmt: str, new: str | None = None, mutates=False, data_check=False) -> bool:
        """Run a statement on CPU and keep it, unless it made something too big or (a data
        check) rejected values in place, which the non-Debug modes would not see."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(stmt, "<fuzz>", "exec"), self.ns)
        except Exception:  # noqa: BLE001 - CPU's refusals are part of the program
            if data_check and mutates:
                return False
            if data_check:
                stmt += "  # data-check"
            self.stmts.append(stmt)
            return True
        if new is not None:
            vals = self.ns[new] if isinstance(self.ns[new], (tuple, list)) else [self.ns[new]]
            if any(isinstance(v, torch.Tensor) and (v.numel() > MAX_NUMEL or v.dim() > MAX_DIM) for v in vals):
                del self.ns[new]
                return False
        if data_check:
            stmt += "  # data-check"
        self.stmts.append(stmt)
        return True


def _broadcasts(a, b) -> bool:
    try:
        return torch.broadcast_shapes(a, b) == tuple(b)
    except RuntimeError:
        return False


def generate(seed: int, n_ops: int | None = None) -> list[str]:
    """The program of one seed: its inputs, then 5-40 random statements."""
    g = Gen(seed)
    for i in range(g.rng.randint(1, 4)):
        shape, dt = g.choice(SHAPES), g.dtype()
        src = f"inp({shape!r}, {dt}, {g.new_seed()}).to(d)"
        r = g.rng.random()
        if r < 0.15 and len(shape) == 2:
            src = f"inp({shape[::-1]!r}, {dt}, {g.new_seed()}).to(d).t()"  # non-contiguous
        elif r < 0.2:
            src = f"inp((3, 4), {dt}, {g.new_seed()}).to(d)[:, ::2]"
        elif r < 0.23:
            src = f"inp((4,), {dt}, {g.new_seed()}).to(d).as_strided((3, 2), (1, 1))"  # overlapping
        g.run(f"a{i} = {src}")
    n_ops = n_ops if n_ops is not None else g.rng.randint(5, 40)
    families, weights = zip(*FAMILIES)
    tries, start = 0, len(g.stmts)
    while len(g.stmts) - start < n_ops and tries < 20 * n_ops:
        tries += 1
        family = g.rng.choices(families, weights)[0]
        family(g)
    return g.stmts
