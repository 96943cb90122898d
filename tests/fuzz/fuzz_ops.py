"""The fuzzer's op families: each writes one or a few statements into a `fuzz_gen.Gen`.

Every family draws its arguments from the live tensors, so most calls are valid; a few percent
are made wrong on purpose (a dim out of range, a source of the wrong shape, mismatched dtypes),
because a bad call must raise CPU's exception at the call in every mode.
"""
from __future__ import annotations

import torch

_UNARY = {
    "any": ["-{x}", "{x}.abs()", "torch.sign({x})", "{x}.square()", "{x}.clone()", "torch.sgn({x})",
            "{x}.logical_not()", "torch.isnan({x})", "torch.isfinite({x})", "{x}.to({dt})", "{x}.float()",
            "{x}.bool()", "{x}.long()", "{x}.to({dt}, copy=True)", "torch.nan_to_num({x})", "{x}.flip({dim})",
            "{x}.roll(1, {dim})", "{x}.contiguous()", "{x}.exp()", "~{x}", "torch.positive({x})"],
    "float": ["torch.exp({x})", "torch.sin({x})", "torch.tanh({x})", "torch.sigmoid({x})", "torch.sqrt({x})",
              "torch.rsqrt({x})", "{x}.reciprocal()", "torch.log1p({x})", "{x}.floor()", "{x}.ceil()",
              "{x}.round()", "{x}.trunc()", "{x}.frac()", "torch.relu({x})", "{x}.clamp({a}, {b})",
              "{x}.clamp(min={a})", "torch.atan({x})", "torch.erf({x})", "torch.log({x}.abs() + 1)",
              "{x}.tril()", "{x}.triu(1)", "torch.softmax({x}, {dim})", "{x}.cos()"],
    "int": ["~{x}", "{x}.bitwise_not()", "{x} << 1", "{x} >> 1", "{x}.clamp({a}, {b})"],
    "complex": ["{x}.conj_physical()", "torch.exp({x})", "{x}.reciprocal()", "torch.sqrt({x})", "{x}.angle()",
                "torch.tanh({x})"],
}

_BINOPS = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "==", "<", ">=", "!="]
_BINFNS = ["torch.maximum", "torch.minimum", "torch.atan2", "torch.remainder", "torch.fmod", "torch.logical_and",
           "torch.logical_xor", "torch.hypot", "torch.copysign", "torch.eq", "torch.gt", "torch.mul", "torch.true_divide",
           "torch.bitwise_and", "torch.bitwise_or", "torch.xlogy", "torch.pow", "torch.floor_divide"]
_DIVIDES = {"/", "//", "%", "torch.remainder", "torch.fmod", "torch.true_divide", "torch.floor_divide", "torch.div"}


def _kind(t: torch.Tensor) -> str:
    return "complex" if t.is_complex() else "float" if t.dtype.is_floating_point else "int"


def unary(g):
    x = g.pick()
    if x is None:
        return
    t = g.t(x)
    pool = _UNARY["any"] + _UNARY[_kind(t)] + (_UNARY["int"] if t.dtype == torch.bool else [])
    a, b = sorted([g.choice([-1.0, -0.5, 0.0, 1, 1.5]), g.choice([-1, 0.5, 2.0, 3])])
    expr = g.choice(pool).format(x=x, dt=g.dtype(), dim=g.dim(t), a=a, b=b)
    v = g.fresh()
    g.run(f"{v} = {expr}", new=v)


