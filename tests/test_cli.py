"""The command line: envs, bench, errors; and a light core import."""
import json
import re
import subprocess
import sys

import peregrine

PEREGRINE = [sys.executable, "-m", "peregrine.cli"]


def run(*args, timeout=120):
    return subprocess.run(PEREGRINE + list(args), capture_output=True, text=True, timeout=timeout)


def test_envs_lists_every_registered_env_with_spaces():
    result = run("envs", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == set(peregrine.list_envs())
    assert rows["cartpole"]["action_space"].startswith("Discrete(2")
    assert rows["cartpole"]["agents_per_env"] == 1
    assert rows["cartpole"]["bounds"]["max_steps"][2] is True        # an integer field
    text = run("envs", "cartpole")
    # each field with its default, its type and the bounds the env checks
    low, high, _ = rows["cartpole"]["bounds"]["max_steps"]
    shown = re.escape(f"int in [{low:g}, {high:g}]")
    assert re.search(rf"max_steps += 500 +{shown}", text.stdout), text.stdout


def test_bench_reports_env_and_agent_steps_per_second():
    result = run("bench", "cartpole", "--num-envs", "64", "--threads", "2", "--seconds", "0.2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["num_envs"] == 64 and report["num_threads"] == 2
    assert report["env_steps_per_sec"] > 0
    assert report["agent_steps_per_sec"] == report["env_steps_per_sec"] * report["agents_per_env"]


def test_bad_arguments_give_a_message_not_a_traceback():
    result = run("bench", "no_such_env", "--seconds", "0.1")
    assert result.returncode == 2
    assert "unknown env 'no_such_env'" in result.stderr and "Traceback" not in result.stderr
    result = run("bench", "cartpole", "--num-envs", "0", "--seconds", "0.1")
    assert result.returncode == 2 and "num_envs" in result.stderr
    assert run("no_such_command").returncode == 2


def test_core_import_is_light():
    code = ("import sys, peregrine; env = peregrine.make('cartpole', num_envs=2);"
            "heavy = [m for m in ('torch', 'rich', 'matplotlib', 'PIL') if m in sys.modules];"
            "print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_version_flag_prints_the_installed_version():
    from importlib import metadata
    result = subprocess.run([sys.executable, "-m", "peregrine", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"peregrine {metadata.version('peregrine-rl')}"


def test_train_without_torch_names_the_extra_to_install():
    """A missing optional dependency is a one-line instruction, not a traceback."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from peregrine.cli import main\n"
            "sys.exit(main(['train', 'cartpole', '--detach']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("peregrine train needs torch, which is not installed: "
                                     "pip install 'peregrine-rl[train]'")


def test_tensorboard_absent_is_a_notice_and_present_gets_the_config_as_text(tmp_path,
                                                                            monkeypatch,
                                                                            capsys):
    from peregrine.train.run_log import RunLogger
    monkeypatch.setenv("PEREGRINE_CACHE", str(tmp_path / "cache"))  # a machine that never saw it
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    logger = RunLogger(tmp_path / "a", (), tensorboard=True, dashboard=False,
                       config_toml="[train]\nseed = 1\n")
    logger.close("finished")
    assert "TensorBoard event files skipped: tensorboard is not installed" in \
        capsys.readouterr().err
    assert not (tmp_path / "a" / "tensorboard").exists()
    monkeypatch.undo()

    texts = []

    class Writer:      # stands in for SummaryWriter: what the logger hands to TensorBoard
        def __init__(self, directory, purge_step=None):
            self.directory = directory

        def add_text(self, tag, text, step):
            texts.append((tag, text, step))

        def close(self):
            pass

    import types
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    logger = RunLogger(tmp_path / "b", (), tensorboard=True, dashboard=False,
                       config_toml="[train]\nseed = 1\n")
    logger.close("finished")
    assert texts == [("hyperparameters", "```toml\n[train]\nseed = 1\n\n```", 0)]


# The public API as the README and the package docstrings name it: what users
# call and what a type checker reads through py.typed.
PUBLIC_FUNCTIONS = [
    ("peregrine", "make"), ("peregrine", "list_envs"), ("peregrine.envs.registry", "env_class"),
    ("peregrine.vector", "make"), ("peregrine.vector", "gymnasium_vector_env"),
    ("peregrine.vector", "sb3_vec_env"), ("peregrine.envs", "check_env"),
    ("peregrine.train", "train"), ("peregrine.train", "load_config"),
    ("peregrine.train", "load_actor"), ("peregrine.train.run", "load_run_config"),
    ("peregrine.train.checkpoint", "load_actor"), ("peregrine.train.checkpoint", "make_trained_env"),
    ("peregrine.train.checkpoint", "env_kwargs"), ("peregrine.envs.drone_swarm", "parallel_env"),
]

# ... and the classes those return, whose public methods users call.
PUBLIC_CLASSES = [
    ("peregrine.envs.native.batch", "NativeEnv"), ("peregrine.envs.gpu.batch", "DeviceEnv"),
    ("peregrine.vector", "Serial"), ("peregrine.vector", "Multiprocessing"),
    ("peregrine.vector", "GymnasiumEnv"), ("peregrine.vector", "GymnasiumVectorEnv"),
    ("peregrine.envs.drone_swarm.parallel", "DroneSwarmParallelEnv"),
    ("peregrine.train.checkpoint", "Actor"),
]


def test_public_functions_are_annotated_and_the_package_is_typed():
    import importlib
    import inspect
    from pathlib import Path
    callables = [(f"{module}.{name}", getattr(importlib.import_module(module), name))
                 for module, name in PUBLIC_FUNCTIONS]
    for module, name in PUBLIC_CLASSES:
        cls = getattr(importlib.import_module(module), name)
        callables += [(f"{module}.{name}.{attribute}", value)
                      for attribute, value in vars(cls).items()
                      if inspect.isfunction(value)
                      and (attribute == "__init__" or not attribute.startswith("_"))]
    unannotated = []
    for label, function in callables:
        signature = inspect.signature(function)
        if signature.return_annotation is inspect.Signature.empty:
            unannotated.append(f"{label} -> ?")
        unannotated += [f"{label}({p.name})" for p in signature.parameters.values()
                        if p.annotation is inspect.Parameter.empty
                        and p.name not in ("self", "cls")]
    assert unannotated == []
    assert (Path(peregrine.__file__).parent / "py.typed").is_file()


def test_version_is_written_once():
    """pyproject.toml reads the version from peregrine.__version__, so the installed
    metadata (what --version prints) and the package cannot disagree."""
    from importlib import metadata
    from pathlib import Path
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "peregrine.__version__"}
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["*"]
    assert metadata.version("peregrine-rl") == peregrine.__version__
