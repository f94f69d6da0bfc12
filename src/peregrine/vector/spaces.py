"""Flattening Gymnasium spaces into the flat-row contract, and back.

Observations of any nesting of Box, Discrete, MultiDiscrete, MultiBinary,
Dict and Tuple become one vector per agent: each leaf's values, raveled, in
the space's own order (Dict in its key order). Discrete values are stored as
their integer value, not one-hot, so `unflatten` can return the original
structure exactly; a policy that wants one-hot encodes it itself. The vector
is float32 unless the whole space is one uint8 Box (kept uint8: images).
float32 holds integers exactly up to 2**24, far above any Discrete size.

Actions become one of the three native action kinds: Discrete -> Discrete
and MultiDiscrete -> MultiDiscrete, both keeping the wrapped space's integer
dtype (Gymnasium's int64 by default, so the env's own samples are accepted),
MultiBinary/nested discrete -> MultiDiscrete int32, Box/nested Box -> Box
float32 with the original bounds. A nesting that mixes discrete and
continuous leaves is refused.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

_LEAVES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
_SMALL = 16     # integer leaves up to this size are range-checked in Python, not NumPy


def leaves(space, path=()):
    """(path, leaf space) for every leaf, in flattening order."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from leaves(sub, path + (key,))
    elif isinstance(space, spaces.Tuple):
        for index, sub in enumerate(space.spaces):
            yield from leaves(sub, path + (index,))
    elif isinstance(space, _LEAVES):
        yield path, space
    else:
        where = f" (at {'/'.join(map(str, path))})" if path else ""
        raise ValueError(f"cannot flatten space {space!r}{where}: supported are Box, Discrete, "
                         "MultiDiscrete, MultiBinary and Dict/Tuple nestings of them; drop a "
                         "Dict key the policy cannot read with env.wrappers = [{name = "
                         "\"FilterObservation\", filter_keys = [...]}]")


