"""Training configuration: four sections (env, vec, train, policy) from TOML.

A run's configuration is resolved in layers, later ones winning:

    built-in defaults (the dataclasses below)
    -> for an env without a shipped file whose actions are continuous (a Box
       action space): CONTINUOUS_DEFAULTS
    -> the env's shipped file, peregrine/train/configs/<env>.toml
    -> a user file (--config FILE), or a shipped variant of the env's config
       (--config NAME: peregrine/train/configs/<env>-NAME.toml, e.g. the
       throughput-oriented `fast` ones)
    -> command-line overrides (--train.learning-rate 3e-4, --vec.num-envs 64)

Sections `vec`, `train` and `policy` have fixed keys with types taken from the
defaults; an unknown key or a value of the wrong type is a ValueError that names
the key and lists the valid ones. Section `env` holds the env's name plus its
own config fields (the keywords of `peregrine.make`), checked against the env
class when it is a registered native env. The resolved configuration is written
to the run directory as TOML, so `--resume` and `--config` read it back.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


class _Section:
    """A config section: setting a key it does not have is an error naming the valid
    ones (`config.train.learning_rat = 0.1` was a new attribute that nothing read)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.__dataclass_fields__:
            section = {cls: key for key, cls in SECTIONS.items()}.get(type(self), "?")
            raise AttributeError(f"unknown config key {section}.{name}; valid keys in "
                                 f"[{section}]: {sorted(self.__dataclass_fields__)}")
        object.__setattr__(self, name, value)


@dataclass
class VecConfig(_Section):
    backend: str = "auto"            # native | serial | multiprocessing (peregrine.vector)
    #                                  | device: the native env on train.device, torch buffers
    #                                  (a GPU env on cuda; no host copy in the rollout)
    #                                  | auto: native for a native env, multiprocessing for
    #                                  an emulated one (Gymnasium, PettingZoo, a factory),
    #                                  serial for a gym-vec: one (resolve_auto)
    num_envs: int = 16               # env instances; rows = num_envs * agents_per_env
    num_threads: int = 1             # C step threads inside one native batch
    num_workers: Any = "auto"        # worker processes (multiprocessing / serial blocks), or
    #                                  "auto": for multiprocessing one per available core (the
    #                                  largest divisor of num_envs within the core count),
    #                                  else 1. config.toml records the number that ran
    split: int = 1                   # 2: the batch as two halves stepped alternately, each
    #                                  half's env step (native: a worker thread; multi-
    #                                  processing: half the worker processes) overlapping
    #                                  the other half's policy forward (train/collect.py)


@dataclass
class TrainConfig(_Section):
    seed: int = 1
    total_steps: int = 100_000       # agent steps (rows x steps) to train for
    horizon: int = 64                # steps per row per update (rollout length)
    minibatch_size: int = 512        # samples per gradient step
    update_epochs: int = 4           # passes over each rollout
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True           # linear decay to 0 over total_steps
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    clip_vloss: bool = True
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    target_kl: float = 0.0           # > 0: stop an update's epochs once approx KL exceeds it
    adam_eps: float = 1e-5
    device: str = "cpu"              # cpu | cuda | auto
    precision: str = "fp32"          # fp32 | bf16: autocast of the policy's forward/backward
    #                                  (weights, optimizer state and losses stay fp32)
    torch_threads: int = 0           # torch.set_num_threads; env threads are vec.num_threads.
    #                                  0 = auto (ppo.learner_threads): 1 for an MLP (> 1 pays
    #                                  off only with idle cores, see benchmarks/RESULTS.md),
    #                                  the available cores for a CNN over image observations
    deterministic: bool = True       # torch.use_deterministic_algorithms (cheap on CPU)
    checkpoint_interval: int = 50    # updates between checkpoints; 0 = only at the end
    progress_interval: int = 10      # updates between plain progress lines
    run_dir: str = "runs"            # parent folder of run directories
    tensorboard: bool = True         # also write TensorBoard event files (if installed)
    track: str = "none"              # experiment tracking beside metrics.jsonl: "wandb" = the
    #                                  same records and the resolved config to Weights & Biases
    #                                  (pip install 'peregrine-rl[wandb]'; offline without an
    #                                  API key or with WANDB_MODE=offline) | "none"
    stop_return: float = 0.0         # > 0: stop once the recent mean episode return reaches it
    normalize_obs: bool = False      # policy input = clip((obs - running mean) / running std)
    obs_clip: float = 10.0           # |normalised observation| limit
    normalize_reward: bool = False   # reward / running std of the discounted return
    reward_clip: float = 10.0        # |scaled reward| limit
    teacher: str = ""                # kickstarting: a scripted policy name (peregrine.policies)
    #                                  or a checkpoint path whose actions the policy is also
    #                                  trained to reproduce; "" = none (plain PPO)
    teacher_coef: float = 1.0        # initial weight of the teacher term (-log pi(teacher action))
    teacher_steps: int = 0           # steps over which that weight decays linearly to 0;
    #                                  0 = constant for the whole run
    dist_backend: str = "auto"       # collectives with several ranks (torchrun, --nproc):
    #                                  "auto" = nccl on CUDA; on CPU "shm" (shared-memory
    #                                  sums) when every rank is on this machine, else gloo
    dist_timeout: float = 60.0       # seconds a collective may wait for a missing rank
    compile: bool = False            # torch.compile the rollout's forward + sampling and the
    #                                  minibatch loss + backward, once at construction
    #                                  (CUDA graphs on cuda; MLP policies; train/compiling.py)
    overlap: bool = False            # an actor process collects rollout k+1 (env + forward)
    #                                  while this process learns on rollout k: a one-update
    #                                  policy lag, corrected in the advantages (overlap.py)


