"""One count of available cores (affinity and cgroup CPU quota) behind the
Multiprocessing backend, --nproc, --nproc auto and the benchmarks' records, and
one warning, in the same words, when more workers or ranks than that are asked for."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest

import peregrine.vector as pv
from peregrine.profile import machine
from peregrine.train import distributed
from peregrine.vector import common
from peregrine.vector.common import CoresWarning, available_cores, cgroup_cpu_limit


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A machine of `cpus` CPUs in this process's affinity mask, a cgroup tree under
    tmp_path and a /proc/self/cgroup naming `path` (v2) or `v1_path` (v1 cpu controller)."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    root.mkdir()
    monkeypatch.setattr(common, "CGROUP_ROOT", root)
    monkeypatch.setattr(common, "PROC_SELF_CGROUP", proc)

    def make(cpus=8, path=None, v1_path=None, files=()):
        monkeypatch.setattr(common.os, "sched_getaffinity", lambda pid: set(range(cpus)),
                            raising=False)
        lines = []
        if v1_path is not None:
            lines += ["5:memory:/elsewhere", f"4:cpu,cpuacct:{v1_path}"]
        if path is not None:
            lines.append(f"0::{path}")
        proc.write_text("".join(line + "\n" for line in lines))
        for relative, text in files:
            file = root / relative
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text)
        return root
    return make


def test_no_quota_leaves_the_affinity_mask(fake_machine):
    fake_machine(cpus=8, path="/user.slice/job", files=[("user.slice/job/cpu.max", "max 100000\n")])
    assert cgroup_cpu_limit() is None and available_cores() == 8
    fake_machine(cpus=3, path="/")                      # no cpu.max anywhere
    assert cgroup_cpu_limit() is None and available_cores() == 3


def test_cgroup_v2_quota_is_rounded_up_and_the_tightest_ancestor_wins(fake_machine):
    fake_machine(cpus=8, path="/user.slice/job", files=[("user.slice/job/cpu.max", "150000 100000\n")])
    assert cgroup_cpu_limit() == 1.5 and available_cores() == 2
    # a parent's quota binds its children too
    fake_machine(cpus=8, path="/user.slice/job", files=[("user.slice/cpu.max", "100000 100000\n")])
    assert cgroup_cpu_limit() == 1.0 and available_cores() == 1
    # a fraction of one CPU is still one core
    fake_machine(cpus=8, path="/user.slice/job", files=[("user.slice/cpu.max", "20000 100000\n"),
                                                        ("user.slice/job/cpu.max", "max 100000\n")])
    assert cgroup_cpu_limit() == pytest.approx(0.2) and available_cores() == 1


def test_cgroup_v1_quota_and_a_container_whose_mount_is_its_own_cgroup(fake_machine):
    fake_machine(cpus=16, v1_path="/batch/job7",
                 files=[("cpu,cpuacct/batch/job7/cpu.cfs_quota_us", "300000\n"),
                        ("cpu,cpuacct/batch/job7/cpu.cfs_period_us", "100000\n")])
    assert cgroup_cpu_limit() == 3.0 and available_cores() == 3
    # A container: /proc/self/cgroup names the host's path, but the mount at
    # CGROUP_ROOT/cpu is the container's own cgroup.
    fake_machine(cpus=16, v1_path="/docker/0123abcd",
                 files=[("cpu/cpu.cfs_quota_us", "200000\n"), ("cpu/cpu.cfs_period_us", "100000\n")])
    assert available_cores() == 2
    fake_machine(cpus=16, v1_path="/", files=[("cpu/cpu.cfs_quota_us", "-1\n"),
                                              ("cpu/cpu.cfs_period_us", "100000\n")])
    assert cgroup_cpu_limit() is None and available_cores() == 16


def test_affinity_below_the_quota_wins_and_a_missing_affinity_call_falls_back(fake_machine,
                                                                             monkeypatch):
    fake_machine(cpus=1, path="/job", files=[("job/cpu.max", "400000 100000\n")])
    assert available_cores() == 1
    fake_machine(path="/job", files=[("job/cpu.max", "max 100000\n")])
    monkeypatch.delattr(common.os, "sched_getaffinity")     # macOS, Windows
    monkeypatch.setattr(common.os, "cpu_count", lambda: 6)
    assert available_cores() == 6


def test_unreadable_or_junk_cgroup_files_are_no_limit(fake_machine):
    fake_machine(cpus=4, path="/job", files=[("job/cpu.max", "garbage\n"),
                                             ("cpu/cpu.cfs_quota_us", "not a number\n")])
    assert cgroup_cpu_limit() is None and available_cores() == 4


def test_every_user_of_the_count_asks_the_same_function(fake_machine):
    fake_machine(cpus=8, path="/job", files=[("job/cpu.max", "200000 100000\n")])
    assert distributed.available_cores() == 2
    assert machine.machine_facts()["usable_cores"] == 2
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "benchmarks"))
    try:
        import suite_common
    finally:
        sys.path.pop(0)
    assert suite_common.usable_cores() == 2 and suite_common.thread_counts() == [1, 2]
    # --nproc auto: one rank per available core, not per CPU of the mask
    from peregrine.train.config import load_config
    config = load_config("cartpole", overrides=[("vec.num_envs", 64), ("train.minibatch_size", 64)])
    ranks, _, why = distributed.auto_ranks(config, distributed.available_cores())
    assert ranks == 2, why


def test_the_warning_names_the_count_and_how_to_ask_for_fewer(fake_machine):
    fake_machine(cpus=1, path="/")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert common.warn_if_oversubscribed(1, "ranks", "fewer") is False
    with pytest.warns(CoresWarning, match=r"^3 ranks on 1 available core: they take turns "
                                          r".* Use fewer\.$"):
        assert common.warn_if_oversubscribed(3, "ranks", "Use fewer.") is True


def test_multiprocessing_warns_unless_overwork_says_it_is_intended(fake_machine):
    """The warning comes before any worker starts (an impossible batch_size then stops
    construction here, so no process is started)."""
    fake_machine(cpus=1, path="/")
    with pytest.warns(CoresWarning, match="2 workers on 1 available core.*--vec.num-workers 1"), \
            pytest.raises(ValueError, match="batch_size"):
        pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2, batch_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CoresWarning)
        with pytest.raises(ValueError, match="batch_size"):
            pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2,
                    batch_size=3, overwork=True)


# ---- under a real one-core affinity: the backend and --nproc say the same ----------------------

BACKEND = textwrap.dedent("""
    import peregrine.vector as pv
    from peregrine.vector.common import available_cores
    if __name__ == "__main__":
        print("cores", available_cores(), flush=True)
        with pv.make("cartpole", backend="multiprocessing", num_envs=2, num_workers=2,
                     seed=0) as env:
            env.reset(seed=0)
            print("workers started:", env.num_workers, flush=True)
