"""`peregrine render ENV --policy P --out episode.gif`: one episode as an animated GIF.

The policy and the world are resolved as in `peregrine eval` (a scripted
policy name or a checkpoint path; a checkpoint's own env config unless
`--preset` is given; `--env.KEY VALUE` overrides). Each env with a renderer
lists its module in the registry's RENDERERS.
"""
from __future__ import annotations

import importlib

from .eval import add_world_arguments, world_overrides

RENDERERS = {
    "drone_swarm": "peregrine.envs.drone_swarm.render",
}


def add_arguments(parser):
    parser.add_argument("env", help=f"environment to render ({', '.join(sorted(RENDERERS))})")
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
    if args.env not in RENDERERS:
        raise ValueError(f"no renderer for env {args.env!r}; renderable envs: {sorted(RENDERERS)}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be positive, got {args.steps}")
    if not str(args.out).lower().endswith(".gif"):
        raise ValueError(f"--out must be a .gif path, got {args.out!r}")
    from ..evaluate import eval_world
    from ..policies import make_policy
    from ..envs.registry import make
    renderer = importlib.import_module(RENDERERS[args.env])
    preset, fields = world_overrides(args)
    world = eval_world(args.env, args.policy, preset, fields)
    print(f"{args.env}, policy {args.policy}, world: {world['description']}")
    env = make(args.env, num_envs=1, seed=args.seed, **world["kwargs"])
    try:
        policy = make_policy(args.env, args.policy, env, seed=args.seed,
                             check_world=not world["explicit"])
        result = renderer.render_episode(env, policy, args.out, max_steps=args.steps,
                                         every=args.every, size=args.size, frame_ms=args.frame_ms)
    finally:
        env.close()
    print(f"wrote {result['path']}: {result['frames']} frames, {result['steps']} steps, "
          f"delivered {result['delivered']}")
    return 0