@dataclass
class PolicyConfig(_Section):
    hidden_size: int = 64
    num_layers: int = 2              # hidden layers in each of the actor and critic MLPs
    activation: str = "tanh"         # tanh | relu
    lstm: bool = False               # an LSTM core after the encoder, state per row
    lstm_size: int = 64
    bptt_horizon: int = 16           # truncated backprop length (must divide train.horizon)
    init_log_std: float = 0.0        # Gaussian heads: initial log standard deviation
    init: str = "orthogonal"         # layer weights: "orthogonal" (gain sqrt 2, heads 0.01 and
    #                                  1, biases 0) | "torch": PyTorch's own per-layer defaults
    #                                  (SB3's ortho_init=False, the RL Zoo's MuJoCo setting)
    encoder: str = "auto"            # observations of an emulated env (encoders.py): "auto" =
    #                                  chosen from its space (a CNN for images, one-hot for
    #                                  discrete leaves, one part per Dict key) | "flat" = the
    #                                  flat row as it is | "nature" / "small": that CNN
    action_mask: str = "auto"        # Discrete heads: "auto" = mask invalid actions with the
                                     # env's action_mask_slice (if it has one) | "false"
    slot_encoder: str = "none"       # "deepsets": the env's repeated observation slots
    #                                  (DroneSwarm's detections, obstacles) through a
    #                                  permutation-invariant encoder (policy.py) | "none"
    slot_size: int = 32              # features per slot group of that encoder
    critic: str = "local"            # what the value function reads: "local" = the row's own
    #                                  observation, as the actor | "global" = the env's global
    #                                  state + agent id + own observation (MAPPO's agent-
    #                                  specific state) | "state" = the global state alone;
    #                                  the actor always reads only its row (policy.py)


SECTIONS = {"vec": VecConfig, "train": TrainConfig, "policy": PolicyConfig}

# The dataclass defaults above are a discrete-action starting point. An env whose
# actions are continuous (a Box action space) and that has no shipped config starts
# from these instead (load_config, under every file and override): no entropy bonus
# (it widens a Gaussian that must narrow), more and smaller gradient steps per sample
# (10 epochs of 64-sample minibatches), a running normalisation of observations
# (real-valued ones: _continuous_overlay leaves it out for images or discrete values)
# and rewards. Measured on fresh seeds: benchmarks/RESULTS.md, "Continuous control defaults".
CONTINUOUS_DEFAULTS = {
    "train": {"ent_coef": 0.0, "update_epochs": 10, "minibatch_size": 64,
              "learning_rate": 3e-4, "normalize_obs": True, "normalize_reward": True},
}
CHOICES = {
    ("vec", "backend"): ("auto", "native", "serial", "multiprocessing", "device"),
    ("train", "device"): ("cpu", "cuda", "auto"),
    ("train", "precision"): ("fp32", "bf16"),
    ("train", "dist_backend"): ("auto", "gloo", "nccl", "shm"),
    ("train", "track"): ("none", "wandb"),
    ("policy", "activation"): ("tanh", "relu"),
    ("policy", "init"): ("orthogonal", "torch"),
    ("policy", "action_mask"): ("auto", "false"),
    ("policy", "critic"): ("local", "global", "state"),
    ("policy", "slot_encoder"): ("none", "deepsets"),
    ("policy", "encoder"): ("auto", "flat", "nature", "small"),
}