def action_high(space):
    """The highest valid value of each action of a batch's action space, as int64 (a
    0-d array for Discrete(n): n - 1; per column for MultiDiscrete: nvec - 1); None for
    Box. Batch action spaces start at 0 (an env's own `start` is added back when its
    actions are rebuilt), so the valid values are 0..action_high."""
    if isinstance(space, spaces.Discrete):
        return np.asarray(int(space.n) - 1, np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(space.nvec, np.int64) - 1
    if isinstance(space, spaces.Box):
        return None
    raise ValueError(f"{space} is not a batch action space (Discrete, MultiDiscrete or Box)")


def _leaf_bounds(leaf):
    """(shape, low, high) of one leaf, bounds raveled as float64."""
    if isinstance(leaf, spaces.Box):
        return leaf.shape, leaf.low.ravel().astype(np.float64), leaf.high.ravel().astype(np.float64)
    if isinstance(leaf, spaces.Discrete):
        start = float(leaf.start)
        return (), np.array([start]), np.array([start + int(leaf.n) - 1])
    if isinstance(leaf, spaces.MultiDiscrete):
        start = np.broadcast_to(leaf.start, leaf.nvec.shape).ravel().astype(np.float64)
        return leaf.shape, start, start + leaf.nvec.ravel() - 1
    size = int(np.prod(leaf.shape))
    return leaf.shape, np.zeros(size), np.ones(size)


def _get(value, path):
    for key in path:
        value = value[key]
    return value


class FlatObservation:
    """Writes observations of `space` into flat rows; `space` is the flat Box."""

    def __init__(self, space):
        self.source_space = space
        self.fields = []  # (path, offset, size)
        self._shapes = []  # each field's leaf shape
        lows, highs, offset = [], [], 0
        all_leaves = list(leaves(space))
        for path, leaf in all_leaves:
            shape, low, high = _leaf_bounds(leaf)
            size = int(np.prod(shape))
            self.fields.append((path, offset, size))
            self._shapes.append(tuple(shape))
            lows.append(low)
            highs.append(high)
            offset += size
        self.size = offset
        single_uint8 = (len(all_leaves) == 1 and isinstance(all_leaves[0][1], spaces.Box)
                        and all_leaves[0][1].dtype == np.uint8)
        dtype = np.uint8 if single_uint8 else np.float32
        low, high = np.concatenate(lows), np.concatenate(highs)
        if dtype == np.float32:
            big = np.finfo(np.float32).max
            low, high = np.clip(low, -big, big), np.clip(high, -big, big)
        self.space = spaces.Box(low.astype(dtype), high.astype(dtype), (offset,), dtype)
        self._check_finite = dtype == np.float32
        # Discrete, MultiDiscrete and MultiBinary leaves: whole numbers in [low, high]
        # (what a one-hot encoder reads), checked after each write of a float32 row;
        # a uint8 row (an image) checks input that is not uint8 already before the cast,
        # which would wrap 300 to 44 and floor 0.5 to 0.
        self._integral = [(offset, size, low.tolist() if size <= _SMALL else low,
                           high.tolist() if size <= _SMALL else high, "/".join(map(str, path)),
                           leaf)
                          for (path, leaf), (_, offset, size), low, high
                          in zip(all_leaves, self.fields, lows, highs)
                          if not isinstance(leaf, spaces.Box)] if dtype == np.float32 else []
        self._simple = len(self.fields) == 1 and self.fields[0][0] == ()
        self._flat_leaf = (self._simple and isinstance(all_leaves[0][1], spaces.Box)
                           and len(all_leaves[0][1].shape) == 1)

    def write(self, value, row: np.ndarray, where: str = "the env") -> None:
        """Writes one observation into the 1-D row (casts; no allocation for Box leaves).
        Each leaf must have its space's shape exactly: nothing is broadcast (a scalar
        is not four equal values). ValueError naming `where` and the space otherwise.

        A float32 row must come out finite: NaN, +-inf, None (NaN once cast) and
        values beyond float32's range (1e300 becomes inf) are refused, naming the
        leaf and index. The check is one np.isfinite over the written row."""
        try:
            if self._simple:
                shape = self._shapes[0]
                if getattr(value, "shape", None) != shape and np.shape(value) != shape:
                    raise ValueError(f"expected shape {shape}")
                if not self._check_finite and getattr(value, "dtype", None) != np.uint8:
                    self._check_bytes(value, where)
                row[...] = value if self._flat_leaf else np.ravel(value)
            else:
                for (path, offset, size), shape in zip(self.fields, self._shapes):
                    leaf = _get(value, path)
                    if getattr(leaf, "shape", None) != shape and np.shape(leaf) != shape:
                        raise ValueError(f"{'/'.join(map(str, path))} has shape "
                                         f"{np.shape(leaf)}, expected {shape}")
                    if not self._check_finite and getattr(leaf, "dtype", None) != np.uint8:
                        self._check_bytes(leaf, where)
                    row[offset:offset + size] = np.ravel(leaf)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeWarning) as error:
            # (RuntimeWarning: NumPy's overflow warning in the cast, under -W error)
            try:
                shape = f" of shape {np.shape(value)}"
            except (ValueError, TypeError):     # a ragged nesting has no shape
                shape = ""
            raise ValueError(f"{where} returned an observation{shape} that does not fit its "
                             f"observation_space {self.source_space}: {error}") from None
        if self._check_finite and not np.isfinite(row).all():
            self._refuse_non_finite(value, row, where)
        for offset, size, low, high, name, leaf in self._integral:
            if size <= _SMALL:       # Python floats: a fraction of numpy's per-call cost
                if all(lo <= x <= hi and x.is_integer() for x, lo, hi
                       in zip(row[offset:offset + size].tolist(), low, high)):
                    continue
            else:
                values = row[offset:offset + size]
                if np.all(values >= low) and np.all(values <= high) \
                        and np.all(values == np.floor(values)):
                    continue
            self._refuse_integral(row[offset:offset + size], low, high, name, leaf, where)

    def write_batch(self, values, rows: np.ndarray, where: str = "the vector env") -> None:
        """Writes a vector env's batched observations (each leaf [n, *shape], as
        Gymnasium batches a space) into the [n, size] rows: one copy per leaf, the same
        shape and finiteness rules as `write`, the message naming the env's row."""
        n = rows.shape[0]
        try:
            for (path, offset, size), shape in zip(self.fields, self._shapes):
                leaf = _get(values, path)
                if getattr(leaf, "shape", None) != (n, *shape):
                    name = "/".join(map(str, path)) or "observations"
                    raise ValueError(f"{name} has shape {np.shape(leaf)}, expected "
                                     f"{(n, *shape)}")
                if not self._check_finite and leaf.dtype != np.uint8:
                    self._check_bytes(leaf, where)
                rows[:, offset:offset + size] = leaf.reshape(n, size)
        except (ValueError, TypeError, KeyError, IndexError, RuntimeWarning) as error:
            raise ValueError(f"{where} returned observations that do not fit its "
                             f"single_observation_space {self.source_space} batched {n} "
                             f"times: {error}") from None
        if self._check_finite and not np.isfinite(rows).all():
            row = int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
            self._refuse_non_finite(row_of(values, row), rows[row], f"{where} (row {row})")
        for offset, size, low, high, name, leaf in self._integral:
            block, low, high = rows[:, offset:offset + size], np.asarray(low), np.asarray(high)
            bad = ~((block >= low) & (block <= high) & (block == np.floor(block))).all(axis=1)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                self._refuse_integral(block[row], low, high, name, leaf, f"{where} (row {row})")

    @staticmethod
    def _check_bytes(value, where: str) -> None:
        """A uint8 Box's observation given in another dtype: whole numbers in [0, 255]
        only (ValueError otherwise), so the cast to uint8 cannot wrap or floor."""
        array = np.asarray(value)
        if array.dtype == np.bool_:
            return
        if array.dtype == object or not np.issubdtype(array.dtype, np.number):
            raise ValueError(f"its values are {array.dtype}, not numbers")
        fits = (array >= 0) & (array <= 255) & (array == np.floor(array)) \
            if np.issubdtype(array.dtype, np.floating) else (array >= 0) & (array <= 255)
        if not fits.all():
            index = int(np.flatnonzero(~fits.ravel())[0])
            raise ValueError(f"its value at [{index}] is {array.ravel()[index].item()!r} "
                             f"({array.dtype}), which uint8 cannot hold (whole numbers 0-255; "
                             f"a float image in [0, 1] needs a float32 Box)")

    def _refuse_integral(self, values, low, high, name, leaf, where: str) -> None:
        low, high = np.asarray(low), np.asarray(high)
        bad = ~((values >= low) & (values <= high) & (values == np.floor(values)))
        index = int(np.flatnonzero(bad)[0])
        value = values[index].item()
        what = f"the observation {value!r}" if values.size == 1 and not name else \
            f"an observation whose {name or 'value'}[{index}] is {value!r}" if values.size > 1 \
            else f"an observation whose {name} is {value!r}"
        raise ValueError(f"{where} returned {what}, not one of the whole numbers "
                         f"{low[index]:g}..{high[index]:g} its space {leaf} holds")

    def _refuse_non_finite(self, value, row: np.ndarray, where: str) -> None:
        index = int(np.flatnonzero(~np.isfinite(row))[0])
        path, offset, _ = next(f for f in reversed(self.fields) if f[1] <= index)
        leaf = _get(value, path)
        try:
            original = np.ravel(np.asarray(leaf, dtype=object))[index - offset]
        except (ValueError, TypeError, IndexError):
            original = row[index]
        name = "/".join(map(str, path)) or "the observation"
        raise ValueError(f"{where} returned an observation whose value at {name}[{index - offset}] "
                         f"is not finite in float32 ({original!r}; NaN, inf, None and values "
                         f"beyond +-3.4e38 cannot be stored): observations must be finite "
                         f"numbers")


