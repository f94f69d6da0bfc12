/*
 * pg_math.h -- float32 math that vectorizes and that the NumPy references
 * reproduce bit for bit (peregrine/envs/reference/pg_math.py).
 *
 * libm's sinf/cosf are calls the compiler cannot vectorize, and NumPy's own
 * float32 sin differs from them in the last bit, which is enough for two
 * implementations to disagree on a termination threshold after a million
 * steps. So envs use this sincos: Cody-Waite reduction by pi/2 (three-part
 * constant, exact products for |x| < ~8000) and minimax polynomials on
 * [-pi/4, pi/4] (coefficients from Cephes' sinf/cosf). Error is about 1 ulp.
 * Only + - * and conversions are used, all correctly rounded in IEEE float32,
 * so with -ffp-contract=off the C and NumPy results are identical.
 */
#ifndef PEREGRINE_PG_MATH_H
#define PEREGRINE_PG_MATH_H

#include "pg_env.h"

#define PG_TWO_OVER_PI 0.636619772367581343f
#define PG_PIO2_1 1.5703125f
#define PG_PIO2_2 4.837512969970703125e-4f
#define PG_PIO2_3 7.54978995489188216e-8f
#define PG_ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: x + M - M rounds to nearest */

PG_DEVICE static inline void pg_sincosf(float x, float *sin_out, float *cos_out) {
    float k = (x * PG_TWO_OVER_PI + PG_ROUND_MAGIC) - PG_ROUND_MAGIC;
    float r = ((x - k * PG_PIO2_1) - k * PG_PIO2_2) - k * PG_PIO2_3;
    float z = r * r;
    float s = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
    float c = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z +
               4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
    int q = (int)k & 3;
    float sin_mag = (q & 1) ? c : s;
    float cos_mag = (q & 1) ? s : c;
    *sin_out = (q & 2) ? -sin_mag : sin_mag;
    *cos_out = ((q + 1) & 2) ? -cos_mag : cos_mag;
}

#endif /* PEREGRINE_PG_MATH_H */
