"""`peregrine render ENV --policy P --out episode.gif`: one episode as an animated GIF.

The policy and the world are resolved as in `peregrine eval` (a scripted
policy name or a checkpoint path; a checkpoint's own env config unless
`--preset` is given; `--env.KEY VALUE` overrides). A native env draws with its
renderer module (the registry's, or a plugin class's `renderer`): its own
`render_episode` where it has one (DroneSwarm's annotated episodes), else the
frames of `rgb_frame(env, instance, size)`. An emulated env draws itself
(render_mode "rgb_array").
"""
from __future__ import annotations

import argparse
import importlib
import os

from . import headless
from .eval import add_world_arguments, world_overrides


def _size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        size = None
    if size is None or not 32 <= size <= 2048:
        raise argparse.ArgumentTypeError(f"must be an int in [32, 2048], got {text!r}")
    return size


def add_arguments(parser):
    parser.add_argument("env", nargs="?", default=None,
                        help="environment to render: a native env with a renderer, or an "
                             "emulated env that draws itself (gym:ID, pettingzoo:MODULE, "
                             "module:function, with render_mode='rgb_array'); omit it with a "
                             "checkpoint to use the env it was trained on")
    parser.add_argument("--policy", default="random",
                        help="scripted policy name or checkpoint path (as for `peregrine eval`)")
    parser.add_argument("--out", required=True, help="output GIF path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="stop after this many steps (default: the end of the episode)")
    parser.add_argument("--every", type=int, default=2, help="keep every k-th step as a frame")
    parser.add_argument("--size", type=_size, default=None,
                        help="the frame's longer side in pixels, 32-2048 (default: the "
                             "env's own drawing size)")
    parser.add_argument("--frame-ms", type=int, default=80, help="milliseconds per frame")
    parser.add_argument("--sample", action="store_true",
                        help="a checkpoint's policy samples its actions (seeded by --seed), "
                             "as `peregrine eval --sample` scores it, instead of taking the "
                             "most likely one")
    add_world_arguments(parser)


def parse_arguments(parser, argv):
    from .eval import parse_arguments as parse
    return parse(parser, argv)


def run(args) -> int:
    from ..vector.sources import is_native_name, kind_of
    if args.env is None:
        from ..evaluate import checkpoint_env_name
        args.env = checkpoint_env_name(args.policy)
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    if not str(args.out).lower().endswith(".gif"):
        raise ValueError(f"--out must be a .gif path, got {args.out!r}")
    if not is_native_name(args.env):
        kind_of(args.env)
        return _run_emulated(args)
    from ..envs.registry import ENVS, make, renderer as renderer_of
    module = renderer_of(args.env)
    if module is None:
        drawn = sorted(name for name in ENVS if renderer_of(name) is not None)
        raise ValueError(f"no renderer for env {args.env!r}; renderable envs: {drawn}")
    from ..evaluate import eval_world
    from ..policies import make_policy
    renderer = importlib.import_module(module)
    preset, fields = world_overrides(args)
    world = eval_world(args.env, args.policy, preset, fields)
    print(f"{args.env}, policy {args.policy}, world: {world['description']}")
    env = make(args.env, num_envs=1, seed=args.seed, **world["kwargs"])
    try:
        policy = make_policy(args.env, args.policy, env, seed=args.seed,
                             check_world=not world["explicit"], sample=args.sample)
        if not hasattr(renderer, "render_episode"):
            return _frames_of_native(env, policy, module, args)
        from ..files import written_atomically
        # Whatever the renderer module does with the path (a plugin's too), the
        # output reaches --out by a rename: Ctrl-C never leaves it half-written.
        with written_atomically(args.out) as temporary:
            result = renderer.render_episode(
                env, policy, temporary, max_steps=args.steps, every=args.every,
                frame_ms=args.frame_ms, **({} if args.size is None else {"size": args.size}))
    finally:
        env.close()
    print(f"wrote {args.out}: {result['frames']} frames, {result['steps']} steps, "
          f"delivered {result['delivered']}")
    return 0


def _episode_frames(batch, policy, draw, every: int, limit: int) -> tuple[list, int]:
    """(frames, steps) of the episode a one-instance batch (a native batch, or one
    emulated env) has just begun: `draw()` before the first step and every `every`
    steps, up to the episode's end (not after it: the instance has reset by then, and
    a PettingZoo episode ends when its last agent does, not its first). An emulated
    env is drawn once more as its episode ends, before its reset (its `before_reset`):
    the state the episode ended in, a goal reached or a fall, is the GIF's last frame."""
    from ..evaluate import policy_actions
    batch.episode_stats(clear=True)
    observations, frames, steps = batch.observations, [draw()], 0
    if hasattr(batch, "before_reset"):
        batch.before_reset = lambda: frames.append(draw())
    observe_done = getattr(policy, "observe_done", None)
    while steps < limit:
        observations, _, terminals, truncations, _ = batch.step(
            policy_actions(policy, observations, batch))
        steps += 1
        if observe_done is not None:
            observe_done(terminals, truncations)
        if batch.episode_stats(clear=False).count:
            break
        if steps % every == 0:
            frames.append(draw())
    return frames, steps


def _finish(args, frames, steps, stats) -> int:
    write_gif(frames, args.out, args.frame_ms)
    ended = ", ".join(f"{name} {value:.2f}" for name, value in stats.mean.items()) \
        if stats.count else "episode not finished"
    print(f"wrote {args.out}: {len(frames)} frames, {steps} steps, {ended}")
    return 0


def _frames_of_native(env, policy, module_name, args) -> int:
    """One episode of instance 0 drawn by the renderer's rgb_frame."""
    from ..envs.native import drawing
    env.reset(seed=args.seed)
    frames, steps = _episode_frames(
        env, policy, lambda: drawing.frame(module_name, env, 0, args.size), args.every,
        args.steps or int(env.config.get("max_steps", 100_000)))
    return _finish(args, frames, steps, env.episode_stats(clear=True))


def _run_emulated(args) -> int:
    """One episode of an emulated env drawn by the env itself (render_mode "rgb_array")."""
    import numpy as np

    from ..evaluate import emulated_env_keywords
    from ..policies import make_policy
    from ..vector.emulation import emulate
    from ..vector.sources import EnvFactory, EnvKeywordError
    if args.preset is not None:
        raise ValueError("--preset applies to native envs; an emulated env takes "
                         "--env.KEY VALUE (its make's keywords)")
    _, fields = world_overrides(args)
    if headless():      # before the env imports mujoco, which reads it then
        os.environ.setdefault("MUJOCO_GL", "egl")
    keywords = {"render_mode": "rgb_array",
                **emulated_env_keywords(args.env, args.policy, fields)}
    factory = EnvFactory.from_keywords(args.env, keywords).vector_envs_of(1)
    try:
        made = factory()
    except EnvKeywordError as error:
        if "'render_mode'" not in str(error):
            raise
        raise ValueError(f"{args.env} does not take render_mode, which render makes it with "
                         f"(render_mode='rgb_array'): give the env (or your factory) a "
                         f"render_mode argument and a render() that returns an RGB array") \
            from None
    unit = emulate(made, seed=args.seed)

    def draw():
        try:
            frame = unit.env.render()
        except Exception as error:   # noqa: BLE001 - the env's own drawing, reported
            raise ValueError(_drawing_failed(args.env, error)) from None
        if factory.kind == "gymnasium_vector" and isinstance(frame, (tuple, list)):
            return frame[0] if frame else None      # a vector env draws one frame per env
        return frame
    try:
        policy = make_policy(args.env, args.policy, unit, seed=args.seed, sample=args.sample)
        frames, steps = _episode_frames(unit, policy, draw, args.every,
                                        args.steps or 1_000_000)
        stats = unit.episode_stats(clear=True)
    finally:
        unit.close()
    if frames[0] is None or not isinstance(frames[0], np.ndarray):
        raise ValueError(f"{args.env} drew no frame: it needs render_mode='rgb_array' "
                         f"(--env.render_mode rgb_array) and an env that supports it")
    return _finish(args, frames, steps, stats)


def _drawing_failed(env_name: str, error: BaseException) -> str:
    """One line for an env whose render() raised; for MuJoCo's envs, how to choose the
    OpenGL backend it draws with (render sets MUJOCO_GL=egl on a headless machine)."""
    text = str(error).strip().splitlines()
    message = (f"{env_name} could not draw a frame (render_mode 'rgb_array'): "
               f"{type(error).__name__}: {text[0] if text else ''}")
    if "mujoco" in type(error).__module__ or "opengl" in str(error).lower():
        message += (f" (MuJoCo draws with MUJOCO_GL={os.environ.get('MUJOCO_GL', 'glfw')}; "
                    f"without a display use MUJOCO_GL=egl, or MUJOCO_GL=osmesa with Mesa's "
                    f"OSMesa library installed)")
    return message


def write_gif(frames, out_path, frame_ms: int) -> None:
    """RGB frames as an animated GIF, written to a temporary name and renamed, so an
    interrupted render never leaves a half-written file at `out_path` (nor a
    temporary beside it)."""
    from PIL import Image

    from ..files import written_atomically
    images = [Image.fromarray(frame).convert("P", palette=Image.ADAPTIVE) for frame in frames]
    durations = [frame_ms] * len(images)
    durations[-1] = max(frame_ms, 1500)
    with written_atomically(out_path) as temporary:
        images[0].save(temporary, format="GIF", save_all=True, append_images=images[1:],
                       duration=durations, loop=0)
