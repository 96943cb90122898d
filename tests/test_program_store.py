"""deferfuse's own store of programs (deferfuse/cache/stored.py): a warm process loads each
program under a key made before tracing, and so neither traces nor lowers it.

What must hold: the key tells apart everything a trace tells apart (each op's layouts, static
values to the bit, dtypes, scalar types), refuses what it cannot name in every process (an op id,
a function), and names the same program alike in two processes; a loaded program is the one a
trace would make (DEFERFUSE_CACHE_VERIFY=1 checks, and fails on a key that misses something).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import deferfuse
from deferfuse import target
from deferfuse.cache import stored
from deferfuse.graph import Op

from conftest import ROOT, child_env

# several programs in every mode, a result to compare and what the store did
_RUN = """
import json, sys, jax, torch, deferfuse
traces = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: traces.append(event) if event == "/jax/core/compile/jaxpr_trace_duration" else None)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
x, y = torch.randn(8, 16).to("tpu"), torch.randn(8, 4).to("tpu")
losses = []
for mode in ("strict", "defer_and_fuse"):
    with deferfuse.mode(mode):
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
            losses.append(loss.item())
        z = (x.t() @ x)[::2, 1:].softmax(-1).to(torch.bfloat16)
        losses.append(z.float().sum().item())
m = deferfuse.metrics()
print(json.dumps({"losses": losses, "loaded": m["programs_loaded"], "hits": m["persistent_cache_hits"],
                  "misses": m["persistent_cache_misses"], "traces": len(traces)}))
"""


def _run(cache_dir: str, code: str = _RUN, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=child_env(DEFERFUSE_CACHE_DIR=cache_dir, **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.subprocess
def test_a_warm_process_loads_every_program_and_traces_none(tmp_path):
    cold = _run(str(tmp_path))
    warm = _run(str(tmp_path), DEFERFUSE_CACHE_VERIFY="0")
    assert cold["loaded"] == 0 and cold["misses"] > 0 and cold["traces"] > 0
    assert warm["loaded"] == warm["hits"] == cold["misses"] and warm["misses"] == 0
    assert warm["traces"] == 0, warm
    assert warm["losses"] == cold["losses"]


@pytest.mark.subprocess
def test_each_loaded_program_is_the_one_tracing_makes(tmp_path):
    """Checked the slow way, by tracing and lowering each loaded program again: the bench's
    workloads (GPT, a convnet, a KV-cache decoder, fused AdamW) in a fresh process, then in
    another that loads them all with DEFERFUSE_CACHE_VERIFY=1."""
    code = f"""
import json, sys
sys.path[:0] = [{os.path.join(ROOT, "bench")!r}, {os.path.join(ROOT, "examples")!r}]
import deferfuse, workloads
for name in ("gpt host (4 layers, d16, T8, B2)", "convnet train (2 conv, bs 32)", "kv decode (48 tokens)",
             "mlp train, AdamW(fused=True)"):
    for engine in ("defer_and_fuse", "strict"):
        w = workloads.WORKLOADS[name](engine)
        for _ in range(3):
            w.step()
        w.sync()
m = deferfuse.metrics()
print(json.dumps({{"loaded": m["programs_loaded"], "hits": m["persistent_cache_hits"]}}))
"""
    cold = _run(str(tmp_path), code)
    warm = _run(str(tmp_path), code, DEFERFUSE_CACHE_VERIFY="1")
    assert cold["loaded"] == 0
    assert warm["loaded"] > 100, warm  # hundreds of programs, each traced again and compared


@pytest.mark.subprocess
def test_a_warm_process_loads_torch_compiles_programs_too(tmp_path):
    """A graph torch.compile made is one op whose key names its nodes by their op ids; spelled
    with each node's own token it is stored like any program: a warm run of a compiled training
    step loads its programs, each the one tracing makes, and traces none (it traced them all)."""
    code = f"""
