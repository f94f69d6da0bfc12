"""Collectors: how one rollout's `horizon` steps reach the rollout storage.

A rollout is data in, data out: `collector.collect(parts, storage, state)`
takes the parts it steps with (`RolloutParts`: env, policy, observation
pipeline, the per-step policy function, generator, critic column, teacher
labels; the trainer's, fixed for a run) and what the previous rollout left
(`RolloutState`: every row's recurrent state and which rows start an episode),
fills `storage`, and returns the new `RolloutState` with the seconds it waited
for env steps. Nothing else is read or written: the env's own observations,
the normalisers' statistics and the generator's position move on inside the
objects that own them.

The trainer picks a collector at construction (`Trainer.collector`). Both write
the same columns through the same parts, so a path is a choice of collector,
not a branch inside one.

`SyncCollector` (vec.split = 1, every batch kind): per step, every row at once:
observe, forward and sample, hand the actions to `env.step`, receive its output,
bootstrap truncated rows. The trainer waits while the env steps.

`SplitCollector` (vec.split = 2, a host batch; EnvPool's alternating halves):
the batch is two blocks, rows [0, R/2) and [R/2, R) of the storage
(environment.split_blocks): two native batches of num_envs / 2 instances (the
native backend), or two groups of worker processes (the multiprocessing
backend, any env). Per step, for half h in turn:

    wait for half h's env step      (submitted one half earlier)
    receive its output              (rewards, episode ends, bootstrap)
    observe + forward + sample      (half h's rows only)
    actions to half h's buffer      (CUDA: non-blocking into pinned memory + event)
    submit half h's env step        (native: a worker thread, the C step releases the
                                     GIL; multiprocessing: the group's processes)

so while half h steps, this thread runs the forward of the other half. One
worker thread steps native halves in submission order; worker-process groups
step on their own, so both halves' processes may be stepping at once. Each half
has its own observation pipeline over its own rows (sharing the normalisers'
statistics, SplitPipeline), its own action buffer and, for a recurrent policy,
its own slice of the LSTM state. The order of everything this thread does is
fixed (half 0, then half 1), whichever half's step ends first: a seed gives
the same run twice.

On a CUDA learner, observations and env outputs go through pinned staging
arrays (`PinnedRows`): after a half's step they are copied (host memcpy) into
page-locked memory, from which the pipeline's `.to(device, non_blocking=True)`
copies are truly asynchronous (from the env's pageable buffers they would wait
for the GPU). No extra event is needed to reuse a staging array: the worker
waits on the action buffer's event, recorded on the same stream after that
half's host-to-device copies, before it steps, so a finished step means those
copies are done. On a CPU learner the pipelines read the env's buffers
directly (`DirectRows`). Pinned memory and CUDA events are used only when the
device is CUDA.

Seeding and determinism: native blocks are seeded as `vector.Serial` with two
workers seeds them (block b: seed + b*phi, `vector.common.unit_seed`), stream
re-derivation and per-instance state go through that batch, and the sampling
generator is drawn half 0 then half 1 at every step, whatever the threads'
timing: a seed gives the same run twice. Native blocks do not reproduce
vec.split = 1's numbers: the second half's instances run other random streams
than one native batch's, and the generator's draws are cut differently (which
matters where a draw's numbers depend on its size). Worker groups are the
unsplit batch's own workers, so where the draws do not depend on the cut
(CartPole's Discrete actions, tested) the split run takes the unsplit one's actions;
its values can differ in the last bit (a forward over half the rows may round
differently than one over all of them: the test's 8 instances match bit for bit on one
CPU, policy losses 3e-8 apart on another; 4 instances gave 5e-7), and the normalisers,
updated half by half, make it differ slightly.

Time split: `env` is the seconds this thread WAITED for a half's env step (the
part of the env's work not hidden behind the other half's forward);
`env_hidden` the env-step seconds that ran beside it (the worker's busy time
minus that wait; for worker processes, whose busy time is theirs, the steps'
time in flight). `forward` stays the rest of the rollout.

Not available with vec.split (refused by the compatibility table, config.INCOMPATIBLE):
kickstarting, train.overlap, device batches, several ranks.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from . import environment
from .critic_states import CriticStates
from .observations import ObservationPipeline


@dataclass
class RolloutState:
    """What one rollout hands the next: every row's recurrent state (None for a
    feed-forward policy) and which rows' current observation starts an episode."""
    lstm: tuple | None
    starts: torch.Tensor

    @classmethod
    def fresh(cls, policy, rows: int, device) -> "RolloutState":
        """A run's first state: zero recurrent state, every row starting."""
        return cls(policy.initial_state(rows, device),
                   torch.ones(rows, dtype=torch.bool, device=device))


