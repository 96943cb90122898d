"""The benchmark workloads, each runnable under every engine.

A workload's `prepare(engine)` returns a `Runner` whose `step()` runs one step and whose `sync()`
waits for the device. Engines:
- cpu: plain PyTorch eager on CPU;
- strict, debug, defer_and_fuse: deferfuse's modes on "tpu";
- jit: the same step recorded once with `deferfuse.capture` and replayed as one XLA program
  (deferfuse's own lowering with recording taken out: the limit DeferAndFuse can approach);
- compiled: `torch.compile(step, backend="tpu")` in DeferAndFuse, the migration path's last step:
  Dynamo/AOTAutograd graphs recorded once through deferfuse's lowerings, then each call one node
  of the pending graph (forward, backward and optimizer step are separate graphs, with
  `loss.backward()` a graph break between them, fused into one program at the cut);
- torchax: the peer, in its eager mode (runs in a process of its own, see torchax_runner.py);
- jax: the GPT written directly in JAX (jax_gpt.py), the anchor independent of deferfuse; other
  workloads raise NotImplementedError, which the table shows as "-" (not applicable).

The GPT workloads also carry their analytic FLOPs per step (mfu.py) for the MFU table.
`gpt2-small` is device-sized: one step is about 2.5 TFLOP, minutes per step on a CPU, so where
JAX's default backend is the CPU it runs only when `--workloads` selects it and nothing else
(`--workloads gpt2`); `--workloads gpt` alone leaves it out there.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

ENGINES = ("cpu", "strict", "debug", "defer_and_fuse", "jit", "compiled", "jax", "torchax")


def device_of(engine: str) -> str:
    if engine == "jax":
        raise NotImplementedError("the plain-JAX engine implements the GPT workloads only")
    if engine == "torchax":
        _ctx("torchax")  # the "jax" device exists once torchax is imported
        return "jax"
    return "cpu" if engine == "cpu" else "tpu"


_TORCHAX_ENV = []


def _ctx(engine: str):
    if engine in ("strict", "debug", "defer_and_fuse", "compiled"):
        import deferfuse

        return deferfuse.mode("defer_and_fuse" if engine == "compiled" else engine)
    if engine in ("torchax", "torchax_aten"):
        if not _TORCHAX_ENV:
            from torchax_shim import import_torchax

            torchax, _ = import_torchax()
            _TORCHAX_ENV.append(torchax.default_env())
        env = _TORCHAX_ENV[0]
        # Steps run under torchax's ATen-level dispatch mode alone. Its torch-function mode
        # maps F.linear and friends straight to JAX, which bypasses PyTorch autograd (the
        # loss then has no grad_fn), so a torch training loop cannot run with it on.
        return env._dispatch_mode if engine == "torchax_aten" else env
    return contextlib.nullcontext()


@dataclass
class Runner:
    step: Callable[[], object]
    sync: Callable[[], None]
    flops: float = 0.0      # analytic FLOPs per step, the same for every engine (mfu.py); 0: not counted
    xla_flops: float = 0.0  # XLA's count of the jax engine's compiled step, the cross-check
    programs: int = 0       # programs compiled outside deferfuse's cache (the jax engine's step)


def _sync_for(engine: str, last: list):
    def sync():
        if engine == "cpu":
            return
        if engine == "torchax":
            import jax

            jax.effects_barrier()
            for t in last:
                getattr(t, "jax", lambda: None)()
            return
        import deferfuse

        with _ctx(engine):
            deferfuse.sync()

    return sync


def _make_runner(engine: str, step_fn: Callable[[], object], compile_step: bool = True) -> Runner:
    """Wrap a step that uses tensors on device_of(engine) into a Runner for that engine (with
    `compile_step=False` the "compiled" engine runs the step as it is: it compiles a part itself)."""
    last: list = []
    if engine == "jit":
        import deferfuse

        for _ in range(2):  # let first-step Python state (optimizer buffers) settle
            with deferfuse.mode():
                step_fn()
        cap = deferfuse.capture(step_fn)

        def step():
            return cap()

        return Runner(step, _sync_for(engine, last))
    if engine == "compiled" and compile_step:
        step_fn = torch.compile(step_fn, backend="tpu")
    ctx = _ctx("torchax_aten" if engine == "torchax" else engine)

    def step():
        with ctx:
            out = step_fn()
        last[:] = [out] if isinstance(out, torch.Tensor) else []
        return out

    return Runner(step, _sync_for(engine, last))


def steps_for(window_ms: float, step_ms: float, least: int, most: int = 500) -> int:
    """How many steps make a timed run last window_ms, so that the first step's unoverlapped host
    work is a small share of it."""
    return max(least, min(most, -int(-window_ms // max(step_ms, 1e-3))))


# --- workloads -------------------------------------------------------------------------------------


def chain(engine: str, numel: int = 16 * 1024 * 1024) -> Runner:
    """20 elementwise ops over 16 M floats: memory bound, where fusion saves 19 round trips."""
    dev = device_of(engine)
    torch.manual_seed(0)
    x = torch.rand(numel).to(dev)

    def step_fn():
        y = x
        for i in range(4):
            y = y * 1.0001
            y = y + 0.5
            y = torch.tanh(y)
            y = y * y
            y = torch.sigmoid(y)
        return y

    return _make_runner(engine, step_fn)


def _adamw(params, fused: bool):
    """PyTorch's default AdamW (a foreach step), or its fused kernel: one ATen call per step."""
    return torch.optim.AdamW(params, lr=1e-3, **({"fused": True} if fused else {}))


