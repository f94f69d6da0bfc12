"""Learning curves of several DroneSwarm runs (seeds, variants) on one figure.

    python benchmarks/plot_swarm_curves.py OUT.png \
        --panel "wilderness;wilderness;71" \
        --group "wilderness;global critic, 20M;/runs/wg20_s*" \
        --group "wilderness;local critic, 10M;/runs/wilderness-local-s*"

A panel is "TITLE;PRESET;TARGET[;METRIC]": one axis per panel, with the scripted
`voronoi` swarm's mean of METRIC on that preset (64 episodes, seed 0, measured when
the figure is drawn) and the target as horizontal lines. METRIC is
`episode_length` (default) or an episode statistic such as `delivered`. A group is "PANEL
TITLE;LABEL;GLOB": every run directory the glob matches is drawn as one thin line
in the group's colour. The y value is the mean of METRIC over the training
episodes that ended in each whole million agent steps (`monitor.plots.episode_bins`);
episode length on a log scale (an episode that ends before the time limit
delivered every victim).
Needs Matplotlib (the `train` extra).
"""
from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

from peregrine.evaluate import evaluate
from peregrine.monitor.plots import episode_bins, read_jsonl

BIN_STEPS = 1_000_000
MIN_EPISODES = 16


def parse_panel(text: str) -> tuple[str, str, float, str]:
    parts = text.split(";")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"a panel is TITLE;PRESET;TARGET[;METRIC], got "
                                         f"{text!r}")
    return parts[0], parts[1], float(parts[2]), parts[3] if len(parts) == 4 else \
        "episode_length"


def parse_group(text: str) -> tuple[str, str, list[Path]]:
    parts = text.split(";")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a group is PANEL;LABEL;GLOB, got {text!r}")
    runs = sorted(Path(path) for path in glob.glob(parts[2]))
    if not runs:
        raise argparse.ArgumentTypeError(f"no run directory matches {parts[2]!r}")
    return parts[0], parts[1], runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output")
    parser.add_argument("--panel", type=parse_panel, action="append", required=True)
    parser.add_argument("--group", type=parse_group, action="append", required=True)
    args = parser.parse_args(argv)
    titles = [title for title, *_ in args.panel]
    for panel, label, _ in args.group:
        if panel not in titles:
            parser.error(f"group {label!r} names panel {panel!r}; panels: {titles}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, len(args.panel), figsize=(6.0 * len(args.panel), 4.0),
                                dpi=110, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, (title, preset, target, metric) in zip(axes[0], args.panel):
        groups = [group for group in args.group if group[0] == title]
        for index, (_, label, runs) in enumerate(groups):
            for number, run in enumerate(runs):
                records = read_jsonl(run / "metrics.jsonl")
                # whole bins only: a run's last few updates past a multiple of BIN_STEPS
                # would make a bin of a handful of episodes
                end = max(r["global_step"] for r in records) // BIN_STEPS * BIN_STEPS
                curve = episode_bins([r for r in records if r["global_step"] < end],
                                     metric, BIN_STEPS, MIN_EPISODES)
                axis.plot([step / 1e6 for step, _, _ in curve], [value for _, value, _ in curve],
                          color=colours[index % len(colours)], linewidth=1.2, alpha=0.8,
                          label=f"{label} ({len(runs)} seeds)" if number == 0 else None)
        voronoi = evaluate("drone_swarm", "voronoi", episodes=64, seed=0, preset=preset)
        scripted = voronoi["mean"][metric]
        unit = " steps" if metric == "episode_length" else ""
        axis.axhline(scripted, color="black", linestyle=":",
                     label=f"voronoi (scripted): {scripted:.3g}{unit}")
        axis.axhline(target, color="grey", linestyle="--", label=f"target: {target:g}{unit}")
        if metric == "episode_length":
            axis.set_yscale("log")
            axis.set_ylabel("mean training episode length (steps)")
        else:
            axis.set_ylabel(f"mean {metric} per training episode")
        axis.set_xlabel("agent steps (millions)")
        axis.set_title(f"DroneSwarm {title}")
        axis.legend(fontsize=8)
        print(f"{title}: voronoi {metric} {scripted:.2f}; " + "; ".join(
            f"{label}: {len(runs)} runs" for _, label, runs in groups), flush=True)
    figure.tight_layout()
    figure.savefig(args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
