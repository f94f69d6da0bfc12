"""Determinism, exact resume, and checkpoints that refuse to load when damaged."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer
from peregrine.train.run import StopFlag, train

SMALL = [("vec.num_envs", 8), ("train.horizon", 16), ("train.minibatch_size", 64),
         ("train.update_epochs", 2), ("train.learning_rate", 3e-3), ("train.total_steps", 128 * 6),
         ("train.checkpoint_interval", 0), ("train.progress_interval", 1)]


def small_config(*extra):
    return load_config("cartpole", overrides=SMALL + list(extra))


def run_updates(trainer, count):
    return [trainer.update()["losses"] for _ in range(count)]


def train_until_solved(trainer, target=475.0):
    """Updates until the recent mean return reaches `target` or the budget ends; asserts
    it was reached and returns the last update's record."""
    while not trainer.done:
        record = trainer.update()
        if (record["recent_return"] or 0) >= target:
            break
    assert trainer.recent_return() >= target, trainer.recent_return()
    return record


def parameters(trainer):
    return [p.detach().clone() for p in trainer.policy.parameters()]


def assert_resume_is_exact(make_trainer, tmp_path):
    """Stop a run after 2 updates, save, load into a fresh trainer, run 3 more: the
    losses and parameters equal those of an uninterrupted 5-update run. Returns
    (uninterrupted, resumed), both open."""
    uninterrupted = make_trainer()
    expected = run_updates(uninterrupted, 5)
    first = make_trainer()
    got = run_updates(first, 2)
    path = tmp_path / "ckpt.pt"
    checkpoint.save(path, first.state_dict())
    first.close()
    resumed = make_trainer()
    resumed.load_state_dict(checkpoint.load(path))
    assert resumed.updates == 2
    got += run_updates(resumed, 3)
    assert got == expected
    for a, b in zip(parameters(resumed), parameters(uninterrupted)):
        assert torch.equal(a, b)
    return uninterrupted, resumed


@pytest.mark.parametrize("lstm", [False, True])
def test_same_seed_gives_identical_losses(lstm):
    extra = [("policy.lstm", lstm), ("policy.bptt_horizon", 8)]
    first, second = Trainer(small_config(*extra)), Trainer(small_config(*extra))
    assert run_updates(first, 3) == run_updates(second, 3)
    for a, b in zip(parameters(first), parameters(second)):
        assert torch.equal(a, b)
    other = Trainer(small_config(("train.seed", 2), *extra))
    assert run_updates(other, 1) != run_updates(Trainer(small_config(*extra)), 1)
    for trainer in (first, second, other):
        trainer.close()


