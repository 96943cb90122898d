"""The device profile (`--device-profile`, `./dev test-device`): what a session with one real
accelerator runs, in ONE process (issue 42, item 1). A TPU chip is held by one process at a time,
so the profile runs without xdist and without any test that starts a second Python process; the
same option on CPU runs the same selection. What is in, and why:

- core: the in-process tests outside the three big suites, less
  - tests marked `subprocess` (they start another Python process, which on a TPU host would
    contend with this one for the chip, or a Python tool the host may lack) and `xla_cpu` (they
    assert what XLA:CPU alone does);
  - EXCLUDED_PATHS below, each with its reason: tests/distributed, test_hf_trainer, the bench
    harness, and the files that test host-side logic only;
  - of each parametrized test, a fixed third of its cases (by a hash of the test id; the first
    case where the hash keeps none), so each test function that runs has its grid thinned;
  - in the ci share, a fixed half of the test functions (by a hash of the function's id);
- opinfo: tests/test_opinfo.py's ci profile, for a fixed seventh of the entries, two fifths of
  those in the ci share (`in_device_profile` there says why);
- models: tests/models/test_zoo.py's ci profile less its Debug and Strict forwards and its Strict
  generations: every model's forward in DeferAndFuse, the Strict third trained, one generation;
- fuzz: tests/fuzz/test_fuzz.py's ci seeds, a fixed quarter of them in the ci share, and the
  fuzzer's own tests.

Two shares, as the big suites have ci and full profiles: DEFERFUSE_DEVICE_PROFILE=ci (the
default) or full. The ci share is cut to fit one session on one chip, about 20 minutes on a TPU
v5e; the full share took about 40 there (docs/testing.md has the runs), more than a session's 30
minutes of device time, and runs across sessions with `--device-resume`. Each ci selection is
inside the full one (see SHARES), so a full run covers it.
Why cut at all: uncut (the in-process core tests, the OpInfo and model-zoo ci profiles, the fuzz
seeds) it takes 35 to 50 minutes in one process on our 2-core CPU machines, by their load, and a
TPU v5e runs each test about 2.5 (core) to 10 (fuzz) times slower than they do: its compiles and
its host's slower Python.

The profile forces the suites' ci profiles (DEFERFUSE_OPINFO=ci, DEFERFUSE_MODELS=ci, no
DEFERFUSE_FUZZ*), deselects the rest at collection (reported as deselected, not skipped), refuses
`-n`, and fails a test that starts a Python process at once, naming the mark it lacks.
`--device-suites` runs some of the four suites and `--device-part K/N` a contiguous part of them, to
split the run into shorter commands; `--device-resume FILE` keeps a journal, so the same command
run again goes on after a deadline or an abort (XLA:TPU's failed CHECKs kill the process). At the
end it prints the JAX platform, device kind, float32 matmul precision, commit, wall and CPU time
and each suite's counts, and writes them with the failing test ids as JSON to
$DEFERFUSE_PROFILE_JSON if set.
"""
from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
import zlib

import pytest

