"""An env's drawing module, as every adapter uses it.

A native env draws with a module of its own (the registry's renderer: a built-in
env's `envs/NAME/render.py`, a plugin class's `renderer`) that defines
`RENDER_FPS` and `rgb_frame(env, instance[, size])`, and may define
`agent_frames(env, instance, frame)` (one frame per agent of a multi-agent
instance) and `render_episode` (an annotated GIF). The Gymnasium and SB3 exports,
the PettingZoo view and `peregrine render` read it through these functions only.
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect

import numpy as np


@functools.lru_cache(maxsize=None)
def render_fps(module_name: str) -> int:
    """RENDER_FPS of a drawing module, read from its source without running it.

    Adapters state the fps in metadata whatever their render_mode, and a drawing
    module may import what only drawing needs (DroneSwarm's imports Pillow, which
    the core install lacks): an env made without a render_mode must neither need
    that nor pay for importing it. A module whose source cannot be read (or that
    computes the value) is imported instead."""
    spec = importlib.util.find_spec(module_name)
    source = spec.loader.get_source(module_name) if spec is not None and spec.loader else None
    if source is not None:
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(target, ast.Name) and target.id == "RENDER_FPS"
                    for target in node.targets):
                try:
                    return ast.literal_eval(node.value)
                except ValueError:
                    break
    return importlib.import_module(module_name).RENDER_FPS


def frame(module_name: str, env, instance: int = 0, size: int | None = None) -> np.ndarray:
    """The instance's frame, RGB uint8 [H, W, 3]; `size` (the longer side) goes to an
    rgb_frame that takes one, and scales the frame of one that draws at its env's own
    size."""
    draw = importlib.import_module(module_name).rgb_frame
    if size is None:
        return np.asarray(draw(env, instance))
    if "size" in inspect.signature(draw).parameters:
        return np.asarray(draw(env, instance, size=size))
    drawn = np.asarray(draw(env, instance))
    height, width = drawn.shape[:2]
    if max(height, width) == size:
        return drawn
    from PIL import Image       # render's own dependency (it writes the GIF with it)
    scale = size / max(height, width)
    shape = (max(1, round(width * scale)), max(1, round(height * scale)))
    return np.asarray(Image.fromarray(drawn).resize(shape, Image.BILINEAR))


def agent_frames(module_name: str, env, instance: int, first: np.ndarray) -> list:
    """One frame per agent row of `instance`: the module's agent_frames (each agent
    marked), else the instance's frame once per agent."""
    module = importlib.import_module(module_name)
    if hasattr(module, "agent_frames"):
        return list(module.agent_frames(env, instance, first))
    return [first] * env.agents_per_env
