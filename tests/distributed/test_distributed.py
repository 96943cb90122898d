"""torch.distributed on tpu, with real processes: each test launches
`python -m torch.distributed.run --standalone --nproc_per_node=N tests/distributed/workers.py`
under a hard timeout and compares what the ranks saved.

These run outside pytest-xdist (`./dev test` runs them after the rest, one at a time): two xdist
workers each launching two processes would put four JAX processes on two cores.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch


pytestmark = pytest.mark.skipif(bool(os.environ.get("PYTEST_XDIST_WORKER")),
                                reason="multi-process tests run outside xdist: ./dev test runs them after the rest")

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["strict", "debug", "defer_and_fuse"]


def launch(case: str, out, mode: str = "strict", nproc: int = 2, timeout: float = 240, env=None):
    """Run the case on nproc processes; (return code, output, seconds).

    A job still running at `timeout` fails the test. It is stopped as torchrun stops its workers
    (SIGTERM to torchrun, which sends it on and SIGKILLs a worker still alive 30 s later): killing
    torchrun alone would leave them running, and they start in sessions of their own."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(HERE, "workers.py"), case, str(out), mode]
    full_env = {**os.environ, "DEFERFUSE_CACHE_DIR": "", "OMP_NUM_THREADS": "1", **(env or {})}
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env) as p:
        try:
            log, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                log, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                log, _ = p.communicate()
            pytest.fail(f"{case}: the job was still running after {timeout:g} s\n{log[-4000:]}")
    return p.returncode, log, time.perf_counter() - t0


def ranks(out, nproc: int = 2) -> list:
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(nproc)]


def test_every_collective_matches_gloo_on_cpu_tensors(tmp_path):
    rc, log, _ = launch("collectives", tmp_path)
    assert rc == 0, log[-4000:]
    for r, res in enumerate(ranks(tmp_path)):
        tpu, cpu = res["tpu"], res["cpu"]
        assert set(cpu) <= set(tpu)
        for key, want in cpu.items():
            got = tpu[key]
            if key.startswith("all_reduce AVG") and isinstance(got, torch.Tensor):
                # gloo has no AVG: the oracle is its SUM over the world size
                torch.testing.assert_close(got, (cpu[key.replace("AVG", "SUM")] / 2).to(got.dtype),
                                           msg=lambda m: f"rank {r} {key}: {m}")
            elif isinstance(want, str):  # gloo raised: so must tpu_dist, with the same type
                assert got == want, f"rank {r} {key}: gloo raised {want}, tpu_dist gave {got}"
            elif key.endswith("_object") or key.endswith("object_list"):
                assert got == want, f"rank {r} {key}"
            else:
                torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0,
                                           msg=lambda m: f"rank {r} {key}: {m}")
        torch.testing.assert_close(tpu["all_to_all uneven lists"], tpu["all_to_all uneven lists expected"])
        assert tpu["all_reduce AVG torch.float32"].dtype == torch.float32


@pytest.mark.parametrize("mode", MODES)
def test_ddp_matches_one_process_on_the_whole_batch(tmp_path, mode):
    rc, log, _ = launch("ddp", tmp_path, mode)
    assert rc == 0, log[-4000:]
    r0, r1 = ranks(tmp_path)
    for step, (g0, g1) in enumerate(zip(r0["grads"], r1["grads"])):
        for a, b in zip(g0, g1):  # the all-reduced gradients are the same on every rank
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")
    for r in (r0, r1):
        torch.testing.assert_close(r["params"], r["ref_params"], rtol=1e-5, atol=1e-5)
        assert r["metrics"]["collectives"]["all_reduce"] >= 2 * 2  # several buckets per step
    if mode == "defer_and_fuse":
        assert r0["metrics"]["flushes_by_cause"].get("distributed_op", 0) > 0


