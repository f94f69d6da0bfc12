"""Observation encoders chosen from the env's own observation space.

Every env's observations reach the policy as flat rows (the batch is the
environment); an emulated env's rows encode its own space, which may be nested
or hold images (vector/spaces.py: each leaf's values, raveled, in the space's
order). `build_encoder` turns that space back into features, one part per leaf,
concatenated in the space's order:

    image Box      a CNN: (H, W, C) or (C, H, W), uint8 or float; 2-D uint8 (H, W)
                   is one channel. "nature" (Mnih et al. 2015: 8x8/4, 4x4/2, 3x3/1
                   convolutions, 512 features) for sides >= 36, else "small" (two
                   3x3 convolutions keeping the size, 256 features: MiniGrid's 7x7)
    Discrete       one-hot of the value (its start subtracted)
    MultiDiscrete  one one-hot per component
    other leaves   their values as they are (uint8 scaled to [0, 1])

The encoder is shared by the actor and the critic (one CNN, not two), and the
policy's MLP (or LSTM) core and heads follow it unchanged. Without any image,
Discrete or nesting the encoder is None: flat observations go straight into the
MLP as before. `policy.encoder` overrides the choice: "flat" (no encoder: the
raw flat row, as a native env's), "nature" or "small" (that CNN for images).

A leaf is sliced out of the row and reshaped (views), with no Python loop over
rows: one batched op per leaf.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

ENCODERS = ("auto", "flat", "nature", "small")
SMALL_IMAGE_SIDE = 36       # the Nature CNN's smallest input that leaves a 1x1 map


def is_image(space) -> bool:
    """A Box that is a picture: 3-D (one side of at most 4 channels), or 2-D uint8."""
    if not isinstance(space, spaces.Box):
        return False
    shape = space.shape
    if len(shape) == 3:
        return min(shape[0], shape[-1]) <= 4
    return len(shape) == 2 and space.dtype == np.uint8 and min(shape) >= 8


def image_layout(shape) -> tuple[int, int, int, bool]:
    """(channels, height, width, channels_last) of an image space's shape."""
    if len(shape) == 2:
        return 1, shape[0], shape[1], True
    first, last = shape[0], shape[-1]
    channels_last = last <= 4 and (first > 4 or last <= first)
    if channels_last:
        return last, shape[0], shape[1], True
    return first, shape[1], shape[2], False


def standardisable(space) -> bool:
    """Whether train.normalize_obs can standardise the flat rows of `space` (an emulated
    env's own observation space; None for a native env's rows): only real-valued Box
    leaves that are not images and not uint8, whose encoder passes the row on as it is
    (a Dict of positions and goals, say). An image, a uint8 leaf (scaled by 1/255) or a
    discrete one (one-hot) is read by the encoder in its own units."""
    if space is None:
        return True
    return all(isinstance(leaf, spaces.Box) and not is_image(leaf)
               and np.dtype(leaf.dtype) != np.uint8 for _, leaf in _leaves(space))


def needs_encoder(space) -> bool:
    """Whether `space`'s flat rows need an encoder (anything but one flat real leaf)."""
    if space is None:
        return False
    if isinstance(space, (spaces.Dict, spaces.Tuple, spaces.Discrete, spaces.MultiDiscrete)):
        return True
    return is_image(space)


class ImageEncoder(nn.Module):
    def __init__(self, shape, dtype, kind: str):
        super().__init__()
        channels, height, width, self.channels_last = image_layout(tuple(shape))
        self.shape = tuple(shape)
        self.scale = 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0
        if kind == "auto":
            kind = "nature" if min(height, width) >= SMALL_IMAGE_SIDE else "small"
        if kind == "nature":
            if min(height, width) < SMALL_IMAGE_SIDE:
                raise ValueError(f"the Nature CNN needs images of at least {SMALL_IMAGE_SIDE}x"
                                 f"{SMALL_IMAGE_SIDE}, got {height}x{width}; use "
                                 f"policy.encoder = 'small' (or 'auto')")
            convolutions = [nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
                            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten()]
            features = 512
        else:
            convolutions = [nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Flatten()]
            features = 256
        for module in convolutions:
            if isinstance(module, nn.Conv2d):
                nn.init.orthogonal_(module.weight, math.sqrt(2.0))
                nn.init.zeros_(module.bias)
        self.convolutions = nn.Sequential(*convolutions)
        with torch.no_grad():
            flat = self.convolutions(torch.zeros(1, channels, height, width)).shape[1]
        self.project = nn.Sequential(nn.Linear(flat, features), nn.ReLU())
        nn.init.orthogonal_(self.project[0].weight, math.sqrt(2.0))
        nn.init.zeros_(self.project[0].bias)
        self.out_dim = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = x.reshape(x.shape[0], *self.shape)
        if len(self.shape) == 2:
            images = images.unsqueeze(1)
        elif self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return self.project(self.convolutions(images * self.scale))


