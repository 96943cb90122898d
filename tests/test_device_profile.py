"""The device profile (tests/device_profile.py, `./dev test-device`): its selection holds all four
suites and nothing that starts another process or asserts XLA:CPU's own behaviour, its summary
counts by suite, and under it a test that starts a Python process fails at once."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import device_profile as P
from conftest import ROOT, child_env, widened

# a plugin for the collecting process: what was selected and deselected, with each item's markers
_PROBE = """
import json, os
_deselected = []
def pytest_deselected(items):
    _deselected.extend(items)
def pytest_collection_finish(session):
    row = lambda i: [i.nodeid, sorted({m.name for m in i.iter_markers()})]
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump({"selected": [row(i) for i in session.items], "deselected": [row(i) for i in _deselected]}, f)
"""


def _collect(tmp_path, *args, xdist: str = "no:xdist", share: str = "full") -> subprocess.CompletedProcess:
    (tmp_path / "selection_probe.py").write_text(_PROBE)
    env = child_env(str(tmp_path), PROBE_OUT=str(tmp_path / "probe.json"), DEFERFUSE_OPINFO="full",
                    DEFERFUSE_PROFILE_JSON=str(tmp_path / "summary.json"), **{P.SHARE_ENV: share})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", xdist, "-p", "selection_probe", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _selection(tmp_path, share: str) -> tuple[list, list, dict]:
    out = _collect(tmp_path, P.OPTION, "--collect-only", "-q", "tests", share=share)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"; share {share};" in out.stdout and "float32 matmul precision" in out.stdout
    probe = json.loads((tmp_path / "probe.json").read_text())
    return probe["selected"], probe["deselected"], json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.subprocess  # collects the suite in pytest processes of its own
def test_the_selection_holds_every_suite_and_nothing_that_needs_another_process(tmp_path, monkeypatch):
    chosen = {}
    for share in ("full", "ci"):
        monkeypatch.setenv(P.SHARE_ENV, share)  # for P.in_share here, as in the collecting process
        selected, deselected, summary = _selection(tmp_path, share)
        by_suite = {s: [n for n, _ in selected if P.suite_of(n) == s] for s in P.SUITE_NAMES}
        assert all(by_suite.values()), {s: len(v) for s, v in by_suite.items()}
        for nodeid, marks in selected:
            assert not set(marks) & set(P.MARKERS), (nodeid, marks)
            assert not nodeid.startswith(tuple(P.EXCLUDED_PATHS)), nodeid
        # what left: each for a reason the profile gives, and each reason at work
        why = {"marker": 0, "path": 0, "share": 0, "core third": 0, "core functions": 0}
        functions = {n.split("[")[0] for n, _ in selected}
        for nodeid, marks in deselected:
            function = nodeid.split("[")[0]
            if set(marks) & set(P.MARKERS):
                why["marker"] += 1
            elif nodeid.startswith(tuple(P.EXCLUDED_PATHS)):
                why["path"] += 1
            elif P.suite_of(nodeid) == "core" and not P.in_share("core functions", function):
                assert function not in functions, nodeid  # a test function the share leaves out whole
                why["core functions"] += 1
            elif P.suite_of(nodeid) == "core":
                # a case of a parametrized test left out, where another case of the same test runs
                assert "[" in nodeid and not P.in_core_share(nodeid) and function in functions, nodeid
                why["core third"] += 1
            else:
                assert P.suite_of(nodeid) in ("opinfo", "models", "fuzz"), nodeid
                why["share"] += 1
        assert all(n for k, n in why.items() if not (share == "full" and k == "core functions")), (share, why)
        assert any(n.startswith("tests/test_autoload.py::") for n, _ in deselected)
        assert any(n.startswith("tests/distributed/") for n, _ in deselected)
        # the ci profile whatever DEFERFUSE_OPINFO says: the full one has every variant in every mode
        assert not any("-method-" in n for n in by_suite["opinfo"])
        assert {s: c["selected"] for s, c in summary["suites"].items()} == {s: len(v) for s, v in by_suite.items()}
        assert summary["platform"] and summary["device_kind"] and summary["float32_matmul_precision"] == "highest"
        assert summary["share"] == share
        chosen[share] = {n for n, _ in selected}
    assert "tests/test_device_profile.py::test_the_guard_knows_a_python_process" in chosen["full"]
    # the ci share is a part of the full one, in every suite
    assert chosen["ci"] < chosen["full"]
    for suite in P.SUITE_NAMES:
        assert 0 < sum(P.suite_of(n) == suite for n in chosen["ci"]) <= sum(P.suite_of(n) == suite for n in chosen["full"])


def test_an_unknown_share_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(P.SHARE_ENV, "most")
    with pytest.raises(pytest.UsageError, match="takes full or ci, not 'most'"):
        P.share()


@pytest.mark.subprocess  # a pytest process of its own
def test_workers_are_refused(tmp_path):
    out = _collect(tmp_path, P.OPTION, "-n", "2", "--collect-only", "tests/test_device_profile.py", xdist="xdist")
    assert out.returncode != 0 and "one process" in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_guard_knows_a_python_process(tmp_path):
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert P._starts_python([sys.executable, "-c", "pass"], False, None)
    assert P._starts_python("python3 -c pass", True, None) == "python3"
    assert P._starts_python([str(script)], False, None)
    assert P._starts_python(["anything"], False, sys.executable)
    assert P._starts_python(["git", "rev-parse", "HEAD"], False, None) is None
    assert P._starts_python("ls -l", True, None) is None


def test_the_summary_counts_by_suite():
    class Rep:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    class Config:
        stash = {P._STATE: {"t0": 0.0, "selected": {"core": 3, "opinfo": 2}, "deselected": {"opinfo": 5}}}

    stats = {"passed": [Rep("tests/test_engine.py::a"), Rep("tests/test_opinfo.py::test_forward[x]")],
             "failed": [Rep("tests/fuzz/test_fuzz.py::test_random_program_agrees_with_cpu_in_every_mode[3]")],
             "error": [Rep("tests/models/test_zoo.py::test_model[bert-strict-forward]")],
             "xfailed": [Rep("tests/test_opinfo.py::test_backward[y]")], "deselected": [object()]}
    s = P.summary(Config(), stats, 1)
    assert s["suites"]["core"]["passed"] == 1 and s["suites"]["opinfo"]["passed"] == 1
    assert s["suites"]["opinfo"]["xfailed"] == 1 and s["suites"]["fuzz"]["failed"] == 1
    assert s["suites"]["models"]["error"] == 1 and s["suites"]["opinfo"]["deselected"] == 5
    assert s["failed"] == ["tests/fuzz/test_fuzz.py::test_random_program_agrees_with_cpu_in_every_mode[3]"]
    assert s["errors"] == ["tests/models/test_zoo.py::test_model[bert-strict-forward]"]
    assert s["exit_status"] == 1 and s["wall_seconds"] > 0 and s["platform"]
    json.dumps(s)


def test_the_parts_cover_the_selection_once():
    items = list(range(10))
    parts = [P.part_of(items, k, 3) for k in (1, 2, 3)]
    assert [len(kept) for kept, _ in parts] == [3, 3, 4]
    assert sum((kept for kept, _ in parts), []) == items
    assert all(sorted(kept + rest) == items for kept, rest in parts)
    assert P.part_of(items, 1, 1) == (items, [])


@pytest.mark.subprocess  # pytest processes of their own
def test_a_run_goes_on_from_its_journal(tmp_path):
    """A run that died in a test (an abort on the chip) is started again with its journal: what
    finished is counted, not rerun; the test it died in is an error; the rest runs."""
    journal = tmp_path / "journal.jsonl"
    ids = [f"tests/test_device_profile.py::{name}" for name in (
        "test_the_guard_knows_a_python_process", "test_the_summary_counts_by_suite", "test_the_parts_cover_the_selection_once")]
    rows = [{"id": ids[0]}, {"id": ids[0], "outcome": "passed"}, {"id": ids[1]}]
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "tests/test_dev')  # cut mid-line
    for run in (1, 2):  # the second run finds everything in the journal and runs nothing
        out = _collect(tmp_path, P.OPTION, "--device-suites", "core", "--device-resume", str(journal), *ids)
        assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]  # the error counts
        s = json.loads((tmp_path / "summary.json").read_text())
        core = s["suites"]["core"]
        assert (core["selected"], core["passed"], core["error"], core["failed"]) == (3, 2, 1, 0), (run, core)
        assert s["errors"] == [ids[1]] and s["resumed"] == (2 if run == 1 else 3), (run, s)
        assert "counted from the journal" in out.stdout
    written = P.read_journal(str(journal))
    assert written == {ids[0]: "passed", ids[1]: "error", ids[2]: "passed"}, written  # the cut line is no record
    assert [(name, n) for name, _, n in P.costs(str(journal))] == [("tests/test_device_profile.py", 1)]  # ids[2]'s


def test_the_journal_reads_what_finished_died_and_was_cut(tmp_path):
    rows = [{"id": "a"}, {"id": "a", "outcome": "failed"}, {"id": "b"}, {"id": "c"}, {"id": "c", "cut": True},
            {"id": "d"}, {"id": "d", "outcome": "xfailed"}]
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "e", "outc')
    assert P.read_journal(str(path)) == {"a": "failed", "b": "died", "d": "xfailed"}
    assert P.read_journal(str(tmp_path / "none.jsonl")) == {}


def test_a_tpu_tolerance_widens_float32_alone():
    """What @pytest.mark.tpu_tolerance does to a test's comparisons on a TPU (conftest.widened)."""
    loose = widened(torch.testing.assert_close, 4)
    want = torch.tensor([1.0, 2.0])
    got = want + 3e-5  # 3 times float32's default 1e-5 absolute
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, want)
    loose(got, want)
    loose([got, torch.tensor([1, 2])], [want, torch.tensor([1, 2])])  # ints beside: still widened
    with pytest.raises(AssertionError):
        loose(got + 1e-4, want)  # 13 times: past 4 times
    with pytest.raises(AssertionError):  # its own tolerance, times 4: 4e-6 absolute
        loose(torch.tensor([1.0]) + 1e-5, torch.tensor([1.0]), rtol=0.0, atol=1e-6)
    with pytest.raises(AssertionError):  # float64 compares as written
        loose(want.double() + 3e-5, want.double())


def test_the_journal_keeps_each_tests_seconds_for_costs_per_file(tmp_path):
    path = tmp_path / "journal.jsonl"
    rows = [{"id": "tests/test_a.py::t1"}, {"id": "tests/test_a.py::t1", "outcome": "passed", "seconds": 1.5},
            {"id": "tests/test_b.py::t[x]", "outcome": "failed", "seconds": 4.0},
            {"id": "tests/test_a.py::t2", "outcome": "passed", "seconds": 0.25}, {"id": "tests/test_c.py::t3"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert P.costs(str(path)) == [("tests/test_b.py", 4.0, 1), ("tests/test_a.py", 1.75, 2)]