def binary(g):
    x = g.pick()
    if x is None:
        return
    t = g.t(x)
    y = g.operand(t.shape, like=t)
    r = g.rng.random()
    divisor = y
    if r < 0.45:
        op = g.choice(_BINOPS)
        if g.chance(0.2) and "inp(" not in y:
            expr, divisor = f"{y} {op} {x}", x
        else:
            expr = f"{x} {op} {y}"
    elif r < 0.75:
        op = g.choice(_BINFNS)
        if op == "torch.copysign" and not _is_number(y):
            # the sign bit of a NaN is not kept (docs/limits.md): copysign would show it
            y = f"{y}.nan_to_num()"
        expr = f"{op}({x}, {y})"
    elif r < 0.85:
        op = g.choice(["torch.add", "torch.sub"])
        expr = f"{op}({x}, {y}, alpha={g.scalar(t)})"
    elif r < 0.9:
        op = "torch.div"
        expr = f"torch.div({x}, {y}, rounding_mode={g.choice(['floor', 'trunc', None])!r})"
    else:
        c = g.pick(lambda v: v.dtype == torch.bool) or f"({x} > 0)"
        z = g.operand(t.shape, like=t)
        op = g.choice(["where", "lerp", "addcmul", "addcdiv", "clamp"])
        expr = {"where": f"torch.where({c}, {x}, {y})", "lerp": f"torch.lerp({x}, {y}, {g.choice([0.5, 0.25])})",
                "addcmul": f"torch.addcmul({x}, {y}, {z}, value={g.scalar(t)})",
                "addcdiv": f"torch.addcdiv({x}, {y}, {z}, value={g.scalar(t)})",
                "clamp": f"torch.clamp({x}, min={y}, max={z})"}[op]
    v = g.fresh()
    # integer division by a tensor holding 0 is a data check CPU makes and only Debug mirrors
    g.run(f"{v} = {expr}", new=v, data_check=op in _DIVIDES and not _is_number(divisor))


def _is_number(s: str) -> bool:
    try:
        complex(s)
        return True
    except ValueError:
        return False


def reduction(g):
    x = g.pick()
    if x is None:
        return
    t = g.t(x)
    dim = g.dim(t)
    keep = g.choice([True, False])
    fn = g.choice([
        "{x}.sum()", "{x}.sum({dim})", "{x}.sum({dim}, keepdim={keep})", "{x}.sum(dtype={dt})", "{x}.mean({dim})",
        "{x}.mean()", "{x}.prod({dim})", "{x}.amax({dim})", "{x}.amin()", "{x}.max()", "{x}.argmax({dim})",
        "{x}.argmin()", "{x}.any({dim})", "{x}.all()", "{x}.std({dim})", "{x}.var(correction=0)", "{x}.cumsum({dim})",
        "{x}.cumprod({dim})", "torch.logsumexp({x}, {dim})", "{x}.norm()", "torch.linalg.vector_norm({x}, 2, {dim})",
        "{x}.count_nonzero({dim})", "{x}.max({dim})", "{x}.min({dim}, keepdim={keep})",
        "{x}.sort({dim}, stable=True)", "{x}.median()", "{x}.cummax({dim})", "{x}.sum(({dim}, 0))", "{x}.nansum()",
        "{x}.aminmax()", "torch.std_mean({x}, {dim})",
    ])
    expr = fn.format(x=x, dim=dim, keep=keep, dt=g.dtype())
    v = g.fresh()
    if g.run(f"{v} = {expr}", new=v) and isinstance(g.ns.get(v), tuple) and g.chance(0.5):
        g.run(f"{v} = {v}[{g.choice([0, 1])}]", new=v)


