"""float32 sin/cos identical to pg_math.h's pg_sincosf, for the references.

Cody-Waite reduction by pi/2 and Cephes' minimax polynomials; only + - * and
conversions, each correctly rounded in float32, so the result matches the C
code bit for bit (which is compiled with -ffp-contract=off).
"""
from __future__ import annotations

import numpy as np

f32 = np.float32
_TWO_OVER_PI = f32(0.636619772367581343)
_PIO2_1, _PIO2_2, _PIO2_3 = f32(1.5703125), f32(4.837512969970703125e-4), f32(7.54978995489188216e-8)
_MAGIC = f32(12582912.0)


def sincos(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float32)
    k = (x * _TWO_OVER_PI + _MAGIC) - _MAGIC
    r = ((x - k * _PIO2_1) - k * _PIO2_2) - k * _PIO2_3
    z = r * r
    s = ((f32(-1.9515295891e-4) * z + f32(8.3321608736e-3)) * z - f32(1.6666654611e-1)) * z * r + r
    c = ((f32(2.443315711809948e-5) * z - f32(1.388731625493765e-3)) * z
         + f32(4.166664568298827e-2)) * z * z - f32(0.5) * z + f32(1.0)
    q = k.astype(np.int32) & 3
    odd = (q & 1).astype(bool)
    sin_mag = np.where(odd, c, s)
    cos_mag = np.where(odd, s, c)
    sin = np.where((q & 2).astype(bool), -sin_mag, sin_mag)
    cos = np.where(((q + 1) & 2).astype(bool), -cos_mag, cos_mag)
    return sin, cos
