"""Peregrine envs for other libraries: a Gymnasium 1.x VectorEnv and an SB3 VecEnv.

Both treat each row (agent) of a Peregrine batch as one sub-env, so a batch
of N CartPoles is an N-env vector env. Both copy what they return (those
libraries keep references to observations across steps), so they cost one
copy per step that the native interface avoids. Rows whose mask is False
(absent agents of a multi-agent env) still appear; the Gymnasium adapter puts
`masks` in infos, SB3 has no notion of them.
"""
from __future__ import annotations

import time

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv


def _as_actions(env, actions):
    shape = (env.num_agents, *env.single_action_space.shape)
    actions = np.asarray(actions)
    if actions.size != int(np.prod(shape)):
        raise ValueError(f"actions must hold {int(np.prod(shape))} values (shape {shape}), "
                         f"got shape {actions.shape}")
    return np.ascontiguousarray(actions.reshape(shape), dtype=env.single_action_space.dtype)


class GymnasiumVectorEnv(VectorEnv):
    """A Gymnasium VectorEnv over any Peregrine env (native batch or backend).

    Autoreset mode SAME_STEP: an ended sub-env is reset inside the step that
    ended it; its last observation is in infos["final_obs"] (an object array,
    None where the sub-env did not end) with the boolean mask
    infos["_final_obs"], exactly as Gymnasium's own vector envs report it.
    """

    def __init__(self, env, copy: bool = True):
        self.env = env
        self.copy = copy
        self.num_envs = env.num_agents
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = None
        self.closed = False

    def _out(self, array):
        return array.copy() if self.copy else array

    def reset(self, *, seed=None, options=None):
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        observations, _ = self.env.reset(seed=seed)
        return self._out(observations), {}

    def step(self, actions):
        observations, rewards, terminals, truncations, _ = self.env.step(
            _as_actions(self.env, actions))
        infos = {}
        ended = terminals | truncations
        if ended.any():
            final = np.full(self.num_envs, None, dtype=object)
            for row in np.flatnonzero(ended):
                final[row] = self.env.final_observations[row].copy()
            infos["final_obs"] = final
            infos["_final_obs"] = ended.copy()
            infos["final_info"] = {}
            infos["_final_info"] = ended.copy()
        masks = self.env.masks
        if not masks.all():
            infos["masks"] = masks.copy()
        return (self._out(observations), self._out(rewards), self._out(terminals),
                self._out(truncations), infos)

    def close_extras(self, **kwargs):
        self.env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sb3_vec_env(env):
    """An SB3 VecEnv over a Peregrine env (requires stable-baselines3)."""
    from stable_baselines3.common.vec_env import VecEnv

    class SB3VecEnv(VecEnv):
        """SB3's VecEnv interface: dones = terminals | truncations, the final
        observation in info["terminal_observation"], info["TimeLimit.truncated"]
        for bootstrapping, and info["episode"] (return, length) so SB3 logs
        episode statistics like its Monitor wrapper does."""

        def __init__(self, env):
            self.env = env
            self.render_mode = None
            super().__init__(env.num_agents, env.single_observation_space,
                             env.single_action_space)
            self._returns = np.zeros(env.num_agents, np.float64)
            self._lengths = np.zeros(env.num_agents, np.int64)
            self._start = time.perf_counter()
            self._actions = None

        def reset(self):
            seed = self._seeds[0]
            observations, _ = self.env.reset(seed=seed)
            self._reset_seeds()
            self._reset_options()
            self._returns[:] = 0
            self._lengths[:] = 0
            return observations.copy()

        def step_async(self, actions):
            self._actions = _as_actions(self.env, actions)

        def step_wait(self):
            observations, rewards, terminals, truncations, _ = self.env.step(self._actions)
            self._returns += rewards
            self._lengths += 1
            dones = terminals | truncations
            infos = [{} for _ in range(self.num_envs)]
            for row in np.flatnonzero(dones):
                info = infos[row]
                info["terminal_observation"] = self.env.final_observations[row].copy()
                info["TimeLimit.truncated"] = bool(truncations[row] and not terminals[row])
                info["episode"] = {"r": float(self._returns[row]), "l": int(self._lengths[row]),
                                   "t": round(time.perf_counter() - self._start, 6)}
                self._returns[row] = 0.0
                self._lengths[row] = 0
            return observations.copy(), rewards.copy(), dones, infos

        def close(self):
            self.env.close()

        def get_attr(self, attr_name, indices=None):
            value = getattr(self, attr_name) if attr_name == "render_mode" else \
                getattr(self.env, attr_name)
            return [value] * len(self._indices(indices))

        def set_attr(self, attr_name, value, indices=None):
            setattr(self.env, attr_name, value)

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            result = getattr(self.env, method_name)(*method_args, **method_kwargs)
            return [result] * len(self._indices(indices))

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(self._indices(indices))

        def _indices(self, indices):
            if indices is None:
                return range(self.num_envs)
            if isinstance(indices, int):
                return [indices]
            return list(indices)

    return SB3VecEnv(env)