@dataclass
class Config:
    env: dict[str, Any] = field(default_factory=dict)   # name + env config fields
    vec: VecConfig = field(default_factory=VecConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    # A Python callable the env is made with (peregrine.train.train(config) with
    # load_config(env=callable)): not written to TOML; env.name then holds its import
    # path, or "python:<name>" when it has none (such a run is rebuilt only by passing
    # the callable again).
    env_factory: Any = field(default=None, compare=False, repr=False)
    # "continuous" when load_config started from CONTINUOUS_DEFAULTS (not written to TOML:
    # the values it gave are)
    defaults: str = field(default="", compare=False, repr=False)

    @property
    def env_name(self) -> str:
        return self.env["name"]

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in self.env.items() if k != "name"}

    @property
    def is_native(self) -> bool:
        """Whether the env is a native Peregrine env (else emulated: vector/sources.py)."""
        from ..vector.sources import is_native_name
        return self.env_factory is None and is_native_name(self.env_name)

    def env_source(self):
        """What makes one env of an emulated run: a vector.sources.EnvFactory."""
        from ..vector.sources import EnvFactory
        return EnvFactory.from_keywords(self.env_factory or self.env_name, self.env_kwargs)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {"env": dict(self.env), **{name: dataclasses.asdict(getattr(self, name))
                                          for name in SECTIONS}}

    def to_toml(self) -> str:
        return dump_toml(self.to_dict())


# ---- loading ----------------------------------------------------------------

def shipped_config_path(env_name: str) -> Path:
    """The env's shipped training config: the built-in file, else a plugin env's own
    (its class's `train_config`, a file the plugin ships)."""
    path = CONFIG_DIR / f"{env_name}.toml"
    if path.is_file():
        return path
    from ..envs.registry import ENVS, env_class
    if env_name in ENVS:
        shipped = getattr(env_class(env_name), "train_config", None)
        if shipped is not None:
            return Path(shipped)
    return path


def shipped_configs() -> list[str]:
    """The envs with a shipped config (variants, <env>-NAME.toml, are not listed)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml") if "-" not in p.stem)


def shipped_variants(env_name: str) -> list[str]:
    """Names of the env's shipped config variants: --config NAME."""
    return sorted(p.stem.split("-", 1)[1] for p in CONFIG_DIR.glob(f"{env_name}-*.toml"))


def resolve_config_file(env_name: str | None, config_file) -> Path:
    """--config's argument as a file: an existing path, or the name of one of the env's
    shipped variants."""
    path = Path(config_file)
    if path.is_file() or env_name is None or path.suffix or path.name != str(config_file):
        return path
    variants = shipped_variants(env_name)
    if str(config_file) in variants:
        return CONFIG_DIR / f"{env_name}-{config_file}.toml"
    raise ValueError(f"config {str(config_file)!r} is neither a file nor a shipped variant of "
                     f"{env_name}'s config (variants: {', '.join(variants) or 'none'})")


def read_toml(path: str | os.PathLike[str]) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:     # tomllib decodes the bytes as UTF-8
        line = path.read_bytes()[:error.start].count(b"\n") + 1
        raise ValueError(f"config file {str(path)!r} is not UTF-8 text (TOML files are): byte "
                         f"0x{error.object[error.start]:02x} on line {line}; save it as "
                         f"UTF-8") from None