def unflatten(flat, space, cast: bool = False):
    """The structured value(s) of `space` from flat rows `flat` (..., size).

    Works on NumPy arrays and torch tensors (slices and reshapes only, so no
    copy); leaf shapes are restored with the leading batch dimensions kept.
    With cast=True (NumPy only) each leaf is converted to its space's dtype.
    """
    batch = tuple(flat.shape[:-1])

    def build(sub, offset):
        if isinstance(sub, spaces.Dict):
            out = {}
            for key, child in sub.spaces.items():
                out[key], offset = build(child, offset)
            return out, offset
        if isinstance(sub, spaces.Tuple):
            items = []
            for child in sub.spaces:
                item, offset = build(child, offset)
                items.append(item)
            return tuple(items), offset
        shape, _, _ = _leaf_bounds(sub)
        size = int(np.prod(shape))
        value = flat[..., offset:offset + size].reshape(batch + tuple(shape))
        if cast and isinstance(value, np.ndarray):
            value = value.astype(sub.dtype)
        return value, offset + size

    list(leaves(space))  # refuses unsupported spaces with a clear message
    return build(space, 0)[0]


class FlatAction:
    """Maps rows of the flat action space back to actions of `space`."""

    def __init__(self, space):
        self.source_space = space
        all_leaves = list(leaves(space))
        continuous = [isinstance(leaf, spaces.Box) for _, leaf in all_leaves]
        if any(continuous) and not all(continuous):
            raise ValueError(f"action space {space!r} mixes discrete and continuous leaves; "
                             "Peregrine's flat actions are all integers or all float32")
        self.continuous = all(continuous)
        self._leaves = all_leaves
        self._simple = len(all_leaves) == 1 and all_leaves[0][0] == ()
        if self.continuous:
            _, lows, highs = zip(*(_leaf_bounds(leaf) for _, leaf in all_leaves))
            low, high = np.concatenate(lows), np.concatenate(highs)
            self.space = spaces.Box(low.astype(np.float32), high.astype(np.float32),
                                    (low.size,), np.float32)
        elif self._simple and isinstance(space, spaces.Discrete):
            self.space = spaces.Discrete(int(space.n), dtype=space.dtype)
        elif self._simple and isinstance(space, spaces.MultiDiscrete):
            self.space = spaces.MultiDiscrete(np.asarray(space.nvec).ravel().astype(np.int64),
                                              dtype=space.dtype)
        else:
            nvec = [np.asarray(leaf.nvec).ravel() if isinstance(leaf, spaces.MultiDiscrete)
                    else np.array([leaf.n]) if isinstance(leaf, spaces.Discrete)
                    else np.full(int(np.prod(leaf.shape)), 2) for _, leaf in all_leaves]
            self.space = spaces.MultiDiscrete(np.concatenate(nvec).astype(np.int64),
                                              dtype=np.int32)
        self._starts = [_leaf_bounds(leaf)[1] for _, leaf in all_leaves]
        self._discrete_start = (int(space.start) if self._simple and
                                isinstance(space, spaces.Discrete) else None)

    def _leaf_value(self, leaf, start, values):
        if isinstance(leaf, spaces.Box):
            # NaN/inf treated as 0, as in the native envs
            values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
            return values.reshape(leaf.shape).astype(leaf.dtype)
        if isinstance(leaf, spaces.Discrete):
            return int(values[0]) + int(leaf.start)
        if isinstance(leaf, spaces.MultiDiscrete):
            return (values + start.astype(np.int64)).reshape(leaf.shape).astype(leaf.dtype)
        return values.reshape(leaf.shape).astype(leaf.dtype)

    def to_env_batch(self, rows: np.ndarray):
        """A vector env's batched actions for the [n, ...] flat action rows: each leaf
        [n, *shape] in its own dtype (an int64 array for Discrete), as Gymnasium
        batches the single action space."""
        n = rows.shape[0]
        flat = rows.reshape(n, -1)
        values, offset = {}, 0
        for (path, leaf), start in zip(self._leaves, self._starts):
            size = int(start.size)
            part = flat[:, offset:offset + size]
            if isinstance(leaf, spaces.Box):
                part = np.nan_to_num(part, nan=0.0, posinf=0.0, neginf=0.0)
            elif isinstance(leaf, (spaces.Discrete, spaces.MultiDiscrete)) and start.any():
                part = part.astype(np.int64) + start.astype(np.int64)
            shape = (n,) if isinstance(leaf, spaces.Discrete) else (n, *leaf.shape)
            # a view of the rows where nothing is shifted or cast (Discrete from 0, its
            # own dtype: an Atari action batch costs no copy)
            values[path] = part.reshape(shape).astype(leaf.dtype, copy=False)
            offset += size
        return values[()] if self._simple else _rebuild(self.source_space, values, ())

    def to_env(self, row):
        """The env action for one flat action row (a scalar for Discrete)."""
        if self._discrete_start is not None:
            return int(row) + self._discrete_start
        row = np.atleast_1d(row)
        if self._simple:
            return self._leaf_value(self.source_space, self._starts[0], row)
        values, offset = {}, 0
        for (path, leaf), start in zip(self._leaves, self._starts):
            size = int(start.size)
            values[path] = self._leaf_value(leaf, start, row[offset:offset + size])
            offset += size
        return _rebuild(self.source_space, values, ())


def row_of(values, index: int):
    """Element `index` of a batched value (an array, or a Dict/Tuple of them)."""
    if isinstance(values, dict):
        return {key: row_of(value, index) for key, value in values.items()}
    if isinstance(values, tuple):
        return tuple(row_of(value, index) for value in values)
    return values[index]


def _rebuild(space, values, path):
    if isinstance(space, spaces.Dict):
        return {key: _rebuild(sub, values, path + (key,)) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_rebuild(sub, values, path + (i,)) for i, sub in enumerate(space.spaces))
    return values[path]
