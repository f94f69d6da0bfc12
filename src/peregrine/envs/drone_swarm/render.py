"""Top-down DroneSwarm frames (Pillow) and animated GIFs of an episode.

    from peregrine.envs.drone_swarm.render import draw_frame, render_episode
    env = peregrine.make("drone_swarm", num_envs=1, seed=0)
    render_episode(env, policy, "swarm.gif")        # policy: callable(obs) -> actions

A frame is drawn from one instance's exact state (`env.get_state(instance)`,
decoded with reference.decode_state), not from observations:

- the base (black square) and its radio range (light blue disc of r_comm);
- obstacles (dark slate rectangles; radio passes them, sight does not);
- links (thin grey lines) between connected drones within r_comm of each
  other, and from connected drones to the base (with link drops on, a drawn
  link may have been down this step; the connected flags are exact);
- drones: green = connected to the base, orange = cut off, grey = battery
  empty; at sizes >= 320 px scanning drones also get a faint r_sense ring
  (it clutters small frames);
- victims: red = unknown, gold = confirmed (report on its way), blue =
  delivered;
- the step and the delivered count in the corner.

Colours come from one fixed palette, so frames are quantized exactly and the
GIF stays small.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..raster import Canvas
from .reference import decode_state

COLOURS = {
    "background": (250, 250, 247),
    "border": (160, 160, 160),
    "range": (214, 232, 250),
    "range_edge": (150, 190, 230),
    "link": (140, 140, 140),
    "base": (20, 20, 20),
    "connected": (30, 160, 70),
    "cut_off": (240, 140, 20),
    "empty": (150, 150, 150),
    "sense": (225, 238, 225),
    "unknown": (215, 40, 40),
    "confirmed": (225, 185, 0),
    "delivered": (40, 90, 220),
    "text": (30, 30, 30),
    "obstacle": (70, 80, 95),
}


def _palette_image() -> Image.Image:
    palette = []
    for rgb in COLOURS.values():
        palette += list(rgb)
    palette += [0, 0, 0] * (256 - len(COLOURS))
    image = Image.new("P", (1, 1))
    image.putpalette(palette)
    return image


_PALETTE = _palette_image()


def draw_frame(state: dict, config: dict, size: int = 200, text: str | None = None) -> Image.Image:
    """One RGB frame of a decoded state (reference.decode_state) of `config`."""
    L = float(config["world_size"])
    scale = (size - 1) / L
    image = Image.new("RGB", (size, size), COLOURS["background"])
    draw = ImageDraw.Draw(image)

    def px(x, y):  # world -> pixel, y up
        return float(x) * scale, (size - 1) - float(y) * scale

    base = np.array([float(config["base_x"]), float(config["base_y"])])
    r_comm = float(state["r_comm"]) if state["r_comm"] > 0 else float(config["r_comm"])
    bx, by = px(*base)
    radius = r_comm * scale
    draw.ellipse((bx - radius, by - radius, bx + radius, by + radius),
                 fill=COLOURS["range"], outline=COLOURS["range_edge"])
    draw.rectangle((0, 0, size - 1, size - 1), outline=COLOURS["border"])
    for present, x0, y0, x1, y1 in state.get("obstacles", ()):
        if present:
            (left, top), (right, bottom) = px(x0, y1), px(x1, y0)
            draw.rectangle((left, top, right, bottom), fill=COLOURS["obstacle"])

    drones = state["drones"]
    x, y = drones["x"], drones["y"]
    alive = drones["battery"] > 0
    connected = (drones["connected"] > 0.5) & alive
    if size >= 320:
        sense = float(config["r_sense"]) * scale
        for d in np.flatnonzero((drones["scanning"] > 0.5) & alive):
            cx, cy = px(x[d], y[d])
            draw.ellipse((cx - sense, cy - sense, cx + sense, cy + sense), outline=COLOURS["sense"])

    # links between connected drones, and to the base
    n = len(x)
    for i in np.flatnonzero(connected):
        if (x[i] - base[0]) ** 2 + (y[i] - base[1]) ** 2 <= r_comm * r_comm:
            draw.line((px(x[i], y[i]), (bx, by)), fill=COLOURS["link"], width=1)
        for j in range(i + 1, n):
            if connected[j] and (x[i] - x[j]) ** 2 + (y[i] - y[j]) ** 2 <= r_comm * r_comm:
                draw.line((px(x[i], y[i]), px(x[j], y[j])), fill=COLOURS["link"], width=1)

    half = max(2.0, size / 100)
    draw.rectangle((bx - half * 1.5, by - half * 1.5, bx + half * 1.5, by + half * 1.5), fill=COLOURS["base"])

    victims = state["victims"]
    victim_colour = {0: COLOURS["unknown"], 1: COLOURS["confirmed"], 2: COLOURS["delivered"]}
    vr = max(2.5, size / 80)
    for v in range(len(victims["x"])):
        cx, cy = px(victims["x"][v], victims["y"][v])
        colour = victim_colour.get(int(victims["status"][v]), COLOURS["unknown"])
        draw.line((cx - vr, cy - vr, cx + vr, cy + vr), fill=colour, width=2)
        draw.line((cx - vr, cy + vr, cx + vr, cy - vr), fill=colour, width=2)

    dr = max(2.0, size / 90)
    for d in range(n):
        cx, cy = px(x[d], y[d])
        colour = COLOURS["connected"] if connected[d] else (COLOURS["cut_off"] if alive[d] else COLOURS["empty"])
        draw.ellipse((cx - dr, cy - dr, cx + dr, cy + dr), fill=colour)

    if text is None:
        delivered = int((victims["status"] == 2).sum())
        text = f"t={int(state['step'])}  delivered {delivered}/{len(victims['x'])}"
    draw.text((3, 2), text, fill=COLOURS["text"], font=ImageFont.load_default())
    return image


def _quantize(image: Image.Image) -> Image.Image:
    return image.quantize(palette=_PALETTE, dither=Image.Dither.NONE)


def render_episode(env, policy, out_path, instance: int = 0, max_steps: int | None = None,
                   every: int = 2, size: int = 200, frame_ms: int = 80) -> dict:
    """Runs `policy` on `env` from a reset until `instance`'s episode ends (or
    `max_steps` steps) and writes every `every`-th state as an animated GIF.

    `policy` is callable(observations) -> actions for all rows, optionally with
    observe_done(terminals, truncations). The last frame shows the step before
    the episode ended (the env resets an ended instance in the same call) with
    the episode's final delivered count. Returns {"frames", "steps", "path",
    "delivered"}.
    """
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive int, got {every!r}")
    if not isinstance(size, int) or not 32 <= size <= 2048:
        raise ValueError(f"size must be an int in [32, 2048], got {size!r}")
    config = env.config
    limit = int(config["max_steps"]) if max_steps is None else int(max_steps)
    if limit < 1:
        raise ValueError(f"steps must be positive, got {max_steps!r}")
    observations, _ = env.reset()
    env.episode_stats(clear=True)
    agents = env.agents_per_env
    rows = slice(instance * agents, (instance + 1) * agents)
    frames = []
    state = decode_state(env.get_state(instance), config)
    frames.append(_quantize(draw_frame(state, config, size)))
    ended_text = None
    steps = 0
    observe_done = getattr(policy, "observe_done", None)
    for steps in range(1, limit + 1):
        actions = policy(observations)
        observations, _rewards, terminals, truncations, _ = env.step(
            np.ascontiguousarray(actions, dtype=np.float32))
        if observe_done is not None:
            observe_done(terminals, truncations)
        if (terminals[rows] | truncations[rows]).any():
            # `state` is the last one before the end; the env already reset the instance
            delivered_before = int((state["victims"]["status"] == 2).sum())
            total = len(state["victims"]["x"])
            stats = env.episode_stats(clear=True)
            delivered = delivered_before
            if stats.count == 1 and "delivered" in stats.mean:
                delivered = int(round(stats.mean["delivered"]))
            why = "all delivered" if delivered == total else (
                "truncated" if truncations[rows].any() else "ended")
            ended_text = f"t={steps}  delivered {delivered}/{total}  ({why})"
            frames.append(_quantize(draw_frame(state, config, size, text=ended_text)))
            break
        state = decode_state(env.get_state(instance), config)
        if steps % every == 0:
            frames.append(_quantize(draw_frame(state, config, size)))
    if ended_text is None:
        delivered = int((state["victims"]["status"] == 2).sum())
    durations = [frame_ms] * len(frames)
    durations[-1] = max(frame_ms, 1500)  # linger on the last frame
    # A temporary name, renamed when complete: Ctrl-C during the (slow, optimised)
    # write leaves an existing file at out_path as it was.
    from ...files import written_atomically
    with written_atomically(out_path) as temporary:
        frames[0].save(temporary, format="GIF", save_all=True, append_images=frames[1:],
                       duration=durations, loop=0, optimize=True, disposal=1)
    return {"frames": len(frames), "steps": steps, "path": str(out_path), "delivered": delivered}


RENDER_FPS = 12  # frames per second of recorded videos (Gymnasium's render_fps)


def rgb_frame(env, instance: int = 0, size: int = 200) -> np.ndarray:
    """The frame of one instance of `env` now, as RGB uint8 [size, size, 3]
    (the Gymnasium exports' render())."""
    return np.asarray(draw_frame(decode_state(env.get_state(instance), env.config), env.config,
                                 size))


AGENT_MARK = (200, 0, 200)


def agent_frames(env, instance: int, frame: np.ndarray) -> list[np.ndarray]:
    """One frame per drone of `instance`: `frame` (its rgb_frame) with that
    drone ringed in magenta. The Gymnasium vector export gives each sub-env
    (a drone) its own frame this way, so a vector video shows whose view each
    tile is rather than the same picture once per drone."""
    state = decode_state(env.get_state(instance), env.config)
    size = frame.shape[0]
    scale = (size - 1) / float(env.config["world_size"])
    radius = max(4.0, size / 40)
    frames = []
    for x, y in zip(state["drones"]["x"], state["drones"]["y"]):
        marked = frame.copy()
        # draw_frame's pixel of (x, y) is column x * scale, row (size - 1) - y * scale;
        # the raster's y runs up from the bottom edge through pixel centres
        Canvas.wrap(marked).ring(float(x) * scale + 0.5, float(y) * scale + 0.5, radius,
                                 max(1.5, size / 150), AGENT_MARK)
        frames.append(marked)
    return frames
