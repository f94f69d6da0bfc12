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
 *       for integer fields, naming the field. Cross-field rules go in env_init,
 *       which reads each field by name, config[CFG_<name>] (PG_CONFIG_INDEX).
 *   #define ENV_STATS(X) X(name) ...
 *       Episode statistics. env_step calls pg_stats_record() once per finished
 *       episode with one value per statistic, in this order.
 *   typedef struct Env Env;   whose FIRST member is `PgBatch pg;`
 *   static int  env_init(Env*, const double* config, char* err, size_t errlen);
 *       Called with pg.num_envs set and config already range-checked. Must set
 *       pg.obs_dim, pg.obs_is_uint8, pg.agents_per_env, pg.action_kind,
 *       pg.action_dim and pg.action_nvec[], and allocate its state with
 *       PG_ALLOC (every array; the binding frees them, the GPU batch mirrors
 *       them: a pointer member made any other way is found by
 *       envs/gpu/audit.py's pointer_problems in the test suite). Return 0, or -1
 *       with a message naming the offending field in err.
 *   static void env_free(Env*);   anything else env_init made (usually nothing)
 *       env_init and env_free sit inside #ifndef PG_GPU (host only).
 *   PG_DEVICE static void env_reset(Env*, int start, int end);  fresh episodes
 *   PG_DEVICE static void env_step(Env*, int start, int end);
 *   PG_DEVICE static int  env_state_size(const Env*);  doubles per instance
 *   PG_DEVICE static void env_get_state(const Env*, int instance, double* out);
 *   PG_DEVICE static int  env_set_state(Env*, int instance, const double* in);
 *       (0 / -1) State get/set lets tests build exact scenarios and compare C
 *       with the NumPy reference from identical states.
 *
 * Optional: #define ENV_CONSTANTS(X) X(name, value) ...
 *   Named integer layout facts (sizes of state blocks, say) that Python reads
 *   from the built module's constants() instead of restating them.
 *
 * Optional, for multi-agent envs: a global state for a centralised critic.
 *   #define ENV_GLOBAL_STATE 1, set pg.state_dim > 0 in env_init, and define
 *   PG_DEVICE static void env_global_state(const Env*, int instance, float *out);
 *       state_dim floats describing the whole instance (every agent and object
 *       of the world, normalised for learning to about [-1, 1]). It is not the
 *       exact state above (env_get_state: doubles, for tests and checkpoints);
 *       it is an observation of everything, which a value function may read
 *       while the agents' policies see only their own rows.
 *   The binding (and pg_gpu.h) writes pg.states for every instance a step,
 *   reset or set_state touched, when pg.states is not NULL. An episode end
 *   must, like final_observations, write the state it ended on into
 *   pg.final_states before the instance resets, when that is not NULL.
 *
 *   Every function the step or reset reaches is PG_DEVICE, and the header is
 *   portable C that NVRTC accepts as C++ (see "one header, two compilers"):
 *   `peregrine envs --gpu-check` and the test suite compile it for the GPU.
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
 *   - On the GPU one thread steps one instance (start + 1 == end): per-call
 *     scratch on that thread's stack becomes local memory reserved for every
 *     thread the GPU can hold, so keep it small and constant-indexed, or put it
 *     in a PG_ALLOC array of the Env (DroneSwarm's `work`); write nothing
 *     outside your instance's rows.
 */
#ifndef PEREGRINE_PG_ENV_H
#define PEREGRINE_PG_ENV_H

/* ---- one header, two compilers ---------------------------------------------
 * Every env header is compiled by the C compiler for the CPU batch (binding.h)
 * and, unchanged, by NVRTC for the GPU batch (pg_gpu.h, one GPU thread per
 * instance). What differs between the two is only spelled here:
 *   PG_DEVICE     on every function the step or reset reaches (host+device on
 *                 the GPU build, nothing on the CPU one);
 *   PG_RESTRICT   C's restrict / CUDA's __restrict__;
 *   PG_TABLE      a constant lookup table readable from device code;
 *   PG_GPU        defined in the GPU build, for sizes of per-thread scratch.
 * NVRTC has no libc headers: the fixed-width types and the two constants the
 * rules use are spelled here. Host-only parts of a header (config checks,
 * env_init's allocations) sit inside #ifndef PG_GPU. Rules code uses only + - * /
 * sqrtf fabsf floorf fminf fmaxf isfinite and pg_math.h, all correctly rounded or
 * exact in both builds (no FMA contraction on either side). */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define PG_GPU 1
#define PG_DEVICE __host__ __device__
#define PG_RESTRICT __restrict__
#define PG_TABLE static __device__ const
#ifdef __CUDACC_RTC__ /* NVRTC: no libc headers; size_t is built in */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define FLT_MAX 3.402823466e+38f
#define INFINITY __int_as_float(0x7f800000)
#endif
#else
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PG_DEVICE
#define PG_RESTRICT restrict
#define PG_TABLE static const
#endif

/* PG_GPU_STACK(max_bytes, "why"): a header whose GPU step kernel needs a
 * per-thread local-memory stack (arrays indexed at run time) declares it here,
 * with a ceiling and the reason. ptxas' report is checked against it for sm_90
 * (envs/gpu/audit.py, tests/test_gpu_build.py): a step kernel with a stack
 * and no declaration, over its ceiling, or with any register spill fails.
 * Local memory is as slow as global memory and is reserved for every resident
 * thread, so small constant-indexed arrays (registers) are the rule. Expands to
 * nothing; write it at file scope, without a semicolon. */
#define PG_GPU_STACK(max_bytes, why)

/* Config fields by name: after ENV_CONFIG, `enum { ENV_CONFIG(PG_CONFIG_INDEX) };`
 * gives CFG_<field> = the field's index in env_init's `config` array, so a header
 * reads config[CFG_max_steps] and every field is written once, in ENV_CONFIG. */
#define PG_CONFIG_INDEX(name, default_value, min_value, max_value, is_integer) CFG_##name,

#define PG_ACTION_DISCRETE 0      /* int32 [rows]            */
#define PG_ACTION_MULTIDISCRETE 1 /* int32 [rows, action_dim] */
#define PG_ACTION_CONTINUOUS 2    /* float32 [rows, action_dim] */
#define PG_MAX_ACTION_DIM 64
#define PG_MAX_ALLOCS 48

typedef struct {
    size_t offset; /* bytes from the start of the Env to the pointer member */
    size_t bytes;  /* size of the array it points to */
} PgAllocation;

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
    /* The optional global state (ENV_GLOBAL_STATE below): state_dim floats per
     * instance, set by env_init (0 = the env has none). The two buffers are
     * caller-owned and NULL until a caller asks for states (Batch.attach_states):
     * nothing is written, and nothing costs, before that. */
    int state_dim;
    float *states;            /* [num_envs, state_dim] the current state of each instance */
    float *final_states;      /* same layout; valid on instances whose rows just ended */
    /* Owned by the binding. */
    uint64_t *rng;            /* [num_envs] one stream per instance */
    double *stats;            /* [num_envs, 1 + 2*num_stats] count, sums, sums of squares */
    int num_stats;
    /* Every array made by pg_alloc (the env's state and the two above): where
     * its pointer sits in the Env and its size. The binding frees them; the
     * GPU batch mirrors each in device memory and patches the pointer. */
    int num_allocs;
    PgAllocation allocs[PG_MAX_ALLOCS];
} PgBatch;

#ifndef PG_GPU
/* Host only (env_init, the binding): a zeroed array of `count` elements of
 * `size` bytes whose pointer is stored at `field`, the address of a pointer
 * member of the Env that starts with `pg`. Returns 0, or -1 when out of
 * memory or the table is full. Every array an env's step or reset reads must
 * come from here, so that the GPU batch finds it: PG_ALLOC(env, x, n). */
static int pg_alloc(PgBatch *pg, void *field, size_t count, size_t size) {
    if (pg->num_allocs >= PG_MAX_ALLOCS || (size && count > (size_t)-1 / size)) return -1;
    void *memory = calloc(count ? count : 1, size ? size : 1);
    if (!memory) return -1;
    memcpy(field, &memory, sizeof memory);
    pg->allocs[pg->num_allocs].offset = (size_t)((char *)field - (char *)pg);
    pg->allocs[pg->num_allocs].bytes = count * size;
    pg->num_allocs++;
    return 0;
}
#define PG_ALLOC(env, field, count) \
    pg_alloc(&(env)->pg, &(env)->field, (size_t)(count), sizeof(*(env)->field))
#endif

/* ---- random numbers: splitmix64 ------------------------------------------
 * Each instance owns a 64-bit state advanced by the golden-ratio increment and
 * finalised by Stafford's mix13 (splitmix64). The same generator is written in
 * NumPy in peregrine/envs/reference/rng.py, so references draw the very same numbers. */
#define PG_GOLDEN 0x9E3779B97F4A7C15ULL

PG_DEVICE static inline uint64_t pg_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Stream start for an instance: never the raw seed. */
PG_DEVICE static inline uint64_t pg_seed_instance(uint64_t seed, uint64_t instance) {
    return pg_mix64(pg_mix64(seed) + (instance + 1) * PG_GOLDEN);
}

PG_DEVICE static inline uint64_t pg_next_u64(uint64_t *state) {
    *state += PG_GOLDEN;
    return pg_mix64(*state);
}

/* Uniform float in [0, 1) with 24 random bits: exact in float32 everywhere. */
PG_DEVICE static inline float pg_uniform(uint64_t *state) {
    return (float)(pg_next_u64(state) >> 40) * 0x1.0p-24f;
}

/* Uniform float in [lo, hi): lo + u * (hi - lo), rounded in float32. */
PG_DEVICE static inline float pg_uniform_range(uint64_t *state, float lo, float hi) {
    float u = pg_uniform(state);
    float width = hi - lo;
    float scaled = u * width;
    return lo + scaled;
}

/* Uniform integer in [0, n) by multiply-shift on the top 32 bits. */
PG_DEVICE static inline int pg_randint(uint64_t *state, int n) {
    uint64_t top = pg_next_u64(state) >> 32;
    return (int)((top * (uint64_t)n) >> 32);
}

/* PG_SIMD_KERNEL marks an env's hot loop: GCC builds an AVX2 clone beside the
 * baseline one and picks at load time, so a portable wheel still runs wide
 * SIMD where the CPU has it. -ffp-contract=off keeps both bitwise identical.
 * (A -march=native build, or other compilers/architectures, use one version.) */
#if defined(PG_GPU)
#define PG_SIMD_KERNEL
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__AVX2__) && !defined(__SANITIZE_ADDRESS__)
#define PG_SIMD_KERNEL __attribute__((noinline, target_clones("avx2", "default")))
#else
#define PG_SIMD_KERNEL __attribute__((noinline))
#endif

