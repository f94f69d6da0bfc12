"""PPO over the env's flat row buffers: one update (`Trainer.update`) is

    rollout()   collect `horizon` steps of every row into the storage, then
                their advantages (GAE, all rows at once)
    learn()     `update_epochs` passes of minibatch gradient steps

and a rollout is data in, data out: `collector.collect(parts, storage, state)`
takes the trainer's parts (`collect.RolloutParts`, built per rollout by
`rollout_parts()`) and the last rollout's `collect.RolloutState` (every row's
LSTM state and episode starts, `Trainer.rollout_state`), and returns the next
state; `advantages.fill_advantages` takes the storage and the last value.

The parts, each in its own module and chosen once at construction:

* `storage.RolloutStorage`: the [horizon, rows, ...] tensors, allocated once,
  and their minibatch views (flat samples, or whole segments for the LSTM);
* `observations.ObservationPipeline`: zero-copy views of the env's buffers,
  observation normalisation and reward scaling (normalize.py), the live-row
  and valid-action mask columns; it writes each step's inputs into storage;
* `environment.ActionBuffer`: the host array `env.step` receives (Box actions
  clipped on the way in);
* `collect.SyncCollector` / `collect.SplitCollector`: how a rollout's steps are
  gathered (every row at once, or two halves stepped alternately with each
  half's env step, a native block on a worker thread or a group of worker
  processes, beside the other half's forward, `vec.split = 2`);
* `kickstart.Kickstarter`: the teacher's labels and its loss term;
* `advantages.fill_advantages` (GAE, `compute_gae`) and `loss.ppo_loss`
  (statistics as `LossStats`).

Three env paths, chosen once at construction (the other parts are the same):
* a host batch (NumPy buffers: native, serial, multiprocessing):
  `ObservationPipeline` reads zero-copy views of its arrays and actions reach
  it through a preallocated NumPy array;
* a device batch (`vec.backend = "device"`: the native env's header on
  `train.device`, torch buffers; a GPU env on CUDA): `DeviceObservationPipeline`
  and the env's own `actions` tensor, with no host synchronisation in the
  rollout (truncated rows are bootstrapped with a mask, episode statistics are
  read once per update; `tests/test_train_device.py` enforces it);
* a host batch split in two halves (`vec.split = 2`): the env's two native
  blocks or two groups of worker processes (environment.split_blocks), one
  `ObservationPipeline` and `ActionBuffer` per half, and `collect.SplitCollector`
  (on CUDA through pinned memory with non-blocking copies).
`train.precision = "bf16"` runs every policy forward (rollout and learning)
under autocast; weights, optimizer state, stored values and losses stay fp32.
`train.compile = true` replaces the rollout's policy step and the minibatch
loss with torch.compile'd ones, compiled here once (compiling.py); the loops
call whichever was chosen.

Memory: nothing is copied per step beyond the observation row block into
storage (and, with vec.split on CUDA, the env outputs into pinned staging).

Correctness points worth naming:
* Terminals and truncations stay apart. A truncated row's reward is
  increased by gamma * V(final observation) (the observation the episode was
  cut on, from `env.final_observations`, normalised like any input), and the
  row is then treated as ended: that is exactly the bootstrapped one-step
  target, and GAE does not leak across the reset.
* Losses: clipped surrogate, optionally clipped value loss, entropy bonus,
  per-minibatch advantage normalisation, global gradient-norm clipping, linear
  learning-rate annealing, optional early stop on approximate KL.
* Rows whose `masks` entry is False (dead agents) are left out of the loss.
* Invalid-action masking (`policy.action_mask`, Discrete only): the logits of
  invalid actions are set to -1e9 for sampling, log-probs and entropy, with the
  mask read from the raw observation and stored with the rollout.
* Recurrent policies keep their state per row, zeroed at episode starts; the
  state at each `bptt_horizon` segment's start is stored and training replays
  the segment from it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import sys
import time
from collections import deque

import numpy as np
import torch

from ..envs.native.batch import EpisodeStats
from ..envs.native.protocols import ObservationSlots, stat_names
from . import compiling
from . import environment
from . import torch_startup
from .advantages import compute_gae, fill_advantages
from .collect import (RolloutParts, RolloutState, SplitCollector, SyncCollector,
                      policy_step)
from .config import check_features, recheck
from .critic_states import CriticStates, global_state_width
from .encoders import standardisable, unread_images
from .kickstart import Kickstarter
from .loss import LossStats, evaluate_flat, evaluate_segments, ppo_loss
from .observations import DeviceObservationPipeline, ObservationPipeline, storage_dtype
from .policy import Policy, describe_space, observation_structure
from .resources import ResourceProbe, merge_ranks
from .storage import RolloutStorage


# More observation-encoder parameters than this are named at the start (_say_large_encoder):
# the Nature CNN on 84 x 84 frames has 1.7M, on 280 x 480 x 3 ones 57M.
LARGE_ENCODER = 10_000_000


def resolve_device(name: str) -> torch.device:
    """train.device as a torch.device; CUDA always with its index, as the device
    batch names it (envs/gpu/batch.py, `with_cuda_index`)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"train.device = {name!r} but no CUDA device is available; use "
                             "'cpu' or 'auto'")
        from ..envs.gpu.batch import with_cuda_index
        device = with_cuda_index(torch, device)
    return device


