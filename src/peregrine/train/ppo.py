"""PPO over the env's flat row buffers.

One update = a rollout of `horizon` steps on every row, advantages for all
rows at once, then `update_epochs` passes of minibatch gradient steps.

Memory: the rollout storage (observations, actions, log-probs, values,
rewards, episode ends, live masks) is allocated once as [horizon, rows, ...]
tensors. The env's buffers are wrapped with `torch.from_numpy` once; actions
are written into a preallocated NumPy array through its torch view and that
array is what `env.step` receives. Nothing is copied per step beyond the
observation row block into storage.

Correctness points worth naming:
* Terminals and truncations stay apart. A truncated row's reward is
  increased by gamma * V(final observation) (the observation the episode was
  cut on, from `env.final_observations`), and the row is then treated as
  ended: that is exactly the bootstrapped one-step target, and GAE does not
  leak across the reset.
* GAE runs as a reverse loop over time with every row in each step
  (`compute_gae`): per step one multiply-add on a [rows] vector (NumPy on
  CPU, torch elsewhere; a C kernel would save at most the ~1-2% of an update
  this takes).
* Losses: clipped surrogate, optionally clipped value loss, entropy bonus,
  per-minibatch advantage normalisation, global gradient-norm clipping, linear
  learning-rate annealing, optional early stop on approximate KL.
* Rows whose `masks` entry is False (dead agents) are left out of the loss.
* Invalid-action masking (`policy.action_mask`, Discrete only): where the env
  declares `action_mask_slice`, each step's valid-action mask is read from the
  raw observation (before any normalisation), stored with the rollout, and the
  logits of invalid actions are set to -1e9 for sampling, log-probs and entropy.
* Optional observation normalisation and reward scaling (`train.normalize_obs`,
  `train.normalize_reward`, see normalize.py): statistics are updated from each
  step's env output; the normalised observation is written into the rollout
  storage row (never into the env's buffer), truncated rows are bootstrapped
  from V(normalised final observation), and the statistics are checkpointed.
  Off, the hot path is unchanged (one `is None` test per step).
* Kickstarting (`train.teacher`): a teacher policy (a scripted baseline such as
  Prospector's "trader", or a checkpoint) labels every observation the
  *student* visits with its own action, and the loss gains
  `w * -log pi(teacher action)` with w decaying linearly from
  `train.teacher_coef` to 0 over `train.teacher_steps` (constant when 0). The
  student still acts, so the PPO terms stay on-policy; once w reaches 0 the
  teacher is no longer called and the run is plain PPO. Samples whose teacher
  action the mask calls invalid are left out of the term.
"""
from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
import torch

from . import environment
from .normalize import ObservationNormalizer, RewardScaler
from .policy import Policy, describe_space


SCALARS = ("logprobs", "values", "advantages", "returns")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device = 'cuda' but no CUDA device is available; use 'cpu' "
                         "or 'auto'")
    return torch.device(name)


def compute_gae(rewards, values, dones, last_value, gamma: float, lam: float, out=None):
    """Generalised advantage estimates for [T, rows] tensors, all rows at once.

    `dones[t]` is True where the episode ended on step t (terminal or
    truncated; truncated rows carry their bootstrap inside `rewards`), and
    `last_value` is V of the observation after the last step.

    On CPU the reverse loop runs in NumPy on zero-copy views of the tensors:
    per time step it is one multiply-add over the rows either way, and NumPy's
    per-call overhead is a fraction of torch's (benchmarks/bench_train.py,
    `gae` part: 2-4x faster at horizon 16-32, equal at 128 x 4096). On other
    devices the same loop runs in torch.
    """
    horizon = rewards.shape[0]
    advantages = torch.empty_like(rewards) if out is None else out
    if rewards.device.type == "cpu":
        r, v, d = rewards.numpy(), values.numpy(), dones.numpy()
        last, adv = last_value.numpy(), advantages.numpy()
        not_done = 1.0 - d.astype(np.float32)
        deltas = r - v
        deltas[:-1] += np.float32(gamma) * v[1:] * not_done[:-1]
        deltas[-1] += np.float32(gamma) * last * not_done[-1]
        decay = np.float32(gamma * lam) * not_done
        adv[horizon - 1] = deltas[horizon - 1]
        for t in range(horizon - 2, -1, -1):
            np.multiply(decay[t], adv[t + 1], out=adv[t])
            adv[t] += deltas[t]
        return advantages
    not_done = 1.0 - dones.float()
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)], 0)
    deltas = rewards + gamma * next_values * not_done - values
    decay = (gamma * lam) * not_done
    advantages[horizon - 1] = deltas[horizon - 1]
    for t in range(horizon - 2, -1, -1):
        torch.addcmul(deltas[t], decay[t], advantages[t + 1], out=advantages[t])
    return advantages