""")

# `peregrine train --nproc 2` up to torchrun, whose run() only reports what it was asked.
NPROC = textwrap.dedent("""
    import sys
    import torch.distributed.run as torchrun
    torchrun.run = lambda args: print("ranks started:", args.nproc_per_node, flush=True)
    from peregrine.cli import main
    sys.exit(main(["train", "cartpole", "--nproc", "2", "--run-dir", sys.argv[1]]))
""")

# Python's format from the library, the command's own one-line format from the CLI
WARNING = re.compile(r"(?:CoresWarning|peregrine train: warning): (\d+) (workers|ranks) on "
                     r"(\d+) available cores?: (.*?\)\.) ")


@pytest.mark.skipif(shutil.which("taskset") is None or not hasattr(__import__("os"),
                                                                     "sched_getaffinity"),
                    reason="needs Linux taskset")
def test_one_core_affinity_backend_and_nproc_warn_alike(tmp_path):
    (tmp_path / "backend.py").write_text(BACKEND)
    backend = subprocess.run(["taskset", "-c", "0", sys.executable, str(tmp_path / "backend.py")],
                             capture_output=True, text=True, timeout=120)
    nproc = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", NPROC,
                            str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert backend.returncode == 0, backend.stderr
    assert nproc.returncode == 0, nproc.stderr
    # both go ahead (a warning, not a refusal) ...
    assert "cores 1" in backend.stdout and "workers started: 2" in backend.stdout
    assert "ranks started: 2" in nproc.stdout
    # ... after one warning each, in the same words
    found = [WARNING.findall(run.stderr) for run in (backend, nproc)]
    assert [len(f) for f in found] == [1, 1], (backend.stderr, nproc.stderr)
    (count_w, noun_w, cores_w, rest_w), (count_r, noun_r, cores_r, rest_r) = found[0][0], found[1][0]
    assert (count_w, noun_w, cores_w) == ("2", "workers", "1")
    assert (count_r, noun_r, cores_r) == ("2", "ranks", "1")
    assert rest_w.replace("workers", "ranks") == rest_r
    # the command says it in its own words, on one line; the library in Python's format
    assert "peregrine train: warning: 2 ranks" in nproc.stderr and "CoresWarning" not in nproc.stderr
    assert "CoresWarning: 2 workers" in backend.stderr


def test_auto_torch_threads_give_a_cnn_the_cores_and_an_mlp_one(fake_machine, monkeypatch):
    """train.torch_threads = 0: one thread for an MLP (a second one slowed LunarLander
    1.9x on 2 cores), the available cores for a CNN (Pong's learning 1.8x faster with 2),
    shared by the ranks on this machine and by the overlap's actor; a set value wins."""
    import torch

    from any_env_toys import image_env, parity_env
    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer, learner_threads
    fake_machine(cpus=8, path="/job", files=[("job/cpu.max", "600000 100000\n")])   # 6 cores
    small = [("vec.backend", "serial"), ("vec.num_envs", 2), ("train.horizon", 4),
             ("train.minibatch_size", 8)]
    before = torch.get_num_threads()
    try:
        for make, auto in ((image_env, 6), (parity_env, 1)):
            trainer = Trainer(load_config(make, overrides=small))
            try:
                assert trainer.config.train.torch_threads == 0      # recorded as auto
                assert trainer.torch_threads == auto == torch.get_num_threads()
                policy = trainer.policy
            finally:
                trainer.close()
        image = Trainer(load_config(image_env, overrides=small + [("train.torch_threads", 2)]))
        try:
            assert image.torch_threads == 2 == torch.get_num_threads()
            config = image.config
        finally:
            image.close()
    finally:
        torch.set_num_threads(before)
    config.train.torch_threads = 0
    assert learner_threads(config, policy) == 1                     # the MLP's policy
    cnn = image.policy
    assert learner_threads(config, cnn) == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert learner_threads(config, cnn) == 1                        # 6 cores, 4 ranks
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert learner_threads(config, cnn) == 3
    config.train.overlap = True
    assert learner_threads(config, cnn) == 1                        # and an actor each
    # --nproc N divides a set count among the ranks and keeps auto
    from peregrine.train import distributed
    ranked = load_config("cartpole", overrides=[("vec.num_envs", 64),
                                                ("train.minibatch_size", 64),
                                                ("train.torch_threads", 0)])
    assert dict(distributed.auto_ranks(ranked, 2)[1])["train.torch_threads"] == 0
    ranked.train.torch_threads = 4
    assert dict(distributed.auto_ranks(ranked, 2)[1])["train.torch_threads"] == 2