def _shapes_of(numel: int) -> list:
    out = [(numel,), (-1,), (1, numel)]
    if numel % 3 == 0:
        out.append((numel // 3, 3))
    if numel % 2 == 0 and numel:
        out.append((2, -1))
    if numel == 0:
        out.append((0, 5))
    return out


def view_expr(g, x: str):
    """(expression of a view of `x`, whether it aliases `x` for writes)."""
    t = g.t(x)
    n, s = t.dim(), tuple(t.shape)
    opts = [f"{x}.view({g.choice(_shapes_of(t.numel()))!r})", f"{x}.reshape(-1)", f"{x}.unsqueeze({g.rng.randint(-n - 1, n)})",
            f"{x}.squeeze()", f"{x}.flatten()", f"{x}[None]", f"{x}[...]", f"{x}.expand({(2,) + s!r})"]
    if n >= 1:
        d = g.dim(t)
        size = s[d] if -n <= d < n else 1
        i = g.rng.randrange(-size, size) if size and not g.chance(0.05) else size
        opts += [f"{x}[{i}]", f"{x}[1:]", f"{x}[::2]", f"{x}.narrow({d}, {min(1, size)}, {max(size - 1, 0)})",
                 f"{x}.select({d}, {i})", f"{x}.unfold({d}, {min(2, size)}, 1)", f"{x}.chunk(2, {d})[0]",
                 f"{x}.split(1, {d})[-1]", f"{x}.movedim(0, -1)", f"{x}.squeeze({d})"]
        if s[0]:
            opts.append(f"{x}.unbind(0)[{g.rng.randrange(s[0])}]")
    if n >= 2:
        opts += [f"{x}.transpose(0, 1)", f"{x}.mT", f"{x}.permute({tuple(reversed(range(n)))!r})",
                 f"{x}.diagonal()", f"{x}[:, 1:]", f"{x}[..., ::2]", f"{x}.diagonal({g.choice([-1, 1])})"]
    if n == 2:
        opts.append(f"{x}.t()")
    if n == 3:
        opts.append(f"{x}.diagonal(0, 1, 2)")
    if t.numel() >= 3 and g.chance(0.3):
        off = t.storage_offset()
        opts.append(f"{x}.as_strided((2, 2), (1, 1), {off})")  # overlapping elements
    if t.is_complex() and g.chance(0.5):
        return g.choice([f"{x}.real", f"{x}.imag", f"torch.view_as_real({x})"]), False
    return g.choice(opts), True


def view(g):
    x = g.pick()
    if x is None:
        return
    expr, aliases = view_expr(g, x)
    v = g.fresh()
    if g.run(f"{v} = {expr}", new=v) and (not aliases or x in g.copies):
        g.copies.add(v)
        if not aliases:
            g.frozen.add(g.t(x).untyped_storage().data_ptr())


def join(g):
    x = g.pick()
    if x is None:
        return
    t = g.t(x)
    y = g.pick(lambda u: u.shape == t.shape or g.chance(0.1)) or x
    dim = g.dim(t) if t.dim() else 0
    fn = g.choice(["torch.cat([{x}, {y}], {dim})", "torch.stack([{x}, {y}])", "torch.cat([{x}, {x}])",
                   "{x}.repeat(2, *([1] * {x}.dim()))", "torch.stack([{x}, {y}], -1)"])
    v = g.fresh()
    g.run(f"{v} = " + fn.format(x=x, y=y, dim=dim), new=v)


def indexing(g):
    x = g.pick(lambda u: u.dim() >= 1)
    if x is None:
        return
    t = g.t(x)
    n0 = t.shape[0]
    idx_l = g.index_list(n0, g.rng.randint(1, 3))
    idx = f"torch.tensor({idx_l!r}, dtype=torch.int64, device=d)"
    d = g.rng.randrange(t.dim())
    gather_idx = g.index_tensor(t.shape, d, t.shape[d], unique=False)
    uidx = g.index_tensor(t.shape, d, t.shape[d], unique=True)
    src = g.operand(t.shape, like=t, allow_scalar=False)
    fn = g.choice([
        "{x}[{idx}]", "{x}.index_select(0, {idx})", "torch.take({x}, {flat})", "{x}[{x} > 0]",
        "torch.gather({x}, {d}, {gi})", "{x}.scatter({d}, {ui}, {src})", "{x}.scatter({d}, {ui}, {s})",
        "{x}.scatter_add({d}, {gi}, {src})", "{x}.masked_fill({x} > 0, {s})", "{x}.nonzero()",
        "torch.masked_select({x}, {x} < 1)", "torch.argwhere({x})", "{x}.index_fill(0, {idx}, {s})",
        "{x}.index_add(0, {idx}, {isrc}, alpha={s})", "F.one_hot({x}.long().clamp(0, 2), 3)",
        "F.one_hot(torch.tensor({cls!r}, device=d), 3)", "torch.where({x} != 0)[0]", "{x}.nonzero(as_tuple=True)[-1]",
    ])
    flat = f"torch.tensor({g.index_list(t.numel(), 2)!r}, dtype=torch.int64, device=d)"
    isrc_shape = (len(idx_l),) + tuple(t.shape[1:])
    if g.chance(0.1):  # the wrong source shape, which CPU names at the call
        isrc_shape = tuple(isrc_shape[:-1]) + (isrc_shape[-1] + 1,) if len(isrc_shape) > 1 else (isrc_shape[0] + 1,)
    isrc = f"inp({isrc_shape!r}, {t.dtype}, {g.new_seed()}).to(d)"
    cls = [g.choice([0, 1, 2, -1 if g.chance(0.2) else 1])]
    expr = fn.format(x=x, idx=idx, flat=flat, d=d, gi=gather_idx, ui=uidx, src=src, s=g.scalar(t), isrc=isrc, cls=cls)
    v = g.fresh()
    # CPU refuses a negative index in these two, a check on the data that only Debug mirrors
    neg = any(i < 0 for i in idx_l) and ("index_select" in fn or "index_add" in fn)
    g.run(f"{v} = {expr}", new=v, data_check="one_hot" in fn or neg)


def matmul(g):
    # not over one element: the sign of a zero product differs among CPU's own BLAS paths (docs/limits.md)
    x = g.pick(lambda u: 1 <= u.dim() <= 3 and u.shape[-1] != 1)
    if x is None:
        return
    t = g.t(x)
    k = t.shape[-1]
    m = g.choice([1, 2, 3])
    # CPU lets mixed dtypes through when an operand is empty (einsum), and refuses them otherwise
    dt = t.dtype if g.chance(0.85) or t.numel() == 0 else g.dtype()
    if t.dim() == 1:
        shape = g.choice([(k,), (k, m)])
    elif t.dim() == 2:
        shape = g.choice([(k, m), (k,)])
    else:
        shape = (t.shape[0], k, m)
    y = g.pick(lambda u: tuple(u.shape) == shape and u.dtype == dt) or f"inp({shape!r}, {dt}, {g.new_seed()}).to(d)"
    opts = [f"{x} @ {y}", f"torch.matmul({x}, {y})"]
    if t.dim() == 2 and len(shape) == 2:
        opts += [f"torch.mm({x}, {y})", f"torch.addmm(inp({(t.shape[0], m)!r}, {dt}, {g.new_seed()}).to(d), {x}, {y}, "
                 f"beta={g.choice([0, 1, 0.5])}, alpha={g.choice([1, 2])})", f"torch.einsum('ij,jk->ik', {x}, {y})"]
    if t.dim() == 1 and len(shape) == 1:
        opts += [f"torch.dot({x}, {y})", f"torch.outer({x}, {y})"]
    if t.dim() == 3:
        opts.append(f"torch.bmm({x}, {y})")
    v = g.fresh()
    g.run(f"{v} = {g.choice(opts)}", new=v)


_INPLACE = ["add_({y})", "add_({y}, alpha={s})", "sub_({y})", "mul_({y})", "div_({y})", "clamp_({a}, {b})",
            "zero_()", "fill_({s})", "copy_({y})", "copy_({s})", "neg_()", "abs_()", "pow_(2)", "floor_()",
            "addcmul_({y}, {y}, value={s})", "lerp_({y}, 0.5)", "masked_fill_({m}, {s})", "relu_()",
            "index_fill_(0, {idx}, {s})", "index_add_(0, {idx}, {isrc})", "index_copy_(0, {uidx}, {isrc})",
            "scatter_({dd}, {ui}, {s})", "scatter_add_({dd}, {gi}, {y})", "sigmoid_()", "exp_()", "logical_not_()",
            "clamp_(min={y})", "remainder_({y})", "bitwise_and_({y})", "index_put_(({idx},), {isrc}, accumulate=True)"]


_FILL_LIKE = ["fill_({s})", "zero_()", "copy_({s})", "[...] = {s}"]


def _shares_memory(t: torch.Tensor):
    """Whether two elements of `t` are one element of its storage: "expanded" (a zero stride,
    where CPU refuses most writes, as deferfuse does, but not all), True, or False."""
    if t.numel() < 2:
        return False
    if any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())):
        return "expanded"
    off = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        off = off.unsqueeze(-1) + torch.arange(n) * s
    return off.unique().numel() < t.numel()