@dataclass
class RolloutParts:
    """What a rollout steps with (the trainer's, fixed for a run): the env batch,
    the policy and its per-step function `act` (eager or compiled, `policy_step`),
    the autocast context of its forwards, the sampling generator, the observation
    pipeline, a centralised critic's column writer (None: a local critic, or the
    split path's own per half), the teacher's labeller while its weight is above 0
    (None otherwise), the discount that truncation bootstraps use, the number of
    steps, and an all-False row of episode starts for the bootstraps' forwards
    (a final observation continues its episode)."""
    env: Any
    policy: Any
    act: Callable
    autocast: Any
    generator: torch.Generator
    pipeline: Any
    critic: CriticStates | None
    teacher_label: Callable | None
    gamma: float
    horizon: int
    no_starts: torch.Tensor


def _no_state(step, state, starts) -> None:
    """`remember` for feed-forward policies: nothing to store."""


def bootstrap_truncated(parts: RolloutParts, pipeline, storage, step: int, state,
                        critic_states=None) -> None:
    """Adds gamma * V(final observation) to the reward of the rows of `storage` cut
    by truncation at `step` (a row flagged both ways ended for real and gets no
    bootstrap); `state` is the recurrent state of those rows after the step's
    forward (None for feed-forward policies), `critic_states` the rows'
    critic_states.CriticStates (None for a local critic: the final states)."""
    policy, autocast, no_starts = parts.policy, parts.autocast, parts.no_starts
    critic = critic_states

    def value(inputs, rows):          # rows: an index tensor, or None for every row
        rows_state = state if state is None or rows is None else \
            (state[0][rows], state[1][rows])
        final = None if critic is None else critic.final(rows)
        with autocast:
            return policy.value(inputs, rows_state, no_starts[:inputs.shape[0]], final).float()
    pipeline.bootstrap(storage, step, value, parts.gamma)


def policy_step(policy, autocast, compilable: bool = False):
    """The rollout's per-step policy work, `step(observations, state, starts,
    randomness, mask) -> (actions, log-probs, values, new state)`: the forward
    (under `autocast`), then sampling in fp32. `randomness` is the trainer's
    generator, or with `compilable` the numbers `policy.draw` drew from it
    (`Policy.sample_from`): a function of tensors only, which train.compile
    compiles (compiling.py)."""
    sample = policy.sample_from if compilable else policy.sample

    def step(observations, state, starts, randomness, mask, critic_states=None):
        with autocast:
            params, values, state = policy.heads(observations, state, starts, critic_states)
        actions, logprobs = sample(params.float(), randomness, mask)
        return actions, logprobs, values, state
    return step


def with_drawn_noise(policy, compiled_step):
    """A compiled compilable `policy_step` that takes the generator: the numbers
    are drawn eagerly (the same draws, in the same order, as the eager step
    makes), then the compiled step runs."""
    draw = policy.draw

    def step(observations, state, starts, generator, mask, critic_states=None):
        noise = draw(observations.shape[0], generator, observations.device)
        return compiled_step(observations, state, starts, noise, mask, critic_states)
    return step


