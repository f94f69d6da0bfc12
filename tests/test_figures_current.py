"""Every committed image has the command that makes it, and is what that command makes.

docs/figures.toml lists each committed image (docs/*.gif, docs/*.png) with its
command and a fingerprint of the committed file: frame count, size and a hash
of the first frame's pixels. An image whose command is cheap (a scripted
policy's episode, about a second) is `regenerate = true`: here the command runs
again and must give the same frame count and size, and the world it starts
from (the env's state after reset, hashed: `layout_sha256`) must be the one
recorded. Images that need a training run first are `dated` (the commit and
command that made them): only their command, existence and fingerprint are
checked.

After regenerating an image, print its fingerprint for the registry with

    python tests/test_figures_current.py docs/NAME.gif
"""
from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "figures.toml"
IMAGE_SUFFIXES = (".gif", ".png")


def registry() -> dict[str, dict]:
    entries = tomllib.loads(REGISTRY.read_text())["figure"]
    return {entry["path"]: entry for entry in entries}


def image_fingerprint(path: Path) -> dict:
    """Frame count, size and the sha256 of the first frame's RGB pixels (decoded, so a
    re-encoding of the same pictures keeps it)."""
    from PIL import Image
    with Image.open(path) as image:
        frames = getattr(image, "n_frames", 1)
        image.seek(0)
        first = image.convert("RGB")
        return {"frames": frames, "size": list(image.size),
                "first_frame_sha256": hashlib.sha256(first.tobytes()).hexdigest()}


def render_arguments(command: str) -> list[str]:
    """The arguments after `peregrine render` of a registered command."""
    words = shlex.split(command)
    assert words[:2] == ["peregrine", "render"], f"not a `peregrine render` command: {command}"
    return words[2:]


def layout_fingerprint(command: str) -> str:
    """sha256 of the env's state right after the reset that `command`'s episode starts
    from: the world layout (and everything else the first frame draws), resolved as
    `peregrine render` resolves it (the same parser, world and seed)."""
    import argparse

    from peregrine.cli import render
    from peregrine.cli.eval import world_overrides
    from peregrine.envs.registry import make
    from peregrine.evaluate import eval_world
    parser = argparse.ArgumentParser()
    render.add_arguments(parser)
    args = render.parse_arguments(parser, render_arguments(command))
    preset, fields = world_overrides(args)
    world = eval_world(args.env, args.policy, preset, fields)
    env = make(args.env, num_envs=1, seed=args.seed, **world["kwargs"])
    try:
        env.reset()          # as the renderer's render_episode does
        return hashlib.sha256(env.get_state(0).tobytes()).hexdigest()
    finally:
        env.close()


def regenerate_hint(entry: dict) -> str:
    return (f"regenerate it with `{entry['command']}` and update its fingerprint in "
            f"docs/figures.toml (python tests/test_figures_current.py {entry['path']})")


def committed_images() -> set[str]:
    listed = subprocess.run(["git", "ls-files", "docs"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode != 0:
        pytest.skip("needs a git checkout")
    return {name for name in listed.stdout.splitlines() if name.endswith(IMAGE_SUFFIXES)}


def test_every_committed_image_is_registered_with_its_command():
    entries = registry()
    assert committed_images() == set(entries), (
        "docs/figures.toml must list exactly the committed images (path, command, fingerprint)")
    for path, entry in entries.items():
        assert (ROOT / path).is_file(), path
        assert path in entry["command"], f"{path}: its command does not write it"
        # Either the suite regenerates it, or it says when and by what it was made.
        assert entry.get("regenerate") or entry.get("dated", "").startswith("made at commit"), path


@pytest.mark.parametrize("path", sorted(registry()))
def test_committed_file_matches_its_registered_fingerprint(path):
    entry = registry()[path]
    expected = {key: entry[key] for key in ("frames", "size", "first_frame_sha256")}
    assert image_fingerprint(ROOT / path) == expected, (
        f"{path} differs from its entry in docs/figures.toml: {regenerate_hint(entry)}")


CHEAP = sorted(path for path, entry in registry().items() if entry.get("regenerate"))


@pytest.mark.parametrize("path", CHEAP)
def test_cheap_figure_is_what_its_command_makes_now(path, tmp_path):
    """The command, run again into tmp_path: same world, same frame count and size."""
    entry = registry()[path]
    assert layout_fingerprint(entry["command"]) == entry["layout_sha256"], (
        f"{path} is stale: its command now starts from a different world. "
        + regenerate_hint(entry))
    out = tmp_path / Path(path).name
    arguments = [str(out) if word == path else word for word in render_arguments(entry["command"])]
    made = subprocess.run([sys.executable, "-m", "peregrine.cli", "render", *arguments],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    now = image_fingerprint(out)
    assert (now["frames"], now["size"]) == (entry["frames"], entry["size"]), (
        f"{path} is stale: its command now makes {now['frames']} frames of "
        f"{now['size'][0]}x{now['size'][1]}, the committed file has {entry['frames']} of "
        f"{entry['size'][0]}x{entry['size'][1]}. " + regenerate_hint(entry))


def test_a_stale_figure_is_detected(tmp_path):
    """The checks above fail on a file made by another command (another seed: another world,
    another episode length), naming the command to regenerate with."""
    entry = registry()["docs/drone_swarm_obstacles.gif"]
    other = entry["command"].replace("--seed 4", "--seed 5")
    assert other != entry["command"]
    assert layout_fingerprint(other) != entry["layout_sha256"]
    out = tmp_path / "other.gif"
    arguments = [str(out) if word == entry["path"] else word for word in render_arguments(other)]
    subprocess.run([sys.executable, "-m", "peregrine.cli", "render", *arguments], cwd=ROOT,
                   check=True, capture_output=True)
    assert image_fingerprint(out)["first_frame_sha256"] != entry["first_frame_sha256"]
    assert entry["command"] in regenerate_hint(entry)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        found = registry().get(name, {})
        print(f"# {name}")
        for key, value in image_fingerprint(ROOT / name).items():
            print(f"{key} = {value!r}".replace("'", '"'))
        if found.get("regenerate"):
            print(f'layout_sha256 = "{layout_fingerprint(found["command"])}"')
