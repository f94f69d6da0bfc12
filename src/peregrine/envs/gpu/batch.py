"""DeviceEnv: a native env's batch whose buffers are torch tensors on a device.

    env = peregrine.make("cartpole", num_envs=1 << 20, seed=0, device="cuda")
    observations, _ = env.reset()
    observations, rewards, terminals, truncations, _ = env.step(actions)  # tensors

The contract is the CPU batch's (module docstring of envs/native/batch.py): the seven
buffers (`observations`, `final_observations`, `actions`, `rewards`,
`terminals`, `truncations`, `masks`) are updated in place, finished instances
reset inside the same step, terminals and truncations stay apart, episode
statistics accumulate per instance. What changes is where it runs:

* `device="cuda"` / `"cuda:N"`: the env's C header, compiled by NVRTC
  (envs/gpu/compiler.py), steps one GPU thread per instance; the Env struct and every
  array of its state live in device memory. `step` launches one kernel on
  torch's current stream: no host synchronisation and no allocation, so it can
  be captured in a CUDA graph.
* `device="cpu"`: the CPU build of the same header steps the tensors' memory
  in place (`num_threads` as usual). It is the same class and the same rules
  on both devices, so the suite tests this path without a GPU.

Both compile from the one header, so the same seed and actions give the same
observations, rewards, flags and per-instance statistics on both (no fused
multiply-adds on either side; `tests/test_device_envs.py` checks it bit for bit
where a GPU is present).

Bad input: an `actions` tensor of the wrong type, device, dtype or shape is
refused at once (checked on the host, no sync). Values cannot be checked
without a sync, so both devices treat them alike (pg_repair_actions in
pg_env.h): an out-of-range discrete action becomes 0, a NaN/inf continuous one
acts as 0 (as on the CPU batch), and each is counted on the device;
`check()` reads the counts (one sync) and raises if any was seen.
"""
from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from ..native.batch import BUFFER_NAMES, EpisodeStats, NativeEnv, _ClosedBatch, resolve_seed
from ..native.protocols import ObservationSlots

if TYPE_CHECKING:   # torch is imported when a DeviceEnv is made, not with this module
    import torch

ACTION_ERRORS = ("out-of-range discrete action component(s), replaced by 0",
                 "non-finite continuous action component(s), treated as 0")


def _torch():
    try:
        import torch
    except ImportError as error:
        raise ImportError("a device batch keeps its buffers in torch tensors: install "
                          "torch (pip install 'peregrine-rl[train]')") from error
    return torch


def _host_array(address: int, nbytes: int) -> np.ndarray:
    """A uint8 NumPy view of `nbytes` of C memory at `address` (no copy)."""
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(address))