class SyncCollector:
    """Every row at once, the env stepped in this thread (module docstring)."""

    def __init__(self, env, action_space, rows: int, device, on_device: bool):
        self.actions = environment.ActionBuffer(
            action_space, rows, device, target=env.actions if on_device else None)
        self.clock = environment.StepClock(device if on_device else torch.device("cpu"))

    @torch.no_grad()
    def collect(self, parts: RolloutParts, storage, state: RolloutState
                ) -> tuple[RolloutState, float]:
        """`parts.horizon` steps of every row into `storage`, from `state`; returns
        the state after them and the seconds spent in `env.step`."""
        pipeline, env, act, generator = parts.pipeline, parts.env, parts.act, parts.generator
        observe = self._observer(parts, storage)
        remember = storage.record_state if parts.policy.use_lstm else _no_state
        actions_np, clock = self.actions.array, self.clock
        lstm, starts = state.lstm, state.starts
        clock.restart()
        for step in range(parts.horizon):
            observe(step)                     # policy input, live rows, masks, teacher labels,
            remember(step, lstm, starts)      # global states; recurrent: starts, segment states
            actions, logprobs, values, lstm = act(storage.obs[step], lstm, starts, generator,
                                                  storage.step_mask(step),
                                                  storage.step_critic_states(step))
            storage.record(step, actions, logprobs, values)
            self.actions.write(actions)
            clock.start()
            next_obs, rewards, terminals, truncations, _infos = env.step(actions_np)
            clock.stop()
            pipeline.receive(storage, step, next_obs, rewards, terminals, truncations)
            bootstrap_truncated(parts, pipeline, storage, step, lstm, parts.critic)
            starts = storage.dones[step]
        return RolloutState(lstm, starts.clone()), clock.seconds()

    @staticmethod
    def _observer(parts: RolloutParts, storage):
        """This rollout's per-step writer of the current observation's columns: the
        pipeline's, plus a centralised critic's global state column and the
        teacher's labels while its weight is above 0."""
        pipeline, critic, label = parts.pipeline, parts.critic, parts.teacher_label
        writers = [pipeline.observe]
        if critic is not None:
            writers.append(critic.write)
        if label is not None:
            writers.append(lambda storage, step: label(pipeline.obs_view,
                                                       storage.teacher_actions[step]))
        if len(writers) == 1:
            return lambda step: pipeline.observe(storage, step)

        def observe(step):
            for write in writers:
                write(storage, step)
        return observe

    def time_split(self) -> dict:
        """Extra time-split entries of the last rollout (none on this path)."""
        return {}

    def close(self) -> None:
        """Nothing to stop."""


# ---- the split path ---------------------------------------------------------------

class DirectRows:
    """A half's env buffers as its pipeline reads them: the env's own (CPU learner)."""

    def __init__(self, env):
        self.source = env

    def load(self) -> None:
        """Nothing to copy: the pipeline reads the env's buffers."""


class PinnedRows:
    """Pinned (page-locked) copies of a half's env outputs, for a CUDA learner: the
    pipeline is built over this object, so its host-to-device copies read pinned
    memory and run asynchronously. `final_observations` stays the env's own (read
    only on truncated rows, gathered on the host first). `pin=False` makes plain
    host copies, which runs the same staging logic on a CPU learner (tests)."""

    COPIED = ("observations", "rewards", "terminals", "truncations", "masks")

    def __init__(self, env, pin: bool = True):
        self.env = env
        self.source = self
        for name in self.COPIED:
            array = np.zeros_like(getattr(env, name))
            if pin:
                array = torch.from_numpy(array).pin_memory().numpy()
            setattr(self, name, array)
        self.final_observations = env.final_observations
        self.num_agents = env.num_agents
        self.load()

    def load(self) -> None:
        """The env's current outputs into the staging arrays. Called only when no
        copy from them is in flight (module docstring: after the half's step)."""
        for name in self.COPIED:
            np.copyto(getattr(self, name), getattr(self.env, name))


class ThreadStepper:
    """A native block's step on the collector's one worker thread (the C step
    releases the GIL), started once the half's actions are on the host."""

    def __init__(self, block, actions, worker: ThreadPoolExecutor):
        self.block, self.actions, self.worker = block, actions, worker
        self.future = None

    def _step(self) -> float:
        self.actions.wait()
        tick = time.perf_counter()
        self.block.step(self.actions.array)
        return time.perf_counter() - tick

    def submit(self) -> None:
        self.future = self.worker.submit(self._step)

    def wait(self) -> float:
        """Waits for the step; returns the seconds it took (re-raises its error)."""
        future, self.future = self.future, None
        return future.result()


