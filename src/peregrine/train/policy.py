"""Policies: an MLP actor and critic, with the action head chosen by the space.

    Discrete(n)         categorical over n logits
    MultiDiscrete(nvec) one categorical per component, log-probs summed
    Box(d)              diagonal Gaussian: a mean per dimension and a learned,
                        state-independent log standard deviation

Without an LSTM the actor and the critic are separate MLPs (sharing a trunk
makes the value loss fight the policy on small problems). With
`policy.lstm = true` one encoder MLP feeds an LSTM whose state is kept per
row: it is zeroed where a row's episode just started and carried across the
rollout; training replays each row in segments of `bptt_horizon` steps from
the state saved at the segment's start (truncated backprop through time).

The LSTM is one `nn.LSTM` module (one set of weights, one state dict). The
rollout advances it one step at a time (`heads`); training replays whole
segments with fused multi-step calls (`replay`, exact): on the CPU, forward and
backward over DroneSwarm's minibatches (512 segments of 16 steps) take half
the time of the LSTM cell stepped in a Python loop.

The critic (`policy.critic`):
    "local"   reads what the actor reads (its own row), as above;
    "global"  a separate MLP over the env's global state of the row's instance,
              a one-hot of the agent's index in it, and the row's own (policy
              input) observation: MAPPO's agent-specific global state;
    "state"   a separate MLP over the global state alone (the same value for
              every agent of an instance).
Why "global" is agent-specific: DroneSwarm pays each drone its own reward (its
exploration, dispersion, owner credit), so one state has as many values as
drones; the state alone cannot say whose return is asked for. Yu et al. (MAPPO)
found the agent-specific state as good as or better than the state alone. The
global state column is assembled by the trainer (train/critic_states.py: state
and agent id, [rows, critic_state_dim]); the policy appends the observation.
With the LSTM the critic stays feed-forward (the global state is what memory
stands in for); the actor is unchanged in every mode, so `act` (evaluation,
rendering) never needs a state.

Slot encoder (`policy.slot_encoder = "deepsets"`): where the env describes
repeated slots in its observation (`observation_slots`: DroneSwarm's detection
and obstacle slots, each group a number of same-shaped slots), the actor's (and
a local critic's) first layers see each group through a Deep Sets encoder: one
small MLP applied to every slot, zeroed for an empty (all-zero) slot, and
summed over the group, beside the other columns as they are. The sum does not
depend on the order of the slots, so neither does the policy (the env's
nearest-first order is kept only as the information in each slot's values).

Sampling takes a `torch.Generator`, so a seeded run draws the same actions on
every run; log-probabilities and entropies are written out by hand rather than
through `torch.distributions`, which costs several microseconds per call in
validation and object creation on the rollout's hot path.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.utils.deterministic
from gymnasium import spaces
from torch import nn

from ..envs.native.protocols import StructuredRows
from .encoders import build_encoder, describe_structure

LOG_2PI = math.log(2.0 * math.pi)
# Logit given to invalid actions: exp() of it underflows to exactly 0, and
# 0 * (-1e9) stays 0 in the entropy (unlike -inf or finfo.min, which give NaN).
MASKED_LOGIT = -1e9


def mask_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Logits with invalid actions (`mask` False) set to MASKED_LOGIT. A row with no
    valid action is left unmasked rather than turned into NaNs."""
    if mask is None:
        return logits
    mask = mask | ~mask.any(-1, keepdim=True)
    return logits.masked_fill(~mask, MASKED_LOGIT)


def describe_space(space) -> dict:
    """A plain-data description of a space, stored in checkpoints to detect mismatches."""
    if isinstance(space, spaces.Discrete):
        return {"kind": "discrete", "n": int(space.n)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"kind": "multidiscrete", "nvec": [int(n) for n in np.asarray(space.nvec).ravel()]}
    if isinstance(space, spaces.Box):
        return {"kind": "box", "shape": [int(s) for s in space.shape], "dtype": str(space.dtype)}
    raise ValueError(f"unsupported space {space!r}; Peregrine policies take Discrete, "
                     f"MultiDiscrete or Box")


