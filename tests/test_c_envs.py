"""Your own C env: the SDK, envs built at run time (load), plugins found by entry point,
and the `peregrine new-env` scaffold installed, checked, trained and GPU-checked."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import peregrine
from peregrine.envs import registry, sdk
from peregrine.envs.check import check_env
from peregrine.envs.gpu.compiler import header_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of this test's own; the envs it loads are forgotten afterwards, so that
    later tests see only the built-in envs."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("PEREGRINE_CACHE", str(folder))
    before = set(registry.ENVS)
    yield folder / "native"
    for name in set(registry.ENVS) - before:
        registry.unload(name)


def test_unload_forgets_a_loaded_env_only(cache, cartpole_copy):
    registry.load(cartpole_copy, name="my_cartpole")
    registry.unload("my_cartpole")
    assert "my_cartpole" not in registry.ENVS
    with pytest.raises(ValueError, match="unknown env"):
        peregrine.make("my_cartpole")
    with pytest.raises(ValueError, match="was not loaded"):
        registry.unload("cartpole")


@pytest.fixture
def cartpole_copy(tmp_path):
    path = tmp_path / "src" / "my_cartpole.h"
    path.parent.mkdir()
    path.write_text(header_path("cartpole").read_text())
    return path


def test_the_sdk_headers_ship_with_the_package():
    include = Path(peregrine.get_include())
    for header in ("pg_env.h", "pg_math.h", "pg_gpu.h", "binding.h"):
        assert (include / header).is_file()


def test_load_builds_caches_and_rebuilds_on_edit(cache, cartpole_copy):
    start = time.perf_counter()
    cls = registry.load(cartpole_copy, name="my_cartpole")
    first = time.perf_counter() - start
    built = list(cache.glob("my_cartpole-*/*.so"))
    assert len(built) == 1
    env, ours = peregrine.make("my_cartpole", num_envs=8, seed=5), peregrine.make(
        "cartpole", num_envs=8, seed=5)
    actions = np.ones(8, np.int32)
    for _ in range(50):      # the same header: the same episodes as the built-in
        np.testing.assert_array_equal(env.step(actions)[0], ours.step(actions)[0])
    env.close()
    ours.close()
    modified = built[0].stat().st_mtime_ns
    start = time.perf_counter()
    assert registry.load(cartpole_copy, name="my_cartpole") is cls     # served by the cache
    second = time.perf_counter() - start
    assert built[0].stat().st_mtime_ns == modified and second < first / 10, (first, second)
    # an edit (the force doubled) is a new build with the new rule
    cartpole_copy.write_text(cartpole_copy.read_text().replace("X(force_mag, 10.0,",
                                                               "X(force_mag, 20.0,"))
    edited = registry.load(cartpole_copy, name="my_cartpole")
    assert edited is not cls and len(list(cache.glob("my_cartpole-*/*.so"))) == 2
    assert peregrine.make("my_cartpole").config["force_mag"] == 20.0


def test_a_loaded_env_meets_the_contract_and_crosses_processes(cache, cartpole_copy):
    registry.load(cartpole_copy, name="my_cartpole")
    check_env("my_cartpole")
    import peregrine.vector as pv
    with pv.make("my_cartpole", backend="multiprocessing", num_envs=4, num_workers=2, overwork=True,
                 seed=1) as env, pv.make("cartpole", backend="serial", num_envs=4,
                                         num_workers=2, seed=1) as ours:
        np.testing.assert_array_equal(env.reset(seed=1)[0], ours.reset(seed=1)[0])


def test_a_syntax_error_comes_back_as_file_and_line(cache, cartpole_copy):
    lines = cartpole_copy.read_text().splitlines()
    broken = next(i for i, line in enumerate(lines)
                  if "env->gravity = (float)config[CFG_gravity];" in line)
    lines[broken] = lines[broken].replace(";", "")         # a missing semicolon
    cartpole_copy.write_text("\n".join(lines) + "\n")
    with pytest.raises(sdk.NativeBuildError) as caught:
        registry.load(cartpole_copy, name="my_cartpole")
    message = str(caught.value)
    assert message.startswith(f"{cartpole_copy}:{broken + 2}:") or \
        message.startswith(f"{cartpole_copy}:{broken + 1}:"), message
    assert "error" in message and "Traceback" not in message


@pytest.mark.parametrize("change, missing", [
    (lambda text: text.replace("env_step", "env_advance"), "env_step"),
    (lambda text: "", "ENV_CONFIG, ENV_STATS, Env"),
])
def test_a_header_missing_part_of_the_contract_says_which(cache, cartpole_copy, change, missing):
    """A header without env_step used to build and then fail at import ("undefined
    symbol: env_step"); an empty one gave only the binding's own errors."""
    cartpole_copy.write_text(change(cartpole_copy.read_text()))
    with pytest.raises(sdk.NativeBuildError) as caught:
        registry.load(cartpole_copy, name="my_cartpole")
    assert str(caught.value).startswith(f"{cartpole_copy} does not define {missing}")
    assert "see pg_env.h" in str(caught.value)


def test_the_contract_names_come_from_pg_env_h():
    """sdk.CONTRACT is read from pg_env.h's own list, in its order."""
    assert sdk.CONTRACT == ("ENV_CONFIG", "ENV_STATS", "Env", "env_init", "env_free",
                            "env_reset", "env_step", "env_state_size", "env_get_state",
                            "env_set_state")


@pytest.mark.parametrize("change, message", [
    # writes 4 floats a row into rows of 3: it overran the NumPy buffer (a crash, or
    # silently corrupted memory) before check_env could say anything
    (("pg->obs_dim = 4;", "pg->obs_dim = 3;"), "wrote past the end of the observations buffer"),
    (("pg->obs_dim = 4;", "pg->obs_dim = 5;"), "reset left observations unwritten"),
    (("memcpy(final_obs + 4 * (size_t)i, obs + 4 * (size_t)i, 4 * sizeof(float));",
      "(void)final_obs;"),         # (used: CI builds with -Werror)
     "a row that ended must have its final observation written"),
])
def test_check_env_catches_rows_written_wrong(cache, cartpole_copy, change, message):
    """Mistakes nothing caught before: training ran on garbage (or crashed) silently."""
    from peregrine.envs import check_env
    from peregrine.envs.check import EnvContractError
    text = cartpole_copy.read_text()
    assert change[0] in text
    cartpole_copy.write_text(text.replace(change[0], change[1]))
    registry.load(cartpole_copy, name="my_cartpole")
    with pytest.raises(EnvContractError, match=message):
        check_env("my_cartpole")


@pytest.mark.parametrize("change, error, message", [
    # a kind past the binding's tables was read out of bounds ("element format 'f'")
    (("pg->action_kind = PG_ACTION_DISCRETE;", "pg->action_kind = 3;"), RuntimeError,
     r"env_init set pg.action_kind \(a PG_ACTION_\* value\) to 3"),
    (("pg->action_nvec[0] = 2;", "pg->action_nvec[0] = 0;"), RuntimeError,
     r"env_init set pg.action_nvec\[i\] \(choices, >= 1\) to 0"),
    (("pg->agents_per_env = 1;", "pg->agents_per_env = 0;"), RuntimeError,
     r"env_init set pg.agents_per_env \(>= 1\) to 0"),
    (("PgBatch *pg = &env->pg;\n    pg->obs_dim = 4;", "PgBatch *pg = &env->pg;\n    "
      "if (env) return -1;\n    pg->obs_dim = 4;"), ValueError,
     "env_init returned -1 without a message"),
])
def test_what_env_init_sets_wrong_is_named(cache, cartpole_copy, change, error, message):
    """It was "env_init produced invalid dimensions" or "invalid config", whichever
    field it was."""
    text = cartpole_copy.read_text()
    assert change[0] in text
    cartpole_copy.write_text(text.replace(change[0], change[1]))
    registry.load(cartpole_copy, name="my_cartpole")
    with pytest.raises(error, match=message):
        peregrine.make("my_cartpole")


def test_no_c_compiler_is_one_line(cache, cartpole_copy, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(sdk.sysconfig, "get_config_var", lambda name: None)
    with pytest.raises(sdk.NativeBuildError, match="no C compiler found") as caught:
        registry.load(cartpole_copy, name="my_cartpole")
    assert "\n" not in str(caught.value)


def test_names_that_clash_are_refused(monkeypatch, cartpole_copy, cache):
    with pytest.raises(ValueError, match="already taken by 'built-in'"):
        registry.load(cartpole_copy, name="cartpole")

    class Point:
        name, value, group, dist = "cartpole", "somewhere:Else", "peregrine.envs", None
    monkeypatch.setattr(registry, "_entry_points", lambda: [Point()])
    registry.ENVS.refresh()
    try:
        with pytest.raises(ValueError, match="env name clash: 'cartpole'"):
            registry.env_class("pendulum")
    finally:
        monkeypatch.undo()
        registry.ENVS.refresh()
    assert "cartpole" in registry.ENVS


def test_the_builtin_envs_are_one_table_and_their_folders():
    """setup.py builds every envs/NAME/NAME.h through the SDK's extension helper and
    holds no list of envs; the registry's one table names each of them."""
    setup = (ROOT / "setup.py").read_text()
    assert 'sdk["extension"]' in setup and "cartpole" not in setup
    folders = sorted(p.parent.name for p in (ROOT / "src/peregrine/envs").glob("*/*.h")
                     if p.stem == p.parent.name)
    assert folders == sorted(registry.BUILT_IN)


# ---- the scaffold, installed as a plugin ------------------------------------------------

def _run(*command, cwd, timeout=600, check=True):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, env=env)
    if check:
        assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


@pytest.mark.slow
@pytest.mark.parametrize("multi_agent", [False, True], ids=["single", "multi"])
def test_the_scaffold_installs_as_a_plugin_checks_and_trains(tmp_path, multi_agent):
    name = "scaffold_multi" if multi_agent else "scaffold_single"
    python = sys.executable
    _run(python, "-m", "peregrine.cli", "new-env", name, "--dir", str(tmp_path),
         *(["--multi-agent"] if multi_agent else []), cwd=tmp_path)
    package = tmp_path / name
    _run(python, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
         "--no-index", str(package), cwd=tmp_path)
    try:
        listed = _run(python, "-m", "peregrine.cli", "envs", "--json", cwd=tmp_path)
        assert name in [row["name"] for row in json.loads(listed.stdout)]
        # its own tests: check_env and bit-for-bit parity with its NumPy reference
        _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests"),
             cwd=tmp_path)
        # Gymnasium's id of a plugin env (a multi-agent env is a vector env: a row per agent)
        make = "make_vec" if multi_agent else "make"
        _run(python, "-c", f"import gymnasium, peregrine; gymnasium.{make}('peregrine/{name}')",
             cwd=tmp_path)
        if shutil.which("readelf") and _has_nvrtc():
            checked = _run(python, "-m", "peregrine.cli", "envs", name, "--gpu-check",
                           cwd=tmp_path)
            assert "every pointer mirrored" in checked.stdout
        run = tmp_path / "run"
        # the shipped config, shortened (the multi-agent one trains for 2M steps)
        budget = ["--total-steps", "60000", "--vec.num-envs", "16", "--train.minibatch-size",
                  "768", "--train.learning-rate", "1e-3"] if multi_agent else [
            "--total-steps", "40000"]
        _run(python, "-m", "peregrine.cli", "train", name, "--detach", "--run-dir", str(run),
             *budget, "--train.tensorboard", "false", cwd=tmp_path)
        returns = [json.loads(line)["episode_return"] for line in
                   (run / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line).get("episode_return") is not None]
        assert np.mean(returns[-3:]) > np.mean(returns[:3]), returns
        evaluated = json.loads(_run(python, "-m", "peregrine.cli", "eval", "--policy",
                                    str(run), "--episodes", "8", "--json", cwd=tmp_path).stdout)
        assert evaluated["env"] == name
        if multi_agent:     # the PettingZoo view, checked by PettingZoo's own API test
            _run(python, "-c", "from pettingzoo.test import parallel_api_test; "
                 "from peregrine.envs.registry import parallel_env; "
                 f"parallel_api_test(parallel_env({name!r}, max_cycles=50), num_cycles=100)",
                 cwd=tmp_path)
        if multi_agent:     # the multi-agent template ships a renderer
            out = tmp_path / "episode.gif"
            _run(python, "-m", "peregrine.cli", "render", "--policy", str(run), "--out",
                 str(out), cwd=tmp_path)
            from PIL import Image
            with Image.open(out) as gif:
                assert gif.n_frames >= 2
    finally:
        _run(python, "-m", "pip", "uninstall", "--quiet", "-y", name, cwd=tmp_path,
             check=False)


