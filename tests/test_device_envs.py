"""Device batches (peregrine.make(..., device=...)) and the GPU build of the headers.

Without a GPU the suite still covers: every header compiled for the GPU by NVRTC
(to PTX, when the `cuda` extra is installed), `peregrine envs --gpu-check`, the
device batch's contract on device="cpu" (same class, the CPU build stepping the
tensors' memory) bit for bit against the NumPy batch, and the clear error for
device="cuda" where there is none. With a GPU, the same seed and actions must give
bit-identical results on the GPU and the CPU for every env.
"""
import importlib.util
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import peregrine
from peregrine.envs.gpu import compiler as gpu

ENVS = peregrine.list_envs()
HAVE_NVRTC = importlib.util.find_spec("cuda") is not None and \
    importlib.util.find_spec("cuda.bindings") is not None
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="NVRTC not installed (the cuda extra: "
                                                        "pip install 'peregrine-rl[cuda]')")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
SHORT = {"max_steps": 17}   # forces truncations (and, with random actions, terminals)


def random_actions(env, steps, seed):
    """`steps` action batches as NumPy arrays in the env's action dtype."""
    rng = np.random.default_rng(seed)
    space = env.single_action_space
    batches = []
    for _ in range(steps):
        if hasattr(space, "n"):
            batches.append(rng.integers(0, space.n, env.num_agents).astype(np.int32))
        else:
            batches.append(rng.uniform(-1.5, 1.5, (env.num_agents, *space.shape))
                           .astype(np.float32))
    return batches


def trace_numpy(env, batches):
    rows = []
    for actions in batches:
        obs, rewards, terminals, truncations, _ = env.step(actions)
        rows.append([a.copy() for a in (obs, rewards, terminals, truncations,
                                        env.final_observations)])
    return rows


def trace_device(env, batches):
    rows = []
    for actions in batches:
        obs, rewards, terminals, truncations, _ = env.step(
            torch.from_numpy(actions).to(env.device))
        rows.append([t.cpu().numpy().copy() for t in (obs, rewards, terminals, truncations,
                                                     env.final_observations)])
    return rows


def assert_same(trace_a, trace_b):
    assert len(trace_a) == len(trace_b)
    for step, (a, b) in enumerate(zip(trace_a, trace_b)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=f"step {step}")


# ---- the GPU build, checked without a GPU ------------------------------------------

@needs_nvrtc
@pytest.mark.parametrize("name", ENVS)
def test_every_header_compiles_for_the_gpu(name):
    ptx = gpu.compile_env(name, "ptx")
    text = ptx.decode(errors="replace")
    assert ".entry pg_step" in text and ".entry pg_reset" in text
    # NVRTC writes into the buffers it is handed: never into a shared bytes object
    # (an empty log once overwrote the interpreter's cached b" ", breaking torch.load).
    assert (b" " * 1)[0] == 32


