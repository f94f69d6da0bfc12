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

import importlib

from .eval import add_world_arguments, world_overrides


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
    parser.add_argument("--size", type=int, default=200, help="frame side in pixels")
    parser.add_argument("--frame-ms", type=int, default=80, help="milliseconds per frame")
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
                             check_world=not world["explicit"])
        if not hasattr(renderer, "render_episode"):
            return _frames_of_native(env, policy, renderer, args)
        from ..envs.raster import written_atomically
        # Whatever the renderer module does with the path (a plugin's too), the
        # output reaches --out by a rename: Ctrl-C never leaves it half-written.
        with written_atomically(args.out) as temporary:
            result = renderer.render_episode(env, policy, temporary, max_steps=args.steps,
                                             every=args.every, size=args.size,
                                             frame_ms=args.frame_ms)
    finally:
        env.close()
    print(f"wrote {args.out}: {result['frames']} frames, {result['steps']} steps, "
          f"delivered {result['delivered']}")
    return 0


def _frames_of_native(env, policy, renderer, args) -> int:
    """One episode of instance 0 drawn by the renderer's rgb_frame(env, 0, size)."""
    import numpy as np
    import inspect
    sized = "size" in inspect.signature(renderer.rgb_frame).parameters

    def frame():
        return renderer.rgb_frame(env, 0, size=args.size) if sized else renderer.rgb_frame(env, 0)
    observations, _ = env.reset(seed=args.seed)
    env.episode_stats(clear=True)
    frames, steps = [frame()], 0
    observe_done = getattr(policy, "observe_done", None)
    limit = args.steps or int(env.config.get("max_steps", 100_000))
    while steps < limit:
        actions = np.ascontiguousarray(policy(observations), dtype=env.action_space.dtype)
        observations, _, terminals, truncations, _ = env.step(
            actions.reshape(env.action_space.shape))
        steps += 1
        if observe_done is not None:
            observe_done(terminals, truncations)
        if (terminals | truncations).any():
            break       # the instance has reset already: its last frame is the one before
        if steps % args.every == 0:
            frames.append(frame())
    stats = env.episode_stats(clear=True)
    write_gif(frames, args.out, args.frame_ms)
    ended = ", ".join(f"{name} {value:.2f}" for name, value in stats.mean.items()) \
        if stats.count else "episode not finished"
    print(f"wrote {args.out}: {len(frames)} frames, {steps} steps, {ended}")
    return 0


def _run_emulated(args) -> int:
    """One episode of an emulated env drawn by the env itself (render_mode "rgb_array")."""
    import numpy as np

    from ..evaluate import emulated_env_keywords
    from ..policies import make_policy
    from ..vector.emulation import emulate
    from ..vector.sources import EnvFactory
    if args.preset is not None:
        raise ValueError("--preset applies to native envs; an emulated env takes "
                         "--env.KEY VALUE (its make's keywords)")
    _, fields = world_overrides(args)
    keywords = emulated_env_keywords(args.env, args.policy, fields)
    wrappers = keywords.pop("wrappers", ())
    keywords.setdefault("render_mode", "rgb_array")
    unit = emulate(EnvFactory(args.env, keywords, wrappers)(), seed=args.seed)
    try:
        policy = make_policy(args.env, args.policy, unit, seed=args.seed)
        frames, steps = [unit.env.render()], 0
        limit = args.steps or 1_000_000
        while steps < limit:
            actions = np.ascontiguousarray(policy(unit.observations), dtype=unit.actions.dtype)
            unit.step(actions.reshape(unit.actions.shape))
            steps += 1
            observe_done = getattr(policy, "observe_done", None)
            if observe_done is not None:
                observe_done(unit.terminals, unit.truncations)
            ended = unit.episode_stats(clear=False).count > 0
            if steps % args.every == 0 or ended:
                frames.append(unit.env.render())
            if ended:
                break
        stats = unit.episode_stats(clear=True)
    finally:
        unit.close()
    if frames[0] is None or not isinstance(frames[0], np.ndarray):
        raise ValueError(f"{args.env} drew no frame: it needs render_mode='rgb_array' "
                         f"(--env.render_mode rgb_array) and an env that supports it")
    write_gif(frames, args.out, args.frame_ms)
    ended_text = (f"return {stats.mean['episode_return']:.1f}" if stats.count
                  else "episode not finished")
    print(f"wrote {args.out}: {len(frames)} frames, {steps} steps, {ended_text}")
    return 0


def write_gif(frames, out_path, frame_ms: int) -> None:
    """RGB frames as an animated GIF, written to a temporary name and renamed, so an
    interrupted render never leaves a half-written file at `out_path` (nor a
    temporary beside it)."""
    from PIL import Image

    from ..envs.raster import written_atomically
    images = [Image.fromarray(frame).convert("P", palette=Image.ADAPTIVE) for frame in frames]
    durations = [frame_ms] * len(images)
    durations[-1] = max(frame_ms, 1500)
    with written_atomically(out_path) as temporary:
        images[0].save(temporary, format="GIF", save_all=True, append_images=images[1:],
                       duration=durations, loop=0)