def _pointer_at(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


class _HostArrays:
    """The CPU batch's pg_alloc arrays (state, streams, statistic rows) as
    NumPy views, found through the binding's `layout()`."""

    def __init__(self, batch):
        layout = batch.layout()
        self.address, self.size = layout["address"], layout["size"]
        self.buffer_offsets = layout["buffers"]
        self.arrays = []                 # (offset in the Env, host uint8 view)
        for offset, nbytes in layout["allocations"]:
            self.arrays.append((offset, _host_array(_pointer_at(self.address + offset), nbytes)))

    def index_of(self, name: str) -> int:
        """Position in `arrays` of the PgBatch array `name` ("rng" or "stats")."""
        offset = self.buffer_offsets[name]
        return next(i for i, (at, _) in enumerate(self.arrays) if at == offset)


class _CpuKernels:
    """device="cpu": the C batch steps the tensors' memory directly."""

    def __init__(self, host: NativeEnv, arrays: _HostArrays, torch, buffers, errors):
        self.host = host
        self.errors = errors.numpy().view(np.uint64)     # the same memory as the tensor
        stats = arrays.arrays[arrays.index_of("stats")][1]
        self.stats_rows = torch.from_numpy(stats.view(np.float64))

    def step(self) -> None:
        self.host._batch.repair_actions(self.errors)
        self.host._batch.step()

    def reset(self, seed: int | None) -> None:
        self.host.reset(seed)

    def seed_streams(self, seed: int) -> None:
        self.host.seed_streams(seed)

    def pull(self) -> None:
        """Device state -> the host batch (nothing to do: it is the same memory)."""

    def push(self) -> None:
        """The host batch -> device state (the same memory)."""

    def attach_states(self, states, final_states) -> None:
        """The host batch writes the global state into the tensors' memory."""
        self.host.enable_states(states.numpy(), final_states.numpy())


class _CudaKernels:
    """device="cuda": the NVRTC build of the header, one thread per instance.

    The Env struct is built on the host by the CPU binding (env_init checks
    the config and sizes every array), then mirrored: each pg_alloc array gets
    a device tensor, and a copy of the struct with those device pointers (and
    the device buffers' pointers) is uploaded once. The host batch stays as the
    mirror that get_state/set_state go through.
    """

    def __init__(self, host: NativeEnv, arrays: _HostArrays, torch, buffers, errors):
        from cuda.bindings import driver

        from . import compiler as gpu
        self.torch, self.driver, self.host, self.arrays = torch, driver, host, arrays
        self._check = gpu._check
        self.buffers, self.errors = buffers, errors
        device = buffers["observations"].device
        self.device = device
        major, minor = torch.cuda.get_device_capability(device)
        code = gpu.cached_cubin(type(host).gpu_source(), f"sm_{major}{minor}")
        with torch.cuda.device(device):
            torch.cuda.current_stream(device)       # makes torch's (primary) context current
            gpu._check(driver.cuInit(0), "cuInit")
            self.module = gpu._check(driver.cuModuleLoadData(code), "cuModuleLoadData")
        self.step_kernel = gpu._check(driver.cuModuleGetFunction(self.module, b"pg_step"),
                                      "cuModuleGetFunction(pg_step)")
        self.reset_kernel = gpu._check(driver.cuModuleGetFunction(self.module, b"pg_reset"),
                                       "cuModuleGetFunction(pg_reset)")
        self.states_kernel = gpu._check(driver.cuModuleGetFunction(self.module, b"pg_states"),
                                        "cuModuleGetFunction(pg_states)")
        self.state_buffers = None       # (states, final_states) once attached
        self.device_arrays = [torch.empty(array.nbytes, dtype=torch.uint8, device=device)
                              for _, array in arrays.arrays]
        struct_bytes = bytearray(ctypes.string_at(arrays.address, arrays.size))
        for (offset, _), tensor in zip(arrays.arrays, self.device_arrays):
            struct.pack_into("<Q", struct_bytes, offset, tensor.data_ptr())
        for name in BUFFER_NAMES:
            offset = arrays.buffer_offsets[name]
            struct.pack_into("<Q", struct_bytes, offset, buffers[name].data_ptr())
        self.env_struct = torch.frombuffer(struct_bytes, dtype=torch.uint8).to(device)
        self.stats_rows = self.device_arrays[arrays.index_of("stats")].view(torch.float64)
        kernel_max_threads = min(
            gpu._check(driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel),
                "cuFuncGetAttribute") for kernel in (self.step_kernel, self.reset_kernel,
                                                      self.states_kernel))
        self.blocks, self.threads = gpu.launch_config(host.num_envs,
                                                      kernel_max_threads=kernel_max_threads)
        self.push()

    def _launch(self, kernel, *args) -> None:
        """One thread per instance on torch's current stream (captured, inside a
        CUDA graph capture); `args` are (value, ctypes type) pairs."""
        stream = self.torch.cuda.current_stream(self.device).cuda_stream
        values = tuple(value for value, _ in args)
        types = tuple(kind for _, kind in args)
        self._check(self.driver.cuLaunchKernel(
            kernel, self.blocks, 1, 1, self.threads, 1, 1, 0,
            self.driver.CUstream(stream), (values, types), 0), "cuLaunchKernel")

    def step(self) -> None:
        self._launch(self.step_kernel, (self.env_struct.data_ptr(), ctypes.c_void_p),
                     (self.errors.data_ptr(), ctypes.c_void_p))

    def reset(self, seed: int | None) -> None:
        self._launch(self.reset_kernel, (self.env_struct.data_ptr(), ctypes.c_void_p),
                     (0 if seed is None else seed, ctypes.c_uint64),
                     (0 if seed is None else 1, ctypes.c_int))

    def seed_streams(self, seed: int) -> None:
        """Streams from (seed, instance), episodes untouched: on the host mirror,
        then the stream array alone goes up."""
        index = self.arrays.index_of("rng")
        self.host.seed_streams(seed)
        self.device_arrays[index].copy_(self.torch.from_numpy(self.arrays.arrays[index][1]))

    def pull(self) -> None:
        for (_, array), tensor in zip(self.arrays.arrays, self.device_arrays):
            array[:] = tensor.cpu().numpy()
        for name in BUFFER_NAMES:
            getattr(self.host, name)[...] = self.buffers[name].cpu().numpy()

    def push(self) -> None:
        for (_, array), tensor in zip(self.arrays.arrays, self.device_arrays):
            tensor.copy_(self.torch.from_numpy(array))
        for name in BUFFER_NAMES:
            self.buffers[name].copy_(self.torch.from_numpy(getattr(self.host, name)))
        if self.state_buffers is not None:    # the states of the instances just written
            self._launch(self.states_kernel, (self.env_struct.data_ptr(), ctypes.c_void_p))

    def attach_states(self, states, final_states) -> None:
        """Points the device Env's states / final_states at these device tensors
        (two pointer words of the struct, patched in place), then writes every
        instance's state (the pg_states kernel)."""
        self.state_buffers = (states, final_states)     # kept alive with the struct
        for name, tensor in zip(("states", "final_states"), self.state_buffers):
            word = self.torch.tensor(list(struct.pack("<Q", tensor.data_ptr())),
                                     dtype=self.torch.uint8)
            offset = self.arrays.buffer_offsets[name]
            self.env_struct[offset:offset + 8].copy_(word)
        self._launch(self.states_kernel, (self.env_struct.data_ptr(), ctypes.c_void_p))