def inplace(g):
    x = g.pick(writable=True)
    if x is None:
        return
    target, aliases = view_expr(g, x) if g.chance(0.5) else (x, True)
    if not aliases:
        return
    try:
        tt = eval(target, g.ns)
    except Exception:  # noqa: BLE001 - an invalid view: the write is still tried, and fails alike
        tt = g.t(x)
    shape = tuple(tt.shape)
    y = g.operand(shape, like=tt)
    n0 = shape[0] if shape else 0
    idx_l = g.index_list(n0, g.rng.randint(1, 3))
    idx = f"torch.tensor({idx_l!r}, dtype=torch.int64, device=d)"
    uidx_l = g.index_list(n0, len(idx_l), unique=True)
    uidx = f"torch.tensor({uidx_l!r}, dtype=torch.int64, device=d)"
    isrc_shape = (len(idx_l),) + shape[1:]
    if g.chance(0.1):  # the wrong source shape
        isrc_shape = isrc_shape + (2,)
    dd = g.rng.randrange(max(len(shape), 1)) if shape else 0
    dn = shape[dd] if shape else 1
    a, b = sorted([g.choice([-1.0, 0.0, 1]), g.choice([0.5, 2.0])])
    shared = _shares_memory(tt)
    if shared:
        # elements that share memory (as_strided, unfold, expand): PyTorch calls most writes into
        # them undefined (refusing some: add_ into an expanded view) and deferfuse refuses them;
        # one value written everywhere is well defined
        op = g.choice(_FILL_LIKE + (["add_({y})", "mul_({y})"] if shared == "expanded" else []))
    else:
        op = g.choice(_INPLACE + ["[...] = {y}", "[0] = {s}", " += {y}", "[{m}] = {s}"])
    stmt = (target + ("" if op[0] in "[ " else ".") + op).format(
        y=y, s=g.scalar(tt), a=a, b=b, m=f"({target} > 0)", idx=idx, uidx=uidx, dd=dd,
        isrc=f"inp({isrc_shape!r}, {tt.dtype}, {g.new_seed()}).to(d)",
        ui=g.index_tensor(shape, dd, dn, unique=True), gi=g.index_tensor(shape, dd, dn, unique=False))
    if " += " in stmt and target != x:
        stmt = f"_t = {target}; _t += {y}"
    neg = (any(i < 0 for i in idx_l) and "index_add_" in op) or (any(i < 0 for i in uidx_l) and "index_copy_" in op)
    g.run(stmt, mutates=True, data_check="remainder_" in op or neg)