import json, sys, jax
sys.path[:0] = [{os.path.join(ROOT, "bench")!r}, {os.path.join(ROOT, "examples")!r}]
traces = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: traces.append(event) if event == "/jax/core/compile/jaxpr_trace_duration" else None)
import deferfuse, workloads
w = workloads.WORKLOADS["gpt host (4 layers, d16, T8, B2)"]("compiled")
losses = [float(w.step().detach()) for _ in range(3)]
m = deferfuse.metrics()
print(json.dumps({{"losses": losses, "compiled": m["programs_compiled"], "loaded": m["programs_loaded"],
                  "traces": len(traces)}}))
"""
    cold = _run(str(tmp_path), code)
    verified = _run(str(tmp_path), code, DEFERFUSE_CACHE_VERIFY="1")
    warm = _run(str(tmp_path), code, DEFERFUSE_CACHE_VERIFY="0")
    assert cold["loaded"] == 0 and cold["compiled"] >= 1 and cold["traces"] > 0
    assert verified["loaded"] == warm["loaded"] == cold["compiled"], (cold, verified, warm)
    assert warm["traces"] == 0, warm
    assert warm["losses"] == verified["losses"] == cold["losses"]


@pytest.mark.subprocess
def test_a_program_jax_cache_served_is_not_stored_again(tmp_path):
    """`|` on bools and `logical_or` lower alike: in Strict the second is a hit in JAX's cache
    within the first process. An XLA:CPU executable serialized again after that load came back
    without its nested functions, and the third process failed to run it."""
    code = """
import json, torch, deferfuse
a = torch.tensor([True, False, True, False]).to("tpu")
b = torch.tensor([1, 2, 3, 4]).to("tpu")
outs = []
with deferfuse.mode("strict"):
    for k in range(3):
        x = a | (b > k)
        outs.append((x.logical_or(a) | (b > 2)).tolist())