def test_ddp_in_spmd_safe_runs_each_step_as_one_program_with_its_collectives(tmp_path):
    rc, log, _ = launch("ddp", tmp_path, "spmd_safe")
    assert rc == 0, log[-4000:]
    for r in ranks(tmp_path):
        torch.testing.assert_close(r["params"], r["ref_params"], rtol=1e-5, atol=1e-5)
        m = r["metrics"]
        assert m["collectives"]["all_reduce"] >= 2 * 2  # several buckets per step, all recorded
        # no flush for a collective: each steady-state step is one flush, the cut at the
        # optimizer step's end (loss.item() right after it then finds its value computed)
        assert m["flushes_by_cause"] == {"optimizer_step": 2}, m["flushes_by_cause"]


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_fsdp2_matches_one_process_after_three_adamw_steps(tmp_path, mode):
    rc, log, _ = launch("fsdp", tmp_path, mode)
    assert rc == 0, log[-4000:]
    for r in ranks(tmp_path):
        assert set(r["types"]) == {"DTensor"}  # the parameters really are sharded
        torch.testing.assert_close(r["params"], r["ref_params"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nproc", [2, 4], ids=["1-D mesh", "2x2 mesh"])
def test_dtensor_matmul_and_redistribute(tmp_path, nproc):
    rc, log, _ = launch("dtensor", tmp_path, "defer_and_fuse", nproc=nproc, timeout=360)
    assert rc == 0, log[-4000:]
    for rank, r in enumerate(ranks(tmp_path, nproc)):
        torch.testing.assert_close(r["whole"], r["expected"], rtol=1e-5, atol=1e-5)
        rows = 8 // (nproc if nproc == 2 else 2)
        shard = rank if nproc == 2 else rank // 2
        torch.testing.assert_close(r["local"], r["a"][shard * rows:(shard + 1) * rows], rtol=0, atol=0)
        if nproc == 4:  # mesh dim 1 of a 2x2 mesh: ranks {0, 1} and {2, 3}
            assert r["col_ranks"] == [rank - rank % 2, rank - rank % 2 + 1]
            assert r["col_sum"].tolist() == [float(sum(r["col_ranks"]))] * 3


def test_a_stuck_peer_is_an_error_naming_the_collective_and_the_rank(tmp_path):
    rc, log, seconds = launch("stuck_peer", tmp_path, timeout=120)
    assert rc != 0
    assert seconds < 45, f"the job took {seconds:.0f} s to end after a peer got stuck"
    waited, message, value = (tmp_path / "rank0.txt").read_text().split("\n", 2)
    assert float(waited) < 15
    assert "all_reduce op=SUM float32[4] (collective #2 on group" in message
    assert "rank(s) [1] of 2 never reached it" in message
    assert "last ran all_reduce op=SUM float32[4] (#1)" in message
    assert value == "[2.0, 2.0, 2.0, 2.0]"  # the tensor is as the first all-reduce left it


@pytest.mark.parametrize("case, mode, error", [
    ("raises_mid_step", "strict", "ValueError: rank 1 fails mid-step"),
    ("raises_in_collective", "defer_and_fuse", "FloatingPointError: rank 1: non-finite gradient in bucket 0"),
], ids=["before a collective", "inside a collective"])
def test_a_rank_that_raises_ends_the_job_promptly_with_its_traceback(tmp_path, case, mode, error):
    """As on gloo: the failing rank exits at once (not waiting for rank 0 in JAX's shutdown
    barrier), and rank 0, waiting for it in a collective, ends on torchrun's SIGTERM (not on its
    SIGKILL 30 s later)."""
    rc, log, _ = launch(case, tmp_path, mode, timeout=60)
    seconds = time.time() - float((tmp_path / "failed_at.txt").read_text())
    assert rc != 0, log[-4000:]
    assert seconds < 10, f"the job took {seconds:.0f} s to end after rank 1 raised\n{log[-4000:]}"
    assert "[rank1]: Traceback (most recent call last)" in log and f"[rank1]: {error}" in log, log[-4000:]


def test_ranks_that_diverge_both_raise_naming_what_each_called(tmp_path):
    rc, log, seconds = launch("diverged", tmp_path, timeout=120)
    assert rc != 0
    assert seconds < 45
    for r in (0, 1):
        message = (tmp_path / f"rank{r}.txt").read_text()
        assert "diverged at collective #1" in message
        assert "rank 0: all_reduce op=SUM float32[4]; rank 1: broadcast root=0 float32[4]" in message


def _losses(log: str) -> list[float]:
    return [float(line.split("loss")[1].split()[0]) for line in log.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("script", ["ddp_train.py", "fsdp_train.py"])
def test_the_examples_train_like_gloo_on_cpu(tmp_path, script):
    """The distributed examples, as the README launches them: tpu in DeferAndFuse against the same
    script on CPU tensors over gloo."""
    path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", script)
    got = {}
    for mode in ("cpu", "defer_and_fuse"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", path,
               "--mode", mode, "--steps", "4", "--layers", "1", "--dim", "64", "--log-every", "1"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "DEFERFUSE_CACHE_DIR": "", "OMP_NUM_THREADS": "1"})
        assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
        got[mode] = _losses(p.stdout)
    assert len(got["cpu"]) == 4
    torch.testing.assert_close(got["defer_and_fuse"], got["cpu"], rtol=2e-3, atol=2e-3)