OPTION = "--device-profile"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = {"tests/test_opinfo.py": "opinfo", "tests/models/test_zoo.py": "models", "tests/fuzz/test_fuzz.py": "fuzz"}
SUITE_NAMES = ("core", "opinfo", "models", "fuzz")
OUTCOMES = ("passed", "failed", "xfailed", "xpassed", "skipped", "error")
MARKERS = ("subprocess", "xla_cpu")  # registered, with what they mean, in pyproject.toml
# path prefix (from the repository root) -> why the device profile leaves it out
EXCLUDED_PATHS = {
    "tests/distributed/": "torchrun-launched runs, a process per device",
    "tests/models/test_hf_trainer.py": "needs accelerate, which the TPU host's bundle lacks; the zoo's GPT-2 covers "
                                       "the model, and it takes about 25 s",
    "tests/test_bench.py": "the benchmark harness (bench/), not the engine; the bench runs on a TPU as a command "
                           "of its own, and this file takes about 95 s",
    # host-side logic only: nothing here runs on the device
    "tests/test_report.py": "deferfuse-report: the CLI in subprocesses, the report builder on synthetic events",
    "tests/test_coverage.py": "the op-serving table",
    "tests/test_layers.py": "import-linter contracts and file sizes",
    "tests/test_fuser.py": "the fuser on plain data",
    "tests/test_period_detector.py": "the period detector's two walks on recorded op keys",
}
# A test is in a share where crc32(its key) (a fuzz seed: the seed) modulo n is one of the
# residues: (n, residues). The ci share's OpInfo entries are two fifths of the full share's
# seventh, by residues modulo 35: a modulus that is a multiple of 7 and of neither 2 nor 3, which
# the ci profile's own choice of dtypes and modes hashes by (test_opinfo.py, `_in_ci`), so the
# share keeps about as many tests per entry as the full one does.
SHARES = {
    "full": {"core functions": (1, (0,)), "core cases": (3, (0,)), "opinfo entries": (7, (0,)),
             "fuzz seeds": (1, (0,))},
    "ci": {"core functions": (2, (0,)), "core cases": (3, (0,)), "opinfo entries": (35, (0, 7)),
           "fuzz seeds": (4, (0,))},
}
SHARE_ENV = "DEFERFUSE_DEVICE_PROFILE"
# the suites' own profile switches: the device profile runs their ci profiles whatever is set
CI_ENV = {"DEFERFUSE_OPINFO": "ci", "DEFERFUSE_MODELS": "ci"}
UNSET_ENV = ("DEFERFUSE_FUZZ", "DEFERFUSE_FUZZ_START", "DEFERFUSE_OPINFO_SAMPLE")

_STATE = pytest.StashKey[dict]()
_T0 = time.time()  # conftest imports this module before torch: the wall time counts importing it


def active(config) -> bool:
    return bool(config.getoption(OPTION, default=False))


def suite_of(nodeid: str) -> str:
    return SUITES.get(nodeid.split("::")[0], "core")


def share() -> str:
    """The share the profile runs: $DEFERFUSE_DEVICE_PROFILE, ci unless it says full."""
    name = os.environ.get(SHARE_ENV) or "ci"
    if name not in SHARES:
        raise pytest.UsageError(f"{SHARE_ENV} takes {' or '.join(SHARES)}, not {name!r}")
    return name


def in_share(what: str, key: "str | int") -> bool:
    """Whether the test (entry, function, seed) that `key` names is in this share of `what`."""
    n, residues = SHARES[share()][what]
    return (key if isinstance(key, int) else zlib.crc32(key.encode())) % n in residues


def pytest_addoption(parser):
    parser.addoption(OPTION, action="store_true", default=False,
                     help="run the device profile: core tests, the OpInfo, model-zoo and fuzzer ci profiles, in this "
                          "one process (tests/device_profile.py)")
    parser.addoption("--device-suites", default=",".join(SUITE_NAMES), metavar="LIST",
                     help=f"with {OPTION}: only these of its suites (comma-separated, default all: "
                          f"{','.join(SUITE_NAMES)}), to split the run where one command has less time")
    parser.addoption("--device-part", default="1/1", metavar="K/N",
                     help=f"with {OPTION}: the K-th of N contiguous parts of the selection (in collection order, so "
                          "an entry's tests stay together and share compiles), to split one suite over commands")
    parser.addoption("--device-resume", default=None, metavar="FILE",
                     help=f"with {OPTION}: a journal of the tests begun and their outcomes; a run with the same "
                          "journal skips what it holds and counts it, so a run cut short or killed by an abort "
                          "goes on where it stopped (the test it died in counts as an error)")


def _suites(config) -> set[str]:
    asked = {s.strip() for s in config.getoption("--device-suites").split(",") if s.strip()}
    if not asked or asked - set(SUITE_NAMES):
        raise pytest.UsageError(f"--device-suites takes some of {','.join(SUITE_NAMES)}, not {sorted(asked)}")
    return asked


def _part(config) -> tuple[int, int]:
    text = config.getoption("--device-part")
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--device-part takes K/N with 1 <= K <= N, not {text!r}")
    return k, n


def part_of(items: list, k: int, n: int) -> tuple[list, list]:
    """The K-th of N contiguous slices (sizes differ by one at most), and the rest."""
    lo, hi = len(items) * (k - 1) // n, len(items) * k // n
    return items[lo:hi], items[:lo] + items[hi:]