def observation_structure(env):
    """The env's own observation space behind its flat rows (an emulated env's), or None."""
    return env.structured_observation_space if isinstance(env, StructuredRows) else None


@contextlib.contextmanager
def _workspace_unfilled():
    """Lets torch.empty skip its NaN fill while the fused LSTM runs with gradients.

    The trainer turns on `torch.use_deterministic_algorithms`, which also makes
    every `torch.empty` write NaNs into its memory first. The CPU (oneDNN) LSTM
    allocates its backward workspace that way on every call, about 4 KB per
    sample for a 64-unit LSTM, and the fill was 7% of DroneSwarm's learning
    phase. The kernel writes the workspace before it reads it, so the fill only
    costs time; results are unchanged (the equivalence and resume tests check).
    """
    previous = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = previous


def layer_init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class SlotEncoder(nn.Module):
    """Deep Sets over an observation's repeated slots (module docstring).

    `slots`: ((name, first column, count, width), ...), groups that do not
    overlap. Output: the columns outside every group, in order, then per group
    sum over its non-empty slots of phi(slot) ([..., size]); phi is one layer
    with the policy's activation, one per group."""

    def __init__(self, obs_dim: int, slots, size: int, activation: str):
        super().__init__()
        self.groups = [(int(first), int(count), int(width)) for _, first, count, width in slots]
        covered = set()
        for name, first, count, width in slots:
            columns = set(range(int(first), int(first) + int(count) * int(width)))
            if not columns or min(columns) < 0 or max(columns) >= obs_dim or columns & covered:
                raise ValueError(f"observation slot group {name!r} ({count} x {width} from "
                                 f"column {first}) must lie inside the {obs_dim} observation "
                                 f"columns and not overlap another group")
            covered |= columns
        self.register_buffer("rest", torch.tensor(
            [c for c in range(obs_dim) if c not in covered], dtype=torch.long), persistent=False)
        self.phis = nn.ModuleList(mlp(width, size, 1, activation)[0]
                                  for _, _, width in self.groups)
        self.out_dim = len(self.rest) + size * len(self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x.index_select(-1, self.rest)]
        for (first, count, width), phi in zip(self.groups, self.phis):
            slots = x[..., first:first + count * width].unflatten(-1, (count, width))
            present = (slots != 0).any(-1, keepdim=True).to(x.dtype)
            parts.append((phi(slots) * present).sum(-2))
        return torch.cat(parts, -1)


def body(in_size: int, hidden: int, layers: int, activation: str, slots=(),
         slot_size: int = 0) -> tuple[nn.Module, int]:
    """An MLP, behind a SlotEncoder when `slots` are given (policy.slot_encoder)."""
    if not slots:
        return mlp(in_size, hidden, layers, activation)
    encoder = SlotEncoder(in_size, slots, slot_size, activation)
    network, size = mlp(encoder.out_dim, hidden, layers, activation)
    return nn.Sequential(encoder, network), size


def mlp(in_size: int, hidden: int, layers: int, activation: str) -> tuple[nn.Module, int]:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    modules: list[nn.Module] = []
    size = in_size
    for _ in range(layers):
        modules += [layer_init(nn.Linear(size, hidden), math.sqrt(2.0)), act()]
        size = hidden
    return nn.Sequential(*modules), size


CRITICS = ("local", "global", "state")


