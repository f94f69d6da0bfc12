"""The files in benchmarks/configs that README and RESULTS run: each is either a training
config (`peregrine train --config FILE`) or a sweep's file (`peregrine sweep FILE`, the
ones with a [sweep] table), and each loads as what it is."""
from __future__ import annotations

from pathlib import Path

import pytest

from peregrine.train.config import load_config, read_toml
from peregrine.vector.sources import kind_of

FILES = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "configs").glob("*.toml"))
SWEEPS = [path for path in FILES if "sweep" in read_toml(path)]
TRAINING = [path for path in FILES if path not in SWEEPS]


def test_both_kinds_are_shipped():
    assert SWEEPS and TRAINING


@pytest.mark.parametrize("path", TRAINING, ids=lambda path: path.name)
def test_every_training_config_loads_for_its_env(path):
    """Env name, sections and values resolve, without making the env (its packages may
    be absent)."""
    config = load_config(config_file=path)
    assert config.env_name and config.train.total_steps > 0
    if path.name == "pong-vector.toml":
        assert kind_of(config.env_name) == "gymnasium_vector"
        assert config.env_kwargs == {"num_threads": 2, "repeat_action_probability": 0.0}
        # a vector env brings its own parallelism: stepped in the trainer's process
        assert (config.vec.backend, config.vec.num_workers) == ("serial", 1)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda path: path.name)
def test_every_sweep_file_loads_and_is_refused_as_a_training_config(path, tmp_path):
    """load_sweep's checks pass (every bound and enqueued trial through the config's own),
    a trial's config holds the file's fixed values, and `train --config` names the right
    command instead of training it."""
    pytest.importorskip("optuna")
    from peregrine.sweep import load_sweep
    sweep = load_sweep(path, directory=tmp_path)
    assert sweep.params and sweep.seeds
    config = sweep.trial_config(sweep.enqueue[0] if sweep.enqueue else {}, sweep.seeds[0])
    assert config.env_name == sweep.env and config.train.seed == sweep.seeds[0]
    resolved = config.to_dict()
    for section, values in sweep.fixed.items():
        for key, value in values.items():
            assert resolved[section][key] == value
    with pytest.raises(ValueError, match=r"a sweep's file, run it with `peregrine sweep FILE`"):
        load_config(env_name=sweep.env, config_file=path)