def pytest_configure(config):
    if not active(config):
        return
    k, n = _part(config)
    if getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(f"{OPTION} runs in one process (one process holds the accelerator): drop -n, "
                                "or pass -p no:xdist")
    asked = _suites(config)
    share()  # one it does not know is a usage error now, not at collection
    os.environ.update(CI_ENV)
    for name in UNSET_ENV:
        os.environ.pop(name, None)
    config.stash[_STATE] = {"t0": _T0, "asked": [s for s in SUITE_NAMES if s in asked], "selected": {},
                           "deselected": {}, "part": f"{k}/{n}", "journal": None, "before": {}, "outcomes": {}}
    path = config.getoption("--device-resume")
    if path:
        config.stash[_STATE]["before"] = read_journal(path)
        journal = config.stash[_STATE]["journal"] = open(path, "a+", buffering=1)  # each line written at once
        if journal.tell():  # a killed process may have left half a line: the next record starts on its own
            journal.seek(journal.tell() - 1)
            if journal.read(1) != "\n":
                journal.write("\n")


def pytest_unconfigure(config):
    if active(config) and config.stash[_STATE]["journal"] is not None:
        config.stash[_STATE]["journal"].close()


def pytest_sessionfinish(session, exitstatus):
    """A resumed run exits as the uncut run would have: failed where its journal holds a failure,
    and not "no tests collected" where the journal holds them all."""
    outcomes = session.config.stash[_STATE]["outcomes"] if active(session.config) else None
    if outcomes and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        bad = any(o in ("failed", "error") for o in outcomes.values())
        session.exitstatus = pytest.ExitCode.TESTS_FAILED if bad else pytest.ExitCode.OK


# --- the journal (--device-resume): what a run cut short or aborted had done ------------------------


def _rows(path: str):
    """The journal's records, in order; none if there is no journal yet."""
    try:
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:  # the line a killed process was writing
                    continue
    except FileNotFoundError:
        return


def read_journal(path: str) -> dict[str, str]:
    """nodeid -> outcome of every test the journal holds; one begun and never finished is an error
    (the process died in it: an abort, a kill); one cut by Ctrl-C or `timeout -s INT` runs again."""
    outcomes: dict[str, str] = {}
    for row in _rows(path):
        if row.get("cut"):
            outcomes.pop(row["id"], None)
        else:
            outcomes[row["id"]] = row.get("outcome", "died")
    return outcomes


def costs(path: str) -> list[tuple[str, float, int]]:
    """(test file, seconds, tests) from a journal's finished tests, the dearest first: where a
    profile that outgrows a session's device time can be trimmed."""
    per: dict[str, list] = {}
    for row in _rows(path):
        if "seconds" in row:
            cost = per.setdefault(row["id"].split("::")[0], [0.0, 0])
            cost[0] += row["seconds"]
            cost[1] += 1
    return sorted(((k, round(s, 3), n) for k, (s, n) in per.items()), key=lambda r: -r[1])


def _write(config, **row) -> None:
    journal = config.stash[_STATE]["journal"]
    if journal is not None:
        journal.write(json.dumps(row) + "\n")


_REPORTS = pytest.StashKey[list]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if active(item.config):
        item.stash.setdefault(_REPORTS, []).append(outcome.get_result())


def outcome_of(reports) -> str:
    """What pytest's summary counts for one test, from its setup, call and teardown reports."""
    for rep in reports:
        if rep.failed:
            return "failed" if rep.when == "call" else "error"
    for rep in reports:
        if rep.skipped:
            return "xfailed" if hasattr(rep, "wasxfail") else "skipped"
        if rep.when == "call" and rep.passed and hasattr(rep, "wasxfail"):
            return "xpassed"
    return "passed"


def _excluded_reason(item, suites: set[str]) -> str | None:
    path = item.nodeid.split("::")[0]
    if suite_of(item.nodeid) not in suites:
        return "--device-suites"
    for prefix, reason in EXCLUDED_PATHS.items():
        if path.startswith(prefix):
            return reason
    for name in MARKERS:
        if item.get_closest_marker(name) is not None:
            return name
    keep = getattr(getattr(item, "module", None), "in_device_profile", None)
    if keep is not None and not keep(item):
        return "the suite's device share"
    return None