class OneHot(nn.Module):
    def __init__(self, sizes, starts):
        super().__init__()
        self.sizes = [int(n) for n in sizes]
        self.register_buffer("starts", torch.as_tensor(np.asarray(starts, np.float32)),
                             persistent=False)
        self.out_dim = sum(self.sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = (x - self.starts).round().long()
        return torch.cat([nn.functional.one_hot(values[:, i].clamp(0, n - 1), n).to(x.dtype)
                          for i, n in enumerate(self.sizes)], -1)


class Scaled(nn.Module):
    def __init__(self, size: int, scale: float):
        super().__init__()
        self.scale = scale
        self.out_dim = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale if self.scale != 1.0 else x


def _leaf_encoder(leaf, kind: str) -> nn.Module:
    if is_image(leaf):
        return ImageEncoder(leaf.shape, leaf.dtype, kind)
    if isinstance(leaf, spaces.Discrete):
        return OneHot([leaf.n], [leaf.start])
    if isinstance(leaf, spaces.MultiDiscrete):
        nvec = np.asarray(leaf.nvec).ravel()
        return OneHot(nvec, np.broadcast_to(leaf.start, leaf.nvec.shape).ravel())
    size = int(np.prod(leaf.shape))
    return Scaled(size, 1.0 / 255.0 if np.dtype(leaf.dtype) == np.uint8 else 1.0)


class StructuredEncoder(nn.Module):
    """Flat rows of `space` -> the concatenated features of its leaves (module doc)."""

    def __init__(self, space, kind: str = "auto"):
        super().__init__()
        from ..vector.spaces import FlatObservation
        flat = FlatObservation(space)       # the flattening the rows were written with
        self.fields = [(offset, size) for _, offset, size in flat.fields]
        leaves = [leaf for _, leaf in _leaves(space)]
        self.parts = nn.ModuleList(_leaf_encoder(leaf, kind) for leaf in leaves)
        self.in_dim = flat.size
        self.out_dim = sum(part.out_dim for part in self.parts)
        self.has_images = any(isinstance(part, ImageEncoder) for part in self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        features = [part(x[:, offset:offset + size])
                    for (offset, size), part in zip(self.fields, self.parts)]
        out = features[0] if len(features) == 1 else torch.cat(features, -1)
        return out.reshape(*leading, out.shape[-1])


def _leaves(space):
    from ..vector.spaces import leaves
    return leaves(space)


def build_encoder(space, kind: str = "auto") -> StructuredEncoder | None:
    """The encoder for rows of `space` (an emulated env's own observation space), or
    None where the flat row is the right input (policy.encoder "flat", or one flat
    real-valued leaf). `kind`: policy.encoder."""
    if kind not in ENCODERS:
        raise ValueError(f"policy.encoder must be one of {list(ENCODERS)}, got {kind!r}")
    if kind == "flat" or not needs_encoder(space):
        if kind in ("nature", "small"):
            raise ValueError(f"policy.encoder = {kind!r} needs an image observation; this "
                             f"env's observation space is {space!r}")
        return None
    return StructuredEncoder(space, kind)


def unread_images(space) -> str | None:
    """What the policy reads flat although it looks like pictures: a Box leaf of 3 or
    more dimensions that is_image does not take (a frame stack of (stack, H, W, C), or
    more than 4 channels); None when there is none. Said at the trainer's start, since
    an MLP over thousands of pixels trains, slowly and badly, without a word."""
    if space is None:
        return None
    for path, leaf in _leaves(space):
        if isinstance(leaf, spaces.Box) and len(leaf.shape) >= 3 and not is_image(leaf):
            where = f" ({'/'.join(map(str, path))})" if path else ""
            return (f"the observation{where} of shape {leaf.shape} is read flat by the MLP "
                    f"({int(np.prod(leaf.shape)):,} inputs), not by a CNN: the CNN takes "
                    f"images of (H, W, C) or (C, H, W) with at most 4 channels, or 2-D uint8 "
                    f"(a stack of grayscale frames: GrayscaleObservation without keep_dim, "
                    f"then FrameStackObservation)")
    return None


def describe_structure(space) -> str | None:
    """The space as text (checkpoints compare it), None for no structure."""
    return None if space is None else repr(space)
