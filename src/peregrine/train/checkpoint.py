"""Checkpoints: written atomically, verified on load, loadable as a bare actor.

File layout: a 16-byte magic, the payload length (8 bytes, little endian), the
payload's SHA-256 (32 bytes), then the payload: `torch.save` of a dict of
tensors and plain values (loaded back with `weights_only=True`, so a
checkpoint cannot run code). The header lets a truncated or corrupted file be
told apart from a checkpoint of another env or format, each with its own
message, instead of an unpickling traceback.

Writes go to a temporary file in the same folder, are flushed to disk and then
renamed over the target, so a crash mid-write leaves the previous checkpoint.
"""
from __future__ import annotations

import hashlib
import io
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..envs.native.protocols import Configured
from ..files import written_atomically

if TYPE_CHECKING:
    import gymnasium

    from ..envs.native.batch import NativeEnv
    from .normalize import ObservationNormalizer
    from .policy import Policy

MAGIC = b"PEREGRINE-CKPT\x00\x01"
HEADER = struct.Struct("<16sQ32s")
FORMAT_VERSION = 1


def save(path: str | os.PathLike[str], payload: dict) -> None:
    """Writes `payload` to `path` atomically with an integrity header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, **payload}, buffer)
    data = buffer.getvalue()
    header = HEADER.pack(MAGIC, len(data), hashlib.sha256(data).digest())
    try:
        with written_atomically(path) as temporary, open(temporary, "wb") as handle:
            handle.write(header)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:   # a full or read-only disk: say which file
        raise OSError(error.errno, f"cannot write checkpoint {str(path)!r}: "
                                   f"{error.strerror or error}") from None


def load(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict:
    """The payload of a checkpoint; ValueError naming the problem if it is not sound."""
    path = Path(path)
    if path.is_dir():
        from .run_dir import CHECKPOINT_NAME, checkpoint_path
        # a run directory, or a folder holding a checkpoint (a run's checkpoints/)
        candidate, inside = checkpoint_path(path), path / CHECKPOINT_NAME
        if not candidate.is_file() and not inside.is_file():
            raise ValueError(f"{str(path)!r} holds no checkpoint (neither {str(candidate)!r} "
                             f"nor {str(inside)!r}): give a run directory or a checkpoint file")
        path = candidate if candidate.is_file() else inside
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    raw = path.read_bytes()
    if not raw:
        raise ValueError(f"checkpoint {str(path)!r} is empty (0 bytes)")
    if len(raw) < HEADER.size or raw[:len(MAGIC)] != MAGIC:
        if len(raw) < HEADER.size and MAGIC.startswith(raw[:len(MAGIC)]) and raw:
            raise ValueError(f"checkpoint {str(path)!r} is truncated: {len(raw)} bytes, "
                             f"shorter than its header")
        raise ValueError(f"{str(path)!r} is not a Peregrine checkpoint (bad header)")
    _magic, length, digest = HEADER.unpack_from(raw)
    data = raw[HEADER.size:]
    if len(data) != length and hashlib.sha256(data).digest() == digest:
        # The payload is whole (its checksum matches): the length field is what changed.
        raise ValueError(f"checkpoint {str(path)!r} has a damaged header: its length field "
                         f"says {length} bytes, but the payload has {len(data)} bytes and "
                         f"matches its checksum (a flipped bit, or the header was edited); "
                         f"the file was changed after it was written: use a copy of it or an "
                         f"earlier checkpoint")
    if len(data) < length:
        raise ValueError(f"checkpoint {str(path)!r} is truncated: payload has {len(data)} of "
                         f"{length} bytes")
    if len(data) > length:
        extra = len(data) - length
        raise ValueError(f"checkpoint {str(path)!r} has {extra} byte{'s' * (extra != 1)} more "
                         f"than its header promises ({length}): something was appended to it")
    if hashlib.sha256(data).digest() != digest:
        raise ValueError(f"checkpoint {str(path)!r} is corrupt: its checksum does not match")
    try:
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any decoding failure means a bad file
        raise ValueError(f"checkpoint {str(path)!r} could not be decoded: "
                         f"{_decoding_problem(error)}") from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"checkpoint {str(path)!r} has an unsupported format version "
                         f"{payload.get('format_version') if isinstance(payload, dict) else None}")
    check_sound(payload, f"checkpoint {str(path)!r}")
    return payload


COUNTERS = ("updates", "global_step", "episodes")
# Entries whose floating-point tensors must all be finite: the weights, Adam's moments,
# the normalisers' statistics.
FINITE_ENTRIES = ("policy", "optimizer", "obs_normalizer", "reward_scaler")


def check_sound(payload: dict, label: str = "checkpoint") -> None:
    """ValueError, naming the entry, for a checkpoint that decodes but cannot be
    trained on or evaluated: a counter that is not an integer >= 0 (a resume would
    count on from it), `elapsed` that is not a finite number >= 0, or weights,
    optimizer moments or normaliser statistics holding NaN or inf (a diverged run:
    evaluating it would print returns of a policy that outputs NaN)."""
    for key in COUNTERS:
        if key in payload:
            value = payload[key]
            if type(value) is not int or value < 0:
                raise ValueError(f"{label} has {key} = {value!r}: a counter must be an integer "
                                 f">= 0; the file was damaged or not written by Peregrine")
    elapsed = payload.get("elapsed", 0.0)
    if type(elapsed) not in (int, float) or not 0.0 <= elapsed < float("inf"):
        raise ValueError(f"{label} has elapsed = {elapsed!r}: it must be a finite number of "
                         f"seconds >= 0; the file was damaged or not written by Peregrine")
    bad = [name for entry in FINITE_ENTRIES if entry in payload
           for name, tensor in _float_tensors(payload[entry], entry)
           if not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        raise ValueError(f"{label} holds values that are not finite (NaN or inf) in {shown}: "
                         f"the run that wrote it diverged or the file was damaged; use an "
                         f"earlier checkpoint (a lower train.learning_rate or "
                         f"train.max_grad_norm keeps a run from diverging)")


def _float_tensors(value: Any, name: str):
    """(dotted name, tensor) of every floating-point tensor or array in a nesting
    of dicts and lists."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield name, value
    elif isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            yield name, torch.from_numpy(value)
    elif isinstance(value, float):
        yield name, torch.tensor(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _float_tensors(item, f"{name}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _float_tensors(item, f"{name}.{index}")


def _decoding_problem(error: Exception) -> str:
    """torch.load's error, without its advice to load with weights_only=False: that
    would run whatever code the file holds, and a Peregrine checkpoint never needs it."""
    text = str(error)
    if "Weights only load failed" not in text:
        return text
    # torch's text: "... WeightsUnpickler error: DETAIL\n\nCheck the documentation ...";
    # DETAIL may follow on the same line or on the next ones.
    detail = text.split("WeightsUnpickler error:", 1)[1] if "WeightsUnpickler error:" in text \
        else ""
    detail = detail.split("Check the documentation")[0].split(". Please use")[0]
    detail = " ".join(detail.split()).rstrip(".")
    if detail.startswith("Unsupported operand"):
        detail = (f"it is a plain pickle, not a torch.save file ({detail}: a pickle protocol "
                  f"or instruction that checkpoints never use)")
    if not detail:
        detail = "it holds an object of a kind checkpoints never hold"
    return (f"{detail}. It is not a Peregrine training checkpoint, and it is refused: loading "
            f"such objects could run code")


# What --resume may not change: the fields that give the checkpoint's weights,
# optimizer state, normaliser statistics, random streams or step schedule their
# meaning. Every [env] and [policy] field is in it; everything else (total_steps,
# learning_rate, checkpoint_interval, device, precision, threads, ...) may change.
RESUME_FIXED = {
    "train": ("seed", "horizon", "normalize_obs", "obs_clip", "normalize_reward", "reward_clip"),
    "vec": ("num_envs", "num_workers"),
}


def _resolved_env(env_name: str, fields: dict) -> dict:
    """The env's full config for the keywords `fields` of make (a preset among them),
    as the env class resolves it; the fields themselves for an env class without
    config resolution."""
    from ..envs.registry import env_class
    try:
        cls = env_class(env_name)
    except ValueError:
        return dict(fields)
    if not hasattr(cls, "resolve_config"):
        return dict(fields)
    fields = dict(fields)
    preset = fields.pop("preset", "default")
    return dict(cls.resolve_config(cls.config_with_preset(preset, fields)))


def check_resume(payload: dict, config: Any) -> None:
    """ValueError naming every field where `config` would give the checkpoint's
    weights or schedule another meaning (RESUME_FIXED, every env and policy field)."""
    from dataclasses import fields as dataclass_fields
    saved = payload.get("config") or {}
    current = config.to_dict()
    changed = []
    saved_env, current_env = dict(saved.get("env") or {}), dict(current["env"])
    trained_on = payload.get("env_name", saved_env.get("name"))
    if trained_on != current_env.get("name"):
        raise ValueError(f"the checkpoint was trained on {trained_on!r}, but this run is "
                         f"{current_env.get('name')!r}")
    if saved_env.get("name") == current_env.get("name"):
        name = current_env.pop("name")
        saved_env.pop("name", None)
        before, after = _resolved_env(name, saved_env), _resolved_env(name, current_env)
        changed += [(f"env.{key}", before.get(key), after.get(key))
                    for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    sections = {"policy": [f.name for f in dataclass_fields(config.policy)], **RESUME_FIXED}
    for section, keys in sections.items():
        defaults = {f.name: f.default for f in dataclass_fields(getattr(config, section))}
        for key in keys:
            before = (saved.get(section) or {}).get(key, defaults.get(key))
            after = current[section].get(key)
            if before != after:
                changed.append((f"{section}.{key}", before, after))
    if changed:
        shown = ", ".join(f"{key} ({before!r} in the checkpoint, {after!r} now)"
                          for key, before, after in changed)
        raise ValueError(f"--resume cannot change {shown}: the checkpoint's weights, optimizer "
                         f"state or schedule would mean something else. Start a new run for "
                         f"that; what a resume may change (total_steps, learning_rate, ...) is "
                         f"listed in docs/scaling.md, \"Resuming\"")


def check_env_matches(payload: dict, env: Any, path: str = "checkpoint") -> None:
    """ValueError unless the env's spaces are the ones the checkpoint was trained on."""
    from .policy import describe_space
    expected = {"observation_space": payload.get("observation_space"),
                "action_space": payload.get("action_space")}
    actual = {"observation_space": describe_space(env.single_observation_space),
              "action_space": describe_space(env.single_action_space)}
    for key in expected:
        if expected[key] != actual[key]:
            raise ValueError(f"{path} was trained on {payload.get('env_name')!r} with "
                             f"{key} {expected[key]}, but this env has {actual[key]}")


def build_policy(payload: dict, env: Any, path: str = "checkpoint") -> Policy:
    from .config import PolicyConfig
    from .policy import Policy, observation_structure
    check_env_matches(payload, env, path)
    policy_config = PolicyConfig(**payload["config"]["policy"])
    # A centralised critic's input width (the actor, all that runs here, needs no state).
    structure = observation_structure(env)
    policy = Policy(env.single_observation_space, env.single_action_space, policy_config,
                    int(payload.get("critic_state_dim", 0)), payload.get("observation_slots", ()),
                    structure=structure)
    if policy.structure != payload.get("observation_structure"):
        raise ValueError(f"{path} was trained on observations structured as "
                         f"{payload.get('observation_structure')}, but this env's are "
                         f"{policy.structure}")
    try:
        policy.load_state_dict(payload["policy"])
    except (RuntimeError, KeyError) as error:
        raise ValueError(f"{path} does not match its policy config: {error}") from None
    policy.eval()
    return policy


class Actor:
    """A deterministic policy: observations [rows, obs_dim] -> actions [rows, ...].

    Argmax for categorical heads, the mean (clipped to the space) for Gaussian
    ones. Recurrent policies keep one state per row, reset where `starts`
    (or the env's terminals | truncations, passed to `observe_done`) say an
    episode began; call `reset()` before a new batch of episodes.
    `obs_normalizer` (an ObservationNormalizer, from a run trained with
    train.normalize_obs) is applied, frozen, to every observation first.
    """

    def __init__(self, policy: Policy, action_space: gymnasium.Space,
                 obs_normalizer: ObservationNormalizer | None = None,
                 mask_slice: slice | None = None, generator: torch.Generator | None = None) -> None:
        self.policy = policy
        # With a generator the actor samples as in training (same mask and
        # normalisation) instead of taking the mode.
        self.generator = generator
        self.obs_normalizer = obs_normalizer
        self.mask_slice = mask_slice    # valid-action mask columns of the RAW observation
        self.action_dtype = np.dtype(action_space.dtype)
        self.low = self.high = None
        if policy.action_kind == "box":
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.state = None
        self.starts = None

    def reset(self, env: Any = None) -> None:
        """Forgets recurrent state (new episodes); `env` is accepted and unused."""
        self.state = None

    def observe_done(self, terminals: np.ndarray, truncations: np.ndarray) -> None:
        self.starts = torch.from_numpy(np.asarray(terminals) | np.asarray(truncations))

    @torch.no_grad()
    def __call__(self, observations: np.ndarray) -> np.ndarray:
        obs = torch.as_tensor(np.asarray(observations))
        if obs.ndim == 1:
            obs = obs.unsqueeze(0)
        mask = None if self.mask_slice is None else obs[:, self.mask_slice] > 0.5
        if self.obs_normalizer is not None:
            obs = self.obs_normalizer.normalize(obs)
        rows = obs.shape[0]
        if self.policy.use_lstm:
            if self.state is None or self.state[0].shape[0] != rows:
                self.state = self.policy.initial_state(rows, "cpu")
                self.starts = torch.zeros(rows, dtype=torch.bool)
            starts = self.starts if self.starts is not None else torch.zeros(rows, dtype=torch.bool)
            params, self.state = self.policy.act(obs, self.state, starts)
            self.starts = torch.zeros(rows, dtype=torch.bool)
        else:
            params, _ = self.policy.act(obs)
        if self.generator is None:
            actions = self.policy.deterministic(params, mask)
        else:
            actions, _log_probs = self.policy.sample(params, self.generator, mask)
        if self.low is not None:
            actions = torch.maximum(torch.minimum(actions, self.high), self.low)
        result = actions.numpy().astype(self.action_dtype, copy=False)
        return np.ascontiguousarray(result)


def env_kwargs(path: str | os.PathLike[str]) -> tuple[str | None, dict]:
    """(env name, keywords of `peregrine.make`) of the world a checkpoint was
    trained on: its [env] section, i.e. `preset` (if any) plus config fields.
    (None, {}) for a checkpoint that records no [env] section."""
    payload = load(path)
    config = payload.get("config")
    env = config.get("env") if isinstance(config, dict) else None
    if not isinstance(env, dict) or "name" not in env:
        return None, {}
    return env["name"], {key: value for key, value in env.items() if key != "name"}


def make_trained_env(path: str | os.PathLike[str], num_envs: int = 1, seed: int | None = None,
                     num_threads: int = 1, preset: str | None = None,
                     **overrides: Any) -> Any:
    """A batch of the env a checkpoint was trained on, in its own world.

    A native env: its batch, where `preset` replaces the checkpoint's world by that
    preset (keeping the agent's observation fields, as evaluation does) and
    `overrides` (config fields) apply on top of either. Any other env (gym:ID,
    pettingzoo:MODULE, module:function): `peregrine.vector.make` of its name with the
    checkpoint's keywords and wrappers (`overrides` on top), serial, `num_envs` envs;
    one trained on a Python callable without an import path cannot be rebuilt by name:
    pass that callable to `peregrine.vector.make` yourself.
    """
    from .world import world_of
    from ..envs.registry import make
    trained = env_kwargs(path)
    name = trained[0]
    if name is None:
        raise ValueError(f"checkpoint {str(path)!r} records no env config: make the env yourself")
    from ..vector.sources import CALLABLE_PREFIX, is_native_name
    if not is_native_name(name):
        if name.startswith(CALLABLE_PREFIX):
            raise ValueError(f"checkpoint {str(path)!r} was trained on {name!r}, a Python "
                             f"callable without an import path: make the env yourself, "
                             f"peregrine.vector.make(CALLABLE, num_envs=...)")
        if preset is not None:
            raise ValueError(f"preset= is for native envs; {name!r} takes its own keywords")
        from .. import vector
        return vector.make(name, backend="serial", num_envs=num_envs, seed=seed,
                           num_threads=num_threads, **{**trained[1], **overrides})
    world = world_of(name, trained, preset, overrides)
    return make(name, num_envs=num_envs, seed=seed, num_threads=num_threads, **world["kwargs"])


def make_env(path: str | os.PathLike[str], num_envs: int = 1, seed: int | None = None,
             num_threads: int = 1, preset: str | None = None, **overrides: Any) -> NativeEnv:
    """Deprecated name of `make_trained_env` (it read like the trainer's
    `environment.make_env`, which builds an env from a config)."""
    import warnings
    warnings.warn("peregrine.train.checkpoint.make_env is deprecated: call make_trained_env",
                  DeprecationWarning, stacklevel=2)
    return make_trained_env(path, num_envs=num_envs, seed=seed, num_threads=num_threads,
                            preset=preset, **overrides)


def world_differences(trained: dict, env_name: str, env: Any) -> dict:
    """{field: (trained value, env's value)} where `env`'s config is not the
    trained world `trained` (keywords of make) resolved by the env class."""
    from ..envs.registry import env_class
    if not hasattr(env_class(env_name), "resolve_config"):
        return {}
    resolved = _resolved_env(env_name, trained)
    return {key: (value, env.config.get(key)) for key, value in resolved.items()
            if env.config.get(key) != value}


def describe_differences(differences: dict, ours: str) -> str:
    """`differences` ({field: (ours, env's)}) as one line: 'field: OURS a, env b, ...'."""
    return ", ".join(f"{key}: {ours} {a!r}, env {b!r}"
                     for key, (a, b) in sorted(differences.items()))


def emulated_world_differences(trained: dict, env: Any) -> dict:
    """{what: (trained, env's)} where a vector env made from a Gymnasium, PettingZoo or
    factory name (its recipe's EnvFactory) is not the emulated env `trained` (the
    checkpoint's [env] section) describes: another name, keyword or wrapper list. {}
    for an env made otherwise (a callable of the user's: nothing to compare)."""
    from ..vector.sources import CALLABLE_PREFIX, EnvFactory
    made = getattr(getattr(env, "recipe", None), "env", None)
    name = trained.get("name")
    if not isinstance(made, EnvFactory) or made.name is None or not isinstance(name, str) \
            or name.startswith(CALLABLE_PREFIX):
        return {}
    if made.name != name:
        return {"env": (name, made.name)}
    recorded = EnvFactory.from_keywords(name, {k: v for k, v in trained.items() if k != "name"})
    ignored = {"num_envs"} if made.kind == "gymnasium_vector" else set()   # vector_envs_of's
    differences = {key: (recorded.kwargs.get(key), made.kwargs.get(key))
                   for key in sorted(set(recorded.kwargs) | set(made.kwargs) - ignored)
                   if recorded.kwargs.get(key) != made.kwargs.get(key)}
    if recorded.wrappers != made.wrappers:
        differences["wrappers"] = (recorded.wrappers, made.wrappers)
    return differences


def load_actor(path: str | os.PathLike[str], env: Any, check_world: bool = True,
               sample_seed: int | None = None) -> Actor:
    """A deterministic actor from a checkpoint file (or a run directory) for `env`;
    with `sample_seed`, one that samples its actions from a generator of that seed.

    Raises ValueError for a missing, truncated, corrupt or foreign file and for
    a checkpoint trained on an env with other spaces. With `check_world`, a
    `UserWarning` names the config fields where `env` differs from the world
    the checkpoint was trained on (an emulated env's name, keywords and wrappers, when
    it was made from a name; `make_trained_env(path)` builds that world); pass
    False when evaluating elsewhere on purpose.
    """
    payload = load(path)
    label = f"checkpoint {str(path)!r}"
    for key in ("policy", "config", "observation_space", "action_space"):
        if key not in payload:
            raise ValueError(f"{label} has no {key!r} entry; it is not a training checkpoint")
    _check_batch(env)
    policy = build_policy(payload, env, label)
    trained_env = payload["config"].get("env", {})
    from ..vector.sources import is_native_name
    if check_world:
        if is_native_name(trained_env.get("name")):
            differences = world_differences(
                {k: v for k, v in trained_env.items() if k != "name"}, trained_env["name"],
                env) if isinstance(env, Configured) else {}
        else:
            differences = emulated_world_differences(trained_env, env)
        if differences:
            import warnings
            warnings.warn(f"{label} was trained in another world than this env's "
                          f"({describe_differences(differences, 'trained')}); "
                          f"peregrine.train.checkpoint.make_trained_env(path) builds the trained one",
                          UserWarning, stacklevel=2)
    from .environment import action_mask_slice
    mask_slice = action_mask_slice(env, payload.get("env_name"),
                                   payload["config"].get("policy", {}).get("action_mask", "auto"))
    if sample_seed is not None:     # 1.5 was taken as 1, and 2**64 overflowed in torch
        from ..envs.native.batch import resolve_seed
        sample_seed = resolve_seed(sample_seed)
    generator = None if sample_seed is None else torch.Generator().manual_seed(sample_seed)
    return Actor(policy, env.single_action_space, build_obs_normalizer(payload, policy, label),
                 mask_slice, generator)


def _check_batch(env: Any) -> None:
    """TypeError unless `env` is a batch whose rows the policy reads: a Peregrine env
    (its observations flattened into rows), or a vector env of flat spaces."""
    from .policy import describe_space
    try:
        describe_space(env.single_observation_space)
        describe_space(env.single_action_space)
    except (ValueError, AttributeError):
        raise TypeError(
            f"load_actor needs the env as a batch of flat rows, got {type(env).__name__}: "
            f"make_trained_env(path) rebuilds the checkpoint's env, and "
            f"peregrine.vector.make(lambda: YourEnv(), num_envs=N) wraps a Gymnasium or "
            f"PettingZoo env (its Dict/Tuple observations become the rows the policy reads)"
        ) from None


def build_obs_normalizer(payload: dict, policy: Policy,
                         path: str = "checkpoint") -> ObservationNormalizer | None:
    """The checkpoint's observation normaliser (None when it was trained without one)."""
    state = payload.get("obs_normalizer")
    if state is None:
        if payload["config"].get("train", {}).get("normalize_obs"):
            raise ValueError(f"{path} was trained with train.normalize_obs but holds no "
                             f"normaliser statistics")
        return None
    from .normalize import ObservationNormalizer
    normalizer = ObservationNormalizer(policy.obs_dim)
    try:
        normalizer.load_state_dict(state, f"{path}: observation normaliser")
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} has a malformed observation normaliser: {error}") from None
    return normalizer