def load_config(env_name: str | None = None, config_file: str | os.PathLike[str] | None = None,
                overrides: Sequence = (),
                base: dict | None = None) -> Config:
    """Resolves a Config: defaults, shipped env file, user file, overrides.

    `overrides` is a sequence of ("section.key", value) pairs or a list of
    command-line tokens (see `parse_override_tokens`); a string value there is
    command-line text, read as the TOML literal it spells (64, 3e-4, true,
    [1, 2]; a bare word stays text), and taken as it is for a string key. `base`
    (a dict as written by `to_dict`) replaces the defaults + shipped file, for
    resuming a run.

    Values from TOML files keep TOML's types: no conversion beyond an int where a
    float is expected and a whole float (1e6) where an int is; "1e3" for an int
    key or "off" for a bool is refused naming the key and the file.
    """
    factory = None
    if callable(env_name):
        from ..vector.sources import CALLABLE_PREFIX, recorded_name
        factory = env_name
        env_name = recorded_name(factory)
        if not env_name.startswith(CALLABLE_PREFIX):
            factory = None      # the import path is the whole truth, as from TOML
    if config_file is not None and not isinstance(config_file, (str, os.PathLike)):
        raise TypeError(f"config_file is a TOML file's path or the name of a shipped variant, "
                        f"got {type(config_file).__name__}"
                        + (": values go in overrides=[(\"train.learning_rate\", 3e-4), ...]"
                           if isinstance(config_file, dict) else ""))
    layers: list[tuple[dict, Path | None]] = []     # (values, the file they came from)
    if base is not None:
        layers.append((base, None))
    user_path = resolve_config_file(env_name, config_file) if config_file is not None else None
    user = read_toml(user_path) if user_path is not None else {}
    if env_name is None:
        env_name = (user.get("env", {}) or {}).get("name") or (base or {}).get("env", {}).get("name")
    if env_name is None:
        raise ValueError("no env given: pass ENV (e.g. `peregrine train cartpole`) or a --config "
                         "file with [env] name = ...")
    if base is None:
        shipped = shipped_config_path(env_name)
        if shipped.is_file():
            layers.append((read_toml(shipped), shipped))
    layers.append((user, user_path))
    overrides = _override_pairs(overrides)
    config = _layered(env_name, factory, layers, overrides)
    if config.env.get("name") != env_name:
        named = config.env.get("name")
        if user_path is not None and (user.get("env") or {}).get("name") == named:
            raise ValueError(f"config file {str(user_path)!r} sets env.name = {named!r}, but the "
                             f"env given is {env_name!r}: a config file's [env] table is that "
                             f"env's; to train {env_name!r} with the file's [train], [vec] and "
                             f"[policy], copy it without its [env] table")
        raise ValueError(f"env.name is {named!r} but the env given is {env_name!r}")
    if factory is None:
        from ..vector.sources import kind_of
        kind_of(env_name)      # an unknown name fails here, with the kinds of names listed
    if base is None and not shipped_config_path(env_name).is_file():
        # The env is made to read its spaces only where the continuous-action defaults
        # would change something (files and overrides that set every key they name skip it).
        if _layered(env_name, factory, [(CONTINUOUS_DEFAULTS, None)] + layers,
                    overrides) != config:
            overlay = _continuous_overlay(config)
            if overlay is not None:
                config = _layered(env_name, factory, [(overlay, None)] + layers, overrides)
                config.defaults = "continuous"
    validate(config)
    return config


def _override_pairs(overrides) -> list:
    """load_config's overrides as a checked list of ("section.key", value) pairs."""
    if isinstance(overrides, (str, dict)) or not isinstance(overrides, Iterable):
        raise TypeError(f"overrides must be a list of (\"section.key\", value) pairs or of "
                        f"command-line tokens, got {type(overrides).__name__} {overrides!r}"
                        + (" (a dict: list(overrides.items()))" if isinstance(overrides, dict)
                           else ""))
    overrides = list(overrides)
    if overrides and isinstance(overrides[0], str):
        overrides = parse_override_tokens(overrides)
    for pair in overrides:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise TypeError(f"an override is a (\"section.key\", value) pair, got {pair!r}")
    return overrides


def _layered(env_name: str, factory, layers, overrides) -> Config:
    """A Config from the defaults, `layers` ((values, the file they came from) in
    order) and then the override pairs."""
    config = Config(env={"name": env_name}, env_factory=factory)
    for layer, source in layers:
        try:
            apply_dict(config, layer)
        except ValueError as error:
            if source is None:
                raise
            raise ValueError(f"config file {str(source)!r}: {error}") from None
    for key, value in overrides:
        set_key(config, key, value, text=True)
    return config