def creation(g):
    shape = g.choice([(), (0,), (3,), (2, 3), (3, 3)])
    dt = g.dtype()
    x = g.pick()
    s = g.scalar()
    opts = [f"torch.zeros({shape!r}, dtype={dt}, device=d)", f"torch.ones({shape!r}, dtype={dt}, device=d)",
            f"torch.full({shape!r}, {s}, device=d)", f"torch.full({shape!r}, {s}, dtype={dt}, device=d)",
            f"torch.arange({g.choice([0, 3, 5])}, device=d)", f"torch.arange(1, 4, 0.5, dtype={dt}, device=d)",
            f"torch.linspace(0, 1, {g.choice([1, 3, 4])}, device=d)", f"torch.eye(3, {g.choice([2, 3])}, device=d)",
            f"torch.tensor({s}, device=d)", f"torch.tensor([{s}, {g.scalar()}], device=d)",
            f"torch.scalar_tensor({s}, device=d)"]
    if x is not None:
        opts += [f"torch.zeros_like({x})", f"torch.ones_like({x}, dtype={dt})", f"torch.full_like({x}, {s})",
                 f"{x}.new_zeros({shape!r})", f"{x}.new_full({shape!r}, {s})", f"{x}.new_tensor([1, 2])",
                 f"torch.empty_like({x}).fill_({s})"]
    v = g.fresh()
    g.run(f"{v} = {g.choice(opts)}", new=v)


def host_read(g):
    x = g.pick()
    if x is None:
        return
    t = g.t(x)
    fn = g.choice(["{x}.sum().item()", "{x}.tolist()", "bool({x}.any())", "{x}.item()", "{x}.max().item()",
                   "float({x}.float().sum())", "{x}.shape", "{x}.eq({x}).all().item()", "{x}[0].tolist()",
                   "int({x}.long().sum())", "{x}.abs().sum().item()"] + (["{x}.item()"] * 2 if t.numel() == 1 else []))
    r = g.fresh("r")
    g.run(f"{r} = " + fn.format(x=x), new=r)


def drop(g):
    x = g.pick(lambda v: True)
    if x is not None and x[0] == "v":
        g.run(f"del {x}")
        g.copies.discard(x)


FAMILIES = [(unary, 10), (binary, 16), (reduction, 8), (view, 10), (join, 3), (indexing, 8), (matmul, 5),
            (inplace, 16), (creation, 5), (host_read, 4), (drop, 4)]
