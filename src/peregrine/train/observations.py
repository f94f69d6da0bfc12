"""The observation pipeline: from the env's host buffers to the rollout storage.

`ObservationPipeline` owns everything between `env.step` and the policy:

* zero-copy torch views of the env's buffers (observations, final
  observations, rewards, terminals, truncations, agent masks), rebound when a
  step hands back different arrays (`receive`);
* the policy's input: the raw observation copied into the storage row, or,
  with `train.normalize_obs`, normalised into it (`ObservationNormalizer`);
* the live-row (agent mask) column and the invalid-action mask columns read
  from the RAW observation (`policy.action_mask`), so learning replays the
  same masked distribution that sampled the action;
* the stored reward, scaled by `RewardScaler` with `train.normalize_reward`;
* the normalisers' statistics, updated from each step's env output before it
  reaches the policy, and their checkpoint state.

Which of these run is decided once, at construction: the per-step methods
call a list of bound writers and never test the configuration.
"""
from __future__ import annotations

import numpy as np
import torch

from .normalize import ObservationNormalizer, RewardScaler


class ObservationPipeline:
    def __init__(self, env, observations, device, obs_dim: int, train_config, mask_slice=None):
        t = train_config
        self.env, self.device = env, device
        self.non_blocking = device.type != "cpu"
        self.mask_slice = mask_slice
        self.bind_observations(observations)
        self.bind_step_buffers(getattr(env, "rewards", None), getattr(env, "terminals", None),
                               getattr(env, "truncations", None))
        self.masks_np = getattr(env, "masks", None)
        self.masks_view = None if self.masks_np is None else torch.from_numpy(self.masks_np)
        rows = int(env.num_agents)
        self.obs_norm = self.reward_scaler = None
        if t.normalize_obs:
            self.obs_norm = ObservationNormalizer(obs_dim, t.obs_clip, device)
            self.obs_norm.update(observations, self.live_rows())
        if t.normalize_reward:
            self.reward_scaler = RewardScaler(rows, t.gamma, t.reward_clip)
            self._scaled_rewards = np.zeros(rows, dtype=np.float32)
            self._scaled_view = torch.from_numpy(self._scaled_rewards)
        # The per-step writers this configuration needs, chosen once.
        self._observers = [self._write_observation]
        if self.masks_view is not None:
            self._observers.append(self._write_live)
        if mask_slice is not None:
            self._observers.append(self._write_action_mask)
        self._receivers = [self._write_dones]
        if self.obs_norm is None and self.reward_scaler is None:
            self._receivers.append(self._write_rewards)
        else:
            self._receivers.append(self._update_normalisers)

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype of the stored policy input (float32 once normalised)."""
        return torch.float32 if self.obs_norm is not None else self.obs_view.dtype

    # ---- env buffers ------------------------------------------------------------------
    def bind_observations(self, observations) -> None:
        """Views of the env's observation buffers (rebound if a step returns others)."""
        self._obs_np = observations
        self.obs_view = torch.from_numpy(observations)
        self.final_obs_view = torch.from_numpy(self.env.final_observations)

    def bind_step_buffers(self, rewards, terminals, truncations) -> None:
        self._rewards_np, self._terminals_np, self._truncations_np = rewards, terminals, truncations
        self.rewards_view = None if rewards is None else torch.from_numpy(rewards)
        self.terminals_view = None if terminals is None else torch.from_numpy(terminals)
        self.truncations_view = None if truncations is None else torch.from_numpy(truncations)

    def live_rows(self):
        """Boolean live-row mask (agent masks) for the normalisers, or None for all rows."""
        if self.masks_np is None or self.masks_np.all():
            return None
        return self.masks_np.astype(bool, copy=False)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=self.non_blocking)

    # ---- per step ---------------------------------------------------------------------
    def observe(self, storage, step: int) -> None:
        """The current observation's columns into storage row `step`: policy input,
        live rows, valid-action mask."""
        for write in self._observers:
            write(storage, step)

    def _write_observation(self, storage, step: int) -> None:
        self.policy_input(self.obs_view, storage.obs[step])

    def _write_live(self, storage, step: int) -> None:
        storage.live[step].copy_(self.masks_view, non_blocking=self.non_blocking)

    def _write_action_mask(self, storage, step: int) -> None:
        torch.gt(self._to_device(self.obs_view[:, self.mask_slice]), 0.5,
                 out=storage.action_mask[step])

    def receive(self, storage, step: int, next_obs, rewards, terminals, truncations) -> None:
        """A step's env output: rebinds moved buffers, writes the episode ends and the
        (scaled) rewards into storage row `step`, updates the normalisers."""
        if (rewards is not self._rewards_np or terminals is not self._terminals_np
                or truncations is not self._truncations_np):
            self.bind_step_buffers(rewards, terminals, truncations)
        if next_obs is not self._obs_np:
            self.bind_observations(next_obs)
        for write in self._receivers:
            write(storage, step)

    def _write_dones(self, storage, step: int) -> None:
        torch.logical_or(self._to_device(self.terminals_view),
                         self._to_device(self.truncations_view), out=storage.dones[step])

    def _write_rewards(self, storage, step: int) -> None:
        storage.rewards[step].copy_(self.rewards_view, non_blocking=self.non_blocking)

    def _update_normalisers(self, storage, step: int) -> None:
        """Statistics from this step's env output; the (scaled) rewards into storage."""
        live = self.live_rows()
        if self.obs_norm is not None:
            self.obs_norm.update(self._obs_np, live)
        source = self.rewards_view
        if self.reward_scaler is not None:
            dones = self._terminals_np | self._truncations_np
            self.reward_scaler.scale(self._rewards_np, dones, self._scaled_rewards, live)
            source = self._scaled_view
        storage.rewards[step].copy_(source, non_blocking=self.non_blocking)

    # ---- policy input -----------------------------------------------------------------
    def policy_input(self, raw: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The policy's view of env observations: normalised when train.normalize_obs."""
        raw = self._to_device(raw)
        if self.obs_norm is None:
            return raw if out is None else out.copy_(raw)
        return self.obs_norm.normalize(raw, out)

    def current(self) -> torch.Tensor:
        """The policy input of the env's current observations."""
        return self.policy_input(self.obs_view)

    def bootstrap(self, storage, step: int, value, gamma: float) -> None:
        """rewards += gamma * V(final observation) on the rows the last step cut by
        truncation (not also terminal). `value(inputs, rows)` evaluates the critic on
        the policy inputs of those rows (a device index tensor)."""
        truncations = self._truncations_np
        if not truncations.any():
            return
        rows = torch.from_numpy(np.flatnonzero(truncations & ~self._terminals_np))
        final = self.policy_input(self.final_obs_view[rows])
        rows = rows.to(self.device)
        storage.rewards[step].index_add_(0, rows, gamma * value(final, rows))

    # ---- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"obs_normalizer": None if self.obs_norm is None else self.obs_norm.state_dict(),
                "reward_scaler": None if self.reward_scaler is None
                else self.reward_scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for name, normaliser, key in (("obs_normalizer", self.obs_norm, "normalize_obs"),
                                      ("reward_scaler", self.reward_scaler, "normalize_reward")):
            if normaliser is None:
                continue
            if state.get(name) is None:
                raise ValueError(f"checkpoint has no {name} statistics but this run has "
                                 f"train.{key} on; keep the run's config when resuming")
            normaliser.load_state_dict(state[name])


class DeviceObservationPipeline:
    """The pipeline for a device batch (vec.backend = "device"): the env's buffers
    are already tensors on the trainer's device, so every per-step write is a
    device op on them, and nothing reads them on the host during a rollout (no
    `.item()`, `.any()`, boolean indexing or copies to NumPy). Truncated rows are
    bootstrapped with a mask instead of an index list. The interface is
    ObservationPipeline's.

    Not available here yet: train.normalize_obs / normalize_reward, whose running
    statistics are float64 NumPy on the host.
    """

    def __init__(self, env, observations, device, obs_dim: int, train_config, mask_slice=None):
        if train_config.normalize_obs or train_config.normalize_reward:
            raise ValueError("train.normalize_obs and train.normalize_reward are not available "
                             "with vec.backend = 'device' (their statistics live on the host); "
                             "turn them off or use vec.backend = 'native'")
        if env.observations.device != device:
            raise ValueError(f"the env's buffers are on {env.observations.device} but the "
                             f"trainer runs on {device}; make them agree")
        self.env, self.device, self.mask_slice = env, device, mask_slice
        self.obs_view, self.final_obs_view = env.observations, env.final_observations
        self.rewards, self.terminals = env.rewards, env.terminals
        self.truncations, self.masks = env.truncations, env.masks
        self._cut = torch.zeros_like(self.truncations)
        self._observers = [self._write_observation, self._write_live]
        if mask_slice is not None:
            self._observers.append(self._write_action_mask)

    @property
    def storage_dtype(self) -> torch.dtype:
        return self.obs_view.dtype

    def observe(self, storage, step: int) -> None:
        for write in self._observers:
            write(storage, step)

    def _write_observation(self, storage, step: int) -> None:
        storage.obs[step].copy_(self.obs_view)

    def _write_live(self, storage, step: int) -> None:
        storage.live[step].copy_(self.masks)

    def _write_action_mask(self, storage, step: int) -> None:
        torch.gt(self.obs_view[:, self.mask_slice], 0.5, out=storage.action_mask[step])

    def receive(self, storage, step: int, next_obs, rewards, terminals, truncations) -> None:
        torch.logical_or(terminals, truncations, out=storage.dones[step])
        storage.rewards[step].copy_(rewards)

    def policy_input(self, raw: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return raw if out is None else out.copy_(raw)

    def current(self) -> torch.Tensor:
        return self.obs_view

    def bootstrap(self, storage, step: int, value, gamma: float) -> None:
        """rewards += gamma * V(final observation) on rows cut by truncation only,
        computed for every row and masked (no host sync)."""
        torch.logical_and(self.truncations, torch.logical_not(self.terminals), out=self._cut)
        values = value(self.final_obs_view, None)
        storage.rewards[step].addcmul_(values, self._cut, value=gamma)

    def state_dict(self) -> dict:
        return {"obs_normalizer": None, "reward_scaler": None}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore (no normalisers on this path)."""