def precision_context(precision: str, device: torch.device):
    """The autocast context of the policy's forward passes: bf16 matmuls with fp32
    weights, optimizer state and losses ("bf16"), or a no-op ("fp32")."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def check_memory(config, rows: int, obs_dim: int, obs_dtype,
                 action_size: int, critic_width: int = 0) -> None:
    """MemoryError naming the settings when the rollout storage or the networks
    (a rough upper estimate) cannot fit in RAM: refused before allocating, since
    an overcommitted allocation fails only when first written (the OOM killer).
    The storage holds each observation once, in `obs_dtype` (a torch or NumPy dtype,
    observations.storage_dtype's: an image's uint8 is a quarter of float32), beside
    float32 columns: the critic's state, the actions twice (room for a teacher's labels)
    and 16 for the per-sample scalars and flags."""
    from ..envs.native.batch import physical_memory
    t, p = config.train, config.policy
    width = max(p.hidden_size, p.lstm_size if p.lstm else 0)
    per_net = (obs_dim + 64) * width + max(p.num_layers - 1, 0) * width ** 2 \
        + (8 * width ** 2 if p.lstm else 0)
    model = 2 * per_net * 4 * 4      # actor + critic; weights, gradients, Adam's two moments
    storage = t.horizon * rows * (obs_dim * obs_dtype.itemsize
                                  + (critic_width + 2 * action_size + 16) * 4)
    ram = physical_memory()
    for what, size in (("the rollout storage (train.horizon x rows)", storage),
                       ("the policy (policy.hidden_size / lstm_size / num_layers)", model)):
        if size > ram:
            raise MemoryError(f"{what} needs about {size / 2**30:,.1f} GiB, more than this "
                              f"machine's {ram / 2**30:,.1f} GiB of RAM")


def learner_threads(config, policy) -> int:
    """train.torch_threads, 0 (auto) resolved: 1 for a policy without a CNN (a small
    MLP's matmuls: a second thread waits more than it works, LunarLander trained 1.9x
    slower with 2 on 2 cores), else the cores this process may use, shared by the
    processes that train beside it on this machine (its data-parallel ranks, the
    overlap's actor): a Nature CNN over Pong's frames learned 1.8x faster with 2 on 2
    cores (docs/your_env.md, "How it runs")."""
    t = config.train
    if t.torch_threads:
        return t.torch_threads
    encoder = policy.observation_encoder
    if encoder is None or not encoder.has_images:
        return 1
    from ..vector.common import available_cores
    from .distributed import local_world_size
    sharing = local_world_size() * (2 if t.overlap else 1)
    return max(1, available_cores() // sharing)


class Trainer:
    """Owns the env batch, the policy, the optimizer and the parts of an update.

    `env` (optional) is any batch with the native interface; by default one is
    made from `config`. `teacher` (optional) is a policy object,
    callable(observations) -> actions, used instead of `train.teacher` (which
    names a scripted policy or a checkpoint) for kickstarting. Construction
    sets process-wide torch state from the config: the thread count,
    deterministic algorithms (`train.deterministic`) and the global seed
    (parameter initialisation); sampling and minibatch order use the trainer's
    own `torch.Generator`.

    `dist` (optional): this process's `distributed.DataParallel` when it is one
    rank of a data-parallel run; the hooks marked "dist hook" use it (rank
    seeds, gradient averaging, global advantage statistics, reduced records).
    """

    def __init__(self, config, env=None, teacher=None, dist=None):
        self.closed = False
        recheck(config)     # a config changed (or built) after load_config: its checks again
        t = config.train
        check_features(config, teacher_object=teacher is not None, env_object=env is not None,
                       several_ranks=dist is not None)
        self.config = config
        self.dist = dist
        self.device = resolve_device(t.device) if dist is None else dist.device
        torch.set_num_threads(t.torch_threads or 1)    # auto: learner_threads, once built
        if t.deterministic:
            torch_startup.use_deterministic_algorithms()
        torch.manual_seed(t.seed)
        self.owns_env = env is None
        if env is not None:     # the world the run records is the one that trains
            self.config = config = environment.recorded_world(config, env)
        self.env = environment.make_env(config, self._env_seed(t.seed), self.device) \
            if env is None else env
        try:
            self._setup(config, teacher)
        except BaseException:
            self.close()
            raise

    def _setup(self, config, teacher=None):
        """The run's parts, in this order (the policy's initialisation draws from the
        global torch seed): sizes, policy and optimizer, rollout parts and storage,
        the per-step and loss functions (compiled or not), counters."""
        observations, _ = self.env.reset(seed=self._env_seed(config.train.seed))
        self._size_batches(config)
        self._say_action_bounds(config)
        self._say_unread_images(config)
        critic_width = self._build_policy(config)
        self.torch_threads = learner_threads(config, self.policy)
        torch.set_num_threads(self.torch_threads)
        self._say_large_encoder()
        self._build_rollout(config, observations, critic_width, teacher)
        self._choose_functions(config)
        self._start_counters()

    def _size_batches(self, config) -> None:
        """Rows, batch sizes and the number of updates (a warning for a minibatch
        larger than the batch)."""
        t, env = config.train, self.env
        self.rows = rows = int(env.num_agents)
        self.horizon = t.horizon
        self.batch_size = rows * t.horizon
        if t.minibatch_size > self.batch_size:
            # Accepted (each epoch is then one gradient step on the whole batch), but said.
            self._say(f"train.minibatch_size ({t.minibatch_size}) is larger than the batch "
                      f"({self.batch_size} samples: {rows} rows x train.horizon {t.horizon}); "
                      f"each epoch is one gradient step on the whole batch. Set "
                      f"train.minibatch_size to at most {self.batch_size}, or raise "
                      f"vec.num_envs or train.horizon")
        # dist hook: total_steps and global_step count the samples of every rank.
        self.world_size = 1 if self.dist is None else self.dist.world_size
        self.global_batch_size = self.batch_size * self.world_size
        self.total_updates = max(1, math.ceil(t.total_steps / self.global_batch_size))

    def _say(self, warning: str) -> None:
        """A warning about the run's setup, on stderr, once (rank 0's)."""
        if getattr(self.dist, "rank", 0) == 0:
            print(f"peregrine train: warning: {warning}", file=sys.stderr, flush=True)

    def _say_action_bounds(self, config) -> None:
        """A warning for Box actions whose bounds are far from the Gaussian head's start
        (mean 0, std exp(policy.init_log_std)): actions outside the bounds are clipped,
        so a space such as [0, 10] clips about half of them to 0 and explores little."""
        space = self.env.single_action_space
        if describe_space(space)["kind"] != "box":
            return
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        centre, half = (low + high) / 2, (high - low) / 2
        odd = finite & ((np.abs(centre) > half / 2) | (half < 0.25) | (half > 20))
        if odd.any():
            index = int(np.flatnonzero(odd)[0])
            self._say(f"the Box action space's bounds [{low[index]:g}, {high[index]:g}] "
                      f"(component {index}) are far from where the Gaussian policy starts "
                      f"(mean 0, std {math.exp(config.policy.init_log_std):.3g}); actions "
                      f"outside them are clipped, so it explores little. Rescale the env's "
                      f"actions: env.wrappers = [{{name = \"RescaleAction\", min_action = "
                      f"-1.0, max_action = 1.0}}]")

    def _say_unread_images(self, config) -> None:
        """A warning for pictures the CNN cannot take, read flat by the MLP instead
        (encoders.unread_images), when the encoder is the automatic choice."""
        unread = unread_images(observation_structure(self.env))
        if unread and config.policy.encoder == "auto":
            self._say(unread)

    def _say_large_encoder(self) -> None:
        """A warning for an observation encoder of more than LARGE_ENCODER parameters:
        a CNN over big frames (PettingZoo's cooperative pong, 280 x 480 x 3, gives the
        Nature CNN 57M parameters)."""
        encoder = self.policy.observation_encoder
        if encoder is None:
            return
        count = sum(parameter.numel() for parameter in encoder.parameters())
        if count > LARGE_ENCODER:
            images = [part.shape for part in encoder.parts if hasattr(part, "convolutions")]
            self._say(f"the observation encoder has {count / 1e6:.1f}M parameters"
                      f"{f' (a CNN over images of {images[0]})' if images else ''}: updates "
                      f"will be slow and checkpoints large. Downsample the frames first: "
                      f"env.wrappers = [{{name = \"ResizeObservation\", shape = [84, 84]}}] "
                      f"for a Gymnasium env (needs OpenCV), a factory with SuperSuit's "
                      f"resize_v1 for a PettingZoo one")

    def _build_policy(self, config) -> int:
        """The policy, its optimizer and the sampling generator; returns the width of
        a centralised critic's global state column (0 for a local critic)."""
        t, p, env, device, rows = config.train, config.policy, self.env, self.device, self.rows
        # What the native batch describes (vec.split: each half's native block does): a
        # centralised critic's state column, the observation's repeated slots.
        native = env if config.vec.split == 1 or (p.critic == "local" and
                                                  p.slot_encoder == "none") \
            else environment.split_blocks(env)[0]
        critic_width = global_state_width(native, p.critic)
        slots = native.observation_slots if p.slot_encoder != "none" and \
            isinstance(native, ObservationSlots) else ()
        action_space = env.single_action_space
        observation_space = env.single_observation_space
        check_memory(config, rows, math.prod(observation_space.shape),
                     storage_dtype(t.normalize_obs, np.dtype(observation_space.dtype)),
                     math.prod(action_space.shape), critic_width)
        self.policy = policy = Policy(env.single_observation_space, action_space, p,
                                      critic_width, slots, structure=observation_structure(env)
                                      ).to(device)
        if t.normalize_obs and policy.observation_encoder is not None \
                and not standardisable(observation_structure(env)):
            raise ValueError("train.normalize_obs standardises real-valued rows, but this "
                             "env's rows hold images, uint8 or discrete values that the policy "
                             "encodes (policy.encoder); normalise Box leaves with a wrapper "
                             "instead (env.wrappers = [\"NormalizeObservation\"]) or set "
                             "policy.encoder = \"flat\"")
        # No torch._dynamo import for a trainer that never compiles (torch_startup.py).
        torch_startup.defer_dynamo_in_optimizer(torch.optim.Adam)
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=t.learning_rate,
                                          eps=t.adam_eps, fused=device.type in ("cpu", "cuda"))
        self._optimizer_step = torch_startup.step_function(self.optimizer)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(t.seed if self.dist is None else self.dist.sampling_seed(t.seed))
        return critic_width

    def _build_rollout(self, config, observations, critic_width: int, teacher) -> None:
        """The observation pipeline, collector, critic column, teacher, storage and
        the first rollout state."""
        t, p, env, device, rows = config.train, config.policy, self.env, self.device, self.rows
        policy, action_space = self.policy, env.single_action_space
        # A device batch (tensor buffers), a host batch, and a host batch split in two
        # halves (vec.split) differ in the pipeline and the collector, chosen here.
        on_device = isinstance(observations, torch.Tensor)
        mask_slice = environment.action_mask_slice(env, config.env_name, p.action_mask)
        if config.vec.split > 1:
            self.collector = SplitCollector(env, device, t, policy.obs_dim, mask_slice,
                                            critic=p.critic)
            self.pipeline = self.collector.pipeline
            self.critic_states = None       # per half (the collector's)
        else:
            pipeline = DeviceObservationPipeline if on_device else ObservationPipeline
            self.pipeline = pipeline(env, observations, device, policy.obs_dim, t, mask_slice)
            self.collector = SyncCollector(env, action_space, rows, device, on_device)
            # A centralised critic's global state column (enables the env's states).
            self.critic_states = None if not critic_width else CriticStates(env, p.critic,
                                                                            device)
        self.autocast = precision_context(t.precision, device)
        if teacher is None:
            teacher = t.teacher or None     # "" = no teacher
        self.kickstarter = None if teacher is None else Kickstarter(teacher, config, env)
        self.storage = RolloutStorage(
            t.horizon, rows, observations.shape[1:], self.pipeline.storage_dtype,
            action_space.shape, torch.float32 if policy.action_kind == "box" else torch.int64,
            device, action_dim=None if mask_slice is None else policy.action_dim,
            teacher=self.kickstarter is not None,
            lstm_size=p.lstm_size if policy.use_lstm else 0, bptt=p.bptt_horizon,
            critic_width=critic_width)
        # Feed-forward and recurrent policies differ in two places here (and in what
        # the collector stores per step).
        if policy.use_lstm:
            self._minibatches = self.storage.segment_minibatches
            self._evaluate = evaluate_segments
        else:
            self._minibatches = self.storage.flat_minibatches
            self._evaluate = evaluate_flat
        # What one rollout hands the next: every row's LSTM state and whether its
        # current observation starts an episode (the LSTM zeroes its state there).
        self.rollout_state = RolloutState.fresh(policy, rows, device)
        self.no_starts = torch.zeros(rows, dtype=torch.bool, device=device)  # bootstraps

    def _choose_functions(self, config) -> None:
        """The rollout's per-step policy work and the minibatch loss: eager, or compiled
        here once (train.compile, compiling.py); the loops call whichever was chosen."""
        t, policy = config.train, self.policy
        self.policy_step = policy_step(policy, self.autocast)
        self._minibatch_loss = self._eager_loss
        self._gae = compute_gae
        compiled = compiling.compile_trainer(self) if t.compile else None
        self.compiled = compiled is not None
        # Spent here, before the first update: outside `elapsed` and the time split.
        self.compile_seconds = 0.0 if compiled is None else compiled.seconds
        if compiled is not None:
            self.policy_step, self._minibatch_loss = compiled.policy_step, compiled.loss
            self._gae = compiled.gae

    def _start_counters(self) -> None:
        """Steps, updates, time and episodes at the start of a run (a resume loads them)."""
        env = self.env
        self.global_step = 0
        self.updates = 0
        self.elapsed = 0.0              # training seconds (rollout + learn), across resumes
        self.cpu_seconds = 0.0          # process CPU seconds in the same span
        self.episodes = 0
        self.recent_episodes: deque = deque(maxlen=256)   # (count, mean return) per update
        self.exact_resume = environment.supports_exact_resume(env)
        self.stat_names = stat_names(env)
        # Memory, CPU, GPU and time to first result, sampled once per record (resources.py).
        self.resources = ResourceProbe(self.device)

    def _env_seed(self, seed: int) -> int:
        """dist hook: the seed this process's env batch gets where one process gives `seed`."""
        return seed if self.dist is None else self.dist.env_seed(seed)

    # ---- schedules --------------------------------------------------------------------
    def learning_rate(self) -> float:
        t = self.config.train
        if not t.anneal_lr:
            return t.learning_rate
        return t.learning_rate * max(0.0, 1.0 - self.updates / self.total_updates)

    def teacher_weight(self) -> float:
        """This update's weight of the teacher term (0 without a teacher)."""
        if self.kickstarter is None:
            return 0.0
        return self.kickstarter.weight(self.global_step)

    # ---- one update -------------------------------------------------------------------
    def update(self) -> dict:
        """One rollout + learning phase; returns the metrics record for it."""
        if self.closed:
            raise RuntimeError("the trainer is closed (Trainer.close, or its `with` block "
                               "ended): make a new Trainer, or load_state_dict into one")
        t = self.config.train
        if self.exact_resume:
            environment.reseed_streams(self.env, t.seed, self.updates, self._env_seed)
        start, cpu_start = time.perf_counter(), time.process_time()
        split = self.rollout()
        learn_start = time.perf_counter()
        losses = self.learn()
        end = time.perf_counter()
        split["learn"] = end - learn_start
        self.elapsed += end - start
        self.cpu_seconds += time.process_time() - cpu_start
        self.updates += 1
        self.global_step += self.global_batch_size
        return self._record(split, losses, end - start)

    def rollout(self) -> dict:
        """Collects `horizon` steps of every row into the storage, then their advantages;
        returns the time split {"env": seconds waiting for env steps, "forward": the
        rest} (with vec.split also "env_hidden", collect.py)."""
        start = time.perf_counter()
        env_seconds = self.collect()
        if self.dist is not None:   # dist hook: the normalisers' statistics of every rank
            self.pipeline.synchronise(self.dist.gather_rows)
        self.advantages()
        return {"env": env_seconds, "forward": time.perf_counter() - start - env_seconds,
                **self.collector.time_split()}

    def collect(self) -> float:
        """`horizon` steps of every row into the storage, by the collector chosen at
        construction, from the last rollout's state to the next; returns the seconds
        the trainer waited for env steps."""
        self.rollout_state, env_seconds = self.collector.collect(
            self.rollout_parts(), self.storage, self.rollout_state)
        return env_seconds

    def rollout_parts(self) -> RolloutParts:
        """What this rollout steps with (collect.RolloutParts), from the trainer's
        parts as they are now (the teacher's labels only while its weight is > 0)."""
        label = self.kickstarter.label if self.teacher_weight() > 0 else None
        return RolloutParts(self.env, self.policy, self.policy_step, self.autocast,
                            self.generator, self.pipeline, self.critic_states, label,
                            self.config.train.gamma, self.horizon, self.no_starts)

    @torch.no_grad()
    def advantages(self) -> None:
        """GAE and returns for the collected rollout, into the storage."""
        t, state = self.config.train, self.rollout_state
        with self.autocast:
            last_value = self.policy.value(self.pipeline.current(), state.lstm, state.starts,
                                           self.current_critic_states()).float()
        fill_advantages(self.storage, last_value, t.gamma, t.gae_lambda, self._gae)

    def current_critic_states(self) -> torch.Tensor | None:
        """A centralised critic's column for every row's current state (None for a
        local critic)."""
        if not self.policy.central:
            return None
        if self.critic_states is not None:
            return self.critic_states.current()
        return self.collector.current_critic_states()

    def learn(self) -> dict:
        """`update_epochs` passes of minibatch steps; returns the losses record."""
        t = self.config.train
        self.policy.train()
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        teacher_weight = self.teacher_weight()
        # Statistics come from the last minibatch of each epoch (averaged over
        # epochs): computing them on every minibatch costs ~10% of the step.
        sums, count = torch.zeros(len(dataclasses.fields(LossStats)), device=self.device), 0
        for epoch in self.minibatches():
            if self.dist is not None and t.norm_adv:
                # dist hook: global minibatch statistics, one all-reduce per epoch.
                epoch = list(epoch)
                self.dist.advantage_statistics([batch for batch, _ in epoch],
                                               unbiased=not self.policy.use_lstm)
            stats = None
            for batch, last in epoch:
                stats = self._gradient_step(batch, teacher_weight, record=last)
            if stats is None:
                continue
            sums += stats.stacked()
            count += 1
            if t.target_kl > 0:
                kl = stats.approx_kl.item()
                if self.dist is not None:
                    kl = self.dist.mean(kl)     # dist hook: every rank stops together
                if kl > t.target_kl:
                    break
        means = LossStats.from_stacked(sums / max(count, 1))
        losses = dataclasses.asdict(means)
        self._check_finite(losses)
        teacher_loss = losses.pop("teacher_loss")
        losses["learning_rate"] = lr
        if self.kickstarter is not None:
            losses["teacher_weight"] = teacher_weight
            if teacher_weight > 0:
                losses["teacher_loss"] = teacher_loss
        return losses

    def _check_finite(self, losses: dict) -> None:
        """Stops a diverged run: once a loss or a weight is NaN/inf, every later update
        is too and the policy is lost. Raises FloatingPointError before the update is
        recorded or checkpointed, so the run directory keeps the last finite checkpoint.
        (One host read per update, beside the losses' own.)"""
        bad = [name for name, value in losses.items() if not math.isfinite(value)]
        # a NaN/inf anywhere makes the sum non-finite: two ops whatever the model
        weights = torch.cat([p.detach().reshape(-1) for p in self.policy.parameters()]).sum()
        if bad or not bool(torch.isfinite(weights)):
            what = f"non-finite {', '.join(bad)}" if bad else "non-finite weights"
            raise FloatingPointError(
                f"training diverged in update {self.updates + 1} (after {self.global_step:,} "
                f"steps): {what}. The run directory keeps its last checkpoint from before; "
                f"a lower train.learning_rate, train.max_grad_norm > 0 or train.precision "
                f"fp32 may train stably")

    def minibatches(self):
        """Per epoch, a generator of (minibatch, is the epoch's last) over the storage."""
        t = self.config.train
        return self._minibatches(t.minibatch_size, t.update_epochs, self.generator,
                                 teacher=self.teacher_weight() > 0)

    def evaluate(self, batch, entropy: bool = True):
        """The policy's `loss.Evaluation` of a minibatch (in fp32, whatever the
        forward's precision)."""
        with self.autocast:
            evaluation = self._evaluate(self.policy, batch, entropy)
        return evaluation._replace(**{
            name: value.float() for name, value in evaluation._asdict().items()
            if isinstance(value, torch.Tensor) and value.is_floating_point()})

    def _gradient_step(self, batch, teacher_weight: float = 0.0, record: bool = True):
        """One Adam step on a minibatch; with `record`, returns its LossStats."""
        t = self.config.train
        loss, stats = self._minibatch_loss(batch, teacher_weight, record)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.dist is not None:
            self.dist.average_gradients(self.policy.parameters())   # dist hook
        if t.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), t.max_grad_norm)
        self._optimizer_step()
        return stats

    def _eager_loss(self, batch, teacher_weight: float = 0.0, record: bool = True):
        """(loss to minimise, LossStats or None) of a minibatch (loss.ppo_loss)."""
        t = self.config.train
        evaluation = self.evaluate(batch, record or t.ent_coef != 0)
        return ppo_loss(evaluation, batch, t, teacher_weight, record)

    def _record(self, split: dict, losses: dict, seconds: float, stats=None) -> dict:
        """The metrics record of the update just finished; `stats` are its rollout's
        episode statistics (default: read from the env; overlap.py passes the actor's)."""
        if stats is None:
            stats = self.env.episode_stats(clear=True)
            if not isinstance(stats, EpisodeStats):
                raise TypeError(f"the env's episode_stats() returned {type(stats).__name__}; "
                                f"it must return an EpisodeStats (peregrine.envs.native.batch: "
                                f"EpisodeStats(count, mean, std), or EpisodeStats() for none)")
        resources = self.resources.sample()
        if self.dist is not None:   # dist hook: every rank's episodes, losses and memory
            stats, losses = self.dist.reduce_update(stats, losses, self.stat_names, memory=(
                resources["peak_rss_mb"] or 0.0, resources["peak_rss_total_mb"] or 0.0))
            resources = merge_ranks(resources, self.dist.rank_memory)
        self.episodes += stats.count
        if stats.count:
            self.recent_episodes.append((stats.count, stats.mean["episode_return"]))
        return {
            "global_step": self.global_step, "updates": self.updates,
            "total_updates": self.total_updates,
            "sps": self.global_step / self.elapsed if self.elapsed > 0 else 0.0,
            "update_sps": self.global_batch_size / seconds,
            "world_size": self.world_size,
            "elapsed": self.elapsed, "cpu_seconds": self.cpu_seconds, "episodes": self.episodes,
            "episodes_this_update": stats.count,
            "episode_return": stats.mean.get("episode_return"),
            "episode_length": stats.mean.get("episode_length"),
            "recent_return": self.recent_return(),
            "env_stats": {k: v for k, v in stats.mean.items()
                          if k not in ("episode_return", "episode_length")},
            "losses": losses, "time_split": split,
            "compile_seconds": self.compile_seconds,
            "resources": resources,
        }

    def recent_return(self, min_episodes: int = 20):
        """Mean return over the most recent updates' episodes, at least `min_episodes` of them
        (None until that many have finished)."""
        count, total = 0, 0.0
        for episodes, mean in reversed(self.recent_episodes):
            count += episodes
            total += episodes * mean
            if count >= min_episodes:
                return total / count
        return None

    @property
    def done(self) -> bool:
        return self.updates >= self.total_updates

    # ---- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict:
        env = self.env
        state = {
            "env_name": self.config.env_name,
            "observation_space": describe_space(env.single_observation_space),
            "action_space": describe_space(env.single_action_space),
            "config": self.config.to_dict(),
            "policy": self.policy.state_dict(),
            "critic_state_dim": self.policy.critic_state_dim,
            "observation_slots": self.policy.observation_slots,
            "observation_structure": self.policy.structure,
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "generator": self.generator.get_state(),
            "global_step": self.global_step, "updates": self.updates,
            "elapsed": self.elapsed, "cpu_seconds": self.cpu_seconds, "episodes": self.episodes,
            "recent_episodes": [list(x) for x in self.recent_episodes],
            "rows": self.rows,
            "next_starts": self.rollout_state.starts.cpu(),
            "env_state": environment.snapshot(env) if self.exact_resume else None,
            **self.pipeline.state_dict(),    # obs_normalizer, reward_scaler
        }
        if self.rollout_state.lstm is not None:
            state["lstm_state"] = [s.cpu() for s in self.rollout_state.lstm]
        return state

    def load_state_dict(self, state: dict) -> None:
        from .checkpoint import check_env_matches, check_sound
        check_sound(state, "checkpoint")
        check_env_matches(state, self.env, "checkpoint")
        if state["rows"] != self.rows:
            raise ValueError(f"checkpoint was trained with {state['rows']} rows but this run "
                             f"has {self.rows}; keep vec.num_envs when resuming")
        try:
            self.policy.load_state_dict(state["policy"])
            # torch keeps the dict's own moment tensors where device and dtype
            # already fit: a copy, so that training on does not change the caller's
            # state (an in-memory state_dict handed to two trainers, say).
            self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        except (RuntimeError, ValueError, KeyError) as error:
            raise ValueError(f"checkpoint's policy does not fit this run's [policy] config "
                             f"(keep the run's config when resuming): {error}") from None
        torch.set_rng_state(state["torch_rng"])
        self.generator.set_state(state["generator"])
        self.global_step, self.updates = int(state["global_step"]), int(state["updates"])
        self.elapsed, self.episodes = float(state["elapsed"]), int(state["episodes"])
        self.cpu_seconds = float(state.get("cpu_seconds", 0.0))
        self.recent_episodes = deque((tuple(x) for x in state["recent_episodes"]), maxlen=256)
        rollout = self.rollout_state
        rollout.starts = state["next_starts"].to(self.device)
        self.pipeline.load_state_dict(state)
        if state.get("lstm_state") is not None:
            rollout.lstm = tuple(s.to(self.device) for s in state["lstm_state"])
        if state.get("env_state") is not None and self.exact_resume:
            environment.restore(self.env, state["env_state"])
        else:
            # Fresh episodes from a seed derived from the update count.
            self.env.reset(seed=self._env_seed(
                environment.stream_seed(self.config.train.seed, self.updates)
                & 0x7FFFFFFFFFFFFFFF))
            self.rollout_state = RolloutState.fresh(self.policy, self.rows, self.device)
        self.env.episode_stats(clear=True)

    def close(self) -> None:
        self.closed = True
        collector = getattr(self, "collector", None)
        if collector is not None:       # before the env: a split half may be stepping
            collector.close()
        if self.owns_env and getattr(self, "env", None) is not None:
            self.env.close()
            self.env = None