m = deferfuse.metrics()
print(json.dumps({"outs": outs, "loaded": m["programs_loaded"], "hits": m["persistent_cache_hits"]}))
"""
    runs = [_run(str(tmp_path), code) for _ in range(3)]
    assert runs[0]["hits"] > 0 and runs[0]["loaded"] == 0  # JAX's cache served one in the first process
    assert runs[1]["loaded"] > 0 and runs[2] == runs[1]
    assert all(r["outs"] == runs[0]["outs"] for r in runs)


@pytest.mark.subprocess
def test_after_a_source_change_a_program_jax_cache_serves_is_stored_where_it_can_be(tmp_path):
    """deferfuse's source is part of the store's key, not of the folder's name: after a change
    (an editable install pulled), JAX's cache still serves the programs whose lowering did not
    change. On a TPU the loaded executable is stored under the new key and the next process loads
    it; XLA:CPU cannot serialize a loaded executable, so there it is traced at every warm run."""
    def code(digest):
        return f"from deferfuse.cache import stored\nstored._source_digest = lambda: {digest!r}\n" + _RUN

    first = _run(str(tmp_path), code("before"))
    changed = [_run(str(tmp_path), code("after")) for _ in range(2)]
    assert first["loaded"] == 0 and first["misses"] > 0
    assert changed[0]["loaded"] == 0 and changed[0]["misses"] == 0  # every program from JAX's cache
    assert all(r["losses"] == first["losses"] for r in changed)
    if target.platform() == "tpu":
        assert changed[1]["loaded"] == first["misses"] and changed[1]["traces"] == 0, changed
    else:
        assert changed[1]["loaded"] == 0 and changed[1]["traces"] == changed[0]["traces"] > 0, changed


@pytest.mark.subprocess
def test_verification_fails_a_key_that_misses_something(tmp_path):
    """A key that named every program alike would load the first program for the second: the
    check says so, where without it the second op would compute the first one's result."""
    code = """
import torch, deferfuse
from deferfuse.cache import plans, stored
stored.program_key = lambda *a: "one-name-for-all"
plans.stored.program_key = stored.program_key
x = torch.arange(4.0).to("tpu")
with deferfuse.mode("strict"):
    (x + 1).cpu()
    (x * 3).cpu()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=child_env(DEFERFUSE_CACHE_DIR=str(tmp_path), DEFERFUSE_CACHE_VERIFY="1"))
    assert out.returncode != 0 and "DifferentProgram" in out.stderr and "is not the one tracing makes" in out.stderr


def _op_of(fn, *args) -> Op:
    """The op DeferAndFuse records for fn(*args) (the last node of the pending graph)."""
    from deferfuse import pending

    with deferfuse.mode():
        fn(*args)
        op = pending.PENDING.graph.nodes[-1].op
        deferfuse.sync()
    return op


def _token(fn, *args) -> str:
    token = stored.op_token(_op_of(fn, *args))
    assert token is not None
    return token


def test_the_key_tells_apart_what_a_trace_tells_apart():
    x = torch.randn(4, 6).to("tpu")
    base = _token(lambda t: t.sum(0), x)
    assert _token(lambda t: t.sum(0), x) == base  # the same call, the same name
    assert _token(lambda t: t.sum(1), x) != base  # a static value
    assert _token(lambda t: t.sum(0), x.t()) != base  # a layout (strides) of the input
    assert _token(lambda t: t.sum(0), x.double()) != base  # a dtype
    assert _token(lambda t: t.div(2, rounding_mode="floor"), x) != _token(lambda t: t.div(2, rounding_mode="trunc"), x)
    assert _token(lambda t: t + 2, x) != _token(lambda t: t + 2.0, x)  # a Python scalar's type
    assert _token(lambda t: t.sum(0, dtype=torch.float64), x) != base


def test_an_op_whose_key_holds_a_process_local_value_is_not_stored():
    """An op id, a function: no other process would read them alike, so a key holding one is not
    spelled (a graph torch.compile made is spelled with its nodes' tokens instead of their ids)."""
    from deferfuse.interned import OpId

    assert stored._canon(OpId(3), []) is False
    assert stored._canon((1, "a", (OpId(0),)), []) is False
    assert stored._canon(lambda: 0, []) is False
    assert stored._canon((1, 2.5, None, torch.float32, torch.device("tpu", 0), (float, int)), []) is True


def test_static_floats_are_told_apart_to_the_bit():
    spelled = []
    for v in (0.0, -0.0, float("nan"), 1.0, 1 + 2 ** -52):
        out = []
        assert stored._canon(v, out)
        spelled.append(out[0])
    assert len(set(spelled)) == 5


def test_a_jax_op_is_not_stored():
    """A jax_op runs the user's function, which a later run may change under the same name: its
    programs go through JAX's cache, which keys them by what they lower to."""
    @deferfuse.jax_op("storetest::scaled")
    def scaled(x):
        return x * 3.0

    x = torch.randn(4).to("tpu")
    assert stored.op_token(_op_of(scaled, x)) is None
    assert stored.op_token(_op_of(lambda t: t * 3.0, x)) is not None


def test_a_jax_flag_changed_while_running_is_part_of_the_key():
    """`jax.config.update` may come at any time (x64, the default matmul precision): a program
    built after it is another program, in this process and on disk."""
    import jax

    from deferfuse.cache import plans

    op = _op_of(lambda t: t.sum(0), torch.randn(4, 6).to("tpu"))
    node = type("Node", (), {"op": op})()

    def name() -> str:  # a one-op group: the op reads input 0
        return stored.program_key([node], [0], (((op.id, (-1,)),), (0,), (((4, 6), torch.float32),)),
                                  (None, plans._rewrites()))

    before = name()
    old = jax.config.values["jax_default_matmul_precision"]
    jax.config.update("jax_default_matmul_precision", "highest" if old != "highest" else "default")
    try:
        assert name() != before
    finally:
        jax.config.update("jax_default_matmul_precision", old)
    assert name() == before
