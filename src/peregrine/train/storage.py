"""Rollout storage: every per-step quantity of one update, allocated once.

All tensors are [horizon, rows, ...] on the trainer's device and are written
in place step by step (`record`), then read by the learner as minibatches:

* `flat_minibatches`: per epoch, a random permutation of the live samples
  (rows whose agent mask was True), cut into minibatches of `size` samples;
* `segment_minibatches` (recurrent policies): per epoch, a random permutation
  of whole `bptt`-step segments of single rows, each with the LSTM state saved
  at its first step (`record_state`), cut into minibatches of
  `size // bptt` segments. Their columns are time-major, [bptt, segments, ...]
  (the fused LSTM's layout: no transposes around it), the states [segments, ...].

Optional columns exist only when their feature is on: `action_mask` (the
valid-action mask the sampling used), `teacher_actions` (kickstarting labels),
`segment_h` / `segment_c` (LSTM), `critic_states` (a centralised critic's global
state column, critic_states.py). Minibatches are dicts of tensors keyed by
column name; the learner reads only the keys it needs.
"""
from __future__ import annotations

import copy

import torch

# The four per-sample scalars packed as columns of one tensor per update:
# one gather per minibatch instead of four.
SCALARS = ("logprobs", "values", "advantages", "returns")


class RolloutStorage:
    def __init__(self, horizon: int, rows: int, obs_shape, obs_dtype, action_shape, action_dtype,
                 device, action_dim: int | None = None, teacher: bool = False,
                 lstm_size: int = 0, bptt: int = 0, critic_width: int = 0):
        self.horizon, self.rows, self.device = horizon, rows, device
        self.size = horizon * rows
        shape = (horizon, rows)
        self.obs = torch.zeros(shape + tuple(obs_shape), dtype=obs_dtype, device=device)
        self.actions = torch.zeros(shape + tuple(action_shape), dtype=action_dtype, device=device)
        self.logprobs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=device)
        self.starts = torch.zeros(shape, dtype=torch.bool, device=device)
        self.live = torch.ones(shape, dtype=torch.bool, device=device)
        self.advantages = torch.zeros(shape, device=device)
        self.returns = torch.zeros(shape, device=device)
        self.action_mask = None if action_dim is None else torch.ones(
            shape + (action_dim,), dtype=torch.bool, device=device)
        self._step_masks = [None] * horizon if self.action_mask is None else list(self.action_mask)
        self.teacher_actions = torch.zeros_like(self.actions) if teacher else None
        self.critic_states = None if not critic_width else torch.zeros(
            shape + (critic_width,), device=device)
        self.bptt = bptt
        self.segment_h = self.segment_c = None
        if lstm_size:
            segments = horizon // bptt
            self.segment_h = torch.zeros(segments, rows, lstm_size, device=device)
            self.segment_c = torch.zeros(segments, rows, lstm_size, device=device)

    def row_block(self, begin: int, end: int) -> "RolloutStorage":
        """Rows [begin, end) of every column as a storage of views: its `record`,
        `record_state`, `step_mask` and column writes land in this storage. For
        collectors that step blocks of rows separately (collect.SplitCollector);
        learning reads the whole storage, never a block (its minibatch views need
        contiguous columns). Every tensor here is [steps or segments, rows, ...],
        so one slice along dim 1 covers every column, optional ones included."""
        block = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(block, name, value[:, begin:end])
        block.rows, block.size = end - begin, self.horizon * (end - begin)
        block._step_masks = [None] * self.horizon if block.action_mask is None \
            else list(block.action_mask)
        return block

    def record(self, step: int, actions, logprobs, values) -> None:
        """The policy's output for step `step`."""
        self.actions[step] = actions
        self.logprobs[step] = logprobs
        self.values[step] = values

    def step_mask(self, step: int):
        """Row `step` of the valid-action mask, or None without masking."""
        return self._step_masks[step]

    def step_critic_states(self, step: int):
        """Row `step` of the global state column, or None for a local critic."""
        return None if self.critic_states is None else self.critic_states[step]

    def record_state(self, step: int, state, starts) -> None:
        """Recurrent policies: the episode starts of step `step`, and the LSTM state
        where a segment begins (training replays each segment from it)."""
        self.starts[step] = starts
        if step % self.bptt == 0:
            self.segment_h[step // self.bptt] = state[0]
            self.segment_c[step // self.bptt] = state[1]

    # ---- minibatches ----------------------------------------------------------------
    def _optional(self, teacher: bool):
        """(name, tensor) of the optional columns a minibatch carries."""
        columns = []
        if self.action_mask is not None:
            columns.append(("action_mask", self.action_mask))
        if teacher:
            columns.append(("teacher_actions", self.teacher_actions))
        if self.critic_states is not None:
            columns.append(("critic_states", self.critic_states))
        return columns

    def flat_minibatches(self, size: int, epochs: int, generator, teacher: bool = False):
        """Per epoch, a generator of (minibatch, is the epoch's last) over the live samples."""
        n = self.size
        live = self.live.view(-1)
        candidates = None if bool(live.all()) else live.nonzero().squeeze(1)
        total = n if candidates is None else candidates.numel()
        size = min(size, max(total, 1))
        flat = {"obs": self.obs.view(n, *self.obs.shape[2:]),
                "actions": self.actions.view(n, *self.actions.shape[2:])}
        for name, tensor in self._optional(teacher):
            flat[name] = tensor.view(n, *tensor.shape[2:])
        scalars = torch.stack([getattr(self, name).view(n) for name in SCALARS], 1)

        def epoch():
            order = torch.randperm(total, generator=generator, device=self.device)
            if candidates is not None:
                order = candidates[order]
            for begin in range(0, total, size):
                index = order[begin:begin + size]
                batch = {name: tensor[index] for name, tensor in flat.items()}
                picked = scalars[index]
                for column, name in enumerate(SCALARS):
                    batch[name] = picked[:, column]
                yield batch, begin + size >= total

        return (epoch() for _ in range(epochs))

    def segment_minibatches(self, size: int, epochs: int, generator, teacher: bool = False):
        """Per epoch, a generator of (minibatch of whole segments, is the epoch's last)."""
        length, rows = self.bptt, self.rows
        segments = self.horizon // length

        def by_segment(tensor):  # [T, rows, ...] -> [length, segments * rows, ...]
            shaped = tensor.view(segments, length, rows, *tensor.shape[2:])
            return shaped.transpose(0, 1).reshape(length, segments * rows, *tensor.shape[2:])

        columns = [("obs", self.obs), ("actions", self.actions)]
        columns += [(name, getattr(self, name)) for name in SCALARS]
        columns += [("starts", self.starts), ("live", self.live)] + self._optional(teacher)
        storage = {name: by_segment(tensor) for name, tensor in columns}
        h = self.segment_h.reshape(segments * rows, -1)
        c = self.segment_c.reshape(segments * rows, -1)
        total = segments * rows
        size = max(1, min(size // length, total))

        def epoch():
            order = torch.randperm(total, generator=generator, device=self.device)
            for begin in range(0, total, size):
                index = order[begin:begin + size]
                # index_select, not tensor[:, index]: 4x faster on the CPU along dim 1.
                batch = {name: tensor.index_select(1, index) for name, tensor in storage.items()}
                batch["h"], batch["c"] = h.index_select(0, index), c.index_select(0, index)
                yield batch, begin + size >= total

        return (epoch() for _ in range(epochs))