def mlp(engine: str, fused: bool = False) -> Runner:
    import mlp_train

    dev = device_of(engine)
    torch.manual_seed(0)
    model = mlp_train.make_model(512).to(dev)
    opt = _adamw(model.parameters(), fused)
    data = mlp_train.batches(512, 64)
    x, y = (t.to(dev) for t in next(data))

    def step_fn():
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return _make_runner(engine, step_fn)


def gpt(engine: str, layers: int = 4, fused: bool = False, cfg=None, batch: int = 8) -> Runner:
    import gpt_train
    import mfu

    cfg = cfg or gpt_train.GPTConfig(layers=layers)
    assert cfg.dim % cfg.heads == 0, cfg
    flops = mfu.gpt_train_flops(cfg, batch)
    torch.manual_seed(0)
    if engine == "jax":  # the same weights, batch and AdamW settings, handed to JAX
        import jax_gpt

        model = gpt_train.GPT(cfg)
        x, y = next(gpt_train.batches(cfg, batch))
        t = jax_gpt.Trainer(model, _adamw(model.parameters(), fused), x, y)
        return Runner(t.step, t.sync, flops=flops, xla_flops=t.xla_flops, programs=1)
    dev = device_of(engine)
    model = gpt_train.GPT(cfg).to(dev)
    opt = _adamw(model.parameters(), fused)
    x, y = (t.to(dev) for t in next(gpt_train.batches(cfg, batch)))

    def step_fn():
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return dataclasses.replace(_make_runner(engine, step_fn), flops=flops)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.b2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


def convnet(engine: str) -> Runner:
    dev = device_of(engine)
    torch.manual_seed(0)
    model = ConvNet().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 3, 32, 32, generator=g).to(dev)
    t = torch.randint(0, 10, (32,), generator=g).to(dev)

    def step_fn():
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return _make_runner(engine, step_fn)


def _kv_model(dev):
    import gpt_train

    torch.manual_seed(0)
    cfg = gpt_train.GPTConfig(layers=2, seq=256)
    return gpt_train.GPT(cfg).to(dev).eval(), cfg