def _continuous_overlay(config: Config) -> dict | None:
    """CONTINUOUS_DEFAULTS for the config's env when it acts in a Box action space, else
    None. One env is made (with the config's [env] keywords) and closed again; an env
    that cannot be made gives None: the trainer makes it next and reports why. Where the
    policy encodes observations that train.normalize_obs cannot standardise (an image,
    discrete values: encoders.standardisable), the overlay leaves normalize_obs out."""
    from gymnasium.spaces import Box
    try:
        if config.is_native:
            from ..envs.registry import make
            env = make(config.env_name, num_envs=1, **config.env_kwargs)
        else:
            env = config.env_source().vector_envs_of(1)()
        try:
            from ..vector.emulation import single_spaces
            observation_space, action_space = single_spaces(env)
        finally:
            env.close()
    except Exception:   # noqa: BLE001 - reported where the run makes its env
        return None
    if not isinstance(action_space, Box):
        return None
    from .encoders import standardisable
    if config.policy.encoder != "flat" and not standardisable(observation_space):
        return {section: {key: value for key, value in values.items()
                          if key != "normalize_obs"}
                for section, values in CONTINUOUS_DEFAULTS.items()}
    return CONTINUOUS_DEFAULTS


def apply_dict(config: Config, data: dict) -> None:
    unknown = sorted(set(data) - {"env", *SECTIONS})
    if unknown == ["sweep"]:
        raise ValueError("it holds a [sweep] table: a sweep's file, run it with "
                         "`peregrine sweep FILE`")
    if unknown:
        raise ValueError(f"unknown config section(s) {unknown}; valid sections: "
                         f"{['env', *SECTIONS]}")
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ValueError(f"config section [{section}] must be a table, got {values!r}")
        for key, value in values.items():
            set_key(config, f"{section}.{key}", value)


def set_key(config: Config, dotted: str, value: Any, text: bool = False) -> None:
    """Sets `section.key` (dashes allowed in key) to `value`, a value of the key's
    type (see `convert`). With `text`, a string `value` is command-line text: read
    as the TOML literal it spells, except for a string key (taken as it is)."""
    section, _, key = dotted.partition(".")
    key = key.replace("-", "_")
    if section not in ("env", *SECTIONS) or not key:
        raise ValueError(f"config key {dotted!r} must look like SECTION.KEY with SECTION one of "
                         f"{['env', *SECTIONS]}")
    if section == "env":
        config.env[key] = convert_env_value(config.env.get("name"), key, value, text=text)
        return
    target = getattr(config, section)
    names = {f.name: f for f in dataclasses.fields(target)}
    if key not in names:
        raise ValueError(f"unknown config key {section}.{key}; valid keys in [{section}]: "
                         f"{sorted(names)}")
    default = getattr(type(target)(), key)
    shown = value
    if (section, key) == ("vec", "num_workers"):
        # "auto" (resolved by validate() for the backend) or a count
        value = _from_text(value, int) if text else value
        target.num_workers = "auto" if value == "auto" else convert(dotted, value, int, shown)
        return
    if (section, key) == ("policy", "action_mask") and isinstance(value, bool):
        value = "auto" if value else "false"   # TOML `action_mask = false`
    kind = type(default)
    converted = convert(f"{section}.{key}", _from_text(value, kind) if text else value, kind,
                        shown)
    choices = CHOICES.get((section, key))
    if choices is not None and converted not in choices:
        raise ValueError(f"{section}.{key} = {converted!r} is not one of {list(choices)}")
    setattr(target, key, converted)


def _from_text(value: Any, kind: type) -> Any:
    """A command-line value for a key of type `kind`: text is read as the TOML
    literal it spells (64, 1e6, 3e-4, true), except for a string key."""
    if isinstance(value, str) and kind is not str:
        return _toml_literal(value)
    return value


def _quoted_hint(value: Any) -> str:
    """For a string that spells a number ("64", as a TOML file quotes it): the fix. A
    word ("abc") gets none: it was not quoted, it is no number."""
    if isinstance(value, str) and isinstance(_toml_literal(value.strip()), numbers.Real):
        return " (a string: write the value without quotes)"
    return ""