class GroupStepper:
    """A Multiprocessing worker group (vector.processes.WorkerGroup): its worker
    processes step while this thread works, so no thread is needed. The seconds
    returned are the step's time in flight, from start to the end of the wait."""

    def __init__(self, group, actions):
        self.group, self.actions = group, actions
        self.started = None

    def submit(self) -> None:
        self.actions.wait()
        self.started = time.perf_counter()
        self.group.start(self.actions.array)

    def wait(self) -> float:
        started, self.started = self.started, None
        self.group.finish()
        return time.perf_counter() - started


class Half:
    """One half of a split batch: its block (a native batch or a group of worker
    processes), rows, staging, pipeline, actions, stepper, and a centralised
    critic's global state column of its rows (None: local critic)."""

    def __init__(self, env, begin: int, device, train_config, mask_slice, staged: bool,
                 obs_dim: int, worker: ThreadPoolExecutor, critic: str = "local",
                 share_with=None):
        self.env, self.begin, self.end = env, begin, begin + int(env.num_agents)
        cuda = device.type == "cuda"
        self.rows = PinnedRows(env, pin=cuda) if staged else DirectRows(env)
        source = self.rows.source
        self.pipeline = ObservationPipeline(source, source.observations, device, obs_dim,
                                            train_config, mask_slice, share_with)
        self.actions = environment.ActionBuffer(env.single_action_space, int(env.num_agents),
                                                device, pinned=cuda)
        from ..vector.processes import WorkerGroup     # imported by then (split_blocks)
        self.stepper = GroupStepper(env, self.actions) if isinstance(env, WorkerGroup) \
            else ThreadStepper(env, self.actions, worker)
        # Read only between this half's steps (its step is waited for before its rows
        # are observed), so the block's own state buffers need no staging.
        self.critic = None if critic == "local" else CriticStates(env, critic, device)


