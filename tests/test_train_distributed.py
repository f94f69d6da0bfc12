"""Data-parallel training on torch.distributed: real ranks (gloo, CPU), launched by torchrun
or `peregrine train --nproc`, kept tiny (startup dominates: each launch imports torch in
three processes)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dist_worker
from peregrine.cli import main as cli_main
from peregrine.train import checkpoint, distributed, load_config
from peregrine.train.policy import Policy
from peregrine.train.ppo import Trainer
from polling import poll_until

WORKER = str(Path(dist_worker.__file__).resolve())
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
QUIET = ["--detach", "--train.tensorboard", "false"]
WAIT = 240     # seconds: a guard against a hung job, not a speed requirement


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def records(run_dir):
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.open()] if path.exists() else []


def wait_for_records(run_dir, count, process):
    def going():
        assert process.poll() is None, process.communicate()
        return len([r for r in records(run_dir) if "updates" in r]) >= count

    assert poll_until(going, WAIT), "the run never got going"


def finish(process):
    out, err = process.communicate(timeout=WAIT)
    return process.returncode, out, err


def parameters(state):
    return {name: tensor.clone() for name, tensor in state.items()}


def test_two_nodes_on_loopback_train_cartpole_as_one_run(tmp_path):
    """Two torchrun "nodes" (one rank each) meet through a c10d rendezvous on
    127.0.0.1 and train CartPole together: one run directory, records that count
    both ranks' steps, and it learns (16 envs x 2 ranks and a global minibatch of 512
    is the shipped 1-process batch) to the stop return within the step budget the
    one-process test gets; both ranks stop at the same update. Each node works in
    its own directory with a relative --run-dir, as two machines would: rank 0 alone
    writes (metrics.jsonl, metrics.bin with the world size, the learning curve,
    the checkpoint) and rank 1's directory stays empty."""
    from peregrine.monitor.metrics import MetricsReader
    homes = [tmp_path / f"node{node}" for node in (0, 1)]
    for home in homes:
        home.mkdir()
    launcher = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "loopback",
                "--max-restarts", "0"]
    train = ["-m", "peregrine", "train", "cartpole", *QUIET, "--run-dir", "run",
             "--seed", "3", "--total-steps", "40000", "--vec.num-envs", "16",
             "--train.minibatch-size", "256", "--train.stop-return", "150"]
    nodes = [subprocess.Popen([*launcher, "--node-rank", str(node), *train], cwd=homes[node],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    results = [finish(node) for node in nodes]
    for code, out, err in results:
        assert code == 0, err
    assert sum("finished:" in out for _, out, _ in results) == 1   # rank 0 alone reports
    run_dir = homes[0] / "run"
    lines = records(run_dir)
    assert lines[-1] == {"status": "finished"}
    updates = lines[:-1]
    assert [r["updates"] for r in updates] == list(range(1, len(updates) + 1))
    assert all(r["world_size"] == 2 for r in updates)
    assert updates[-1]["global_step"] == len(updates) * 2 * 16 * 32   # both ranks' samples
    assert updates[-1]["recent_return"] >= 150, updates[-1]["recent_return"]
    resources = updates[-1]["resources"]        # rank 0's record holds every rank's memory
    assert len(resources["ranks_peak_rss_mb"]) == 2 and min(resources["ranks_peak_rss_mb"]) > 50
    assert resources["peak_rss_total_mb"] >= sum(resources["ranks_peak_rss_mb"])
    assert resources["peak_rss_mb"] == resources["ranks_peak_rss_mb"][0]
    assert list(homes[1].iterdir()) == []
    assert (run_dir / "learning_curve.png").is_file()
    assert checkpoint.load(run_dir)["world_size"] == 2
    with MetricsReader(run_dir) as reader:      # what the dashboard reads
        assert reader.header.world_size == 2
        latest = reader.read()
        assert latest["global_step"] == updates[-1]["global_step"]
        assert latest["sps"] == pytest.approx(updates[-1]["sps"])   # global SPS


def test_two_ranks_equal_one_process_and_resume_exactly_after_ctrl_c(tmp_path, monkeypatch):
    """Ctrl-C on torchrun stops both ranks after the same update and rank 0 saves once;
    the parameters then equal those of one process with both ranks' envs (serial
    backend, two blocks: the same slices) and the global minibatch, to float
    tolerance, and so do they after `--resume` with 2 ranks and a new step budget
    (the annealed learning rate follows the global step count on every rank); the
    records count the episodes of both ranks.
    Resuming that checkpoint in one process is refused. Action draws are row-keyed
    in both (dist_worker.py): per-rank sampling streams are the documented
    difference."""
    algorithm = ["--train.seed", "4", "--train.horizon", "16", "--train.update-epochs", "2",
                 "--train.checkpoint-interval", "0", "--train.tensorboard", "false"]
    shared = ["--detach", *algorithm, "--train.dist-backend", "shm"]   # "auto" picks it too
    run_dir = tmp_path / "run"
    torchrun = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", WORKER, "train"]
    job = subprocess.Popen([*torchrun, "cartpole", *shared, "--run-dir", str(run_dir),
                            "--total-steps", "1e9", "--vec.num-envs", "4",
                            "--train.minibatch-size", "64"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_records(run_dir, 1, job)
    job.send_signal(signal.SIGINT)
    _, _, err = finish(job)
    lines = records(run_dir)
    assert lines[-1] == {"status": "interrupted"}, err
    assert sum("status" in line for line in lines) == 1
    stopped = checkpoint.load(run_dir)
    stopped_at = stopped["updates"]
    assert stopped_at == lines[-2]["updates"] and stopped["world_size"] == 2
    assert len(stopped["ranks"]) == 2
    at_stop = parameters(stopped["policy"])

    total = (stopped_at + 2) * 2 * 4 * 16
    code, _, err = finish(subprocess.Popen(
        [*torchrun, "--resume", str(run_dir), "--total-steps", str(total), *QUIET],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    assert code == 0, err
    resumed = checkpoint.load(run_dir)
    assert resumed["updates"] == stopped_at + 2 and resumed["global_step"] == total
    rates = [r["losses"]["learning_rate"] for r in records(run_dir) if "updates" in r]
    assert rates[-1] < rates[-2] < rates[0]    # annealed over the resumed budget

    # One process: 8 envs in the same two blocks, the global minibatch; stopped and
    # resumed with the new budget through its state dict, as the ranks were.
    monkeypatch.setattr(Policy, "_sample_categorical",
                        staticmethod(dist_worker._sample_categorical))
    dist_worker._draws[0] = 0

    def one_process(total_steps):
        return Trainer(load_config("cartpole", overrides=[
            *algorithm, "--train.total-steps", str(total_steps), "--vec.backend", "serial",
            "--vec.num-workers", "2", "--vec.num-envs", "8", "--train.minibatch-size", "128"]))
    reference = one_process(1e9)
    try:
        for _ in range(stopped_at):
            reference.update()
        for name, tensor in reference.policy.state_dict().items():
            torch.testing.assert_close(at_stop[name], tensor, rtol=1e-4, atol=1e-6)
        # The same episodes, counted over both ranks in the 2-rank records.
        assert lines[-2]["episodes"] == reference.episodes
        state = reference.state_dict()
    finally:
        reference.close()
    reference = one_process(total)
    try:
        reference.load_state_dict(state)
        dist_worker._draws[0] = 0     # the resumed workers count their draws afresh
        while not reference.done:
            reference.update()
        for name, tensor in reference.policy.state_dict().items():
            torch.testing.assert_close(resumed["policy"][name], tensor, rtol=1e-4, atol=1e-6)
        assert resumed["episodes"] == reference.episodes > 0
        assert not torch.equal(resumed["policy"]["actor_head.weight"],
                               at_stop["actor_head.weight"])   # it did train on
    finally:
        reference.close()
    assert cli_main(["train", "--resume", str(run_dir), "--detach"]) == 2


def test_a_rank_that_raises_ends_the_job_with_its_error(tmp_path):
    """Rank 1 raises at its third update while rank 0 waits for it in a collective:
    the job ends (torchrun stops rank 0 long before the collective's timeout, which
    is set beyond this test's patience), rank 1's error is shown, and the checkpoint
    of the last finished update still loads."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", WORKER,
         "train", "cartpole", *QUIET, "--run-dir", str(run_dir), "--total-steps", "1e9",
         "--vec.num-envs", "8", "--train.checkpoint-interval", "1",
         "--train.dist-timeout", str(10 * WAIT)], cwd=tmp_path,
        env={**os.environ, "PEREGRINE_TEST_RAISE": "1:2"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, _, err = finish(job)
    assert code != 0
    assert "rank 1 of 2 failed: RuntimeError: injected failure at update 2" in err, err
    state = checkpoint.load(run_dir)
    assert state["updates"] == 2 and state["world_size"] == 2
    assert [r["updates"] for r in records(run_dir) if "updates" in r] == [1, 2]


def test_resuming_with_another_world_size_is_refused_before_any_rank_starts(tmp_path, capsys):
    """`--resume RUN --nproc 2` on a one-process checkpoint is refused by the launcher
    (no ranks started), and a rank would refuse it too (local_state)."""
    run_dir = tmp_path / "run"
    assert cli_main(["train", "cartpole", *QUIET, "--run-dir", str(run_dir),
                     "--total-steps", "512", "--vec.num-envs", "4"]) == 0
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run_dir), "--nproc", "2", "--detach"]) == 2
    message = capsys.readouterr().err
    assert "written by a run of 1 rank(s) but this run has 2" in message
    assert "a single process" in message
    state = checkpoint.load(run_dir)
    with pytest.raises(ValueError, match="resume it with a single process"):
        distributed.local_state(state, rank=1, world_size=2)
    two = {**state, "world_size": 2, "ranks": [{"generator": "rank 0"}, {"generator": "rank 1"}]}
    assert distributed.local_state(two, rank=1, world_size=2)["generator"] == "rank 1"
    with pytest.raises(ValueError, match=r"--nproc 2 \(or torchrun with 2 ranks in all\)"):
        distributed.local_state(two, rank=0, world_size=3)


def test_a_rank_without_the_run_directory_says_every_node_needs_it(tmp_path, monkeypatch,
                                                                   capsys):
    """On resume every rank reads the run directory that rank 0 alone wrote: a rank on
    another node without it is told why (before joining the process group)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli_main(["train", "--resume", str(tmp_path / "run"), "--detach"]) == 2
    assert "every node needs the run directory" in capsys.readouterr().err


def test_backend_is_gloo_on_cpu_and_nccl_needs_cuda():
    cpu = torch.device("cpu")
    assert distributed.resolve_backend("auto", cpu) == "gloo"
    assert distributed.resolve_backend("gloo", cpu) == "gloo"
    with pytest.raises(ValueError, match="'nccl' needs train.device = 'cuda'"):
        distributed.resolve_backend("nccl", cpu)
    if torch.distributed.is_nccl_available():
        assert distributed.resolve_backend("auto", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="train.dist_backend.*gloo"):
        load_config("cartpole", overrides=["--train.dist-backend", "mpi"])


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(x) for x in (task / "children").read_text().split()]
    return found


def _rank_of(pid: int):
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_killed_rank_ends_the_job_with_its_error(tmp_path):
    """`peregrine train --nproc 2`; rank 1 is SIGKILLed mid-run: the job ends (no
    hang in a collective) reporting rank 1's death, and the last checkpoint loads."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [sys.executable, "-m", "peregrine", "train", "cartpole", "--nproc", "2", *QUIET,
         "--run-dir", str(run_dir), "--total-steps", "1e9", "--vec.num-envs", "8",
         "--train.checkpoint-interval", "1"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_records(run_dir, 2, job)
    victims = [pid for pid in _children(job.pid) if _rank_of(pid) == 1]
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    code, _, err = finish(job)
    assert code != 0
    assert "rank      : 1" in err and "SIGKILL" in err, err
    state = checkpoint.load(run_dir)
    last = [r for r in records(run_dir) if "updates" in r][-1]
    assert 1 <= state["updates"] <= last["updates"]


def test_two_compiled_ranks_match_two_eager_ranks(tmp_path):
    """train.compile with several ranks: the compiled loss sees the global advantage
    statistics each minibatch carries (the warm-up compiles with them, so no
    recompile), and the first update's losses equal the eager job's to float
    tolerance."""
    firsts = {}
    for compile_ in ("false", "true"):
        run_dir = tmp_path / f"compile-{compile_}"
        job = subprocess.run(
            [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "peregrine", "train",
             "cartpole", *QUIET, "--run-dir", str(run_dir), "--total-steps", "4096",
             "--train.stop-return", "0", "--train.compile", compile_],
            capture_output=True, text=True, timeout=WAIT)
        assert job.returncode == 0, job.stderr
        assert "training eagerly" not in job.stderr    # no fallback warning
        updates = [r for r in records(run_dir) if "updates" in r]
        assert len(updates) == 2 and updates[-1]["world_size"] == 2
        firsts[compile_] = updates[0]["losses"]
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert firsts["true"][name] == pytest.approx(firsts["false"][name], rel=1e-4, abs=1e-6), name


def test_two_ranks_train_with_normalisers_whose_statistics_agree(tmp_path):
    """train.normalize_obs and normalize_reward on two ranks (they were refused): the
    statistics are synchronised once a rollout, so both ranks' saved normalisers are the
    same bits and count every observation of both ranks' rollouts (their first resets'
    too)."""
    run_dir = tmp_path / "run"
    job = subprocess.run(
        [sys.executable, "-m", "peregrine", "train", "mountain_car", "--nproc", "2", *QUIET,
         "--run-dir", str(run_dir), "--total-steps", "512", "--vec.num-envs", "4",
         "--train.minibatch-size", "32"], capture_output=True, text=True, timeout=WAIT,
        cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    saved = checkpoint.load(run_dir)
    assert saved["world_size"] == 2 and saved["config"]["train"]["normalize_obs"]
    first, second = (rank["obs_normalizer"] for rank in saved["ranks"])
    assert torch.equal(first["mean"], second["mean"]) and torch.equal(first["var"],
                                                                      second["var"])
    steps = saved["updates"] * saved["config"]["train"]["horizon"] + 1    # + the first reset
    assert first["count"] == second["count"] == steps * 2 * saved["rows"]
    rewards = [rank["reward_scaler"] for rank in saved["ranks"]]
    assert torch.equal(rewards[0]["var"], rewards[1]["var"])
    assert rewards[0]["count"] == first["count"] - 2 * saved["rows"]     # a reward a step