@needs_nvrtc
def test_gpu_check_cli_passes_and_names_a_broken_header(tmp_path, monkeypatch):
    result = subprocess.run([sys.executable, "-m", "peregrine", "envs", "--gpu-check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in ENVS:
        assert f"{name}: compiles for the GPU" in result.stdout
    # A C-only construct NVRTC rejects (a compound literal of an array type) in a
    # copy of the tree: the check fails and names the env and NVRTC's message.
    tree = tmp_path / "envs"
    shutil.copytree(gpu.ENVS_DIR, tree, ignore=shutil.ignore_patterns("*.so", "*.py"))
    header = tree / "cartpole" / "cartpole.h"
    source = header.read_text()
    marker = "PG_DEVICE static void env_reset(Env *env, int start, int end) {"
    assert marker in source
    header.write_text(source.replace(
        marker, marker + "\n    int *unused = undeclared_in_c_or_cuda; (void)unused;"))
    monkeypatch.setattr(gpu, "ENVS_DIR", tree)
    monkeypatch.setattr(gpu, "NATIVE_DIR", tree / "native")
    results = gpu.check_all(["cartpole", "pendulum"])
    assert results["pendulum"] is None
    assert "cartpole" in results["cartpole"] and "undeclared_in_c_or_cuda" in results["cartpole"]
    from peregrine.cli import envs as cli
    assert cli.gpu_check(["cartpole"]) == 1


@needs_nvrtc
def test_compiled_code_is_cached_per_header_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("PEREGRINE_CACHE", str(tmp_path))
    calls = []
    real = gpu.compile_env
    monkeypatch.setattr(gpu, "compile_env", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = gpu.cached_cubin("cartpole", "sm_90")
    second = gpu.cached_cubin("cartpole", "sm_90")
    assert first == second and len(calls) == 1
    assert len(list(tmp_path.glob("cartpole-sm_90-*.cubin"))) == 1


def test_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*device='cpu'"):
        peregrine.make("cartpole", num_envs=4, device="cuda")
    with pytest.raises(ValueError, match="device must be"):
        peregrine.make("cartpole", num_envs=4, device="tpu")


# ---- the device batch's contract, on device="cpu" -------------------------------------

@pytest.mark.parametrize("name", ENVS)
def test_cpu_device_batch_is_bit_identical_to_the_numpy_batch(name):
    reference = peregrine.make(name, num_envs=29, seed=5, num_threads=2, **SHORT)
    device = peregrine.make(name, num_envs=29, seed=5, device="cpu", **SHORT)
    batches = random_actions(reference, 60, seed=1)
    assert_same(trace_numpy(reference, batches), trace_device(device, batches))
    expected = reference.instance_stats()
    episodes, sums = device.instance_stats()
    np.testing.assert_array_equal(expected[0], episodes.numpy())
    np.testing.assert_array_equal(expected[1], sums.numpy())
    assert expected[0].sum() > 0          # episodes did end (truncations at 17 steps)
    # reseeding restarts the same streams on both
    reference.reset(seed=9)
    device.reset(seed=9)
    assert_same(trace_numpy(reference, batches[:20]), trace_device(device, batches[:20]))
    assert reference.episode_stats().count == device.episode_stats().count
    reference.close()
    device.close()


def test_device_batch_buffers_are_tensors_updated_in_place():
    env = peregrine.make("drone_swarm", num_envs=3, seed=0, device="cpu")
    assert isinstance(env.observations, torch.Tensor)
    assert env.observations.shape == (3 * env.agents_per_env, env.obs_dim)
    assert env.masks.dtype == torch.bool and bool(env.masks.all())
    before = env.observations.data_ptr()
    observations, rewards, *_ = env.step(torch.zeros(env.num_agents, 3))
    assert observations is env.observations and rewards is env.rewards
    assert env.observations.data_ptr() == before
    env.close()


def test_bad_action_tensors_are_refused_on_the_host():
    env = peregrine.make("cartpole", num_envs=4, seed=0, device="cpu")
    for bad, what in [(np.zeros(4, np.int32), "ndarray"),
                      (torch.zeros(4, dtype=torch.int64), "dtype torch.int64"),
                      (torch.zeros(5, dtype=torch.int32), r"shape \(5,\)"),
                      (torch.zeros(4, 1, dtype=torch.int32), r"shape \(4, 1\)")]:
        with pytest.raises(ValueError, match=f"actions must be a torch tensor on cpu.*{what}"):
            env.step(bad)
    env.close()


def test_bad_action_values_are_repaired_counted_and_reported_by_check():
    discrete = peregrine.make("cartpole", num_envs=4, seed=0, device="cpu")
    twin = peregrine.make("cartpole", num_envs=4, seed=0)
    discrete.step(torch.tensor([1, 7, -3, 0], dtype=torch.int32))
    twin.step(np.array([1, 0, 0, 0], np.int32))          # the documented repair: 0
    np.testing.assert_array_equal(discrete.observations.numpy(), twin.observations)
    with pytest.raises(ValueError, match="2 out-of-range discrete action"):
        discrete.check()
    discrete.check()                                       # cleared after the report
    continuous = peregrine.make("pendulum", num_envs=3, seed=0, device="cpu")
    continuous.step(torch.tensor([[float("nan")], [float("inf")], [0.5]]))
    with pytest.raises(ValueError, match="2 non-finite continuous"):
        continuous.check()
    for env in (discrete, twin, continuous):
        env.close()


def test_state_round_trip_and_seed_streams():
    env = peregrine.make("prospector", num_envs=5, seed=2, device="cpu")
    twin = peregrine.make("prospector", num_envs=5, seed=2)
    batches = random_actions(twin, 30, seed=4)
    trace_device(env, batches)
    trace_numpy(twin, batches)
    state = env.get_state(3)
    np.testing.assert_array_equal(state, twin.get_state(3))
    env.set_state(1, state)
    np.testing.assert_array_equal(env.get_state(1), state)
    np.testing.assert_array_equal(env.observations[1].numpy(), env.observations[3].numpy())
    env.seed_streams(11)
    twin.set_state(1, state)
    twin.seed_streams(11)
    assert_same(trace_numpy(twin, batches), trace_device(env, batches))
    env.close()
    twin.close()


def test_use_after_close_is_an_error():
    env = peregrine.make("cartpole", num_envs=2, device="cpu")
    env.close()
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.step(torch.zeros(2, dtype=torch.int32))


# ---- on a GPU ---------------------------------------------------------------------------

@needs_gpu
@needs_nvrtc
@pytest.mark.parametrize("name", ENVS)
def test_gpu_batch_is_bit_identical_to_the_cpu_batch(name):
    """Thousands of instances x hundreds of steps, with resets and truncations."""
    num_envs = 2048 if name != "drone_swarm" else 512
    cpu = peregrine.make(name, num_envs=num_envs, seed=7, num_threads=2, **SHORT)
    cuda = peregrine.make(name, num_envs=num_envs, seed=7, device="cuda", **SHORT)
    batches = random_actions(cpu, 300, seed=3)
    assert_same(trace_numpy(cpu, batches), trace_device(cuda, batches))
    expected = cpu.instance_stats()
    episodes, sums = cuda.instance_stats()
    np.testing.assert_array_equal(expected[0], episodes.cpu().numpy())
    np.testing.assert_array_equal(expected[1], sums.cpu().numpy())
    for instance in (0, num_envs // 2, num_envs - 1):
        np.testing.assert_array_equal(cpu.get_state(instance), cuda.get_state(instance))
    cuda.check()
    cpu.close()
    cuda.close()


@needs_gpu
@needs_nvrtc
def test_gpu_step_makes_no_host_sync_and_replays_in_a_cuda_graph():
    env = peregrine.make("cartpole", num_envs=4096, seed=0, device="cuda")
    twin = peregrine.make("cartpole", num_envs=4096, seed=0, device="cuda")
    actions = torch.ones(env.num_agents, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        env.step(actions)                       # warm-up on the capture stream
        twin.step(actions)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):   # raises on any sync
            env.step(actions)
    for _ in range(5):
        graph.replay()
        twin.step(actions)
    torch.cuda.synchronize()
    assert torch.equal(env.observations, twin.observations)
    env.close()
    twin.close()
