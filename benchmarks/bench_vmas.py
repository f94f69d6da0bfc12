"""Env-only throughput of VMAS beside Peregrine's DroneSwarm on the same device.

    .venv/bin/python benchmarks/bench_vmas.py --device cuda --sizes 4096 65536 1048576 --json out.json
    .venv/bin/python benchmarks/bench_vmas.py --device cpu --sizes 32 --seconds 0.2   # the dry run

VMAS (the PyTorch multi-agent simulator, PyPI `vmas`) is the peer: a batch of
instances as torch tensors on one device, like Peregrine's device batch. For each
number of instances, in one process and on one device:

* vmas: `vmas.make_env(scenario, num_envs=N, device=D, continuous_actions=True,
  n_agents=...)`, one fixed list of random per-agent action tensors already on the
  device, `step` in a loop, one synchronisation at the end;
* peregrine: `peregrine.make("drone_swarm", num_envs=N, seed=0, device=D)`, timed by
  bench_gpu.measure_device (fixed random actions, the same loop and synchronisation).

Both report agent steps/s = calls * instances * agents per instance / seconds, with
as many agents per instance on each side (DroneSwarm's default swarm, 8 drones).

The scenario is VMAS's "discovery" by default, the closest of its scenarios to
DroneSwarm's search and rescue: agents move in a bounded 2-D world (continuous
2-D actions), sense with a range-limited sensor (lidar rays) and must find and cover
targets that are placed at random; it is given as many targets as DroneSwarm has
victims (10). "navigation" (each agent drives to its own known goal) and
"transport" (agents push one package together) have no search. DroneSwarm also
has a radio relay network, confirmation and delivery that discovery lacks, and
VMAS resolves collisions with physics (2 substeps) that DroneSwarm lacks: the
work per step differs, so the ratio compares two simulators of a similar task, not
the same rules.

VMAS does not reset finished instances by itself (its caller does): the vmas loop
never resets, while Peregrine resets each instance once per episode (every 800
steps at most) inside `step`. A size that runs out of device memory is recorded
with agent_steps_per_sec = null and the error, and the run goes on; `--json` is
rewritten after every row.
"""
from __future__ import annotations

import argparse
import sys

from bench_gpu import measure_device, timed, write_json
from peregrine.envs.drone_swarm import CONFIG_FIELDS

DEFAULT_SIZES = [4096, 65536, 1 << 20]
# DroneSwarm's defaults (name, default, min, max, is_integer): the swarm VMAS is matched to.
DRONE_SWARM_DEFAULTS = {field[0]: field[1] for field in CONFIG_FIELDS}
AGENTS_PER_INSTANCE = int(DRONE_SWARM_DEFAULTS["n_drones"])
VICTIMS_PER_INSTANCE = int(DRONE_SWARM_DEFAULTS["n_victims"])


def scenario_kwargs(scenario: str) -> dict:
    """Keyword arguments for the VMAS scenario, matched to DroneSwarm's defaults."""
    kwargs = {"n_agents": AGENTS_PER_INSTANCE}
    if scenario == "discovery":
        kwargs["n_targets"] = VICTIMS_PER_INSTANCE
    return kwargs


def measure_vmas(scenario: str, num_envs: int, seconds: float, torch, device: str) -> float:
    """VMAS stepping `num_envs` instances with fixed random actions: agent steps/s."""
    import vmas

    env = vmas.make_env(scenario, num_envs=num_envs, device=device, continuous_actions=True,
                        seed=0, **scenario_kwargs(scenario))
    # One action tensor [num_envs, action size] per agent, uniform in that agent's box,
    # drawn once on the CPU (fixed seed) and moved to the device before timing.
    generator = torch.Generator().manual_seed(0)
    actions = []
    for box in env.action_space:
        low = torch.as_tensor(box.low, dtype=torch.float32)
        high = torch.as_tensor(box.high, dtype=torch.float32)
        unit = torch.rand((num_envs, *box.shape), generator=generator)
        actions.append((low + (high - low) * unit).to(device))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    calls, elapsed = timed(lambda: env.step(actions), seconds, sync)
    return calls * num_envs * env.n_agents / elapsed


def measure_row(impl, scenario, size, measure, torch, device_name) -> dict:
    """One row; an out-of-memory size gives a null figure and its error, not an abort."""
    row = {"impl": impl, "scenario": scenario, "instances": size,
           "agents_per_instance": AGENTS_PER_INSTANCE, "device": device_name}
    try:
        row["agent_steps_per_sec"] = measure()
    except torch.cuda.OutOfMemoryError as error:
        row["agent_steps_per_sec"] = None
        row["error"] = f"out of memory: {str(error).splitlines()[0]}"
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sizes", nargs="+", type=int, default=DEFAULT_SIZES,
                        help="numbers of instances (each of both simulators runs every size)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per row")
    parser.add_argument("--scenario", default="discovery",
                        help="VMAS scenario (default discovery; it must take n_agents)")
    parser.add_argument("--json", help="also write the rows to this file (after every row)")
    args = parser.parse_args(argv)
    import torch
    import vmas

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here (use --device cpu for the dry run)")
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"device: {device_name}; vmas {vmas.__version__} scenario {args.scenario!r} beside "
          f"peregrine drone_swarm, {AGENTS_PER_INSTANCE} agents per instance")
    print(f"{'impl':<10} {'scenario':<12} {'instances':>10} {'agent steps/s':>16} "
          f"{'peregrine/vmas':>15}")
    rows = []
    for size in args.sizes:
        pair = [
            measure_row("vmas", args.scenario, size,
                        lambda: measure_vmas(args.scenario, size, args.seconds, torch, args.device),
                        torch, device_name),
            measure_row("peregrine", "drone_swarm", size,
                        lambda: measure_device("drone_swarm", size, args.seconds, torch,
                                               args.device),
                        torch, device_name),
        ]
        vmas_rate, peregrine_rate = (row["agent_steps_per_sec"] for row in pair)
        for row in pair:
            rate = row["agent_steps_per_sec"]
            cells = [f"{row['impl']:<10}", f"{row['scenario']:<12}", f"{size:>10}",
                     f"{rate:>16,.0f}" if rate else f"{row.get('error', '-'):>16}"]
            if row["impl"] == "peregrine" and vmas_rate and peregrine_rate:
                cells.append(f"{peregrine_rate / vmas_rate:>14,.1f}x")
            print(" ".join(cells), flush=True)
        rows += pair
        if args.json:
            write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