@pytest.mark.parametrize("lstm, normalize", [(False, False), (True, False), (False, True)])
def test_resume_continues_exactly(tmp_path, lstm, normalize):
    """Stop after 2 updates, save, load into a fresh trainer, run 3 more: the losses
    and parameters (and, with normalisation on, the running statistics) equal those
    of an uninterrupted 5-update run."""
    extra = [("policy.lstm", lstm), ("policy.bptt_horizon", 8),
             ("train.normalize_obs", normalize), ("train.normalize_reward", normalize)]
    uninterrupted, resumed = assert_resume_is_exact(lambda: Trainer(small_config(*extra)),
                                                    tmp_path)
    assert resumed.global_step == 5 * 128
    if normalize:
        for name in ("obs_norm", "reward_scaler"):
            mine = getattr(resumed.pipeline, name).stats
            theirs = getattr(uninterrupted.pipeline, name).stats
            # 5 updates x 128 steps, plus the 8 rows' reset observations for the observations
            assert mine.count == theirs.count == 128 * 5 + (8 if name == "obs_norm" else 0)
            assert np.array_equal(mine.mean, theirs.mean) and np.array_equal(mine.var, theirs.var)
        assert np.array_equal(resumed.pipeline.reward_scaler.returns,
                              uninterrupted.pipeline.reward_scaler.returns)
    uninterrupted.close()
    resumed.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_run_stopped_like_ctrl_c_resumes_to_the_same_result(tmp_path, overlap):
    """The run loop: a stop request (what Ctrl-C sets) after 2 updates, then --resume,
    ends with the same checkpoint as a run that was never stopped (with train.overlap
    too: the actor's pending rollout and state are in the checkpoint)."""
    config = small_config(("train.overlap", overlap))
    full = train(config, tmp_path / "full")
    stop = StopFlag()

    def progress(record):
        if record["updates"] == 2:
            stop.requested = True

    partial = train(config, tmp_path / "partial", progress=progress, stop=stop)
    assert partial["status"] == "interrupted" and partial["updates"] == 2
    resumed = train(config, tmp_path / "partial", resume=True)
    assert resumed["status"] == "finished" and resumed["updates"] == full["updates"] == 6
    a = checkpoint.load(full["checkpoint"])["policy"]
    b = checkpoint.load(resumed["checkpoint"])["policy"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = [json.loads(line) for line in (tmp_path / "partial" / "metrics.jsonl").open()]
    assert [x.get("status") for x in lines if "status" in x] == ["interrupted", "finished"]
    assert [x["updates"] for x in lines if "updates" in x] == [1, 2, 3, 4, 5, 6]


def test_resume_cuts_the_logs_back_to_the_checkpoint(tmp_path, monkeypatch):
    """As after a crash: records of updates past the checkpoint and a torn last line
    in metrics.jsonl are dropped on resume; TensorBoard is told to purge those steps."""
    import types
    created = []

    class SummaryWriter:   # stands in for torch.utils.tensorboard's: records how it was made
        def __init__(self, log_dir, purge_step=None):
            created.append(purge_step)

        def add_scalar(self, *args):
            pass

        def close(self):
            pass

    monkeypatch.setitem(__import__("sys").modules, "torch.utils.tensorboard",
                        types.SimpleNamespace(SummaryWriter=SummaryWriter))
    config = small_config()
    stop = StopFlag()

    def progress(record):
        stop.requested = record["updates"] == 2

    train(config, tmp_path, progress=progress, stop=stop)
    metrics = tmp_path / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    assert [json.loads(x).get("updates") for x in lines] == [1, 2, None]  # None: status
    with metrics.open("a") as handle:   # two updates logged, then killed mid-line
        for updates in (3, 4):
            handle.write(json.dumps({"global_step": 128 * updates, "updates": updates}) + "\n")
        handle.write('{"global_step": 640, "upd')
    train(config, tmp_path, resume=True)
    records = [json.loads(line) for line in metrics.open()]
    assert [x["updates"] for x in records if "updates" in x] == [1, 2, 3, 4, 5, 6]
    assert [x["status"] for x in records if "status" in x] == ["interrupted", "finished"]
    assert created == [None, 2 * 128 + 1]


def test_cut_jsonl_keeps_records_up_to_the_update(tmp_path):
    from peregrine.train.run_log import cut_jsonl
    path = tmp_path / "metrics.jsonl"
    lines = ['{"updates": 1}\n', "not json\n", '{"updates": 2}\n', '{"status": "crashed"}\n',
             '{"updates": 3}\n', '{"status": "finished"}\n']
    path.write_text("".join(lines))
    assert cut_jsonl(path, 3) == 0
    assert cut_jsonl(path, 2) == len(lines[4]) + len(lines[5])
    assert path.read_text() == "".join(lines[:4])
    assert cut_jsonl(path, 0) == len("".join(lines[:4]))
    assert path.read_text() == ""
    assert cut_jsonl(tmp_path / "missing.jsonl", 1) == 0


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "latest.pt"
    trainer = Trainer(small_config())
    trainer.update()
    checkpoint.save(path, trainer.state_dict())
    trainer.close()
    return path


def test_load_actor_gives_deterministic_actions(saved_checkpoint):
    import peregrine
    env = peregrine.make("cartpole", num_envs=5, seed=0)
    actor = checkpoint.load_actor(saved_checkpoint, env)
    observations, _ = env.reset(seed=3)
    first = actor(observations)
    assert first.dtype == np.int32 and first.shape == (5,)
    np.testing.assert_array_equal(actor(observations), first)
    env.step(first)  # the env accepts them as they are
    env.close()


def test_load_actor_accepts_a_run_directory(tmp_path):
    summary = train(small_config(("train.total_steps", 128)), tmp_path / "run")
    import peregrine
    env = peregrine.make("cartpole", num_envs=2, seed=0)
    actor = checkpoint.load_actor(tmp_path / "run", env)
    assert actor(env.observations).shape == (2,)
    assert summary["checkpoint"].endswith("latest.pt")
    env.close()


def corrupt_copies(source, tmp_path):
    data = source.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    flipped[len(data) - 100] ^= 0xFF
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(bytes(flipped))
    foreign = tmp_path / "foreign.pt"
    torch.save({"policy": {}}, foreign)
    header_only = tmp_path / "header.pt"
    header_only.write_bytes(data[:20])
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    return {"truncated": truncated, "corrupt": corrupt, "foreign": foreign,
            "header": header_only, "empty": empty}


@pytest.mark.parametrize("kind, message", [
    ("truncated", "truncated"), ("corrupt", "checksum"), ("foreign", "not a Peregrine checkpoint"),
    ("header", "truncated"), ("empty", "is empty")])
def test_damaged_checkpoint_gives_clear_error(saved_checkpoint, tmp_path, kind, message):
    import peregrine
    env = peregrine.make("cartpole", num_envs=2, seed=0)
    path = corrupt_copies(saved_checkpoint, tmp_path)[kind]
    with pytest.raises(ValueError, match=message):
        checkpoint.load_actor(path, env)
    env.close()


def test_missing_checkpoint_and_wrong_env(saved_checkpoint, tmp_path):
    from test_train_bootstrap import CounterEnv
    with pytest.raises(ValueError, match="does not exist"):
        checkpoint.load_actor(tmp_path / "nope.pt", CounterEnv())
    (tmp_path / "runs").mkdir()     # a folder without one: named as such, not as a path
    with pytest.raises(ValueError, match=r"'.*runs' holds no checkpoint \(neither"):
        checkpoint.load_actor(tmp_path / "runs", CounterEnv())
    with pytest.raises(ValueError, match="trained on 'cartpole'"):
        checkpoint.load_actor(saved_checkpoint, CounterEnv())


def test_resume_refuses_a_different_row_count(saved_checkpoint):
    trainer = Trainer(small_config(("vec.num_envs", 4)))
    with pytest.raises(ValueError, match="num_envs"):
        trainer.load_state_dict(checkpoint.load(saved_checkpoint))
    trainer.close()


def test_checkpoint_write_is_atomic(saved_checkpoint, tmp_path, monkeypatch):
    """A failure during the write leaves the previous file intact and no temp files."""
    target = tmp_path / "latest.pt"
    target.write_bytes(saved_checkpoint.read_bytes())

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, "fsync", boom)
    with pytest.raises(OSError):
        checkpoint.save(target, {"x": torch.zeros(3)})
    assert target.read_bytes() == saved_checkpoint.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


