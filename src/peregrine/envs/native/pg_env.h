/*
 * pg_env.h -- the contract between a Peregrine C environment and the generic
 * binding (binding.h).
 *
 * "The batch is the environment": an env header implements a batch of
 * `num_envs` instances, each with `agents_per_env` agent rows. Python owns
 * the buffers (NumPy, shared memory, pinned memory...) and hands their
 * pointers to C once, at construction. `env_step(env, start, end)` steps the
 * instances [start, end), auto-resets the finished ones in the same call and
 * writes every result in place. Nothing is allocated per step.
 *
 * What an env header must define before including binding.h:
 *
 *   (the module's .c file defines ENV_MODULE_IDENT, e.g. _cartpole)
 *   #define ENV_CONFIG(X) X(name, default, min, max, is_integer) ...
 *       Every configuration field, a double in Python's config array in this
 *       order. The binding refuses values outside [min, max] or non-integers
 *       for integer fields, naming the field. Cross-field rules go in env_init.
 *   #define ENV_STATS(X) X(name) ...
 *       Episode statistics. env_step calls pg_stats_record() once per finished
 *       episode with one value per statistic, in this order.
 *   typedef struct Env Env;   whose FIRST member is `PgBatch pg;`
 *   static int  env_init(Env*, const double* config, char* err, size_t errlen);
 *       Called with pg.num_envs set and config already range-checked. Must set
 *       pg.obs_dim, pg.obs_is_uint8, pg.agents_per_env, pg.action_kind,
 *       pg.action_dim and pg.action_nvec[], and allocate its own state. Return
 *       0, or -1 with a message naming the offending field in err.
 *   static void env_free(Env*);
 *   static void env_reset(Env*, int start, int end);   fresh episodes
 *   static void env_step(Env*, int start, int end);
 *   static int  env_state_size(const Env*);            doubles per instance
 *   static void env_get_state(const Env*, int instance, double* out);
 *   static int  env_set_state(Env*, int instance, const double* in);  0 / -1
 *       State get/set lets tests build exact scenarios and compare C with the
 *       NumPy reference from identical states.
 *
 * Rules for env_step (all envs):
 *   - Instances in [start, end) only; different ranges run on different threads
 *     at the same time, so touch nothing shared except through your own rows.
 *     Ranges can start and end anywhere: a step that holds some instances, or
 *     a reset of some, calls env_step/env_reset on the runs between them.
 *   - Never trust actions: NaN/inf floats are treated as 0 (pg_finite_or_zero);
 *     discrete actions were range-checked by the binding before the step.
 *   - On episode end: write the last observation into final_observations for
 *     that instance's rows, set terminals/truncations (never both merged), then
 *     reset the instance and write the new first observation into observations.
 *   - Determinism: all randomness comes from pg.rng[instance].
 */
#ifndef PEREGRINE_PG_ENV_H
#define PEREGRINE_PG_ENV_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PG_ACTION_DISCRETE 0      /* int32 [rows]            */
#define PG_ACTION_MULTIDISCRETE 1 /* int32 [rows, action_dim] */
#define PG_ACTION_CONTINUOUS 2    /* float32 [rows, action_dim] */
#define PG_MAX_ACTION_DIM 64

typedef struct {
    /* Set by the binding before env_init. */
    int num_envs;
    /* Set by env_init. */
    int obs_dim;
    int obs_is_uint8;
    int agents_per_env;
    int action_kind;
    int action_dim;
    int action_nvec[PG_MAX_ACTION_DIM]; /* discrete kinds: choices per component */
    /* Caller-owned buffers, rows = num_envs * agents_per_env. */
    void *observations;       /* [rows, obs_dim] float32 (or uint8) */
    void *final_observations; /* same layout; valid on rows that just ended */
    void *actions;            /* see PG_ACTION_* */
    float *rewards;           /* [rows] */
    uint8_t *terminals;       /* [rows] */
    uint8_t *truncations;     /* [rows] */
    uint8_t *masks;           /* [rows] 1 = live agent row */
    /* Owned by the binding. */
    uint64_t *rng;            /* [num_envs] one stream per instance */
    double *stats;            /* [num_envs, 1 + 2*num_stats] count, sums, sums of squares */
    int num_stats;
} PgBatch;