class SplitPipeline:
    """The observation pipeline's interface outside the step loop (last value,
    checkpoints, evaluation settings), over the halves' pipelines. The halves share
    their normalisers' statistics (ObservationPipeline's `share_with`), updated
    half 0 then half 1 at every step: merged exactly (normalize.py), they are the
    statistics of the whole batch; only the reward scaler's discounted returns are
    per row, so per half."""

    def __init__(self, pipelines):
        self.pipelines = pipelines
        self.mask_slice = pipelines[0].mask_slice
        self.obs_norm = pipelines[0].obs_norm
        self.reward_scaler = pipelines[0].reward_scaler   # its statistics are every half's

    @property
    def storage_dtype(self) -> torch.dtype:
        return self.pipelines[0].storage_dtype

    def current(self) -> torch.Tensor:
        """The policy input of every row's current observation (halves in row order)."""
        return torch.cat([pipeline.current() for pipeline in self.pipelines])

    def state_dict(self) -> dict:
        """As one pipeline over every row would write it: the shared statistics, and
        the reward scaler's returns of every row in row order."""
        state = self.pipelines[0].state_dict()
        if state["reward_scaler"] is not None:
            state["reward_scaler"]["returns"] = torch.cat(
                [pipeline.reward_scaler.state_dict()["returns"] for pipeline in self.pipelines])
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict`'s output (the shared statistics are loaded once per
        half: the same values)."""
        reward = state.get("reward_scaler")
        if reward is None or self.reward_scaler is None:
            for pipeline in self.pipelines:
                pipeline.load_state_dict(state)
            return
        returns = torch.as_tensor(reward["returns"])
        rows = [int(pipeline.reward_scaler.returns.shape[0]) for pipeline in self.pipelines]
        if returns.dim() != 1 or returns.shape[0] != sum(rows):
            raise ValueError(f"reward scaler has {returns.shape[0] if returns.dim() else 0} "
                             f"rows, this run has {sum(rows)}")
        for pipeline, part in zip(self.pipelines, returns.split(rows)):
            pipeline.load_state_dict({**state, "reward_scaler": {**reward, "returns": part}})


class SplitCollector:
    """Two halves stepped alternately, each half's env step overlapping the other
    half's forward (module docstring). `staged` (default: the device is CUDA) routes
    env outputs through `PinnedRows`."""

    def __init__(self, env, device, train_config, obs_dim: int, mask_slice=None,
                 staged: bool | None = None, critic: str = "local"):
        device = torch.device(device)
        if staged is None:
            staged = device.type == "cuda"
        self.device, self.staged = device, staged
        # Native blocks step here (no thread starts until the first submit).
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="peregrine-env-step")
        self.halves, begin = [], 0
        for block in environment.split_blocks(env):
            first = self.halves[0].pipeline if self.halves else None
            self.halves.append(Half(block, begin, device, train_config, mask_slice, staged,
                                    obs_dim, self.worker, critic, share_with=first))
            begin += int(block.num_agents)
        self.pipeline = SplitPipeline([half.pipeline for half in self.halves])
        self.pending = [False] * len(self.halves)
        self.clock = environment.StepClock(torch.device("cpu"))   # this thread's waits
        self.busy = 0.0                 # the worker's env-step seconds in the last rollout

    @torch.no_grad()
    def collect(self, parts: RolloutParts, storage, state: RolloutState
                ) -> tuple[RolloutState, float]:
        """`parts.horizon` steps of every row into `storage`, from `state`; returns
        the state after them and the seconds this thread waited for env steps."""
        generator, act, halves, horizon = parts.generator, parts.act, self.halves, parts.horizon
        blocks = [storage.row_block(half.begin, half.end) for half in halves]
        remember = [block.record_state if parts.policy.use_lstm else _no_state
                    for block in blocks]
        full = state.lstm
        states = [None if full is None else (full[0][half.begin:half.end],
                                             full[1][half.begin:half.end]) for half in halves]
        starts = [state.starts[half.begin:half.end] for half in halves]
        self.clock.restart()
        self.busy = 0.0
        if self.staged and self.device.type == "cuda":
            # The last rollout's final observations may still be in flight from the
            # staging arrays (the last value in `advantages`): one sync per rollout.
            torch.cuda.current_stream(self.device).synchronize()
        for half in halves:             # after a reset or restore the staging is stale
            half.rows.load()
        try:
            for step in range(horizon):
                for h, half in enumerate(halves):
                    block = blocks[h]
                    if step > 0:
                        self._finish(parts, h, blocks[h], step - 1, states[h])
                        starts[h] = block.dones[step - 1]
                    half.pipeline.observe(block, step)
                    if half.critic is not None:
                        half.critic.write(block, step)
                    remember[h](step, states[h], starts[h])
                    actions, logprobs, values, states[h] = act(
                        block.obs[step], states[h], starts[h], generator, block.step_mask(step),
                        block.step_critic_states(step))
                    block.record(step, actions, logprobs, values)
                    half.actions.write(actions)
                    half.stepper.submit()
                    self.pending[h] = True
            for h in range(len(halves)):
                self._finish(parts, h, blocks[h], horizon - 1, states[h])
        finally:
            self._drain()
        lstm = None if full is None else tuple(torch.cat([state[i] for state in states])
                                               for i in range(2))
        return RolloutState(lstm, storage.dones[horizon - 1].clone()), self.clock.seconds()

    def _finish(self, parts: RolloutParts, h: int, block, step: int, state) -> None:
        """Waits for half h's env step of `step` and writes its output into `block`."""
        half = self.halves[h]
        self.clock.start()
        self.pending[h] = False
        self.busy += half.stepper.wait()    # re-raises the step's exception here
        self.clock.stop()
        half.rows.load()
        source = half.rows.source
        half.pipeline.receive(block, step, source.observations, source.rewards,
                              source.terminals, source.truncations)
        bootstrap_truncated(parts, half.pipeline, block, step, state, half.critic)

    def current_critic_states(self) -> torch.Tensor:
        """A centralised critic's column of every row's current state (halves in
        row order)."""
        return torch.cat([half.critic.current() for half in self.halves])

    def _drain(self) -> None:
        """Waits for every submitted step (after an error too: a half must not be
        stepping while the trainer saves, resets or closes the env)."""
        for h, pending in enumerate(self.pending):
            if pending:
                self.pending[h] = False
                try:
                    self.halves[h].stepper.wait()
                except Exception:  # noqa: BLE001 - the error being raised already names it
                    pass

    def time_split(self) -> dict:
        """`env_hidden`: env-step seconds of the last rollout that ran while this
        thread did other work (module docstring)."""
        return {"env_hidden": max(self.busy - self.clock.seconds(), 0.0)}

    def close(self) -> None:
        """Waits for a step in flight, then stops the worker thread."""
        self._drain()
        self.worker.shutdown(wait=True)