def kv_decode(engine: str, bucket: int = 0, tokens: int = 48) -> Runner:
    """Greedy decoding with a KV cache: the cache grows one token per step, so every step has a
    new sequence length (a new program) unless the cache is padded to a bucket and masked (a
    static cache, written at a position held in a tensor)."""
    dev = device_of(engine)
    model, cfg = _kv_model(dev)
    heads, hd = cfg.heads, cfg.dim // cfg.heads

    def attend(blk, x, cache, pos):
        b, t, c = x.shape
        q, k, v = blk.qkv(blk.ln1(x)).split(c, dim=2)
        q = q.view(b, t, heads, hd).transpose(1, 2)
        k = k.view(b, t, heads, hd).transpose(1, 2)
        v = v.view(b, t, heads, hd).transpose(1, 2)
        if bucket:  # a static cache written at a position held in a tensor, as HF's StaticCache does
            kc, vc = cache
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            size = kc.shape[2]
            mask = (torch.arange(size, device=x.device) <= pos).view(1, size)
            y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
            new = cache
        else:
            kc = k if cache is None else torch.cat([cache[0], k], dim=2)
            vc = v if cache is None else torch.cat([cache[1], v], dim=2)
            y = F.scaled_dot_product_attention(q, kc, vc)
            new = (kc, vc)
        y = y.transpose(1, 2).reshape(b, t, c)
        x = x + blk.proj(y)
        x = x + blk.out(F.gelu(blk.fc(blk.ln2(x))))
        return x, new

    def one_token(tok, pos, caches):
        x = model.tok(tok) + model.pos(pos)
        new = []
        for blk, cache in zip(model.blocks, caches):
            x, c = attend(blk, x, cache, pos)
            new.append(c)
        return model.head(model.ln(x)).argmax(-1), new

    if engine == "compiled":  # the per-token body is the compiled function; the loop stays Python
        one_token = torch.compile(one_token, backend="tpu")

    def generate():
        with torch.no_grad():
            tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
            if bucket:
                size = ((tokens + bucket - 1) // bucket) * bucket
                caches = [(torch.zeros(1, heads, size, hd, device=dev), torch.zeros(1, heads, size, hd, device=dev))
                          for _ in model.blocks]
            else:
                caches = [None] * len(model.blocks)
            out = []
            for pos in range(tokens):
                # the position is data (one program for every position), except where the cache
                # grows, whose shapes change every token anyway
                tok, caches = one_token(tok, torch.full((1,), pos, device=dev, dtype=torch.long), caches)
                out.append(tok)
            return torch.cat(out, dim=1)

    if engine == "jit":
        raise NotImplementedError("shapes change every token: nothing to capture once")
    return _make_runner(engine, generate, compile_step=False)


def item_every_step(make: Callable[[str], Runner]) -> Callable[[str], Runner]:
    """The same step in a loop that logs its loss with `.item()` every step, as many training loops
    do: each step waits for its own result, so no engine overlaps the host's next step with it."""

    def wrapped(engine: str) -> Runner:
        r = make(engine)
        ctx = _ctx(engine) if engine == "torchax" else contextlib.nullcontext()

        def step():
            out = r.step()
            with ctx:  # a torchax tensor reads its value only inside torchax's environment
                return out.item()

        return dataclasses.replace(r, step=step)

    return wrapped


def hf_gpt2(engine: str, dropout: float = 0.0, small: bool = False) -> Runner:
    """A Hugging Face `GPT2LMHeadModel` (2 layers, d32, T16, B2, vocab 256; `small`: gpt2-small's
    12 layers, d768, T512, B8, vocab 8192), built from its config class with every dropout at
    `dropout` (GPT-2's default is 0.1, which users train with), and PyTorch's AdamW: the users'
    models, whose forward reads the host a few times a step (an attention mask's checks), where a
    plain GPT reads it never."""
    import transformers

    dev = device_of(engine)
    torch.manual_seed(0)
    vocab, batch, seq = (8192, 8, 512) if small else (256, 2, 16)
    shape = dict(n_embd=768, n_layer=12, n_head=12, n_positions=512) if small else dict(n_embd=32, n_layer=2,
                                                                                         n_head=4, n_positions=64)
    cfg = transformers.GPT2Config(vocab_size=vocab, **shape, resid_pdrop=dropout, embd_pdrop=dropout,
                                  attn_pdrop=dropout, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).to(dev).train()
    opt = _adamw(model.parameters(), False)
    ids = torch.randint(3, vocab, (batch, seq), generator=torch.Generator().manual_seed(4)).to(dev)

    def step_fn():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return _make_runner(engine, step_fn)


def _gpt_cfg(**shape):
    import gpt_train

    return gpt_train.GPTConfig(**shape)


WORKLOADS: dict[str, Callable[[str], Runner]] = {
    "chain (20 ops, 16M floats)": chain,
    "mlp train (3x512, batch 64)": mlp,
    "mlp train, AdamW(fused=True)": lambda e: mlp(e, fused=True),
    "mlp train, loss.item() every step": item_every_step(mlp),
    "gpt train (4 layers, d128)": gpt,
    "gpt train, AdamW(fused=True)": lambda e: gpt(e, fused=True),
    # a trivial program: what each engine's host costs per step, on any machine
    "gpt host (4 layers, d16, T8, B2)": lambda e: gpt(e, cfg=_gpt_cfg(vocab=256, seq=8, layers=4, heads=4, dim=16),
                                                      batch=2),
    # device-bound on an accelerator; see the module docstring for when it runs on a CPU
    "gpt2-small (12 layers, d768, T512, B8)": lambda e: gpt(e, cfg=_gpt_cfg(vocab=8192, seq=512, layers=12,
                                                                            heads=12, dim=768), batch=8),
    "hf gpt2 train (2 layers, d32, T16, B2)": hf_gpt2,
    "hf gpt2 train, dropout 0.1": lambda e: hf_gpt2(e, dropout=0.1),
    "hf gpt2-small, dropout 0.1 (12 layers, d768, T512, B8)": lambda e: hf_gpt2(e, dropout=0.1, small=True),
    "convnet train (2 conv, bs 32)": convnet,
    "kv decode (48 tokens)": kv_decode,
    "kv decode, bucket 64": lambda e: kv_decode(e, bucket=64),
}

DEVICE_SIZED = ("gpt2-small (12 layers, d768, T512, B8)", "hf gpt2-small, dropout 0.1 (12 layers, d768, T512, B8)")


def selected(wanted: list[str], backend: str) -> list[str]:
    """The workloads `--workloads` names by prefix (all when it names none). On a CPU backend a
    device-sized workload runs only when an entry selects it alone, so `--workloads gpt` stays
    a CPU-sized run."""
    def match(w):
        return [n for n in WORKLOADS if n.startswith(w)]

    names = [n for n in WORKLOADS if not wanted or any(n in match(w) for w in wanted)]
    if backend != "cpu":
        return names
    alone = {n for w in wanted for n in match(w) if all(m in DEVICE_SIZED for m in match(w))}
    return [n for n in names if n not in DEVICE_SIZED or n in alone]
