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

`DeviceObservationPipeline` does the same jobs for a device batch, whose
buffers are already tensors on the trainer's device. Both use the same
normalisers (normalize.py); only where their statistics live differs (the
host for a NumPy batch, the device for a device batch), and their checkpoint
state is the same either way.
"""
from __future__ import annotations

import numpy as np
import torch

from ..envs.native.protocols import AgentMasks
from .normalize import ObservationNormalizer, RewardScaler


def storage_dtype(normalized: bool, observation_dtype):
    """dtype of the stored policy input: the observations' own (`observation_dtype`, a
    torch or NumPy dtype: uint8 images stay uint8), torch.float32 once `normalized`
    (train.normalize_obs)."""
    return torch.float32 if normalized else observation_dtype


class _Normalisers:
    """What both pipelines share: the optional normalisers and their checkpoint state."""

    obs_norm: ObservationNormalizer | None
    reward_scaler: RewardScaler | None
    obs_view: torch.Tensor

    def _make_normalisers(self, train_config, obs_dim: int, rows: int, device,
                          stats_device, share_with=None) -> None:
        """train.normalize_obs / normalize_reward's normalisers (None when off), their
        statistics kept on `stats_device` (where the env's buffers are). `share_with`
        (another pipeline over other rows of the same batch: vec.split's halves)
        gives this one the same statistics: its observation normaliser, and its
        reward scaler's running statistics beside this pipeline's own rows' returns."""
        t = train_config
        self.obs_norm = self.reward_scaler = None
        if t.normalize_obs:
            self.obs_norm = share_with.obs_norm if share_with is not None else \
                ObservationNormalizer(obs_dim, t.obs_clip, device, stats_device)
        if t.normalize_reward:
            self.reward_scaler = RewardScaler(rows, t.gamma, t.reward_clip, stats_device)
            if share_with is not None:
                self.reward_scaler.stats = share_with.reward_scaler.stats

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype of the stored policy input (float32 once normalised)."""
        return storage_dtype(self.obs_norm is not None, self.obs_view.dtype)

    def synchronise(self, gather) -> None:
        """Data-parallel ranks, once a rollout: every rank's normaliser statistics become
        those of all ranks' samples (RunningMeanStd.synchronise); vec.split's halves
        share one set, synchronised once here. The reward scaler's discounted returns
        are its own rows' and stay the rank's."""
        if self.obs_norm is not None:
            self.obs_norm.synchronise(gather)
        if self.reward_scaler is not None:
            self.reward_scaler.stats.synchronise(gather)

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


class ObservationPipeline(_Normalisers):
    def __init__(self, env, observations, device, obs_dim: int, train_config, mask_slice=None,
                 share_with=None):
        self.env, self.device = env, device
        self.non_blocking = device.type != "cpu"
        self.mask_slice = mask_slice
        self.bind_observations(observations)
        self.bind_step_buffers(env.rewards, env.terminals, env.truncations)
        self.masks_np = env.masks if isinstance(env, AgentMasks) else None
        self.masks_view = None if self.masks_np is None else torch.from_numpy(self.masks_np)
        rows = int(env.num_agents)
        # The statistics stay on the host, beside the env's arrays (no copy to update them).
        self._make_normalisers(train_config, obs_dim, rows, device, "cpu", share_with)
        if self.obs_norm is not None:
            self.obs_norm.update(self.obs_view, self.masks_view)
        if self.reward_scaler is not None:
            self._scaled_rewards = torch.zeros(rows, dtype=torch.float32)
            self._dones = torch.zeros(rows, dtype=torch.bool)
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
        live = self.masks_view             # the env's agent masks, or None: every row
        if self.obs_norm is not None:
            self.obs_norm.update(self.obs_view, live)
        source = self.rewards_view
        if self.reward_scaler is not None:
            torch.logical_or(self.terminals_view, self.truncations_view, out=self._dones)
            source = self.reward_scaler.scale(self.rewards_view, self._dones,
                                              self._scaled_rewards, live)
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


class DeviceObservationPipeline(_Normalisers):
    """The pipeline for a device batch (vec.backend = "device"): the env's buffers
    are already tensors on the trainer's device, so every per-step write is a
    device op on them, and nothing reads them on the host during a rollout (no
    `.item()`, `.any()`, boolean indexing or copies to NumPy). Truncated rows are
    bootstrapped with a mask instead of an index list. The interface is
    ObservationPipeline's.

    train.normalize_obs / normalize_reward keep their statistics on the device
    too and update them with sums weighted by the env's `masks` tensor (live rows
    only, whatever it holds), so they add device ops per step and no sync.
    """

    def __init__(self, env, observations, device, obs_dim: int, train_config, mask_slice=None):
        if env.observations.device != device:
            raise ValueError(f"the env's buffers are on {env.observations.device} but the "
                             f"trainer runs on {device}; make them agree")
        self.env, self.device, self.mask_slice = env, device, mask_slice
        self.obs_view, self.final_obs_view = env.observations, env.final_observations
        self.rewards, self.terminals = env.rewards, env.terminals
        self.truncations, self.masks = env.truncations, env.masks
        self._cut = torch.zeros_like(self.truncations)
        self._make_normalisers(train_config, obs_dim, int(env.num_agents), device, device)
        if self.obs_norm is not None:
            self.obs_norm.update(self.obs_view, self.masks)
        self._observers = [self._write_observation, self._write_live]
        if mask_slice is not None:
            self._observers.append(self._write_action_mask)
        normalised = self.obs_norm is not None or self.reward_scaler is not None
        self._write_rewards = self._update_normalisers if normalised else self._copy_rewards

    def observe(self, storage, step: int) -> None:
        for write in self._observers:
            write(storage, step)

    def _write_observation(self, storage, step: int) -> None:
        self.policy_input(self.obs_view, storage.obs[step])

    def _write_live(self, storage, step: int) -> None:
        storage.live[step].copy_(self.masks)

    def _write_action_mask(self, storage, step: int) -> None:
        torch.gt(self.obs_view[:, self.mask_slice], 0.5, out=storage.action_mask[step])

    def receive(self, storage, step: int, next_obs, rewards, terminals, truncations) -> None:
        """The step's episode ends and (scaled) rewards into storage row `step`, after
        the normalisers have seen its output (the buffers never move)."""
        torch.logical_or(self.terminals, self.truncations, out=storage.dones[step])
        self._write_rewards(storage, step)

    def _copy_rewards(self, storage, step: int) -> None:
        storage.rewards[step].copy_(self.rewards)

    def _update_normalisers(self, storage, step: int) -> None:
        """Statistics from this step's env output (live rows by mask); the (scaled)
        rewards into storage. Device ops only."""
        if self.obs_norm is not None:
            self.obs_norm.update(self.obs_view, self.masks)
        if self.reward_scaler is None:
            self._copy_rewards(storage, step)
        else:
            self.reward_scaler.scale(self.rewards, storage.dones[step], storage.rewards[step],
                                     self.masks)

    def policy_input(self, raw: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The policy's view of env observations: normalised when train.normalize_obs."""
        if self.obs_norm is None:
            return raw if out is None else out.copy_(raw)
        return self.obs_norm.normalize(raw, out)

    def current(self) -> torch.Tensor:
        return self.policy_input(self.obs_view)

    def bootstrap(self, storage, step: int, value, gamma: float) -> None:
        """rewards += gamma * V(final observation) on rows cut by truncation only,
        computed for every row and masked (no host sync)."""
        torch.logical_and(self.truncations, torch.logical_not(self.terminals), out=self._cut)
        values = value(self.policy_input(self.final_obs_view), None)
        storage.rewards[step].addcmul_(values, self._cut, value=gamma)
