"""deferfuse-report: the CLI end to end (through subprocesses, as a user runs it), the Python API,
and the pure report builder on synthetic events.

Each script under tests/report_scripts/ provokes one case on a line marked `# MARK:<name>`; the
tests find that line's number and check the JSON names exactly `file:line` of the user's script.
Every CLI run happens once, two at a time, and the scripts are tiny, so this file stays
fast on a 2-core CI machine.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import deferfuse
from deferfuse import events
from deferfuse.report import cli, collect, text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "report_scripts")
_CLEAN_ENV = ("DEFERFUSE_LOG", "DEFERFUSE_REPORT", "TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_LAUNCH_BLOCKING",
              "DEFERFUSE_MAX_PENDING", "DEFERFUSE_FUSION_FUEL")


def marker(script: str, name: str) -> str:
    """'abs/path/script.py:LINE' of the line carrying `# MARK:name`."""
    path = os.path.join(SCRIPTS, script)
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if re.search(rf"# MARK:{re.escape(name)}\b", line):
                return f"{path}:{i}"
    raise AssertionError(f"no marker {name} in {script}")


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV}
    env.update(extra or {})
    return env


# Every CLI run the tests need, started together (two at a time: CI has 2 cores) the first time
# any test asks for one: name -> (script, script args, report options, extra env).
MLP = os.path.join(ROOT, "examples", "mlp_train.py")
GPT = os.path.join(ROOT, "examples", "gpt_train.py")
LOOP = os.path.join(ROOT, "examples", "loop.py")  # both examples' training loop, with its loss.item()
PLAN: dict[str, tuple] = {
    "causes": ("flush_causes.py", (), ("--html", "{dir}/causes.html"), {}),
    "compare": ("fallback.py", (), ("--compare", "strict"), {}),
    "mlp": (MLP, ("--steps", "12", "--width", "64"), (), {}),
    "gpt": (GPT, ("--steps", "17", "--layers", "2", "--dim", "64", "--log-every", "4"), (), {}),
    "size_cap": ("size_cap.py", (), (), {"DEFERFUSE_MAX_PENDING": "8"}),
    "recompile": ("recompile.py", (), (), {}),
}
_FUTURES: dict = {}


def _run(tmp_dir: str, name: str) -> dict:
    script, script_args, opts, env = PLAN[name]
    out = os.path.join(tmp_dir, f"{name}.json")
    path = script if os.path.isabs(script) else os.path.join(SCRIPTS, script)
    opts = tuple(o.replace("{dir}", tmp_dir) for o in opts)
    cmd = [sys.executable, "-m", "deferfuse.report", "--json", out, *opts, path, *script_args]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    with open(out) as f:
        rep = json.load(f)
    rep["_stdout"] = proc.stdout
    return rep


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def cli_runs(tmp_dir):
    """name -> the JSON report of that planned run (waits for it)."""
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(_run, tmp_dir, name) for name in PLAN}
        yield lambda name: futures[name].result()


def _source(rep: dict, where: str) -> dict:
    rows = {r["where"]: r for r in rep["flushes"]["by_source"]}
    assert where in rows, f"{where} not among flush sources {sorted(rows)}"
    return rows[where]


# --- the CLI, one script per case ---------------------------------------------------------------


@pytest.fixture(scope="module")
def causes(cli_runs, tmp_dir):
    return dict(cli_runs("causes"), _html=os.path.join(tmp_dir, "causes.html"))


@pytest.mark.subprocess
@pytest.mark.parametrize("cause", ["item", "print", "to_cpu", "tolist", "bool", "data_dependent", "sync"])
def test_flush_cause_and_line(causes, cause):
    row = _source(causes, marker("flush_causes.py", cause))
    assert row["causes"] == {cause: 1}
    assert row["code"].endswith(f"# MARK:{cause}")
    n = 2 if cause == "item" else 1  # the script's last line (MARK:dead) is an item too
    assert {"cause": cause, "count": n, "host_waits": True} in causes["flushes"]["by_cause"]


@pytest.mark.subprocess
def test_report_summary_and_schema(causes):
    s = causes["summary"]
    assert causes["schema_version"] == collect.SCHEMA_VERSION
    assert causes["collecting"] is True and causes["mode"] == "defer_and_fuse"
    assert s["flushes"] == causes["flushes"]["total"] == 8
    assert causes["flushes"]["unattributed"] == 0
    assert s["programs_compiled"] + s["cache_hits"] == s["flushes"]
    assert s["ops_recorded"] > 0 and s["programs_executed"] > 0
    t = causes["time"]
    assert t["wall_seconds"] > 0 and t["record_seconds"] > 0 and t["compile_seconds"] > 0
    assert causes["script"]["exit_code"] == 0
    assert causes["script"]["path"] == os.path.join(SCRIPTS, "flush_causes.py")
    assert "Flushes by cause" in causes["_stdout"]


@pytest.mark.subprocess
def test_dead_intermediates(causes):
    row = _source(causes, marker("flush_causes.py", "dead"))
    assert row["intermediates_skipped"] >= 2  # exp and the product are never materialised
    mem = causes["memory"]
    assert mem["intermediates_skipped"] > 0 and mem["bytes_skipped"] > 0
    assert mem["outputs_materialized"] > 0


@pytest.mark.subprocess
def test_size_cap(cli_runs):
    rep = cli_runs("size_cap")
    row = _source(rep, marker("size_cap.py", "size_cap"))
    assert row["causes"]["size_cap"] >= 3
    assert row["compiles"] == 1  # one program reused by every cut
    assert rep["recompiles"]["warning"] is None


@pytest.mark.subprocess
def test_recompile_from_input_shape(cli_runs):
    rep = cli_runs("recompile")
    where = marker("recompile.py", "recompile")
    rc = rep["recompiles"]
    assert rc["count"] == 6 and rc["items"]
    for item in rc["items"]:
        assert item["where"] == where
        assert item["why"]["what"] == "input"
        assert "changed shape/dtype" in item["why_text"]
    assert rc["by_site"][0]["where"] == where and rc["by_site"][0]["what"] == "input"
    assert rc["after_warm_up"] >= 3
    assert rc["warning"] and "recompiling every step" in rc["warning"]
    assert "recompiling every step" in rep["_stdout"]


@pytest.mark.subprocess
def test_cpu_fallback(cli_runs):
    rep = cli_runs("compare")  # the DeferAndFuse half of the --compare run is a full report
    fb = rep["fallbacks"]
    assert fb["total"] == rep["summary"]["cpu_fallbacks"] == 2
    assert fb["by_op"] == [{"op": "aten.cummax.default", "count": 2}]
    assert fb["by_source"][0]["where"] == marker("fallback.py", "fallback")
    assert fb["by_source"][0]["op"] == "aten.cummax.default"
    # the fused program before the recorded host op (the second call) ends because of it
    assert {"why": "host op", "count": 1} in rep["fusion"]["breaks"]


@pytest.mark.subprocess
def test_mlp_example_steady_state(cli_runs):
    rep = cli_runs("mlp")
    rc = rep["recompiles"]
    assert rc["after_warm_up"] == 0 and rc["warning"] is None
    with open(LOOP) as f:
        item_line = next(i for i, line in enumerate(f, 1) if "loss.item()" in line)
    main = rep["flushes"]["main_sync_point"]
    assert main["where"] == f"{LOOP}:{item_line}" and main["cause"] == "item"
    # each step is cut where the optimizer's step ended; the read then finds its value computed
    step_line = next(i for i, line in enumerate(open(LOOP), 1) if "opt.step()" in line)
    # (and the first step's new optimizer state, made apart there by a program of its own)
    assert _source(rep, f"{LOOP}:{step_line}")["causes"] == {"optimizer_step": rep["flushes"]["total"] - 1,
                                                             "optimizer_state": 1}
    fu = rep["fusion"]
    assert fu["fusion_ratio"] > 10 and fu["largest_programs"][0]["ops"] > 20
    assert rep["dag"] and len(rep["dag"]["nodes"]) == fu["largest_programs"][0]["ops"]
    assert len(text.render(rep).splitlines()) <= 50  # one screen
    # mse_loss has no lowering: after its first call its learned expansion is one node per call
    replayed = {x["op"]: x["count"] for x in fu["decompositions_replayed"]}
    assert replayed.get("aten.mse_loss.default", 0) >= 10
    assert replayed == rep["counters"]["decompositions_replayed"]
    assert "decomposed ops recorded as one node: aten.mse_loss" in text.render(rep)


@pytest.mark.subprocess
def test_gpt_example_item_is_the_main_sync_point(cli_runs):
    """The issue's check on the example: no recompiles after warm-up, and the line the host waits
    at most is the loss.item() line (the per-step cuts where the optimizer's step ends are engine
    cuts the host does not wait for, and are reported as such)."""
    rep = cli_runs("gpt")
    rc = rep["recompiles"]
    assert rc["after_warm_up"] == 0 and rc["warning"] is None
    with open(LOOP) as f:
        item_line = next(i for i, line in enumerate(f, 1) if "loss.item()" in line)
    main = rep["flushes"]["main_sync_point"]
    assert main["where"] == f"{LOOP}:{item_line}" and main["cause"] == "item"
    assert main["count"] == 5  # steps 0, 4, 8, 12, 16
    waits = {c["cause"]: c["host_waits"] for c in rep["flushes"]["by_cause"]}
    # the engine's per-step cuts and the first step's state: no host wait
    assert waits == {"optimizer_step": False, "optimizer_state": False}
    assert "the host waits most at" in rep["_stdout"]


@pytest.mark.subprocess
def test_compare_strict(cli_runs):
    rep = cli_runs("compare")
    other = rep["compare"]
    assert rep["mode"] == "defer_and_fuse" and other["mode"] == "strict"
    assert any(c["cause"] == "strict_op" for c in other["flushes"]["by_cause"])
    assert other["summary"]["flushes"] > rep["summary"]["flushes"]
    assert "mode strict" in rep["_stdout"] and "mode defer_and_fuse" in rep["_stdout"]


@pytest.mark.subprocess
def test_html_self_contained(causes):
    with open(causes["_html"], encoding="utf-8") as f:
        page = f.read()
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and 'class="dag"' in page and 'class="chart"' in page
    assert "http://" not in page and "https://" not in page
    assert "<script src" not in page and "<link" not in page
    data = re.search(r'<script type="application/json" id="deferfuse-report">(.*?)</script>', page, re.S).group(1)
    embedded = json.loads(data)
    assert embedded["summary"] == causes["summary"]


@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="needs /usr/bin/chromium")
def test_html_screenshot(causes, tmp_path):
    png = tmp_path / "report.png"
    cmd = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1200,900",
           "file://" + causes["_html"]]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert png.exists() and png.stat().st_size > 1000


@pytest.mark.subprocess
def test_env_var_starts_collection():
    code = (
        "import json, torch, deferfuse\n"
        "x = torch.ones(3).to('tpu')\n"
        "(x * 2).sum().item()\n"
        "print(json.dumps(deferfuse.report()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env({"DEFERFUSE_REPORT": "1"}),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rep["collecting"] is True and rep["note"] is None
    assert rep["flushes"]["total"] >= 1 and rep["time"]["wall_seconds"] > 0
    assert rep["flushes"]["by_source"][0]["where"] == "<string>:3"


def test_script_exit_code_and_argv(tmp_path, capsys):
    # in this process: the CLI's runner restores the default mode and sys.argv afterwards
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nprint('argv', sys.argv[1:], __name__)\nsys.exit(3)\n")
    out = tmp_path / "bad.json"
    mode, argv = deferfuse.get_default_mode(), list(sys.argv)
    code = cli.main(["--quiet", "--mode", "debug", "--json", str(out), str(bad), "a", "--b"])
    assert code == 3
    assert "argv ['a', '--b'] __main__" in capsys.readouterr().out
    assert deferfuse.get_default_mode() == mode and sys.argv == argv
    rep = json.loads(out.read_text())
    assert rep["script"]["exit_code"] == 3 and rep["script"]["argv"] == [str(bad), "a", "--b"]
    assert rep["mode"] == "debug"
    boom = tmp_path / "boom.py"
    boom.write_text("raise ValueError('boom')\n")
    assert cli.main(["--quiet", "--json", str(out), str(boom)]) == 1
    assert json.loads(out.read_text())["script"]["error"] == "ValueError: boom"


# --- the Python API, in this process -------------------------------------------------------------------


def test_report_is_the_function():
    assert callable(deferfuse.report) and callable(deferfuse.explain)
    from deferfuse.report import report

    assert report is deferfuse.report


def test_report_without_collecting():
    if events.collecting():
        pytest.skip("DEFERFUSE_REPORT is on in this process")
    with deferfuse.mode():
        (torch.ones(4).to("tpu") * 3).sum().item()
    rep = deferfuse.report()
    assert rep["collecting"] is False and "not being collected" in rep["note"]
    assert rep["summary"]["ops_recorded"] >= 2 and rep["flushes"]["total"] >= 1
    assert rep["flushes"]["by_cause"] and rep["recompiles"] is None
    json.dumps(rep)


def test_explain():
    x = torch.arange(5.0).to("tpu")

    def step(t):
        y = (t * 2).exp()
        y.sum().item()  # MARK:explain_item
        return t + 1

    collecting = events.collecting()  # on already when the whole run is under DEFERFUSE_REPORT
    with deferfuse.mode():
        rep = deferfuse.explain(step, x)  # MARK:explain_call
    here = os.path.abspath(__file__)
    with open(here) as f:
        lines = {m: i for i, line in enumerate(f, 1) for m in re.findall(r"# MARK:(explain_\w+)", line)}
    rows = {r["where"]: r for r in rep["flushes"]["by_source"]}
    assert rows[f"{here}:{lines['explain_item']}"]["causes"] == {"item": 1}
    assert rows[f"{here}:{lines['explain_call']}"]["causes"] == {"sync": 1}
    assert rep["summary"]["flushes"] == 2 and rep["summary"]["ops_recorded"] >= 4
    assert events.collecting() == collecting  # explain leaves collection as it found it
    json.dumps(rep)


# --- the pure builder ---------------------------------------------------------------------------------------


def _flush(i, hit, where=("u.py", 10, "f"), key=1, cause="item"):
    return {"kind": "flush", "t": float(i), "cause": cause, "where": where, "nodes": 3, "outputs": 1, "hit": hit,
            "key": key, "groups": 1, "seconds": 0.01, "skipped": 2, "bytes_skipped": 8, "bytes_out": 4, "ops": 3}


def _compile(i, key, recompile, why=None, where=("u.py", 10, "f"), sizes=(3,), hosts=None):
    return {"kind": "compile", "t": float(i), "where": where, "cause": "item", "seconds": 0.5, "ops": sum(sizes),
            "key": key, "groups": len(sizes), "op_names": ["aten.mul.Tensor", "aten.mul.Tensor", "aten.sum.default"],
            "why": why, "recompile": recompile, "breaks": ["end of flush"] * len(sizes),
            "program_sizes": list(sizes), "hosts": hosts or [False] * len(sizes)}


def _metrics(**kw):
    m = {"ops_recorded": 30, "flushes": 10, "flushes_by_cause": {"item": 10}, "cache_hits": 0, "cache_misses": 0,
         "compile_seconds": 0.0, "execute_calls": 10, "cpu_fallbacks": {}, "cpu_fallbacks_total": 0,
         "outputs_materialized": 10, "bytes_materialized": 40, "intermediates_skipped": 20, "bytes_skipped": 80,
         "record_seconds": 0.1, "execute_seconds": 0.01, "sync_wait_seconds": 0.0, "flush_seconds": 0.2}
    m.update(kw)
    return m


def test_build_steady_loop_has_no_warning():
    evs = [_compile(0, 1, False), _flush(0, False)] + [_flush(i, True) for i in range(1, 10)]
    rep = collect.build(evs, _metrics(cache_hits=9, cache_misses=1), wall_seconds=1.0)
    assert rep["recompiles"]["count"] == 0 and rep["recompiles"]["warning"] is None
    assert rep["summary"]["cache_hit_rate"] == 0.9
    assert rep["fusion"]["ops_per_program"] == [
        {"ops": "2-3", "lo": 2, "hi": 3, "programs_compiled": 1, "program_runs": 10}]
    assert rep["programs_by_time"][0]["flushes"] == 10 and rep["programs_by_time"][0]["op_counts"][0] == {
        "op": "mul.Tensor", "count": 2}
    assert rep["flushes"]["by_source"][0]["where"] == "u.py:10"
    assert rep["time"]["other_seconds"] == pytest.approx(0.7)


def test_build_recompiling_every_step_warns():
    why = {"what": "input", "input": 0, "before": "torch.float32[2]", "now": "torch.float32[3]"}
    evs = []
    for i in range(10):
        evs += [_compile(i, i, i > 0, why if i else None), _flush(i, False, key=i)]
    rep = collect.build(evs, _metrics(cache_misses=10))
    rc = rep["recompiles"]
    assert rc["count"] == 9 and rc["after_warm_up"] == 8 and rc["late_recompiles"] == 5
    assert "recompiling every step" in rc["warning"] and "u.py:10" in rc["warning"]
    assert rc["items"][0]["flush_index"] == 1 and rc["items"][0]["why"]["what"] == "input"


def test_build_new_sites_late_do_not_warn():
    evs = []
    for i in range(8):
        evs += [_compile(i, i, False, where=("u.py", 10 + i, "f")), _flush(i, False, key=i, where=("u.py", 10 + i, "f"))]
    rep = collect.build(evs, _metrics(cache_misses=8))
    assert rep["recompiles"]["late_compiles"] == 4 and rep["recompiles"]["warning"] is None


def test_build_host_steps_and_breaks():
    c = _compile(0, 7, False, sizes=(2, 1, 5), hosts=[False, True, False])
    c["breaks"] = ["host op", "host op", "end of flush"]
    rep = collect.build([c, _flush(0, False, key=7)], _metrics())
    fu = rep["fusion"]
    assert {b["why"]: b["count"] for b in fu["breaks"]} == {"host op": 1, "end of flush": 1}
    assert sum(h["programs_compiled"] for h in fu["ops_per_program"]) == 2
    assert fu["largest_programs"][0]["programs"] == 2


def test_build_not_collecting_keeps_counters():
    rep = collect.build(None, _metrics(cpu_fallbacks={"aten.cummax.default": 2}, cpu_fallbacks_total=2),
                        collecting=False)
    assert rep["collecting"] is False and rep["note"]
    assert rep["fallbacks"]["by_op"] == [{"op": "aten.cummax.default", "count": 2}]
    assert rep["flushes"]["by_cause"] == [{"cause": "item", "count": 10, "host_waits": True}]
    assert rep["recompiles"] is None and rep["dag"] is None
    text.render(rep)


def test_why_text_covers_every_kind():
    cases = {
        "input": {"what": "input", "input": 1, "before": "a", "now": "b"},
        "input_order": {"what": "input_order", "input": 1, "before": "a", "now": "b"},
        "inputs": {"what": "inputs", "before": 2, "now": 3},
        "op_args": {"what": "op_args", "op": "aten.ones.default", "where": "u.py:3", "before": "4", "now": "5"},
        "structure": {"what": "structure", "node": 2, "where": "u.py:3", "before": "aten.add.Tensor", "now": "aten.mul.Tensor"},
        "length": {"what": "length", "before": 3, "now": 4},
        "outputs": {"what": "outputs", "before": 1, "now": 2},
        "unknown": {"what": "unknown"},
    }
    texts = {k: collect.why_text(v) for k, v in cases.items()}
    assert "input #1" in texts["input"] and "ones" in texts["op_args"] and "add.Tensor -> mul.Tensor" in texts["structure"]
    assert "reference cycle" in texts["outputs"]  # what makes a count of live tensors change
    assert len(set(texts.values())) == len(texts)
    assert collect.why_text(None, recompile=False) == "first compile at this site"


def test_a_miss_on_the_same_inputs_in_another_order_says_so():
    """wav2vec2's step 1 once compiled again on two inputs swapped: "input #89 changed shape" sent
    one looking for a new shape where there was none."""
    from deferfuse.cache.key import Key, explain_miss

    a, b = ((2, 16), torch.float32), ((16,), torch.float32)
    prev = Key.of([], (), (a, b, a))
    assert explain_miss(prev, Key.of([], (), (b, a, a)), None) == {
        "what": "input_order", "input": 0, "before": "torch.float32[2, 16]", "now": "torch.float32[16]"}
    assert explain_miss(prev, Key.of([], (), (a, a, a)), None)["what"] == "input"


def test_split_argv():
    assert cli.split_argv(["--mode", "strict", "s.py", "--mode", "x"]) == (["--mode", "strict"], "s.py", ["--mode", "x"])
    assert cli.split_argv(["-q", "--top=3", "s.py"]) == (["-q", "--top=3"], "s.py", [])
    assert cli.split_argv(["--json", "o.json", "--", "s.py", "a"]) == (["--json", "o.json"], "s.py", ["a"])
    assert cli.split_argv(["--top", "3"]) == (["--top", "3"], None, [])


def test_dag_layout_is_layered():
    from deferfuse.report import html

    lay = html.layout([0, 1, 2, 3], [(0, 1), (0, 2), (1, 3), (2, 3)])
    assert lay[0][0] == 0 and lay[1][0] == lay[2][0] == 1 and lay[3][0] == 2
    assert {lay[1][1], lay[2][1]} == {0, 1}



def test_one_lines_different_ops_are_not_recompiles_in_strict():
    """Strict flushes every op: an optimizer step's line compiles a dozen different programs,
    which the report counted as recompiles of one site ('different op at node 0'). The same op
    at the same line with another shape still is one."""
    n = 13  # shapes no other test compiles (the cache is shared)
    params = [torch.nn.Parameter(torch.randn(4, n).to("tpu")), torch.nn.Parameter(torch.randn(n).to("tpu"))]
    opts = [torch.optim.Adam([p], lr=0.1) for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    events.start_collecting()
    try:
        with deferfuse.mode("strict"):
            for opt in opts:
                opt.step()  # one line, many ops; the second optimizer's shapes differ
    finally:
        got = events.stop_collecting()
    compiles = [e for e in got if e["kind"] == "compile"]
    first = [e for e in compiles[: len(compiles) // 2]]
    assert len(compiles) >= 8 and not any(e.get("recompile") for e in first)
    assert all(e["why"]["what"] == "input" for e in compiles if e.get("recompile"))


def test_the_report_says_where_and_why_steps_stop_replaying():
    """A loop whose step reads `.item()` from its fourth step on: the replay stops there, and the
    report names the call, its line and the reason."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4).to("tpu")

    def loop():
        with deferfuse.mode("defer_and_fuse"):
            for step in range(6):
                loss = model(x).square().mean()
                if step >= 3:
                    loss.item()  # a sync point the trace of the earlier steps does not have
                loss.backward()
                opt.step()
                opt.zero_grad()

    rep = deferfuse.explain(loop)
    rp = rep["replay"]
    assert rp["ops_replayed"] > 0
    assert any("_local_scalar_dense" in s["op"] and "test_report.py" in s["where"] for s in rp["stops"]), rp
    assert "Step replay" in text.render(rep)