/* ---- random numbers: splitmix64 ------------------------------------------
 * Each instance owns a 64-bit state advanced by the golden-ratio increment and
 * finalised by Stafford's mix13 (splitmix64). The same generator is written in
 * NumPy in peregrine/envs/rng.py, so references draw the very same numbers. */
#define PG_GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t pg_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Stream start for an instance: never the raw seed. */
static inline uint64_t pg_seed_instance(uint64_t seed, uint64_t instance) {
    return pg_mix64(pg_mix64(seed) + (instance + 1) * PG_GOLDEN);
}

static inline uint64_t pg_next_u64(uint64_t *state) {
    *state += PG_GOLDEN;
    return pg_mix64(*state);
}

/* Uniform float in [0, 1) with 24 random bits: exact in float32 everywhere. */
static inline float pg_uniform(uint64_t *state) {
    return (float)(pg_next_u64(state) >> 40) * 0x1.0p-24f;
}

/* Uniform float in [lo, hi): lo + u * (hi - lo), rounded in float32. */
static inline float pg_uniform_range(uint64_t *state, float lo, float hi) {
    float u = pg_uniform(state);
    float width = hi - lo;
    float scaled = u * width;
    return lo + scaled;
}

/* Uniform integer in [0, n) by multiply-shift on the top 32 bits. */
static inline int pg_randint(uint64_t *state, int n) {
    uint64_t top = pg_next_u64(state) >> 32;
    return (int)((top * (uint64_t)n) >> 32);
}

/* PG_SIMD_KERNEL marks an env's hot loop: GCC builds an AVX2 clone beside the
 * baseline one and picks at load time, so a portable wheel still runs wide
 * SIMD where the CPU has it. -ffp-contract=off keeps both bitwise identical.
 * (A -march=native build, or other compilers/architectures, use one version.) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__AVX2__) && !defined(__SANITIZE_ADDRESS__)
#define PG_SIMD_KERNEL __attribute__((noinline, target_clones("avx2", "default")))
#else
#define PG_SIMD_KERNEL __attribute__((noinline))
#endif

static inline float pg_finite_or_zero(float x) {
    return isfinite(x) ? x : 0.0f;
}

static inline float pg_clampf(float x, float lo, float hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

/* ---- episode statistics ----------------------------------------------------
 * Per instance: [count, sum_0..sum_{k-1}, sumsq_0..sumsq_{k-1}]. Per-instance
 * rows make the aggregate independent of how instances were split across
 * threads; the binding reduces them in instance order. */
static inline void pg_stats_record(PgBatch *pg, int instance, const double *values) {
    int k = pg->num_stats;
    double *row = pg->stats + (size_t)instance * (size_t)(1 + 2 * k);
    row[0] += 1.0;
    for (int s = 0; s < k; s++) {
        row[1 + s] += values[s];
        row[1 + k + s] += values[s] * values[s];
    }
}

/* Index of the first i in [from, end) with ended_a[i] | ended_b[i], or end.
 * Episodes end on a few percent of steps, so the scan skips 8 flags at a time. */
static inline int pg_next_ended(const uint8_t *ended_a, const uint8_t *ended_b, int from, int end) {
    int i = from;
    for (; i + 8 <= end; i += 8) {
        uint64_t a, b;
        memcpy(&a, ended_a + i, 8);
        memcpy(&b, ended_b + i, 8);
        if (a | b) break;
    }
    for (; i < end; i++)
        if (ended_a[i] | ended_b[i]) return i;
    return end;
}

#endif /* PEREGRINE_PG_ENV_H */