class DeviceEnv:
    """A batch of a native env with torch-tensor buffers on `device`
    ("cpu", "cuda" or "cuda:N"); see the module docstring. Made by
    `peregrine.make(name, ..., device=...)`."""

    def __init__(self, env_class: type[NativeEnv], num_envs: int = 1, seed: int | None = None,
                 device: Any = "cuda", num_threads: int = 1, preset: str = "default",
                 **config: Any) -> None:
        torch = _torch()
        self._torch = torch
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") \
                from error
        if self.device.type == "cuda":
            _require_cuda(torch, self.device)
            self.device = with_cuda_index(torch, self.device)
            if num_threads != 1:
                raise ValueError("num_threads is for the CPU batch; a CUDA batch runs one GPU "
                                 "thread per instance")
        elif self.device.type != "cpu":
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        seed = resolve_seed(seed)
        host = env_class(num_envs=num_envs, seed=seed, num_threads=num_threads, preset=preset,
                         **config)
        self.host = host
        for attribute in ("name", "num_envs", "agents_per_env", "num_agents", "obs_dim",
                          "config", "single_observation_space", "single_action_space",
                          "observation_space", "action_space", "num_threads", "state_dim",
                          "single_state_space", "state_space"):
            setattr(self, attribute, getattr(host, attribute))
        self.states = self.final_states = None       # until enable_states()
        if isinstance(host, ObservationSlots):
            self.observation_slots = host.observation_slots
        arrays = _HostArrays(host._batch)
        layout_bytes = sum(view.nbytes for _, view in arrays.arrays)
        if self.device.type == "cpu":
            buffers = {name: torch.from_numpy(getattr(host, name)) for name in BUFFER_NAMES}
            kernels = _CpuKernels
        else:
            buffers = {name: torch.empty(getattr(host, name).shape,
                                         dtype=torch.from_numpy(getattr(host, name)[:0]).dtype,
                                         device=self.device) for name in BUFFER_NAMES}
            kernels = _CudaKernels
        self.buffers = buffers
        self._array_bytes = layout_bytes + sum(tensor.nbytes for tensor in buffers.values())
        for name in BUFFER_NAMES:
            setattr(self, name, buffers[name])
        self.action_errors = torch.zeros(len(ACTION_ERRORS), dtype=torch.int64,
                                         device=self.device)
        self._kernels = kernels(host, arrays, torch, buffers, self.action_errors)
        self._action_dtype = buffers["actions"].dtype
        self._action_shape = tuple(buffers["actions"].shape)
        self._first_episode_seed: int | None = None
        self.reset(seed)
        # as NativeEnv: reset() before any step plays the construction seed's first episode
        self._first_episode_seed = seed

    # ---- the loop -------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict]:
        """Fresh episodes everywhere; with a seed, every instance's stream
        restarts from (seed, instance); without one, streams continue (the
        first reset() before any step restarts them from the construction
        seed, as NativeEnv.reset does). Returns (observations, {})."""
        if seed is None:
            seed = self._first_episode_seed
        self._first_episode_seed = None
        self._kernels.reset(None if seed is None else resolve_seed(seed))
        return self.observations, {}

    def seed_streams(self, seed: int) -> None:
        """Restarts every stream from (seed, instance) without a reset."""
        self._kernels.seed_streams(resolve_seed(seed))
        self._first_episode_seed = None

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                   torch.Tensor, dict]:
        """Steps every instance with `actions`, a tensor on this env's device
        with the action buffer's dtype and shape (or the `actions` buffer
        itself). Returns (observations, rewards, terminals, truncations, {}),
        the env's own tensors, overwritten by the next step."""
        torch = self._torch
        if actions is not self.actions:
            if (not isinstance(actions, torch.Tensor) or actions.device != self.device
                    or actions.dtype != self._action_dtype
                    or tuple(actions.shape) != self._action_shape):
                self._refuse_actions(actions)
            self.actions.copy_(actions)
        self._first_episode_seed = None
        self._kernels.step()
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    def _refuse_actions(self, actions):
        expected = (f"a torch tensor on {self.device} of dtype {self._action_dtype} and shape "
                    f"{self._action_shape}")
        if not isinstance(actions, self._torch.Tensor):
            raise ValueError(f"actions must be {expected}, got {type(actions).__name__}")
        raise ValueError(f"actions must be {expected}, got one on {actions.device} of dtype "
                         f"{actions.dtype} and shape {tuple(actions.shape)}")

    def check(self) -> None:
        """Raises ValueError if any step since the last check repaired a bad
        action (see the module docstring), naming how many of each kind, then
        clears the counts. One host synchronisation."""
        counts = self.action_errors.tolist()
        if any(counts):
            self.action_errors.zero_()
            seen = "; ".join(f"{count} {what}" for count, what in zip(counts, ACTION_ERRORS)
                             if count)
            raise ValueError(f"bad actions reached the {self.name} env since the last check: "
                             f"{seen}")

    # ---- the global state (native_env.py's module docstring) ---------------------
    def enable_states(self) -> torch.Tensor:
        """Starts writing the global state into `states` / `final_states`, float32
        tensors [num_envs, state_dim] on this env's device, at every reset and step
        (on the GPU inside the same kernels, no host sync); the current states are
        written at once. Returns `states`; a second call keeps them. ValueError for
        an env without a global state."""
        if not self.state_dim:
            raise ValueError(f"the {self.name} env has no global state (state_dim 0); only "
                             f"multi-agent envs that define one do")
        if self.states is None:
            torch = self._torch
            states, final_states = (torch.zeros(self.num_envs, self.state_dim,
                                                dtype=torch.float32, device=self.device)
                                    for _ in range(2))
            self._kernels.attach_states(states, final_states)
            self.states, self.final_states = states, final_states
        return self.states

    # ---- statistics -------------------------------------------------------------
    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        """Count, mean and std of each statistic over the episodes finished
        since the last clearing read: the per-instance rows summed on the
        device, then one transfer of 1 + 2k numbers. (The sum's order differs
        from the CPU batch's instance order, so aggregates of non-integer
        statistics can differ from the CPU's in the last bits; the rows of
        `instance_stats` are identical.)"""
        k = len(self.stat_names)
        rows = self._kernels.stats_rows.view(self.num_envs, 1 + 2 * k)
        totals = rows.sum(dim=0).tolist()
        if clear:
            rows.zero_()
        return EpisodeStats.from_sums(self.stat_names, int(totals[0]), totals[1:1 + k],
                                      totals[1 + k:])

    def instance_stats(self, clear: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(episodes [num_envs] int64, sums [num_envs, k] float64), tensors on
        this env's device, since the last clearing read."""
        k = len(self.stat_names)
        rows = self._kernels.stats_rows.view(self.num_envs, 1 + 2 * k)
        episodes, sums = rows[:, 0].to(self._torch.int64), rows[:, 1:1 + k].clone()
        if clear:
            rows.zero_()
        return episodes, sums

    @property
    def nbytes(self) -> int:
        """Bytes this batch holds on its device: the env's state arrays (every
        pg_alloc array: state, random streams, statistic rows, scratch), its
        buffers (observations, final observations, actions, rewards, flags) and,
        once enabled, the global states. It grows linearly with num_envs, so a
        small batch's nbytes / num_envs sizes a large one before it is made. On a
        GPU the device also holds the CUDA context and torch's allocator slack
        (benchmarks/RESULTS.md, "GPU third light")."""
        states = 0 if self.states is None else self.states.nbytes + self.final_states.nbytes
        return self._array_bytes + self.action_errors.nbytes + states

    @property
    def stat_names(self) -> tuple[str, ...]:
        return self.host.stat_names

    # ---- exact state (host round trips: for tests, checkpoints, debugging) ------
    def get_state(self, instance: int) -> np.ndarray:
        self._kernels.pull()
        return self.host.get_state(instance)

    def set_state(self, instance: int, state: np.ndarray) -> None:
        """Overwrites one instance's state; its observation rows are rewritten."""
        self.set_states({instance: state})

    def get_states(self) -> np.ndarray:
        """Every instance's state, [num_envs, state_size] float64 (one transfer)."""
        self._kernels.pull()
        return np.stack([self.host.get_state(i) for i in range(self.num_envs)])

    def set_states(self, states: np.ndarray | torch.Tensor | dict[int, np.ndarray]) -> None:
        """Overwrites instances' states: `states` is [num_envs, state_size], or a
        mapping {instance: state}; one transfer each way."""
        items = states.items() if isinstance(states, dict) else enumerate(states)
        self._kernels.pull()
        for instance, state in items:
            self.host.set_state(instance, state)
        self._kernels.push()

    # ---- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Releases the batch; idempotent. Later use raises RuntimeError (on
        every device: the kernels go with the host batch)."""
        self.host.close()
        self._kernels = _ClosedBatch(self.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"DeviceEnv({self.name!r}, num_envs={self.num_envs}, agents_per_env="
                f"{self.agents_per_env}, device={str(self.device)!r})")


def with_cuda_index(torch, device):
    """A CUDA device always with its index ("cuda" = the current device):
    torch.device("cuda") != torch.device("cuda:0"), while every tensor made there
    reports "cuda:0", so devices are compared in this form (the batch, the trainer)."""
    return device if device.index is not None else \
        torch.device("cuda", torch.cuda.current_device())


def _require_cuda(torch, device) -> None:
    """A clear error, before anything is built, where CUDA cannot run."""
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else \
            f"torch built for CUDA {torch.version.cuda}, but no usable GPU or driver was found"
        raise RuntimeError(f"device={str(device)!r} needs a CUDA GPU: this is {build}. Use "
                           "device='cpu' for the same batch on the CPU")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(f"device={str(device)!r}: this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    from . import compiler as gpu
    gpu._nvrtc()                       # the install hint, before building anything