def in_core_share(nodeid: str) -> bool:
    """A fixed third of a parametrized core test's cases, by a hash of the test id."""
    return in_share("core cases", nodeid)


def _core_share(items: list) -> tuple[list, list]:
    """The share's core test functions, each keeping one case at least: its first where the
    hash keeps none."""
    cases: dict[str, list] = {}
    for item in items:
        if suite_of(item.nodeid) == "core":
            cases.setdefault(item.nodeid.split("[")[0], []).append(item)
    dropped = set()
    for function, group in cases.items():
        if not in_share("core functions", function):
            chosen = []
        elif "[" not in group[0].nodeid:
            continue
        else:
            chosen = [item for item in group if in_core_share(item.nodeid)] or group[:1]
        dropped.update(id(item) for item in group if item not in chosen)
    return [i for i in items if id(i) not in dropped], [i for i in items if id(i) in dropped]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not active(config):
        return
    state = config.stash[_STATE]
    kept, dropped, suites = [], [], _suites(config)
    for item in items:
        (dropped if _excluded_reason(item, suites) else kept).append(item)
    kept, thinned = _core_share(kept)
    kept, others = part_of(kept, *_part(config))  # the rest: "--device-part"
    dropped += thinned + others
    for which, group in (("selected", kept), ("deselected", dropped)):
        for item in group:
            suite = suite_of(item.nodeid)
            state[which][suite] = state[which].get(suite, 0) + 1
    before = state["before"]  # "--device-resume": counted from the journal, not run again
    done = [item for item in kept if item.nodeid in before]
    state["outcomes"] = {item.nodeid: "error" if before[item.nodeid] == "died" else before[item.nodeid]
                         for item in done}
    for item in done:
        if before[item.nodeid] == "died":  # the journal's last word on it is an error now
            _write(config, id=item.nodeid, outcome="error", died=True)
    if dropped or done:
        config.hook.pytest_deselected(items=dropped + done)
        items[:] = [item for item in kept if item.nodeid not in before]


# --- a test that starts a Python process fails at once (it would hang or die on a TPU host) ---------


def _starts_python(args, shell: bool, executable) -> str | None:
    if executable is not None:
        argv0 = os.fspath(executable)
    elif isinstance(args, (str, bytes, os.PathLike)):
        argv0 = os.fsdecode(args)
        argv0 = shlex.split(argv0)[0] if shell and argv0.strip() else argv0
    else:
        argv0 = os.fsdecode(list(args)[0])
    path = shutil.which(argv0) or argv0
    if os.path.basename(path).startswith("python") or os.path.realpath(path) == os.path.realpath(sys.executable):
        return argv0
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return None
    return argv0 if first.startswith(b"#!") and b"python" in first else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not active(item.config):
        yield
        return
    real_init = subprocess.Popen.__init__

    def guarded_init(self, args, *a, **kw):
        argv0 = _starts_python(args, kw.get("shell", False), kw.get("executable"))
        if argv0 is not None:
            raise RuntimeError(f"{item.nodeid} starts a Python process ({argv0}): under {OPTION} this process alone "
                               "holds the accelerator; mark the test @pytest.mark.subprocess")
        real_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = guarded_init
    _write(item.config, id=item.nodeid)  # begun: a process that dies now leaves this line alone
    t0 = time.perf_counter()
    try:
        result = yield
    finally:
        subprocess.Popen.__init__ = real_init
    if result.excinfo is None:
        # with its seconds, which on a chip are mostly compiles: `costs` sums them per file
        _write(item.config, id=item.nodeid, outcome=outcome_of(item.stash.get(_REPORTS, [])),
               seconds=round(time.perf_counter() - t0, 3))
    elif issubclass(result.excinfo[0], KeyboardInterrupt):  # cut at a deadline: it runs again
        _write(item.config, id=item.nodeid, cut=True)


# --- the summary ------------------------------------------------------------------------------------------


