"""A few filled shapes drawn into an RGB uint8 array with NumPy alone.

The envs' `rgb_array` frames (render.py in each env's folder) are drawn with
these, so a frame needs no display, no window library and no Pillow. Shapes
are tested against pixel centres over their bounding box only, without
anti-aliasing: a frame of a few dozen shapes takes well under a millisecond.

Coordinates are pixels, x to the right and y *up* from the bottom edge (the
envs' own convention); `Canvas.pixels` is the image the usual way round
(row 0 at the top).

Drawings reach their files through `peregrine.files.written_atomically`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Colour = tuple[int, int, int]


class Canvas:
    """An RGB image of `width` x `height` pixels filled with `background`."""

    def __init__(self, width: int, height: int, background: Colour = (255, 255, 255)) -> None:
        self.width, self.height = int(width), int(height)
        self.pixels = np.empty((self.height, self.width, 3), np.uint8)
        self.pixels[...] = background

    @classmethod
    def wrap(cls, pixels: np.ndarray) -> "Canvas":
        """A canvas drawing into an existing RGB uint8 [height, width, 3] array."""
        canvas = cls.__new__(cls)
        canvas.height, canvas.width = pixels.shape[:2]
        canvas.pixels = pixels
        return canvas

    # ---- the pixels a shape covers ----------------------------------------------------
    def _window(self, x0: float, y0: float, x1: float, y1: float):
        """(rows slice, columns slice, x grid, y grid) of the pixel centres inside
        the box [x0, x1] x [y0, y1] (y up), or None when it is off the canvas."""
        column_low, column_high = max(int(np.floor(x0)), 0), min(int(np.ceil(x1)) + 1, self.width)
        row_low = max(int(np.floor(self.height - y1)), 0)
        row_high = min(int(np.ceil(self.height - y0)) + 1, self.height)
        if column_low >= column_high or row_low >= row_high:
            return None
        xs = np.arange(column_low, column_high, dtype=np.float64) + 0.5
        ys = self.height - (np.arange(row_low, row_high, dtype=np.float64) + 0.5)
        return (slice(row_low, row_high), slice(column_low, column_high),
                xs[None, :], ys[:, None])

    def _paint(self, window, inside: np.ndarray, colour: Colour, alpha: float = 1.0) -> None:
        rows, columns = window[0], window[1]
        region = self.pixels[rows, columns]
        if alpha >= 1.0:
            region[inside] = colour
        else:
            blended = region[inside] * (1.0 - alpha) + np.asarray(colour, np.float64) * alpha
            region[inside] = np.round(blended).astype(np.uint8)

    # ---- shapes --------------------------------------------------------------------------
    def polygon(self, points: Sequence[tuple[float, float]], colour: Colour,
                alpha: float = 1.0) -> None:
        """A filled convex polygon (corners in either winding order)."""
        corners = np.asarray(points, np.float64)
        window = self._window(*corners.min(axis=0), *corners.max(axis=0))
        if window is None:
            return
        xs, ys = window[2], window[3]
        positive = negative = None
        for (ax, ay), (bx, by) in zip(corners, np.roll(corners, -1, axis=0)):
            side = (bx - ax) * (ys - ay) - (by - ay) * (xs - ax)
            positive = side >= 0 if positive is None else positive & (side >= 0)
            negative = side <= 0 if negative is None else negative & (side <= 0)
        self._paint(window, positive | negative, colour, alpha)

    def rectangle(self, x0: float, y0: float, x1: float, y1: float, colour: Colour,
                  alpha: float = 1.0) -> None:
        self.polygon([(x0, y0), (x1, y0), (x1, y1), (x0, y1)], colour, alpha)

    def rotated_rectangle(self, anchor: tuple[float, float], length: float, width: float,
                          angle: float, colour: Colour) -> None:
        """A bar of `length` from `anchor` in direction `angle` (radians
        anticlockwise from +x), `width` across."""
        direction = np.array([np.cos(angle), np.sin(angle)])
        across = np.array([-direction[1], direction[0]]) * (width / 2.0)
        start = np.asarray(anchor, np.float64)
        end = start + direction * length
        self.polygon([start - across, end - across, end + across, start + across], colour)

    def line(self, start: tuple[float, float], end: tuple[float, float], width: float,
             colour: Colour) -> None:
        delta = np.asarray(end, np.float64) - np.asarray(start, np.float64)
        length = float(np.hypot(*delta))
        if length > 0:
            self.rotated_rectangle(start, length, width, float(np.arctan2(delta[1], delta[0])),
                                   colour)

    def circle(self, cx: float, cy: float, radius: float, colour: Colour,
               alpha: float = 1.0) -> None:
        window = self._window(cx - radius, cy - radius, cx + radius, cy + radius)
        if window is None:
            return
        xs, ys = window[2], window[3]
        self._paint(window, (xs - cx) ** 2 + (ys - cy) ** 2 <= radius * radius, colour, alpha)

    def ring(self, cx: float, cy: float, radius: float, width: float, colour: Colour) -> None:
        outer = radius + width / 2.0
        window = self._window(cx - outer, cy - outer, cx + outer, cy + outer)
        if window is None:
            return
        distance = np.hypot(window[2] - cx, window[3] - cy)
        self._paint(window, np.abs(distance - radius) <= width / 2.0, colour)

    def fill_below(self, heights: np.ndarray, colour: Colour) -> None:
        """Fills each pixel column from the bottom up to heights[column] (y up)."""
        ys = self.height - (np.arange(self.height, dtype=np.float64)[:, None] + 0.5)
        self.pixels[ys <= np.asarray(heights, np.float64)[None, :]] = colour