class Policy(nn.Module):
    def __init__(self, observation_space, action_space, config, critic_state_dim: int = 0,
                 observation_slots=(), structure=None):
        """`critic_state_dim`: width of the global state column a "global" / "state"
        critic reads (critic_states.py); 0 for a local critic. `observation_slots`:
        the env's repeated observation slots, read with policy.slot_encoder.
        `structure`: the env's own observation space that the flat rows encode (an
        emulated env's `structured_observation_space`): its images, Dict/Tuple keys
        and discrete leaves get encoders (encoders.py, policy.encoder)."""
        super().__init__()
        self.observation_space_desc = describe_space(observation_space)
        self.action_space_desc = describe_space(action_space)
        if self.observation_space_desc["kind"] != "box" or len(observation_space.shape) != 1:
            raise ValueError(f"observations must be a flat Box, got {observation_space!r}")
        self.obs_dim = int(observation_space.shape[0])
        self.obs_scale = 1.0 / 255.0 if observation_space.dtype == np.uint8 else None
        self.observation_encoder = build_encoder(structure, config.encoder)
        self.structure = describe_structure(structure if self.observation_encoder else None)
        features = self.obs_dim
        if self.observation_encoder is not None:
            if self.observation_encoder.in_dim != self.obs_dim:
                raise ValueError(f"the observation structure {structure!r} flattens to "
                                 f"{self.observation_encoder.in_dim} columns, but the rows "
                                 f"have {self.obs_dim}")
            if config.slot_encoder != "none":
                raise ValueError("policy.slot_encoder reads a native env's observation slots; "
                                 "this env's structured observations have their own encoder")
            self.obs_scale = None           # the encoder scales its uint8 leaves
            features = self.observation_encoder.out_dim
        kind = self.action_space_desc["kind"]
        self.action_kind = kind
        if kind == "discrete":
            self.nvec = [self.action_space_desc["n"]]
            out = self.nvec[0]
        elif kind == "multidiscrete":
            self.nvec = self.action_space_desc["nvec"]
            out = sum(self.nvec)
        else:
            if len(action_space.shape) != 1:
                raise ValueError(f"Box actions must be flat, got shape {action_space.shape}")
            self.nvec = []
            out = int(action_space.shape[0])
        self.action_dim = out
        self.use_lstm = bool(config.lstm)
        hidden, layers, activation = config.hidden_size, config.num_layers, config.activation
        self.critic_kind = config.critic
        if self.critic_kind not in CRITICS:
            raise ValueError(f"policy.critic must be one of {list(CRITICS)}, got "
                             f"{self.critic_kind!r}")
        self.central = self.critic_kind != "local"
        if self.central != (critic_state_dim > 0):
            raise ValueError(f"policy.critic = {self.critic_kind!r} needs "
                             f"{'a' if self.central else 'no'} global state column, got width "
                             f"{critic_state_dim}")
        self.critic_state_dim = int(critic_state_dim)
        encoder = config.slot_encoder
        if encoder == "deepsets" and not observation_slots:
            raise ValueError("policy.slot_encoder = 'deepsets' needs an env that describes "
                             "repeated observation slots (observation_slots, e.g. DroneSwarm "
                             "with obs_n_nearest or obs_n_obstacles > 0); this one has none")
        self.observation_slots = [list(group) for group in observation_slots] \
            if encoder == "deepsets" else []
        slots = dict(slots=self.observation_slots, slot_size=config.slot_size)
        if self.use_lstm:
            self.encoder, size = body(features, hidden, max(layers, 1), activation, **slots)
            self.lstm = nn.LSTM(size, config.lstm_size)
            for name, parameter in self.lstm.named_parameters():
                if "bias" in name:
                    nn.init.zeros_(parameter)
                else:
                    nn.init.orthogonal_(parameter, 1.0)
            self.lstm_size = config.lstm_size
            actor_in = critic_in = config.lstm_size
            self.actor_body = self.critic_body = None
        else:
            self.actor_body, actor_in = body(features, hidden, layers, activation, **slots)
            self.critic_body = None
            if not self.central:
                self.critic_body, critic_in = body(features, hidden, layers, activation,
                                                   **slots)
            self.lstm_size = 0
        self.critic_slots = None
        if self.central:    # its own MLP over the global state (+ the observation)
            own = features if self.critic_kind == "global" else 0
            if own and self.observation_slots:      # the observation's slots as the actor's
                self.critic_slots = SlotEncoder(self.obs_dim, self.observation_slots,
                                                slots["slot_size"], activation)
                own = self.critic_slots.out_dim
            self.critic_body, critic_in = mlp(critic_state_dim + own, hidden, max(layers, 1),
                                              activation)
        self.actor_head = layer_init(nn.Linear(actor_in, out), 0.01)
        self.critic_head = layer_init(nn.Linear(critic_in, 1), 1.0)
        if kind == "box":
            self.log_std = nn.Parameter(torch.full((out,), float(config.init_log_std)))
        if config.init == "torch":
            for module in self.modules():   # every layer back to PyTorch's own default
                if module is not self and hasattr(module, "reset_parameters"):
                    module.reset_parameters()

    # ---- features --------------------------------------------------------------
    def _input(self, observations: torch.Tensor) -> torch.Tensor:
        """The features actor and critic read: the row (uint8 scaled to [0, 1]), or
        the observation encoder's output (images, Dict/Tuple, discrete leaves)."""
        x = observations.float() if observations.dtype != torch.float32 else observations
        if self.observation_encoder is not None:
            return self.observation_encoder(x)
        return x * self.obs_scale if self.obs_scale is not None else x

    def initial_state(self, rows: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.use_lstm:
            return None
        zeros = torch.zeros(rows, self.lstm_size, device=device)
        return zeros, zeros.clone()

    def _core(self, x, state, starts):
        """LSTM step on policy inputs `x`: zero the state where an episode starts,
        then advance it."""
        keep = (~starts).unsqueeze(1)
        h, c = (s * keep.to(s.dtype) for s in state)
        features, lstm = self.encoder(x), self.lstm
        if features.device.type == "cpu":
            # The fused LSTM run for a single step: on CPU (oneDNN) it takes 0.4 ms
            # for 1024 rows against 1 ms for the cell function's separate ops.
            _, (h, c) = lstm(features.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0)))
            return h[0], (h[0], c[0])
        # On CUDA the cell function is one fused kernel.
        h, c = torch.lstm_cell(features, (h, c), lstm.weight_ih_l0, lstm.weight_hh_l0,
                               lstm.bias_ih_l0, lstm.bias_hh_l0)
        return h, (h, c)

    def _central_value(self, inputs: torch.Tensor, critic_states) -> torch.Tensor:
        """The global critic's values: inputs are policy inputs (any leading shape)."""
        if critic_states is None:
            raise ValueError(f"this policy's critic (policy.critic = {self.critic_kind!r}) "
                             f"reads the global state: pass critic_states")
        if self.critic_kind == "global":
            if self.critic_slots is not None:
                inputs = self.critic_slots(inputs)
            critic_states = torch.cat([critic_states.to(inputs.dtype), inputs], -1)
        return self.critic_head(self.critic_body(critic_states)).squeeze(-1)

    def replay(self, observations, state, starts, critic_states=None):
        """(action parameters [L, B, ...], values [L, B]) of B rows replayed over L
        steps (time-major, the fused LSTM's own layout) from `state` (h, c of
        [B, lstm_size]), zeroing a row's state at each of its episode starts
        (`starts`, bool [L, B]): the same outputs as `heads` called once per step.
        A global critic reads `critic_states` ([L, B, critic_state_dim]) instead.

        The fused LSTM cannot reset single rows mid-sequence, so the steps are cut
        into chunks at every time index where any row starts an episode; the rows
        that start there have their state zeroed between two chunks. Exact, and one
        fused call per chunk: few chunks when episodes are long against the segment,
        one per step at worst (measured on DroneSwarm's minibatches: ~15% slower than
        one chunk, still faster than the cell's separate ops)."""
        length, rows = starts.shape
        inputs = self._input(observations.reshape(length * rows, -1))
        features = self.encoder(inputs)
        features = features.view(length, rows, -1)
        # One host read per minibatch: where the chunks begin (step 0 always does).
        boundaries = starts.any(1)
        boundaries[0] = True
        begins = boundaries.nonzero().squeeze(1).tolist() + [length]
        h, c = (s.unsqueeze(0) for s in state)
        outputs = []
        for begin, end in zip(begins[:-1], begins[1:]):
            keep = (~starts[begin]).view(1, rows, 1)
            h, c = h * keep.to(h.dtype), c * keep.to(c.dtype)
            with _workspace_unfilled():
                output, (h, c) = self.lstm(features[begin:end], (h, c))
            outputs.append(output)
        hidden = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        if self.central:
            values = self._central_value(
                inputs, None if critic_states is None
                else critic_states.reshape(length * rows, -1)).view(length, rows)
            return self.actor_head(hidden), values
        return self.actor_head(hidden), self.critic_head(hidden).squeeze(-1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints written before the LSTM became an `nn.LSTM` hold an
        # `nn.LSTMCell`'s parameters: the same tensors (and the same order, so the
        # optimizer state still lines up) under names without the layer suffix.
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            old = f"{prefix}lstm.{name}"
            if old in state_dict and f"{old}_l0" not in state_dict:
                state_dict[f"{old}_l0"] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def heads(self, observations, state=None, starts=None, critic_states=None):
        """(action parameters, values, new state) for one step of rows; a global
        critic reads `critic_states` ([rows, critic_state_dim])."""
        x = self._input(observations)           # once per step, for actor and critic
        params, new_state = self._act(x, state, starts)
        return params, self._value(x, state, starts, critic_states, new_state), new_state

    def act(self, observations, state=None, starts=None):
        """(action parameters, new state): the actor alone, from each row's own
        observation (what evaluation and rendering run; no global state)."""
        return self._act(self._input(observations), state, starts)

    def value(self, observations, state=None, starts=None, critic_states=None) -> torch.Tensor:
        """Values of one step of rows; a global critic reads `critic_states`."""
        return self._value(self._input(observations), state, starts, critic_states, None)

    def _act(self, x, state, starts):
        """`act` on policy inputs `x` (`_input` of the observations)."""
        if self.use_lstm:
            features, state = self._core(x, state, starts)
            return self.actor_head(features), state
        return self.actor_head(self.actor_body(x)), None

    def _value(self, x, state, starts, critic_states, features) -> torch.Tensor:
        """`value` on policy inputs `x`; a local LSTM critic reads the LSTM's output,
        and `features` (the new state `_act` returned for these rows) saves running it
        again."""
        if self.central:
            return self._central_value(x, critic_states)
        if self.use_lstm:
            if features is None:
                features, _ = self._core(x, state, starts)
            else:
                features = features[0]
            return self.critic_head(features).squeeze(-1)
        return self.critic_head(self.critic_body(x)).squeeze(-1)

    # ---- distributions ------------------------------------------------------------
    def sample(self, params, generator, mask=None):
        """(actions, log-probs) drawn from the head's distribution. `mask` (Discrete
        only, bool [rows, n]) marks valid actions; the others get probability 0."""
        if self.action_kind == "box":
            return self.sample_from(params, self.draw(params.shape[0], generator, params.device))
        return self._categoricals(
            params, mask, lambda logits, _: self._sample_categorical(logits, generator))

    def draw(self, rows: int, generator, device) -> torch.Tensor:
        """The random numbers one `sample` of `rows` rows consumes, drawn from
        `generator` in the same order: standard normals [rows, action_dim] (Box), or
        one uniform per row and categorical [rows, components]. With `sample_from`
        it lets a compiled rollout step (torch.compile cannot take a Generator) use
        exactly the eager path's draws."""
        if self.action_kind == "box":
            return torch.randn((rows, self.action_dim), generator=generator, device=device)
        # One [rows, 1] draw per component, in component order, as `sample` draws
        # them (a single [rows, k] draw would assign the numbers differently).
        uniforms = [torch.rand(rows, 1, generator=generator, device=device) for _ in self.nvec]
        return uniforms[0] if len(uniforms) == 1 else torch.cat(uniforms, 1)

    def sample_from(self, params, noise, mask=None):
        """`sample` with its random numbers given (`noise`, from `draw`): no Generator."""
        if self.action_kind == "box":
            std = self.log_std.exp()
            actions = params + std * noise
            logprob = (-0.5 * noise.square() - self.log_std - 0.5 * LOG_2PI).sum(-1)
            return actions, logprob
        return self._categoricals(
            params, mask, lambda logits, i: self._categorical_from(logits, noise[:, i:i + 1]))

    def _categoricals(self, params, mask, categorical):
        """Discrete / MultiDiscrete sampling, `categorical(logits, component)` giving
        one component's (actions, log-probs)."""
        if self.action_kind == "discrete":
            return categorical(mask_logits(params, mask), 0)
        actions, logprobs = [], 0
        for i, logits in enumerate(params.split(self.nvec, dim=-1)):
            a, lp = categorical(logits, i)
            actions.append(a)
            logprobs = logprobs + lp
        return torch.stack(actions, dim=-1), logprobs

    @staticmethod
    def _sample_categorical(logits, generator):
        uniform = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device)
        return Policy._categorical_from(logits, uniform)

    @staticmethod
    def _categorical_from(logits, uniform):
        # Inverse CDF with one uniform per row: cheaper than Gumbel-max (one
        # draw instead of n) and than torch.multinomial for small n.
        # The action is the first index whose cdf exceeds u * total. A masked
        # action has probability exactly 0 (its cdf equals its predecessor's), so
        # it is never that index, even for u = 0; and u * total can round up to
        # the total (the valid mass sums to slightly under 1 in float), where the
        # last index with probability > 0 is taken, never a masked tail. (Taking
        # a masked action stores a log-prob of -1e9, and the PPO ratio of a
        # re-evaluation in another precision overflows: NaN training.)
        log_probs = torch.log_softmax(logits, dim=-1)
        cdf = log_probs.exp().cumsum(-1)
        total = cdf[..., -1:]
        actions = torch.minimum((cdf <= uniform * total).sum(-1), (cdf < total).sum(-1))
        return actions, log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def log_prob_entropy(self, params, actions, entropy: bool = True, mask=None):
        """(log-probs of `actions`, entropies) under the head's distribution; entropies
        are None when `entropy` is False (saves their ops when they are not needed)."""
        if self.action_kind == "box":
            std = self.log_std.exp()
            z = (actions - params) / std
            logprob = (-0.5 * z.square() - self.log_std - 0.5 * LOG_2PI).sum(-1)
            if not entropy:
                return logprob, None
            return logprob, (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(params.shape[0])
        if self.action_kind == "discrete":
            return self._categorical_lp_ent(mask_logits(params, mask), actions.long(), entropy)
        logprob, total = 0, (0 if entropy else None)
        for i, logits in enumerate(params.split(self.nvec, dim=-1)):
            lp, ent = self._categorical_lp_ent(logits, actions[..., i].long(), entropy)
            logprob = logprob + lp
            if entropy:
                total = total + ent
        return logprob, total

    @staticmethod
    def _categorical_lp_ent(logits, actions, entropy: bool = True):
        log_probs = torch.log_softmax(logits, dim=-1)
        chosen = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        if not entropy:
            return chosen, None
        return chosen, -(log_probs.exp() * log_probs).sum(-1)

    def deterministic(self, params, mask=None):
        """The mode: argmax per categorical (over valid actions where `mask` is
        given), the mean for a Gaussian."""
        if self.action_kind == "box":
            return params
        if self.action_kind == "discrete":
            return mask_logits(params, mask).argmax(-1)
        return torch.stack([logits.argmax(-1) for logits in params.split(self.nvec, dim=-1)], -1)