/* Lowest set bit's index (x != 0) and set-bit count of a 64-bit word. */
PG_DEVICE static inline int pg_ctz64(uint64_t x) {
#ifdef PG_GPU
    return __ffsll((long long)x) - 1;
#else
    return __builtin_ctzll(x);
#endif
}

PG_DEVICE static inline int pg_popcount64(uint64_t x) {
#ifdef PG_GPU
    return __popcll(x);
#else
    return __builtin_popcountll(x);
#endif
}

/* always_inline on the host: GCC does not inline a plain inline function into
 * one compiled with other optimize options (drone_swarm's no-trapping-math SIMD
 * kernels); a call per element there stops the loop vectorizing. */
#if defined(__GNUC__) && !defined(PG_GPU)
#define PG_ALWAYS_INLINE __attribute__((always_inline))
#else
#define PG_ALWAYS_INLINE
#endif

PG_DEVICE static inline PG_ALWAYS_INLINE float pg_finite_or_zero(float x) {
    return isfinite(x) ? x : 0.0f;
}

PG_DEVICE static inline float pg_clampf(float x, float lo, float hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

/* ---- episode statistics ----------------------------------------------------
 * Per instance: [count, sum_0..sum_{k-1}, sumsq_0..sumsq_{k-1}]. Per-instance
 * rows make the aggregate independent of how instances were split across
 * threads; the binding reduces them in instance order. */
#define PG_MAX_STATS 16 /* statistics per env (binding.h checks ENV_STATS against it) */

/* PG_UNROLL: unroll the next loop fully in the GPU build (a loop with a
 * constant bound over a small array lets the array live in registers instead
 * of the thread's local-memory stack); nothing in the CPU build. */
#ifdef PG_GPU
#define PG_UNROLL _Pragma("unroll")
#else
#define PG_UNROLL
#endif

PG_DEVICE static inline void pg_stats_record(PgBatch *pg, int instance, const double *values) {
    int k = pg->num_stats;
    double *row = pg->stats + (size_t)instance * (size_t)(1 + 2 * k);
    row[0] += 1.0;
    /* Bounded by the constant PG_MAX_STATS, so that the GPU build unrolls it and
     * the caller's values[] stays in registers (a bound of k alone would index
     * the array at run time and put it on the stack: ptxas' report, checked by
     * tests/test_gpu_build.py). */
    PG_UNROLL
    for (int s = 0; s < PG_MAX_STATS && s < k; s++) {
        row[1 + s] += values[s];
        row[1 + k + s] += values[s] * values[s];
    }
}

/* ---- bad actions on a device ----------------------------------------------
 * The CPU batch refuses out-of-range discrete actions before stepping; a GPU
 * batch cannot without a host synchronisation, so it repairs them in place,
 * the same way for every env, and counts what it saw: an out-of-range
 * discrete component becomes 0 (errors[PG_ERR_DISCRETE] += 1 per component);
 * a NaN/inf continuous component is counted (errors[PG_ERR_NONFINITE]) and
 * left to the env, which treats it as 0 exactly as on the CPU. One instance's
 * rows; instances may run concurrently (atomic counts on the GPU). */
#define PG_ERR_DISCRETE 0
#define PG_ERR_NONFINITE 1
#define PG_NUM_ACTION_ERRORS 2

PG_DEVICE static inline void pg_count_error(unsigned long long *counter, unsigned long long n) {
#ifdef PG_GPU
    atomicAdd(counter, n);
#else
    *counter += n;
#endif
}

PG_DEVICE static inline void pg_repair_actions(PgBatch *pg, int instance,
                                               unsigned long long *errors) {
    const int agents = pg->agents_per_env;
    const int dims = pg->action_kind == PG_ACTION_DISCRETE ? 1 : pg->action_dim;
    const size_t first = (size_t)instance * (size_t)agents * (size_t)dims;
    unsigned long long bad = 0;
    if (pg->action_kind == PG_ACTION_CONTINUOUS) {
        const float *actions = (const float *)pg->actions + first;
        for (int j = 0; j < agents * dims; j++) bad += !isfinite(actions[j]);
        if (bad) pg_count_error(&errors[PG_ERR_NONFINITE], bad);
        return;
    }
    int32_t *actions = (int32_t *)pg->actions + first;
    for (int r = 0; r < agents; r++)
        for (int d = 0; d < dims; d++) {
            int32_t *a = &actions[r * dims + d];
            if ((uint32_t)*a < (uint32_t)pg->action_nvec[d]) continue;
            *a = 0;
            bad++;
        }
    if (bad) pg_count_error(&errors[PG_ERR_DISCRETE], bad);
}

/* Zeroes one instance's rewards and flags and, with `final_observations`,
 * its final observations: what a reset (and a held step) leaves there. */
PG_DEVICE static inline void pg_clear_instance(PgBatch *pg, int instance, int final_observations) {
    const size_t agents = (size_t)pg->agents_per_env, row = (size_t)instance * agents;
    for (size_t r = row; r < row + agents; r++) {
        pg->terminals[r] = 0;
        pg->truncations[r] = 0;
        pg->rewards[r] = 0.0f;
    }
    if (!final_observations) return;
    const size_t width = (size_t)pg->obs_dim * (pg->obs_is_uint8 ? 1 : sizeof(float));
    unsigned char *final_obs = (unsigned char *)pg->final_observations + row * width;
    for (size_t b = 0; b < agents * width; b++) final_obs[b] = 0;
}

/* Index of the first i in [from, end) with ended_a[i] | ended_b[i], or end.
 * Episodes end on a few percent of steps, so the scan skips 8 flags at a time. */
PG_DEVICE static inline int pg_next_ended(const uint8_t *ended_a, const uint8_t *ended_b, int from, int end) {
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