def check_memory(config, rows: int, obs_dim: int) -> None:
    """MemoryError naming the settings when the rollout storage or the networks
    (a rough upper estimate) cannot fit in RAM: refused before allocating, since
    an overcommitted allocation fails only when first written (the OOM killer)."""
    from ..envs.native_env import physical_memory
    t, p = config.train, config.policy
    width = max(p.hidden_size, p.lstm_size if p.lstm else 0)
    per_net = (obs_dim + 64) * width + max(p.num_layers - 1, 0) * width ** 2 \
        + (8 * width ** 2 if p.lstm else 0)
    model = 2 * per_net * 4 * 4      # actor + critic; weights, gradients, Adam's two moments
    storage = t.horizon * rows * (2 * obs_dim + 16) * 4
    ram = physical_memory()
    for what, size in (("the rollout storage (train.horizon x rows)", storage),
                       ("the policy (policy.hidden_size / lstm_size / num_layers)", model)):
        if size > ram:
            raise MemoryError(f"{what} needs about {size / 2**30:,.1f} GiB, more than this "
                              f"machine's {ram / 2**30:,.1f} GiB of RAM")


class Trainer:
    """Owns the env batch, the policy, the optimizer and the rollout storage.

    `env` (optional) is any batch with the native interface; by default one is
    made from `config`. `teacher` (optional) is a policy object,
    callable(observations) -> actions, used instead of `train.teacher` (which
    names a scripted policy or a checkpoint) for kickstarting. Construction
    sets process-wide torch state from the config: the thread count, deterministic algorithms (`train.deterministic`)
    and the global seed (parameter initialisation); sampling and minibatch
    order use the trainer's own `torch.Generator`.
    """

    def __init__(self, config, env=None, teacher=None):
        t = config.train
        self.config = config
        self.device = resolve_device(t.device)
        torch.set_num_threads(t.torch_threads)
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(t.seed)
        self.owns_env = env is None
        self.env = environment.make_env(config) if env is None else env
        try:
            self._setup(config, teacher)
        except BaseException:
            self.close()
            raise

    def _setup(self, config, teacher=None):
        t, p = config.train, config.policy
        env, device = self.env, self.device
        observations, _ = env.reset(seed=t.seed)
        self.rows = rows = int(env.num_agents)
        self.horizon = horizon = t.horizon
        self.batch_size = rows * horizon
        self.total_updates = max(1, math.ceil(t.total_steps / self.batch_size))
        check_memory(config, rows, int(np.prod(env.single_observation_space.shape)))
        self.policy = Policy(env.single_observation_space, env.single_action_space, p).to(device)
        fused = device.type == "cpu"
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=t.learning_rate,
                                          eps=t.adam_eps, fused=fused)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(t.seed)

        # Zero-copy views of the env's buffers (rebound if a step returns others).
        self._bind_observations(observations)
        self._bind_step_buffers(getattr(env, "rewards", None), getattr(env, "terminals", None),
                                getattr(env, "truncations", None))
        self.masks_np = getattr(env, "masks", None)
        self.masks_view = None if self.masks_np is None else torch.from_numpy(self.masks_np)
        self.obs_norm = self.reward_scaler = None
        if t.normalize_obs:
            self.obs_norm = ObservationNormalizer(self.policy.obs_dim, t.obs_clip, device)
            self.obs_norm.update(observations, self._live_rows())
        if t.normalize_reward:
            self.reward_scaler = RewardScaler(rows, t.gamma, t.reward_clip)
            self._scaled_rewards = np.zeros(rows, dtype=np.float32)
            self._scaled_view = torch.from_numpy(self._scaled_rewards)
        action_space = env.single_action_space
        self.actions_np = np.zeros((rows, *action_space.shape), dtype=action_space.dtype)
        self.actions_view = torch.from_numpy(self.actions_np)
        # Invalid-action masking (policy.action_mask): the env's mask columns are read
        # from the RAW observation each step and stored, so learning replays the
        # same masked distribution that sampled the action.
        self.mask_slice = environment.action_mask_slice(env, config.env_name, p.action_mask)
        self.action_mask_buf = None
        self.action_low = self.action_high = None
        if self.policy.action_kind == "box":
            self.action_low = torch.as_tensor(action_space.low, dtype=torch.float32, device=device)
            self.action_high = torch.as_tensor(action_space.high, dtype=torch.float32, device=device)

        # Rollout storage, allocated once.
        obs_shape, obs_dtype = tuple(observations.shape[1:]), self.obs_view.dtype
        if self.obs_norm is not None:
            obs_dtype = torch.float32
        action_dtype = torch.float32 if self.policy.action_kind == "box" else torch.int64
        shape = (horizon, rows)
        self.obs_buf = torch.zeros(shape + obs_shape, dtype=obs_dtype, device=device)
        self.actions_buf = torch.zeros(shape + tuple(action_space.shape), dtype=action_dtype,
                                       device=device)
        self.logprobs_buf = torch.zeros(shape, device=device)
        self.values_buf = torch.zeros(shape, device=device)
        self.rewards_buf = torch.zeros(shape, device=device)
        self.dones_buf = torch.zeros(shape, dtype=torch.bool, device=device)
        self.starts_buf = torch.zeros(shape, dtype=torch.bool, device=device)
        self.live_buf = torch.ones(shape, dtype=torch.bool, device=device)
        self.advantages_buf = torch.zeros(shape, device=device)
        if self.mask_slice is not None:
            self.action_mask_buf = torch.ones(shape + (self.policy.action_dim,),
                                              dtype=torch.bool, device=device)
        self.returns_buf = torch.zeros(shape, device=device)
        self.teacher = self.teacher_buf = None
        if teacher is None:
            teacher = t.teacher or None     # "" = no teacher
        if teacher is not None:
            from ..evaluate import make_policy
            self.teacher = make_policy(config.env_name, teacher, env, seed=t.seed)
            self.teacher_buf = torch.zeros_like(self.actions_buf)
        # Episode starts of the current observations (the LSTM zeroes its state there).
        self.next_starts = torch.ones(rows, dtype=torch.bool, device=device)
        self.lstm_state = self.policy.initial_state(rows, device)
        if self.policy.use_lstm:
            segments = horizon // p.bptt_horizon
            self.segment_h = torch.zeros(segments, rows, p.lstm_size, device=device)
            self.segment_c = torch.zeros(segments, rows, p.lstm_size, device=device)

        self.global_step = 0
        self.updates = 0
        self.elapsed = 0.0              # training seconds (rollout + learn), across resumes
        self.cpu_seconds = 0.0          # process CPU seconds in the same span
        self.episodes = 0
        self.recent_episodes: deque = deque(maxlen=256)   # (count, mean return) per update
        self.exact_resume = environment.supports_exact_resume(env)
        self.stat_names = tuple(getattr(env, "stat_names", ("episode_return", "episode_length")))

    def _live_rows(self):
        """Boolean live-row mask (agent masks) for the normaliser, or None for all rows."""
        if self.masks_np is None or self.masks_np.all():
            return None
        return self.masks_np.astype(bool, copy=False)

    def _policy_input(self, raw: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The policy's view of env observations: normalised when train.normalize_obs."""
        raw = raw.to(self.device, non_blocking=self.device.type != "cpu")
        if self.obs_norm is None:
            return raw if out is None else out.copy_(raw)
        return self.obs_norm.normalize(raw, out)

    def _bind_observations(self, observations) -> None:
        """Views of the env's observation buffers (rebound if a step returns others)."""
        self._obs_np = observations
        self.obs_view = torch.from_numpy(observations)
        self.final_obs_view = torch.from_numpy(self.env.final_observations)

    def _bind_step_buffers(self, rewards, terminals, truncations):
        self._rewards_np = rewards
        self.rewards_view = None if rewards is None else torch.from_numpy(rewards)
        self.terminals_view = None if terminals is None else torch.from_numpy(terminals)
        self._truncations_np = truncations
        self.truncations_view = None if truncations is None else torch.from_numpy(truncations)

    # ---- one update -----------------------------------------------------------------
    def learning_rate(self) -> float:
        t = self.config.train
        if not t.anneal_lr:
            return t.learning_rate
        return t.learning_rate * max(0.0, 1.0 - self.updates / self.total_updates)

    def teacher_weight(self) -> float:
        """This update's weight of the teacher term (0 without a teacher)."""
        t = self.config.train
        if self.teacher is None:
            return 0.0
        if t.teacher_steps <= 0:
            return t.teacher_coef
        return t.teacher_coef * max(0.0, 1.0 - self.global_step / t.teacher_steps)

    def _teacher_actions(self, step: int) -> None:
        """The teacher's actions for the current raw observations, into storage."""
        actions = np.asarray(self.teacher(self.obs_view.numpy()))
        target = self.teacher_buf[step]
        if actions.shape != tuple(target.shape):
            raise ValueError(f"the teacher policy returned actions of shape {actions.shape}; "
                             f"the env's batch needs {tuple(target.shape)}")
        target.copy_(torch.from_numpy(actions))   # copy_ converts the dtype

    @torch.no_grad()
    def rollout(self) -> dict:
        """Fills the storage with `horizon` steps of every row; returns time split."""
        env, policy, device = self.env, self.policy, self.device
        gamma = self.config.train.gamma
        on_cpu = device.type == "cpu"
        use_lstm = policy.use_lstm
        bptt = self.config.policy.bptt_horizon
        env_seconds = 0.0
        start = time.perf_counter()
        state = self.lstm_state
        starts = self.next_starts
        teach = self.teacher_weight() > 0
        for step in range(self.horizon):
            obs = self.obs_buf[step]
            if self.obs_norm is None:
                obs.copy_(self.obs_view, non_blocking=not on_cpu)
            else:
                self.obs_norm.normalize(self.obs_view.to(device, non_blocking=not on_cpu), obs)
            if self.masks_view is not None:
                self.live_buf[step].copy_(self.masks_view, non_blocking=not on_cpu)
            if use_lstm:
                self.starts_buf[step] = starts
                if step % bptt == 0:
                    self.segment_h[step // bptt] = state[0]
                    self.segment_c[step // bptt] = state[1]
            action_mask = None
            if self.action_mask_buf is not None:
                action_mask = self.action_mask_buf[step]
                torch.gt(self.obs_view[:, self.mask_slice].to(device, non_blocking=not on_cpu),
                         0.5, out=action_mask)
            if teach:
                self._teacher_actions(step)
            params, values, state = policy.heads(obs, state, starts)
            actions, logprobs = policy.sample(params, self.generator, action_mask)
            self.actions_buf[step] = actions
            self.logprobs_buf[step] = logprobs
            self.values_buf[step] = values
            if self.action_low is not None:
                actions = torch.maximum(torch.minimum(actions, self.action_high), self.action_low)
            self.actions_view.copy_(actions)
            tick = time.perf_counter()
            next_obs, rewards, terminals, truncations, _infos = env.step(self.actions_np)
            env_seconds += time.perf_counter() - tick
            if rewards is not self._rewards_np or truncations is not self._truncations_np:
                self._bind_step_buffers(rewards, terminals, truncations)
            if next_obs is not self._obs_np:
                self._bind_observations(next_obs)
            done = self.dones_buf[step]
            torch.logical_or(self.terminals_view.to(device, non_blocking=not on_cpu),
                             self.truncations_view.to(device, non_blocking=not on_cpu), out=done)
            if self.obs_norm is None and self.reward_scaler is None:
                self.rewards_buf[step].copy_(self.rewards_view, non_blocking=not on_cpu)
            else:
                self._update_normalisers(next_obs, rewards, terminals, truncations, step)
            if truncations.any():
                # Bootstrap cut-off episodes from V(final observation); a row
                # flagged both ways ended for real and gets no bootstrap.
                rows = torch.from_numpy(np.flatnonzero(truncations & ~terminals)).to(device)
                final = self._policy_input(self.final_obs_view[rows.cpu()])
                if use_lstm:
                    sub_state = (state[0][rows], state[1][rows])
                    final_values = policy.value(final, sub_state, torch.zeros_like(rows, dtype=torch.bool))
                else:
                    final_values = policy.value(final)
                self.rewards_buf[step].index_add_(0, rows, gamma * final_values)
            starts = done
        self.lstm_state = state
        self.next_starts = starts.clone()
        last_value = policy.value(self._policy_input(self.obs_view), state, self.next_starts)
        compute_gae(self.rewards_buf, self.values_buf, self.dones_buf, last_value, gamma,
                    self.config.train.gae_lambda, out=self.advantages_buf)
        torch.add(self.advantages_buf, self.values_buf, out=self.returns_buf)
        total = time.perf_counter() - start
        return {"env": env_seconds, "forward": total - env_seconds}

    def _update_normalisers(self, next_obs, rewards, terminals, truncations, step) -> None:
        """Statistics from this step's env output; the (scaled) rewards into storage."""
        live = self._live_rows()
        if self.obs_norm is not None:
            self.obs_norm.update(next_obs, live)
        source = self.rewards_view
        if self.reward_scaler is not None:
            self.reward_scaler.scale(rewards, terminals | truncations, self._scaled_rewards, live)
            source = self._scaled_view
        self.rewards_buf[step].copy_(source, non_blocking=self.device.type != "cpu")

    def learn(self) -> dict:
        t = self.config.train
        policy, optimizer = self.policy, self.optimizer
        lr = self.learning_rate()
        for group in optimizer.param_groups:
            group["lr"] = lr
        if policy.use_lstm:
            batches = self._segment_batches()
        else:
            batches = self._flat_batches()
        # Statistics come from the last minibatch of each epoch (averaged over
        # epochs): computing them on every minibatch costs ~10% of the step.
        teacher_weight = self.teacher_weight()
        sums = torch.zeros(6, device=self.device)
        count = 0
        for epoch_batches in batches:
            stats = None
            for batch, last in epoch_batches:
                stats = self._gradient_step(batch, teacher_weight, record=last)
            if stats is None:
                continue
            sums += stats
            count += 1
            if t.target_kl > 0 and stats[3].item() > t.target_kl:
                break
        means = (sums / max(count, 1)).tolist()
        names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
        losses = dict(zip(names, means))
        losses["learning_rate"] = lr
        if self.teacher is not None:
            losses["teacher_weight"] = teacher_weight
            if teacher_weight > 0:
                losses["teacher_loss"] = means[5]
        return losses

    def _flat_batches(self):
        """Per epoch, a generator of minibatches of flat sample indices."""
        t = self.config.train
        live = self.live_buf.view(-1)
        candidates = None if bool(live.all()) else live.nonzero().squeeze(1)
        total = self.batch_size if candidates is None else candidates.numel()
        size = min(t.minibatch_size, max(total, 1))
        flat = self._flat_storage()

        def epoch():
            order = torch.randperm(total, generator=self.generator, device=self.device)
            if candidates is not None:
                order = candidates[order]
            for begin in range(0, total, size):
                index = order[begin:begin + size]
                batch = {"obs": flat["obs"][index], "actions": flat["actions"][index]}
                for name in ("action_mask", "teacher_actions"):
                    if name in flat:
                        batch[name] = flat[name][index]
                scalars = flat["scalars"][index]
                for column, name in enumerate(SCALARS):
                    batch[name] = scalars[:, column]
                yield batch, begin + size >= total

        return (epoch() for _ in range(t.update_epochs))

    def _flat_storage(self):
        rows = self.batch_size
        # The four per-sample scalars packed as columns: one gather per
        # minibatch instead of four.
        scalars = torch.stack([self.logprobs_buf.view(rows), self.values_buf.view(rows),
                               self.advantages_buf.view(rows), self.returns_buf.view(rows)], 1)
        flat = {
            "obs": self.obs_buf.view(rows, *self.obs_buf.shape[2:]),
            "actions": self.actions_buf.view(rows, *self.actions_buf.shape[2:]),
            "scalars": scalars,
        }
        if self.action_mask_buf is not None:
            flat["action_mask"] = self.action_mask_buf.view(rows, -1)
        if self.teacher_weight() > 0:
            flat["teacher_actions"] = self.teacher_buf.view(rows, *self.teacher_buf.shape[2:])
        return flat

    def _segment_batches(self):
        """LSTM: minibatches of whole [bptt] segments of single rows."""
        t, p = self.config.train, self.config.policy
        length = p.bptt_horizon
        segments = self.horizon // length

        def by_segment(tensor):  # [T, rows, ...] -> [segments * rows, length, ...]
            shaped = tensor.view(segments, length, self.rows, *tensor.shape[2:])
            return shaped.transpose(1, 2).reshape(segments * self.rows, length, *tensor.shape[2:])

        storage = {name: by_segment(tensor) for name, tensor in (
            ("obs", self.obs_buf), ("actions", self.actions_buf), ("logprobs", self.logprobs_buf),
            ("values", self.values_buf), ("advantages", self.advantages_buf),
            ("returns", self.returns_buf), ("starts", self.starts_buf), ("live", self.live_buf))}
        if self.action_mask_buf is not None:
            storage["action_mask"] = by_segment(self.action_mask_buf)
        if self.teacher_weight() > 0:
            storage["teacher_actions"] = by_segment(self.teacher_buf)
        storage["h"] = self.segment_h.reshape(segments * self.rows, -1)
        storage["c"] = self.segment_c.reshape(segments * self.rows, -1)
        total = segments * self.rows
        size = max(1, min(t.minibatch_size // length, total))

        def epoch():
            order = torch.randperm(total, generator=self.generator, device=self.device)
            for begin in range(0, total, size):
                index = order[begin:begin + size]
                yield {name: tensor[index] for name, tensor in storage.items()}, \
                    begin + size >= total

        return (epoch() for _ in range(t.update_epochs))

    def _evaluate(self, batch, entropy: bool = True):
        """(new log-probs, entropies or None, values, live mask or None, teacher log-probs
        or None) for a minibatch."""
        policy = self.policy
        teacher_actions = batch.get("teacher_actions")
        if not policy.use_lstm:
            params, values, _ = policy.heads(batch["obs"])
            mask = batch.get("action_mask")
            logprobs, entropy = policy.log_prob_entropy(params, batch["actions"], entropy, mask)
            teacher = None
            if teacher_actions is not None:
                teacher, _ = policy.log_prob_entropy(params, teacher_actions, False, mask)
            return logprobs, entropy, values, None, teacher
        state = (batch["h"], batch["c"])
        outputs = []
        for step in range(batch["obs"].shape[1]):
            params, values, state = policy.heads(batch["obs"][:, step], state,
                                                 batch["starts"][:, step])
            mask = batch.get("action_mask")
            mask = None if mask is None else mask[:, step]
            logprobs, step_entropy = policy.log_prob_entropy(params, batch["actions"][:, step],
                                                             mask=mask)
            teacher = None
            if teacher_actions is not None:
                teacher, _ = policy.log_prob_entropy(params, teacher_actions[:, step], False, mask)
            outputs.append((logprobs, step_entropy, values, teacher))
        logprobs, entropy, values, teacher = (
            None if x[0] is None else torch.stack(x, 1) for x in zip(*outputs))
        return logprobs, entropy, values, batch["live"], teacher

    def _gradient_step(self, batch, teacher_weight: float = 0.0, record: bool = True):
        """One Adam step on a minibatch; with `record`, returns the stacked statistics
        (policy loss, value loss, entropy, approx KL, clip fraction, teacher loss)."""
        t = self.config.train
        logprobs, entropy, values, live, teacher_lp = self._evaluate(batch,
                                                                     record or t.ent_coef != 0)
        log_ratio = logprobs - batch["logprobs"]
        ratio = log_ratio.exp()
        advantages = batch["advantages"]
        if live is not None:
            weight = live.float()
            denom = weight.sum().clamp(min=1.0)
            mean = lambda x: (x * weight).sum() / denom  # noqa: E731
        else:
            mean = torch.mean
        if t.norm_adv:
            if live is not None:
                centred = advantages - mean(advantages)
                std = mean(centred.square()).sqrt()
                advantages = centred / (std + 1e-8)
            elif advantages.numel() > 1:
                std, average = torch.std_mean(advantages)
                advantages = (advantages - average) / (std + 1e-8)
        clipped_ratio = ratio.clamp(1.0 - t.clip_coef, 1.0 + t.clip_coef)
        policy_loss = -mean(torch.minimum(advantages * ratio, advantages * clipped_ratio))
        if t.clip_vloss:
            old = batch["values"]
            clipped_values = old + (values - old).clamp(-t.clip_coef, t.clip_coef)
            value_loss = 0.5 * mean(torch.maximum((values - batch["returns"]).square(),
                                                  (clipped_values - batch["returns"]).square()))
        else:
            value_loss = 0.5 * mean((values - batch["returns"]).square())
        loss = policy_loss + t.vf_coef * value_loss
        if t.ent_coef != 0:
            loss = loss - t.ent_coef * mean(entropy)
        teacher_loss = torch.zeros((), device=values.device)
        if teacher_lp is not None:
            teacher_loss = self._teacher_loss(teacher_lp, batch, live)
            loss = loss + teacher_weight * teacher_loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if t.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), t.max_grad_norm)
        self.optimizer.step()
        if not record:
            return None
        with torch.no_grad():
            approx_kl = mean((ratio - 1.0) - log_ratio)
            clip_fraction = mean(((ratio - 1.0).abs() > t.clip_coef).float())
            return torch.stack([policy_loss.detach(), value_loss.detach(),
                                mean(entropy.detach()), approx_kl, clip_fraction,
                                teacher_loss.detach()])

    @staticmethod
    def _teacher_loss(teacher_lp, batch, live):
        """Mean -log pi(teacher action) over live samples whose teacher action is valid."""
        weight = torch.ones_like(teacher_lp)
        mask = batch.get("action_mask")
        if mask is not None:   # a forbidden action's log-prob is ~-1e9: finite, weighted 0
            weight = weight * mask.gather(-1, batch["teacher_actions"].long().unsqueeze(-1)).squeeze(-1)
        if live is not None:
            weight = weight * live
        return -(teacher_lp * weight).sum() / weight.sum().clamp(min=1.0)

    def update(self) -> dict:
        """One rollout + learning phase; returns the metrics record for it."""
        t = self.config.train
        if self.exact_resume:
            environment.reseed_streams(self.env, t.seed, self.updates)
        start, cpu_start = time.perf_counter(), time.process_time()
        split = self.rollout()
        learn_start = time.perf_counter()
        self.policy.train()
        losses = self.learn()
        end = time.perf_counter()
        split["learn"] = end - learn_start
        self.elapsed += end - start
        self.cpu_seconds += time.process_time() - cpu_start
        self.updates += 1
        self.global_step += self.batch_size
        stats = self.env.episode_stats(clear=True)
        self.episodes += stats.count
        if stats.count:
            self.recent_episodes.append((stats.count, stats.mean["episode_return"]))
        record = {
            "global_step": self.global_step, "updates": self.updates,
            "total_updates": self.total_updates,
            "sps": self.global_step / self.elapsed if self.elapsed > 0 else 0.0,
            "update_sps": self.batch_size / (end - start),
            "elapsed": self.elapsed, "cpu_seconds": self.cpu_seconds, "episodes": self.episodes,
            "episodes_this_update": stats.count,
            "episode_return": stats.mean.get("episode_return"),
            "episode_length": stats.mean.get("episode_length"),
            "recent_return": self.recent_return(),
            "env_stats": {k: v for k, v in stats.mean.items()
                          if k not in ("episode_return", "episode_length")},
            "losses": losses, "time_split": split,
        }
        return record

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
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "generator": self.generator.get_state(),
            "global_step": self.global_step, "updates": self.updates,
            "elapsed": self.elapsed, "cpu_seconds": self.cpu_seconds, "episodes": self.episodes,
            "recent_episodes": [list(x) for x in self.recent_episodes],
            "rows": self.rows,
            "next_starts": self.next_starts.cpu(),
            "env_state": environment.snapshot(env) if self.exact_resume else None,
            "obs_normalizer": None if self.obs_norm is None else self.obs_norm.state_dict(),
            "reward_scaler": None if self.reward_scaler is None else self.reward_scaler.state_dict(),
        }
        if self.lstm_state is not None:
            state["lstm_state"] = [s.cpu() for s in self.lstm_state]
        return state

    def load_state_dict(self, state: dict) -> None:
        from .checkpoint import check_env
        check_env(state, self.env, "checkpoint")
        if state["rows"] != self.rows:
            raise ValueError(f"checkpoint was trained with {state['rows']} rows but this run "
                             f"has {self.rows}; keep vec.num_envs when resuming")
        try:
            self.policy.load_state_dict(state["policy"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise ValueError(f"checkpoint's policy does not fit this run's [policy] config "
                             f"(keep the run's config when resuming): {error}") from None
        torch.set_rng_state(state["torch_rng"])
        self.generator.set_state(state["generator"])
        self.global_step, self.updates = int(state["global_step"]), int(state["updates"])
        self.elapsed, self.episodes = float(state["elapsed"]), int(state["episodes"])
        self.cpu_seconds = float(state.get("cpu_seconds", 0.0))
        self.recent_episodes = deque((tuple(x) for x in state["recent_episodes"]), maxlen=256)
        self.next_starts = state["next_starts"].to(self.device)
        for name, normaliser, key in (("obs_normalizer", self.obs_norm, "normalize_obs"),
                                      ("reward_scaler", self.reward_scaler, "normalize_reward")):
            if normaliser is None:
                continue
            if state.get(name) is None:
                raise ValueError(f"checkpoint has no {name} statistics but this run has "
                                 f"train.{key} on; keep the run's config when resuming")
            normaliser.load_state_dict(state[name])
        if state.get("lstm_state") is not None:
            self.lstm_state = tuple(s.to(self.device) for s in state["lstm_state"])
        if state.get("env_state") is not None and self.exact_resume:
            environment.restore(self.env, state["env_state"])
        else:
            # Fresh episodes from a seed derived from the update count.
            self.env.reset(seed=environment.stream_seed(self.config.train.seed, self.updates)
                           & 0x7FFFFFFFFFFFFFFF)
            self.next_starts.fill_(True)
            if self.lstm_state is not None:
                self.lstm_state = self.policy.initial_state(self.rows, self.device)
        self.env.episode_stats(clear=True)

    def close(self) -> None:
        if self.owns_env and getattr(self, "env", None) is not None:
            self.env.close()
            self.env = None