def _commit() -> dict:
    """The commit under test: $DEFERFUSE_COMMIT where the caller names it, else git's where this
    is a checkout. The caller's word comes first: a copy of the tree on a device machine may have
    no git metadata, or another checkout's (the device tool's copy of a tree at d166f32 said
    a46fc7c "with uncommitted changes")."""
    env = os.environ.get("DEFERFUSE_COMMIT")
    if env:
        return {"commit": env, "dirty": None, "commit_from": "DEFERFUSE_COMMIT"}

    def git(*args):
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=20, check=True).stdout

    try:
        if os.path.realpath(git("rev-parse", "--show-toplevel").strip()) == os.path.realpath(ROOT):
            return {"commit": git("rev-parse", "HEAD").strip(),
                    "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip()), "commit_from": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None, "commit_from": None}


def _device() -> dict:
    import jax
    import torch

    d = jax.devices()[0]
    return {"platform": d.platform, "device_kind": getattr(d, "device_kind", d.platform), "device_count": jax.device_count(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(), "jax": jax.__version__,
            "torch": torch.__version__, "python": sys.version.split()[0]}


def pytest_report_header(config):
    if active(config):
        d = _device()
        return [f"device profile, {share()} share: {d['platform']} ({d['device_kind']}), float32 matmul precision "
                f"{d['float32_matmul_precision']}"]
    return None


def summary(config, stats: dict, exitstatus) -> dict:
    state = config.stash[_STATE]
    suites = {s: dict.fromkeys(OUTCOMES, 0) for s in SUITE_NAMES}
    failing = {"failed": [], "error": []}
    for outcome in OUTCOMES:
        for rep in stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            suites[suite_of(nodeid)][outcome] += 1
            if outcome in failing:
                failing[outcome].append(nodeid)
    for nodeid, outcome in state.get("outcomes", {}).items():
        suites[suite_of(nodeid)][outcome] += 1
        if outcome in failing:
            failing[outcome].append(nodeid)
    for s in SUITE_NAMES:
        suites[s]["selected"] = state["selected"].get(s, 0)
        suites[s]["deselected"] = state["deselected"].get(s, 0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"profile": "device", "share": share(), **_device(), **_commit(), "wall_seconds": round(time.time() - state["t0"], 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "exit_status": int(exitstatus), "suites_asked": state.get("asked", list(SUITE_NAMES)),
            "part": state.get("part", "1/1"), "resumed": len(state.get("outcomes", {})), "suites": suites,
            "failed": failing["failed"], "errors": failing["error"]}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not active(config):
        return
    s = summary(config, terminalreporter.stats, exitstatus)
    tr = terminalreporter
    tr.section("device profile")
    commit = s["commit"] or "unknown (no git checkout, no DEFERFUSE_COMMIT)"
    tr.write_line(f"{s['platform']} ({s['device_kind']}, {s['device_count']} device(s)), float32 matmul precision "
                  f"{s['float32_matmul_precision']}; jax {s['jax']}, torch {s['torch']}, python {s['python']}")
    tr.write_line(f"commit {commit}{' (with uncommitted changes)' if s['dirty'] else ''}; share {s['share']}; "
                  f"wall {s['wall_seconds']:.0f}s, CPU {s['cpu_seconds']:.0f}s; part {s['part']}"
                  + (f"; {s['resumed']} counted from the journal" if s["resumed"] else ""))
    columns = ("selected", *OUTCOMES, "deselected")
    tr.write_line(f"{'suite':8}" + "".join(f"{c:>11}" for c in columns))
    for name, counts in s["suites"].items():
        tr.write_line(f"{name:8}" + "".join(f"{counts[c]:>11}" for c in columns))
    failing = [f"FAILED {n}" for n in s["failed"]] + [f"ERROR {n}" for n in s["errors"]]
    for line in failing[:30]:
        tr.write_line(line)
    if len(failing) > 30:
        tr.write_line(f"... and {len(failing) - 30} more (the JSON lists them all)")
    path = os.environ.get("DEFERFUSE_PROFILE_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(s, f, indent=1)
        tr.write_line(f"written to {path}")


if __name__ == "__main__":  # python tests/device_profile.py JOURNAL: seconds per test file
    for name, seconds, n in costs(sys.argv[1]):
        print(f"{seconds:9.1f} s  {n:5d} tests  {name}")