def test_resume_is_exact_through_a_vector_backend(tmp_path):
    """Through peregrine.vector (serial backend, 2 blocks) resume is exact as well."""
    pytest.importorskip("peregrine.vector")
    extra = [("vec.backend", "serial"), ("vec.num_workers", 2)]
    uninterrupted = Trainer(small_config(*extra))
    expected = run_updates(uninterrupted, 4)
    first = Trainer(small_config(*extra))
    assert first.exact_resume
    got = run_updates(first, 2)
    checkpoint.save(tmp_path / "c.pt", first.state_dict())
    first.close()
    resumed = Trainer(small_config(*extra))
    resumed.load_state_dict(checkpoint.load(tmp_path / "c.pt"))
    got += run_updates(resumed, 2)
    assert got == expected
    uninterrupted.close()
    resumed.close()


def test_loading_a_state_leaves_the_callers_dict_untouched():
    """Trainer.load_state_dict copies the optimizer's moments: a second trainer that
    loads one in-memory state and trains on does not move the state's tensors (torch's
    Optimizer.load_state_dict alone keeps them when device and dtype fit)."""
    first = Trainer(small_config())
    second = Trainer(small_config())
    try:
        run_updates(first, 2)
        state = first.state_dict()
        moments = {key: value.clone() for key, value in
                   state["optimizer"]["state"][0].items() if torch.is_tensor(value)}
        assert moments
        second.load_state_dict(state)
        run_updates(second, 2)
        for key, value in moments.items():
            assert torch.equal(state["optimizer"]["state"][0][key], value), key
    finally:
        first.close()
        second.close()