def convert(name: str, value: Any, kind: type, shown: Any = None) -> Any:
    """`value` (a TOML value, or command-line text already read as one) as the
    key's type bool/int/float/str; ValueError naming `name` (and showing `shown`,
    what the user wrote, when given) otherwise. TOML's types are kept: bools are
    true/false only, a string is never read as a number, an int is accepted for a
    float key and a whole float (1e6, as TOML spells large counts) for an int key.
    A path object (os.PathLike: `config.train.run_dir = Path(...)`) is a string."""
    shown = value if shown is None else shown
    if kind is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise ValueError(f"{name} must be true or false, got {shown!r}")
    if kind is int:
        if isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be an integer, got {shown!r}")
        if isinstance(value, numbers.Integral):
            return int(value)
        if not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be an integer, got {shown!r}{_quoted_hint(value)}")
        number = float(value)
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"{name} must be an integer, got {shown!r}")
        return int(number)
    if kind is float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number, got {shown!r}{_quoted_hint(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{name} must be finite, got {shown!r}")
        return number
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {shown!r}")
    return value


def env_config_fields(env_name: str | None) -> list[tuple] | None:
    """The env's (name, default, min, max, is_integer) fields, or None if unknown."""
    if env_name is None:
        return None
    from ..envs.registry import ENVS, env_class
    if env_name not in ENVS:
        return None
    cls = env_class(env_name)
    return cls.config_fields() if hasattr(cls, "config_fields") else None


def convert_env_value(env_name: str | None, key: str, value: Any, text: bool = False) -> Any:
    """An [env] value: TOML-typed, or command-line text (`text`) read as a TOML
    literal. An emulated env's values are its make's keywords, passed as they are."""
    if key == "name":
        return convert("env.name", value, str)
    if key == "preset":
        return convert("env.preset", value, str)
    fields = env_config_fields(env_name)
    if fields is None:  # an emulated env: its make's keywords, as TOML values
        if key == "wrappers":
            from ..vector.sources import check_wrappers
            return check_wrappers(_toml_literal(value) if text and isinstance(value, str)
                                  else value)
        return _from_text(value, object) if text else value
    by_name = {f[0]: f for f in fields}
    if key not in by_name:
        raise ValueError(f"unknown config key env.{key} for {env_name}; valid keys in [env]: "
                         f"{['name', 'preset', *by_name]}")
    kind = int if by_name[key][4] else float
    return convert(f"env.{key}", _from_text(value, kind) if text else value, kind, value)


def _toml_literal(text: str) -> Any:
    """A command-line value as the TOML value it spells (3, 0.5, true, [1, 2],
    {name = "X"}); the text itself when it spells none (a bare word)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def resolve_auto(config: Config) -> None:
    """vec.backend and vec.num_workers "auto" made concrete, so config.toml records
    what ran: native for a native env, else multiprocessing with one worker per
    available core (the largest divisor of num_envs within the core count); with
    train.overlap an emulated env is serial, stepped in the actor process (the
    actor and the learner fill two cores already; "multiprocessing" there is the
    choice for a machine with cores to spare, overlap.py), and so is a gym-vec: env
    (a vector env brings its own parallelism, as ALE's threads: no worker processes
    and no copies between them)."""
    v = config.vec
    if v.backend == "auto":
        from ..vector.sources import kind_of
        vector = not config.is_native and config.env_factory is None \
            and kind_of(config.env_name) == "gymnasium_vector"
        # (a centralised critic reads the batch's own state buffers: one process)
        v.backend = "native" if config.is_native else \
            "serial" if config.train.overlap or vector or config.policy.critic != "local" \
            else "multiprocessing"
    if v.num_workers == "auto":
        if v.backend != "multiprocessing":
            v.num_workers = 1
        else:
            from ..vector.common import auto_workers
            # Whole groups for vec.split (an indivisible num_envs is refused by validate).
            groups = v.split if v.split > 1 and v.num_envs % v.split == 0 else 1
            v.num_workers = auto_workers(v.num_envs, multiple=groups)


def recheck(config: Config) -> None:
    """load_config's checks once more, for a Config changed or built after it (the
    trainer runs this): every key's type and choices (set_key), then validate. An
    env_factory set on the object must be the env its env.name records (the run's
    config.toml and checkpoint name the env by it)."""
    if config.env_factory is not None:
        from ..vector.sources import recorded_name
        made_by = recorded_name(config.env_factory)
        if made_by != config.env_name:
            raise ValueError(f"config.env_factory is {made_by!r} but env.name is "
                             f"{config.env_name!r}, which the run would record as its env: "
                             f"build the config with load_config(FACTORY, ...) instead")
    for section in SECTIONS:
        target = getattr(config, section)
        for entry in dataclasses.fields(target):
            set_key(config, f"{section}.{entry.name}", getattr(target, entry.name))
    validate(config)


def validate(config: Config) -> None:
    """Cross-field checks; each message names the keys involved."""
    resolve_auto(config)
    t, v, p = config.train, config.vec, config.policy
    if not config.is_native and v.backend in ("native", "device"):
        raise ValueError(f"vec.backend = {v.backend!r} runs native envs only; "
                         f"{config.env_name!r} is emulated: use 'multiprocessing' or 'serial' "
                         f"(or 'auto')")
    positive = [("vec.num_envs", v.num_envs), ("vec.num_threads", v.num_threads),
                ("vec.num_workers", v.num_workers), ("train.total_steps", t.total_steps),
                ("train.horizon", t.horizon), ("train.minibatch_size", t.minibatch_size),
                ("train.update_epochs", t.update_epochs),
                ("policy.hidden_size", p.hidden_size), ("policy.lstm_size", p.lstm_size),
                ("policy.bptt_horizon", p.bptt_horizon), ("policy.slot_size", p.slot_size)]
    for name, value in positive:
        if not value >= 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    nonnegative = [("train.learning_rate", t.learning_rate), ("train.clip_coef", t.clip_coef),
                   ("train.vf_coef", t.vf_coef), ("train.ent_coef", t.ent_coef),
                   ("train.max_grad_norm", t.max_grad_norm), ("train.target_kl", t.target_kl),
                   ("train.checkpoint_interval", t.checkpoint_interval),
                   ("train.progress_interval", t.progress_interval), ("train.seed", t.seed),
                   ("train.teacher_coef", t.teacher_coef), ("train.teacher_steps", t.teacher_steps),
                   ("policy.num_layers", p.num_layers), ("train.torch_threads", t.torch_threads)]
    for name, value in nonnegative:
        if not value >= 0:    # NaN too
            raise ValueError(f"{name} must be >= 0, got {value}")
    if t.torch_threads > 1024:
        raise ValueError(f"train.torch_threads must be in [0, 1024] (0: auto), got "
                         f"{t.torch_threads}")
    if t.seed >= 1 << 64:
        raise ValueError(f"train.seed must be less than 2**64, got {t.seed}")
    for name, value in (("train.gamma", t.gamma), ("train.gae_lambda", t.gae_lambda)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    for name, value in (("train.obs_clip", t.obs_clip), ("train.reward_clip", t.reward_clip)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if not t.dist_timeout > 0:
        raise ValueError(f"train.dist_timeout must be > 0, got {t.dist_timeout}")
    if not t.adam_eps > 0:
        raise ValueError(f"train.adam_eps must be > 0, got {t.adam_eps}")
    if v.split not in (1, 2):
        raise ValueError(f"vec.split must be 1 or 2, got {v.split}")
    if v.split > 1:
        if v.backend == "multiprocessing" and v.num_workers % v.split:
            raise ValueError(f"vec.split = {v.split} with vec.backend = 'multiprocessing' steps "
                             f"{v.split} groups of worker processes: vec.num_workers "
                             f"({v.num_workers}) must be a multiple of {v.split}")
        if v.num_envs % v.split:
            raise ValueError(f"vec.num_envs ({v.num_envs}) must be divisible by vec.split "
                             f"({v.split}): the halves get the same number of instances")
    check_features(config)
    if p.lstm and t.horizon % p.bptt_horizon:
        raise ValueError(f"policy.bptt_horizon ({p.bptt_horizon}) must divide train.horizon "
                         f"({t.horizon}) when policy.lstm is true")


# ---- which features combine -------------------------------------------------------

# Every feature that does not combine with every other, by the name the user sets,
# and how a config says it is on. Three facts of a run are not in its config and
# come from the caller (check_features): a teacher object passed in Python (it
# counts as train.teacher), an env object passed in Python, several ranks.
FEATURES = {
    "train.overlap": lambda c: c.train.overlap,
    "train.compile": lambda c: c.train.compile,
    "vec.split = 2": lambda c: c.vec.split > 1,
    "policy.critic other than 'local'": lambda c: c.policy.critic != "local",
    "policy.lstm": lambda c: c.policy.lstm,
    "train.normalize_obs": lambda c: c.train.normalize_obs,
    "train.normalize_reward": lambda c: c.train.normalize_reward,
    "train.teacher": lambda c: bool(c.train.teacher),
    "train.device other than cpu": lambda c: c.train.device != "cpu",
    "vec.backend = 'device'": lambda c: c.vec.backend == "device",
    "vec.backend = 'serial'": lambda c: c.vec.backend == "serial",
    "vec.backend = 'multiprocessing'": lambda c: c.vec.backend == "multiprocessing",
    "an env callable without an import path": lambda c: c.env_factory is not None,
}
AN_ENV_OBJECT, SEVERAL_RANKS = "an env object", "several ranks"

# The one table of what does not combine (yet): a feature, what it does not
# support, and why. Each pair is written once, under the feature that cannot
# take the other; check_features reads nothing else.
INCOMPATIBLE = (
    ("train.overlap", ("policy.lstm", "train.normalize_obs", "train.normalize_reward",
                       "train.teacher", "vec.backend = 'device'", "train.device other than cpu",
                       "an env callable without an import path", AN_ENV_OBJECT, SEVERAL_RANKS),
     "its actor process makes its own env from the config, and runs a feed-forward CPU "
     "policy without normalisers: overlap.py"),
    ("train.compile", ("policy.lstm", "train.teacher", "train.overlap", "vec.split = 2"),
     "compiling.py says why"),
    ("vec.split = 2", ("train.overlap", "train.teacher", "vec.backend = 'device'",
                       "vec.backend = 'serial'", AN_ENV_OBJECT, SEVERAL_RANKS),
     "its halves are native blocks or groups of worker processes made for it (a host "
     "native or multiprocessing batch from the config), stepped by one collector in one "
     "process"),
    ("policy.critic other than 'local'", ("train.overlap", "vec.backend = 'multiprocessing'"),
     "the global state is written into the env batch's own buffers"),
)


def check_features(config: Config, *, teacher_object: bool = False, env_object: bool = False,
                   several_ranks: bool = False) -> None:
    """Refuses features that do not combine (INCOMPATIBLE), naming both sides and why.
    validate() calls it for every config; the trainer and the launcher again with
    the facts only they know (a teacher or env object, several ranks)."""
    present = {name for name, is_on in FEATURES.items() if is_on(config)}
    if teacher_object:
        present.add("train.teacher")
    if env_object:
        present.add(AN_ENV_OBJECT)
    if several_ranks:
        present.add(SEVERAL_RANKS)
    for feature, others, why in INCOMPATIBLE:
        clash = [other for other in others if other in present]
        if feature in present and clash:
            raise ValueError(f"{_setting(config, feature)} does not support "
                             f"{', '.join(clash)} yet ({why}); turn those off or "
                             f"{_turn_off(feature)}")


def _setting(config: Config, feature: str) -> str:
    """How a feature reads in a message: `train.overlap = true`, `policy.critic = 'global'`."""
    if feature == "policy.critic other than 'local'":
        return f"policy.critic = {config.policy.critic!r}"
    if feature in ("train.overlap", "train.compile"):
        return f"{feature} = true"
    return feature


def _turn_off(feature: str) -> str:
    return {"train.overlap": "train.overlap off", "train.compile": "train.compile off",
            "vec.split = 2": "set vec.split = 1",
            "policy.critic other than 'local'": "set policy.critic = 'local'",
            SEVERAL_RANKS: "train in one process"}[feature]


# ---- command-line overrides ---------------------------------------------------

def is_override(token: str) -> bool:
    """The override syntax: `--SECTION.KEY` (its value the next token) or
    `--SECTION.KEY=VALUE`."""
    return token.startswith("--") and "." in token.split("=", 1)[0]


def split_overrides(argv: Iterable[str]) -> tuple[list[str], list[str]]:
    """(other arguments, override tokens) of a command line, before argparse sees
    the rest: `--a.b VALUE` and `--a.b=VALUE` are overrides."""
    argv, rest, overrides = list(argv), [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        if is_override(token):
            take = 1 if "=" in token or i + 1 >= len(argv) else 2
            overrides += argv[i:i + take]
            i += take
        else:
            rest.append(token)
            i += 1
    return rest, overrides


def parse_override_tokens(tokens: Iterable[str]) -> list[tuple[str, str]]:
    """['--train.learning-rate', '3e-4', '--vec.num-envs=64'] -> [(key, value), ...]."""
    pairs = []
    tokens = list(tokens)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not is_override(token):
            raise ValueError(f"unexpected argument {token!r}; overrides look like "
                             f"--SECTION.KEY VALUE (e.g. --train.learning-rate 3e-4), "
                             f"SECTION one of {['env', *SECTIONS]}")
        if "=" in token:
            key, value = token[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise ValueError(f"override {token} needs a value")
            key, value = token[2:], tokens[i + 1]
            i += 2
        pairs.append((key, value))
    return pairs


# ---- writing TOML (flat tables of scalars) -------------------------------------

def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):     # an inline table (env.wrappers entries)
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {value!r} to TOML")


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else _toml_value(str(key))


def dump_toml(data: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        lines += [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)