def _has_nvrtc() -> bool:
    try:
        from peregrine.envs.gpu import compiler
        compiler.nvrtc_version()
        return True
    except (ImportError, RuntimeError, OSError):
        return False


def test_a_loaded_envs_renderer_reaches_the_gymnasium_export(cache, cartpole_copy):
    """A plugin or loaded env draws with its class's `renderer`, not only the built-ins'."""
    import gymnasium
    registry.load(cartpole_copy, name="my_cartpole", renderer="peregrine.envs.cartpole.render")
    env = gymnasium.make_vec("peregrine/my_cartpole", num_envs=2, render_mode="rgb_array")
    env.reset(seed=0)
    assert env.metadata["render_fps"] == 50 and len(env.render()) == 2
    env.close()


def test_headers_read_config_fields_by_name():
    """Every built-in header and the scaffold's templates read a config field as
    config[CFG_<name>] (or through a table of CFG_ names), never by position."""
    sources = sorted((ROOT / "src/peregrine/envs").glob("*/*.h"))
    sources += sorted((ROOT / "src/peregrine/cli/templates").glob("*.h.tmpl"))
    checked = 0
    for source in sources:
        text = source.read_text()
        if "#define ENV_CONFIG(X)" not in text:
            continue
        assert "enum { ENV_CONFIG(PG_CONFIG_INDEX)" in text, source
        # env_init and its helpers take the config as `const double *NAME, char *err`
        for name in set(re.findall(r"const double \*(\w+), char \*err", text)):
            for index in re.findall(rf"\b{name}\[(\w+\[\w+\]|[^\]]*)\]", text):
                assert re.fullmatch(r"CFG_\w+|\w+\[\w+\]", index), (source, name, index)
                checked += 1
    assert checked >= 100   # the six built-in envs' reads at least


def test_an_env_whose_extension_is_not_built_says_how_to_build_it():
    """A source checkout used before its build: the env package's import of its own
    compiled module fails, and the error says to build it (not only "circular import")."""
    from peregrine.envs.registry import _unbuilt_hint
    unbuilt = ImportError("cannot import name '_cartpole' from partially initialized module "
                          "'peregrine.envs.cartpole' (most likely due to a circular import)")
    assert "C extension is not built" in _unbuilt_hint(unbuilt)
    gone = ModuleNotFoundError("No module named 'my_env._my_env'", name="my_env._my_env")
    assert "pip install -e ." in _unbuilt_hint(gone)
    assert _unbuilt_hint(ModuleNotFoundError("No module named 'numpy'", name="numpy")) == ""
    assert _unbuilt_hint(AttributeError("module has no attribute 'CartPole'")) == ""


def test_a_header_that_is_not_utf8_text_is_a_build_error(cache, tmp_path):
    from peregrine.envs import NativeBuildError, load
    header = tmp_path / "binary_env.h"
    header.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(NativeBuildError, match="binary_env.h:1"):
        load(header)
