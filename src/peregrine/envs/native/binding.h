/*
 * binding.h -- the one generic CPython binding for every native env.
 *
 * An env's extension module is three lines:
 *     #define ENV_MODULE_IDENT _cartpole
 *     #include "cartpole.h"
 *     #include "binding.h"
 * and binding.h turns the env header (see pg_env.h for the contract) into a
 * module exposing:
 *     config_fields()  -> ((name, default, min, max, is_integer), ...)
 *     stat_names()     -> (name, ...)
 *     describe(config) -> dict of dimensions for that config (validates it)
 *     Batch(config, num_envs, num_threads, observations, final_observations,
 *           actions, rewards, terminals, truncations, masks)
 *         .seed(seed) .reset() .step(actions=None) .stats(clear)
 *         .get_state(i) .set_state(i, values) .state_size .num_threads
 *
 * Buffers arrive through the buffer protocol (no NumPy C API, so one build
 * works with NumPy 1.26 and 2.x); their format, size, contiguity and
 * writability are checked here and the views are held for the Batch's life.
 * step() and reset() release the GIL and split the instances into chunks
 * claimed dynamically by a persistent pool of pthreads (see the thread pool
 * section); each instance owns its RNG and statistics row, so results are
 * bitwise identical for every thread count.
 */
#ifndef PEREGRINE_BINDING_H
#define PEREGRINE_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "pg_env.h"

#ifndef ENV_MODULE_IDENT
#error "define ENV_MODULE_IDENT (e.g. _cartpole) before including binding.h"
#endif
#ifndef ENV_CONFIG
#error "the env header defines no ENV_CONFIG(X) list of config fields (see pg_env.h)"
#endif
#ifndef ENV_STATS
#error "the env header defines no ENV_STATS(X) list of episode statistics (see pg_env.h)"
#endif
#define PG_STR_(x) #x
#define PG_STR(x) PG_STR_(x)
#define ENV_MODULE_NAME PG_STR(ENV_MODULE_IDENT)

/* ---- config and stats tables from the env's X-macros ---------------------- */

typedef struct {
    const char *name;
    double default_value, min_value, max_value;
    int is_integer;
} PgConfigField;

#define PG_CONFIG_ROW(name, def, lo, hi, is_int) {#name, (def), (lo), (hi), (is_int)},
static const PgConfigField pg_config_fields[] = {ENV_CONFIG(PG_CONFIG_ROW)};
#undef PG_CONFIG_ROW
#define PG_NUM_CONFIG ((int)(sizeof(pg_config_fields) / sizeof(pg_config_fields[0])))

#define PG_STAT_ROW(name) #name,
static const char *pg_stat_names[] = {ENV_STATS(PG_STAT_ROW)};
#undef PG_STAT_ROW
#define PG_NUM_STATS ((int)(sizeof(pg_stat_names) / sizeof(pg_stat_names[0])))
_Static_assert(PG_NUM_STATS <= PG_MAX_STATS, "ENV_STATS lists more statistics than PG_MAX_STATS (pg_env.h)");

#define PG_MAX_THREADS 256
#define PG_MAX_NUM_ENVS (1 << 26) /* instances per batch; rows = num_envs * agents fit in int */
#define PG_RANGE_ALIGN 16 /* instances per SIMD/cache-friendly block */

/* Reads a Python sequence of numbers into config[], checking every field. */
static int pg_read_config(PyObject *seq, double *config) {
    PyObject *fast = PySequence_Fast(seq, "config must be a sequence of numbers");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n != PG_NUM_CONFIG) {
        PyErr_Format(PyExc_ValueError, "config has %zd values, %s expects %d", n,
                     ENV_MODULE_NAME, PG_NUM_CONFIG);
        Py_DECREF(fast);
        return -1;
    }
    for (int i = 0; i < PG_NUM_CONFIG; i++) {
        const PgConfigField *f = &pg_config_fields[i];
        double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "config field '%s' must be a number", f->name);
            Py_DECREF(fast);
            return -1;
        }
        char message[256];
        if (!(v >= f->min_value && v <= f->max_value)) { /* also refuses NaN */
            snprintf(message, sizeof(message), "config field '%s' = %g must be in [%g, %g]",
                     f->name, v, f->min_value, f->max_value);
            PyErr_SetString(PyExc_ValueError, message);
            Py_DECREF(fast);
            return -1;
        }
        if (f->is_integer && v != floor(v)) {
            snprintf(message, sizeof(message), "config field '%s' = %g must be an integer",
                     f->name, v);
            PyErr_SetString(PyExc_ValueError, message);
            Py_DECREF(fast);
            return -1;
        }
        config[i] = v;
    }
    Py_DECREF(fast);
    return 0;
}

/* ---- thread pool ---------------------------------------------------------
 *
 * Each thread owns a lane: a fixed, contiguous share of the instances cut
 * into PG_CHUNKS_PER_LANE chunks. A thread first runs its own lane's chunks,
 * which are the same instances every step, so their state stays in that
 * core's cache (what light, memory-bound envs like CartPole need); then it
 * steals unclaimed chunks from the other lanes. So if a worker is
 * descheduled (a shared or oversubscribed machine), the caller does that
 * worker's share instead of waiting for it. A claim is a CAS on the lane's
 * 64-bit ticket (generation << 32 | next chunk), so a worker that wakes late
 * can never take a chunk of a later step. Each instance owns its RNG and
 * statistics row, so results do not depend on which thread ran which chunk.
 *
 * Idle workers spin for PG_SPIN_SECONDS (back-to-back steps start at once),
 * then sleep on a condition variable (an idle pool costs no CPU). The caller
 * waits for in-flight chunks by spinning briefly, then yielding its core. */

#define PG_CHUNKS_PER_LANE 4

typedef struct {
    _Alignas(64) atomic_ullong ticket; /* generation << 32 | next chunk of this lane */
} PgLane;

typedef struct {
    PgLane lanes[PG_MAX_THREADS];
    pthread_t threads[PG_MAX_THREADS];
    int num_threads; /* including the calling thread */
    int started;     /* worker threads actually created */
    pid_t owner_pid; /* a forked child has no workers: it runs serially */
    Env *env;
    int op; /* 0 = step, 1 = reset */
    /* Instances the op covers: all when NULL, else those whose byte in
     * `selection` is nonzero exactly when `selected` is (see pg_run_range). */
    const uint8_t *selection;
    int selected;
    int num_envs;
    int chunk_size;
    _Alignas(64) atomic_ulong generation;
    atomic_int sleepers;
    atomic_int stop;
    _Alignas(64) atomic_int chunks_done;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
} PgPool;

typedef struct {
    PgPool *pool;
    int lane;
} PgWorkerArg;

/* The global state of instances [start, end) into pg.states, when a caller
 * attached it (pg_env.h, ENV_GLOBAL_STATE); nothing otherwise. */
static void pg_write_states(Env *env, int start, int end) {
#ifdef ENV_GLOBAL_STATE
    PgBatch *pg = &env->pg;
    if (!pg->states) return;
    for (int i = start; i < end; i++)
        env_global_state(env, i, pg->states + (size_t)i * (size_t)pg->state_dim);
#else
    (void)env, (void)start, (void)end;
#endif
}

static void pg_run_span(Env *env, int op, int start, int end) {
    if (op == 0) env_step(env, start, end);
    else env_reset(env, start, end);
    pg_write_states(env, start, end);
}

/* Runs the pool's op on the covered instances of [start, end). With a
 * selection (a step that holds some instances, a reset of some), each run of
 * consecutive covered instances goes to the env in one call, so the env's
 * vectorized passes still see long ranges. */
static void pg_run_range(const PgPool *pool, int start, int end) {
    const uint8_t *selection = pool->selection;
    if (!selection) {
        if (start < end) pg_run_span(pool->env, pool->op, start, end);
        return;
    }
    int i = start;
    while (i < end) {
        while (i < end && (selection[i] != 0) != pool->selected) i++;
        int first = i;
        while (i < end && (selection[i] != 0) == pool->selected) i++;
        if (first < i) pg_run_span(pool->env, pool->op, first, i);
    }
}

static inline void pg_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static double pg_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define PG_SPIN_SECONDS 50e-6

/* Claims and runs one chunk of `lane` for generation `gen`; 0 when none is left. */
static int pg_claim_one(PgPool *pool, unsigned long gen, int lane) {
    atomic_ullong *ticket = &pool->lanes[lane].ticket;
    for (;;) {
        unsigned long long seen = atomic_load(ticket);
        if ((seen >> 32) != (gen & 0xFFFFFFFFUL)) return 0; /* a later step */
        int chunk = (int)(seen & 0xFFFFFFFFULL);
        if (chunk >= PG_CHUNKS_PER_LANE) return 0;
        if (!atomic_compare_exchange_weak(ticket, &seen, seen + 1)) continue;
        long start = ((long)lane * PG_CHUNKS_PER_LANE + chunk) * pool->chunk_size;
        long end = start + pool->chunk_size;
        if (start > pool->num_envs) start = pool->num_envs;
        if (end > pool->num_envs) end = pool->num_envs;
        pg_run_range(pool, (int)start, (int)end);
        atomic_fetch_add(&pool->chunks_done, 1);
        return 1;
    }
}

/* Own lane first (cache locality), then help the others. */
static void pg_work(PgPool *pool, unsigned long gen, int home) {
    for (int k = 0; k < pool->num_threads; k++) {
        int lane = (home + k) % pool->num_threads;
        while (pg_claim_one(pool, gen, lane)) {
        }
    }
}

static void *pg_worker_main(void *raw) {
    PgWorkerArg *arg = (PgWorkerArg *)raw;
    PgPool *pool = arg->pool;
    int lane = arg->lane;
    free(arg);
    /* The pool was created at generation 0, before any worker existed. */
    unsigned long seen = 0;
    for (;;) {
        double spin_until = pg_now_seconds() + PG_SPIN_SECONDS;
        int spins = 0;
        while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop)) {
            pg_cpu_relax();
            if (++spins % 64 == 0 && pg_now_seconds() > spin_until) {
                pthread_mutex_lock(&pool->mutex);
                atomic_fetch_add(&pool->sleepers, 1);
                while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                    pthread_cond_wait(&pool->cond, &pool->mutex);
                atomic_fetch_sub(&pool->sleepers, 1);
                pthread_mutex_unlock(&pool->mutex);
            }
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = atomic_load(&pool->generation);
        pg_work(pool, seen, lane);
    }
}

/* Starts the pool's worker threads (lanes 1..num_threads-1; the caller is lane
 * 0). -1 if one cannot be created: those already started keep running, and the
 * pool works with them. */
static int pg_pool_start_threads(PgPool *pool) {
    for (int i = 1; i < pool->num_threads; i++) {
        PgWorkerArg *arg = (PgWorkerArg *)malloc(sizeof(PgWorkerArg));
        if (!arg) return -1;
        arg->pool = pool;
        arg->lane = i;
        if (pthread_create(&pool->threads[i - 1], NULL, pg_worker_main, arg) != 0) {
            free(arg);
            return -1;
        }
        pool->started++;
    }
    return 0;
}

/* fork() copies the pool into the child without its threads, and possibly with
 * the mutex held or a worker counted as waiting on the condition variable (the
 * state they were in at the fork): destroying or waiting on those in the child
 * hangs. So a child never touches the inherited ones. Its first op adopts the
 * pool: fresh mutex and condition variable, counters from zero, and threads of
 * its own (serial if they cannot be created); a child that never steps frees
 * the pool's memory without destroying anything (pg_batch_release). */
static void pg_pool_adopt(PgPool *pool) {
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->cond, NULL);
    atomic_store(&pool->generation, 0);
    atomic_store(&pool->sleepers, 0);
    atomic_store(&pool->stop, 0);
    atomic_store(&pool->chunks_done, 0);
    for (int lane = 0; lane < PG_MAX_THREADS; lane++) atomic_store(&pool->lanes[lane].ticket, 0);
    pool->started = 0;
    pool->owner_pid = getpid();
    pg_pool_start_threads(pool);
}

/* Runs op over the instances `selection` covers (all when NULL); called with
 * the GIL released. */
static void pg_pool_run(PgPool *pool, int op, const uint8_t *selection, int selected) {
    pool->op = op;
    pool->selection = selection;
    pool->selected = selected;
    if (pool->owner_pid != getpid()) pg_pool_adopt(pool); /* first op after a fork */
    if (pool->started == 0) {
        pg_run_range(pool, 0, pool->num_envs);
        return;
    }
    unsigned long gen = atomic_load(&pool->generation) + 1;
    atomic_store(&pool->chunks_done, 0);
    for (int lane = 0; lane < pool->num_threads; lane++)
        atomic_store(&pool->lanes[lane].ticket, (unsigned long long)(gen & 0xFFFFFFFFUL) << 32);
    atomic_store(&pool->generation, gen);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->mutex);
    }
    pg_work(pool, gen, 0);
    /* Lanes without a thread (one that could not be created) are finished by
     * pg_work's stealing above; every chunk is counted either way. */
    int total_chunks = pool->num_threads * PG_CHUNKS_PER_LANE;
    double spin_until = pg_now_seconds() + PG_SPIN_SECONDS;
    int spins = 0;
    while (atomic_load(&pool->chunks_done) < total_chunks) {
        if (++spins % 64 == 0 && pg_now_seconds() > spin_until) sched_yield();
        else pg_cpu_relax();
    }
}

static int pg_pool_start(PgPool *pool, Env *env, int num_envs, int num_threads) {
    memset(pool, 0, sizeof(*pool));
    pool->env = env;
    pool->num_envs = num_envs;
    pool->num_threads = num_threads;
    pool->owner_pid = getpid();
    /* PG_CHUNKS_PER_LANE chunks per thread, each a whole number of aligned
     * blocks (trailing chunks may be empty when instances are few). */
    int lanes_chunks = PG_CHUNKS_PER_LANE * num_threads;
    int per = (num_envs + lanes_chunks - 1) / lanes_chunks;
    per = (per + PG_RANGE_ALIGN - 1) / PG_RANGE_ALIGN * PG_RANGE_ALIGN;
    pool->chunk_size = per;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->cond, NULL);
    return pg_pool_start_threads(pool);
}

/* Stops and joins the threads and frees the pool. In a forked child that never
 * adopted the pool, the threads and primitives belong to the parent: only the
 * memory is freed. */
static void pg_pool_free(PgPool *pool) {
    if (pool->owner_pid == getpid()) {
        if (pool->started > 0) {
            pthread_mutex_lock(&pool->mutex);
            atomic_store(&pool->stop, 1);
            pthread_cond_broadcast(&pool->cond);
            pthread_mutex_unlock(&pool->mutex);
            for (int i = 0; i < pool->started; i++) pthread_join(pool->threads[i], NULL);
        }
        pthread_mutex_destroy(&pool->mutex);
        pthread_cond_destroy(&pool->cond);
    }
    pool->started = 0;
    free(pool);
}

/* ---- buffers -------------------------------------------------------------- */

/* kind: 'f' float32, 'i' int32, 'B' uint8/bool */
static int pg_format_matches(const char *format, char kind) {
    if (!format) return kind == 'B';
    if (*format == '@' || *format == '=' || *format == '<') format++;
    if (format[0] == '\0' || format[1] != '\0') return 0;
    char c = format[0];
    switch (kind) {
    case 'f': return c == 'f';
    case 'i': return c == 'i' || (c == 'l' && sizeof(long) == 4);
    case 'B': return c == 'B' || c == '?' || c == 'b';
    case 'Q': return c == 'Q' || (c == 'L' && sizeof(long) == 8);
    }
    return 0;
}

static int pg_get_buffer(PyObject *obj, Py_buffer *view, const char *name, char kind,
                         Py_ssize_t count, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s buffer (a NumPy array)",
                     name, writable ? ", writable" : "");
        return -1;
    }
    Py_ssize_t itemsize = kind == 'B' ? 1 : kind == 'Q' ? 8 : 4;
    if (view->itemsize != itemsize || !pg_format_matches(view->format, kind)) {
        PyErr_Format(PyExc_ValueError, "%s has element format '%s', expected %s", name,
                     view->format ? view->format : "B",
                     kind == 'f'   ? "float32"
                     : kind == 'i' ? "int32"
                     : kind == 'Q' ? "uint64"
                                   : "uint8/bool");
        PyBuffer_Release(view);
        return -1;
    }
    /* A misaligned float/int read is undefined behaviour (and slow where it works). */
    if ((uintptr_t)view->buf % (uintptr_t)itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s is not aligned to its %zd-byte elements (a view at "
                     "an odd byte offset); pass a copy (np.ascontiguousarray)", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd elements, expected %zd", name,
                     view->len / itemsize, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ---- the Batch type ------------------------------------------------------- */

enum { PG_BUF_OBS, PG_BUF_FINAL_OBS, PG_BUF_ACTIONS, PG_BUF_REWARDS, PG_BUF_TERMINALS,
       PG_BUF_TRUNCATIONS, PG_BUF_MASKS, PG_NUM_BUFFERS };
static const char *pg_buffer_names[PG_NUM_BUFFERS] = {
    "observations", "final_observations", "actions", "rewards", "terminals",
    "truncations", "masks"};

typedef struct {
    PyObject_HEAD
    Env *env;
    PgPool *pool;
    Py_buffer views[PG_NUM_BUFFERS];
    int have_view[PG_NUM_BUFFERS];
    Py_buffer state_views[2]; /* states, final_states: once attach_states was called */
    int have_state_views;
    int initialised;
    atomic_int busy;
} PgBatchObject;

static long pg_action_count(const PgBatch *pg) {
    long rows = (long)pg->num_envs * pg->agents_per_env;
    return pg->action_kind == PG_ACTION_DISCRETE ? rows : rows * pg->action_dim;
}

/* Frees an Env, its env_free hook first, then every pg_alloc array. */
static void pg_env_delete(Env *env) {
    env_free(env);
    for (int a = 0; a < env->pg.num_allocs; a++) {
        void *memory;
        memcpy(&memory, (char *)env + env->pg.allocs[a].offset, sizeof memory);
        free(memory);
    }
    free(env);
}

/* Builds an Env for `config`; on failure sets a Python error and returns NULL. */
static Env *pg_env_new(const double *config, int num_envs) {
    Env *env = (Env *)calloc(1, sizeof(Env));
    if (!env) {
        PyErr_NoMemory();
        return NULL;
    }
    env->pg.num_envs = num_envs;
    env->pg.num_stats = PG_NUM_STATS;
    char err[512] = {0};
    if (env_init(env, config, err, sizeof(err)) != 0) {
        PyErr_SetString(PyExc_ValueError,
                        err[0] ? err
                               : "invalid config (env_init returned -1 without a message: "
                                 "it should write one into err, naming the field)");
        pg_env_delete(env);
        return NULL;
    }
    PgBatch *pg = &env->pg;
#ifdef ENV_GLOBAL_STATE
    const int bad_state = pg->state_dim < 1;
#else
    const int bad_state = pg->state_dim != 0;
#endif
    /* What env_init set, checked field by field, so the error names the one that is
     * wrong (a bad action_kind would index the binding's tables out of bounds). */
    const char *bad = NULL;
    long value = 0;
    if (pg->obs_dim < 1) bad = "obs_dim (>= 1)", value = pg->obs_dim;
    else if (pg->agents_per_env < 1) bad = "agents_per_env (>= 1)", value = pg->agents_per_env;
    else if (pg->action_kind < PG_ACTION_DISCRETE || pg->action_kind > PG_ACTION_CONTINUOUS)
        bad = "action_kind (a PG_ACTION_* value)", value = pg->action_kind;
    else if (pg->action_dim < 1 || pg->action_dim > PG_MAX_ACTION_DIM)
        bad = "action_dim (1..PG_MAX_ACTION_DIM)", value = pg->action_dim;
    else if (bad_state)
        bad = "state_dim (> 0 with ENV_GLOBAL_STATE, else 0)", value = pg->state_dim;
    else if (pg->action_kind != PG_ACTION_CONTINUOUS)
        for (int i = 0; i < pg->action_dim && !bad; i++)
            if (pg->action_nvec[i] < 1) bad = "action_nvec[i] (choices, >= 1)", value = pg->action_nvec[i];
    if (bad) {
        PyErr_Format(PyExc_RuntimeError, "env_init set pg.%s to %ld (see pg_env.h)", bad, value);
        pg_env_delete(env);
        return NULL;
    }
    return env;
}

static void pg_batch_release(PgBatchObject *self) {
    if (self->pool) {
        pg_pool_free(self->pool);
        self->pool = NULL;
    }
    if (self->env) {
        pg_env_delete(self->env);
        self->env = NULL;
    }
    for (int i = 0; i < PG_NUM_BUFFERS; i++) {
        if (self->have_view[i]) PyBuffer_Release(&self->views[i]);
        self->have_view[i] = 0;
    }
    if (self->have_state_views) {
        PyBuffer_Release(&self->state_views[0]);
        PyBuffer_Release(&self->state_views[1]);
        self->have_state_views = 0;
    }
    self->initialised = 0;
}

static void pg_batch_dealloc(PgBatchObject *self) {
    pg_batch_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pg_batch_init(PgBatchObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"config", "num_envs", "num_threads", "observations",
                             "final_observations", "actions", "rewards", "terminals",
                             "truncations", "masks", NULL};
    PyObject *config_obj, *objs[PG_NUM_BUFFERS];
    int num_envs, num_threads;
    if (self->initialised) {
        PyErr_SetString(PyExc_RuntimeError, "Batch is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiiOOOOOOO", kwlist, &config_obj,
                                     &num_envs, &num_threads, &objs[0], &objs[1], &objs[2],
                                     &objs[3], &objs[4], &objs[5], &objs[6]))
        return -1;
    if (num_envs < 1 || num_envs > PG_MAX_NUM_ENVS) {
        PyErr_Format(PyExc_ValueError, "num_envs = %d must be in [1, %d]", num_envs,
                     PG_MAX_NUM_ENVS);
        return -1;
    }
    if (num_threads < 1 || num_threads > PG_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "num_threads = %d must be in [1, %d]", num_threads,
                     PG_MAX_THREADS);
        return -1;
    }
    double config[PG_NUM_CONFIG];
    if (pg_read_config(config_obj, config) != 0) return -1;
    Env *env = pg_env_new(config, num_envs);
    if (!env) return -1;
    self->env = env;
    PgBatch *pg = &env->pg;
    if (pg_alloc(pg, &pg->rng, (size_t)num_envs, sizeof(uint64_t)) ||
        pg_alloc(pg, &pg->stats, (size_t)num_envs * (1 + 2 * PG_NUM_STATS), sizeof(double))) {
        pg_batch_release(self);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t rows = (Py_ssize_t)num_envs * pg->agents_per_env;
    Py_ssize_t counts[PG_NUM_BUFFERS] = {rows * pg->obs_dim, rows * pg->obs_dim,
                                         pg_action_count(pg), rows, rows, rows, rows};
    char obs_kind = pg->obs_is_uint8 ? 'B' : 'f';
    char kinds[PG_NUM_BUFFERS] = {obs_kind, obs_kind,
                                  pg->action_kind == PG_ACTION_CONTINUOUS ? 'f' : 'i',
                                  'f', 'B', 'B', 'B'};
    for (int i = 0; i < PG_NUM_BUFFERS; i++) {
        if (pg_get_buffer(objs[i], &self->views[i], pg_buffer_names[i], kinds[i], counts[i],
                          1) != 0) {
            pg_batch_release(self);
            return -1;
        }
        self->have_view[i] = 1;
    }
    pg->observations = self->views[PG_BUF_OBS].buf;
    pg->final_observations = self->views[PG_BUF_FINAL_OBS].buf;
    pg->actions = self->views[PG_BUF_ACTIONS].buf;
    pg->rewards = (float *)self->views[PG_BUF_REWARDS].buf;
    pg->terminals = (uint8_t *)self->views[PG_BUF_TERMINALS].buf;
    pg->truncations = (uint8_t *)self->views[PG_BUF_TRUNCATIONS].buf;
    pg->masks = (uint8_t *)self->views[PG_BUF_MASKS].buf;
    memset(pg->masks, 1, (size_t)rows);
    for (int i = 0; i < num_envs; i++) pg->rng[i] = pg_seed_instance(0, (uint64_t)i);

    /* PgPool has cache-line aligned members: calloc's alignment is not enough
     * (sizeof is a multiple of 64 because of them). pg_pool_start zeroes it. */
    self->pool = (PgPool *)aligned_alloc(64, sizeof(PgPool));
    if (!self->pool || pg_pool_start(self->pool, env, num_envs, num_threads) != 0) {
        pg_batch_release(self);
        PyErr_SetString(PyExc_RuntimeError, "could not start the step threads");
        return -1;
    }
    self->initialised = 1;
    return 0;
}

static int pg_check_ready(PgBatchObject *self) {
    if (!self->initialised) {
        PyErr_SetString(PyExc_RuntimeError, "Batch is closed or not initialised");
        return -1;
    }
    return 0;
}

/* Runs op without the GIL on the instances `selection` covers (all when
 * NULL, see pg_run_range); refuses concurrent use. */
static PyObject *pg_batch_run(PgBatchObject *self, int op, const uint8_t *selection,
                              int selected) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&self->busy, &expected, 1)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Batch is already stepping in another thread; use one env per thread");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pg_pool_run(self->pool, op, selection, selected);
    Py_END_ALLOW_THREADS
    atomic_store(&self->busy, 0);
    Py_RETURN_NONE;
}

/* A seed argument as uint64: an int in [0, 2**64), never wrapped silently. */
static int pg_seed_arg(PyObject *arg, uint64_t *seed) {
    unsigned long long value = PyLong_Check(arg) ? PyLong_AsUnsignedLongLong(arg) : 0;
    if (!PyLong_Check(arg) || PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "seed must be an int in [0, 2**64)");
        return -1;
    }
    *seed = (uint64_t)value;
    return 0;
}

static PyObject *pg_batch_seed(PgBatchObject *self, PyObject *arg) {
    uint64_t seed;
    if (pg_check_ready(self) || pg_seed_arg(arg, &seed)) return NULL;
    for (int i = 0; i < self->env->pg.num_envs; i++)
        self->env->pg.rng[i] = pg_seed_instance(seed, (uint64_t)i);
    Py_RETURN_NONE;
}

static int pg_check_instance(PgBatchObject *self, int instance) {
    if (instance < 0 || instance >= self->env->pg.num_envs) {
        PyErr_Format(PyExc_IndexError, "instance %d out of range [0, %d)", instance,
                     self->env->pg.num_envs);
        return -1;
    }
    return 0;
}

/* seed_instance(instance, seed): restarts one instance's stream as instance 0
 * of a batch seeded with `seed` would start it, so a per-instance seed means
 * the same whatever the instance's index. */
static PyObject *pg_batch_seed_instance(PgBatchObject *self, PyObject *args) {
    int instance;
    PyObject *seed_obj;
    uint64_t seed;
    if (!PyArg_ParseTuple(args, "iO", &instance, &seed_obj)) return NULL;
    if (pg_check_ready(self) || pg_check_instance(self, instance) ||
        pg_seed_arg(seed_obj, &seed)) return NULL;
    self->env->pg.rng[instance] = pg_seed_instance(seed, 0);
    Py_RETURN_NONE;
}

/* rng_states(): every instance's position in its random stream (uint64
 * [num_envs], as bytes); set_rng_states(array) puts such positions back. With
 * get_state/set_state they let a new batch go on exactly as this one would
 * (copies and pickles of a NativeEnv). */
static int pg_check_idle(PgBatchObject *self) {
    if (pg_check_ready(self)) return -1;
    if (atomic_load(&self->busy)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Batch is stepping in another thread; use one env per thread");
        return -1;
    }
    return 0;
}

static PyObject *pg_batch_rng_states(PgBatchObject *self, PyObject *Py_UNUSED(ignored)) {
    if (pg_check_idle(self)) return NULL;
    return PyBytes_FromStringAndSize((const char *)self->env->pg.rng,
                                     (Py_ssize_t)self->env->pg.num_envs *
                                         (Py_ssize_t)sizeof(uint64_t));
}

static PyObject *pg_batch_set_rng_states(PgBatchObject *self, PyObject *arg) {
    if (pg_check_idle(self)) return NULL;
    Py_buffer view;
    if (pg_get_buffer(arg, &view, "rng_states", 'Q', self->env->pg.num_envs, 0) != 0)
        return NULL;
    memcpy(self->env->pg.rng, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* Clears rewards and flags (and, for a reset, final observations) of the
 * rows of every instance whose byte in `selection` is nonzero exactly when
 * `selected` is; all rows when selection is NULL. */
static void pg_clear_rows(PgBatch *pg, const uint8_t *selection, int selected,
                          int final_observations) {
    for (int i = 0; i < pg->num_envs; i++)
        if (!selection || (selection[i] != 0) == selected)
            pg_clear_instance(pg, i, final_observations);
}

/* An optional per-instance uint8/bool buffer argument (None: no selection). */
static int pg_get_selection(PgBatchObject *self, PyObject *obj, const char *name,
                            Py_buffer *view, int *have_view) {
    *have_view = 0;
    if (obj == Py_None) return 0;
    if (pg_get_buffer(obj, view, name, 'B', self->env->pg.num_envs, 0) != 0) return -1;
    *have_view = 1;
    return 0;
}

/* reset(mask=None): fresh episodes in every instance, or only in those where
 * mask (uint8/bool [num_envs]) is set; other instances are left as they are. */
static PyObject *pg_batch_reset(PgBatchObject *self, PyObject *args) {
    PyObject *mask_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &mask_obj)) return NULL;
    if (pg_check_ready(self)) return NULL;
    Py_buffer mask;
    int have_mask;
    if (pg_get_selection(self, mask_obj, "mask", &mask, &have_mask) != 0) return NULL;
    const uint8_t *selection = have_mask ? (const uint8_t *)mask.buf : NULL;
    pg_clear_rows(&self->env->pg, selection, 1, 1);
    PyObject *result = pg_batch_run(self, 1, selection, 1);
    if (have_mask) PyBuffer_Release(&mask);
    return result;
}

/* Refuses out-of-range discrete actions before any state changes. The fast
 * path is a branch-free OR over all actions (vectorized); only when it finds a
 * bad value does a second loop locate it for the message. */
static int pg_check_discrete(const PgBatch *pg, const int32_t *actions) {
    long rows = (long)pg->num_envs * pg->agents_per_env;
    int dims = pg->action_kind == PG_ACTION_DISCRETE ? 1 : pg->action_dim;
    int bad = 0;
    if (dims == 1) {
        uint32_t n = (uint32_t)pg->action_nvec[0];
        for (long i = 0; i < rows; i++) bad |= (uint32_t)actions[i] >= n;
    } else {
        for (long r = 0; r < rows; r++)
            for (int d = 0; d < dims; d++)
                bad |= (uint32_t)actions[r * dims + d] >= (uint32_t)pg->action_nvec[d];
    }
    if (!bad) return 0;
    for (long r = 0; r < rows; r++) {
        for (int d = 0; d < dims; d++) {
            int32_t a = actions[r * dims + d], n = pg->action_nvec[d];
            if ((uint32_t)a < (uint32_t)n) continue;
            if (dims == 1)
                PyErr_Format(PyExc_ValueError,
                             "action %d in row %ld is out of range: expected 0..%d", a, r, n - 1);
            else
                PyErr_Format(PyExc_ValueError,
                             "action %d in row %ld, component %d is out of range: expected 0..%d",
                             a, r, d, n - 1);
            return -1;
        }
    }
    return 0;
}

/* step(actions=None, hold=None): steps every instance, or every instance
 * whose byte in hold (uint8/bool [num_envs]) is 0. A held instance is left as
 * it is (state, observations, statistics, random stream); its rows report
 * reward 0 and no terminal or truncation. */
static PyObject *pg_batch_step(PgBatchObject *self, PyObject *args) {
    PyObject *actions_obj = Py_None, *hold_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|OO", &actions_obj, &hold_obj)) return NULL;
    if (pg_check_ready(self)) return NULL;
    PgBatch *pg = &self->env->pg;
    void *own_actions = pg->actions;
    Py_buffer view, hold;
    int have_view = 0, have_hold;
    if (pg_get_selection(self, hold_obj, "hold", &hold, &have_hold) != 0) return NULL;
    if (actions_obj != Py_None && actions_obj != self->views[PG_BUF_ACTIONS].obj) {
        char kind = pg->action_kind == PG_ACTION_CONTINUOUS ? 'f' : 'i';
        if (pg_get_buffer(actions_obj, &view, "actions", kind, pg_action_count(pg), 0) != 0) {
            if (have_hold) PyBuffer_Release(&hold);
            return NULL;
        }
        have_view = 1;
        pg->actions = view.buf;
    }
    const uint8_t *selection = have_hold ? (const uint8_t *)hold.buf : NULL;
    PyObject *result = NULL;
    if (pg->action_kind == PG_ACTION_CONTINUOUS ||
        pg_check_discrete(pg, (const int32_t *)pg->actions) == 0) {
        result = pg_batch_run(self, 0, selection, 0);
        if (result && selection) pg_clear_rows(pg, selection, 1, 0);
    }
    pg->actions = own_actions;
    if (have_view) PyBuffer_Release(&view);
    if (have_hold) PyBuffer_Release(&hold);
    return result;
}

/* repair_actions(errors): the device batches' treatment of bad actions
 * (pg_repair_actions) over every instance, counting into errors (uint64 [2]),
 * for the batch whose buffers are torch tensors on the CPU. */
static PyObject *pg_batch_repair_actions(PgBatchObject *self, PyObject *arg) {
    if (pg_check_ready(self)) return NULL;
    Py_buffer view;
    if (pg_get_buffer(arg, &view, "errors", 'Q', PG_NUM_ACTION_ERRORS, 1) != 0) return NULL;
    for (int i = 0; i < self->env->pg.num_envs; i++)
        pg_repair_actions(&self->env->pg, i, (unsigned long long *)view.buf);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* layout(): what the GPU batch needs to mirror this Env in device memory:
 * {"address", "size"} of the Env struct, "allocations" ((offset, bytes), ...)
 * of every pg_alloc array, and "buffers" {name: offset of its pointer}. */
static PyObject *pg_batch_layout(PgBatchObject *self, PyObject *Py_UNUSED(ignored)) {
    if (pg_check_ready(self)) return NULL;
    const PgBatch *pg = &self->env->pg;
    PyObject *allocations = PyTuple_New(pg->num_allocs);
    for (int a = 0; allocations && a < pg->num_allocs; a++)
        PyTuple_SET_ITEM(allocations, a, Py_BuildValue("(nn)", (Py_ssize_t)pg->allocs[a].offset,
                                                       (Py_ssize_t)pg->allocs[a].bytes));
    return Py_BuildValue(
        "{s:K,s:n,s:N,s:{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}}", "address",
        (unsigned long long)(uintptr_t)self->env, "size", (Py_ssize_t)sizeof(Env),
        "allocations", allocations, "buffers",
        "observations", (Py_ssize_t)offsetof(PgBatch, observations),
        "final_observations", (Py_ssize_t)offsetof(PgBatch, final_observations),
        "actions", (Py_ssize_t)offsetof(PgBatch, actions),
        "rewards", (Py_ssize_t)offsetof(PgBatch, rewards),
        "terminals", (Py_ssize_t)offsetof(PgBatch, terminals),
        "truncations", (Py_ssize_t)offsetof(PgBatch, truncations),
        "masks", (Py_ssize_t)offsetof(PgBatch, masks),
        "rng", (Py_ssize_t)offsetof(PgBatch, rng),
        "stats", (Py_ssize_t)offsetof(PgBatch, stats),
        "states", (Py_ssize_t)offsetof(PgBatch, states),
        "final_states", (Py_ssize_t)offsetof(PgBatch, final_states));
}

/* Returns (episodes, sums, sums_of_squares) reduced in instance order. */
static PyObject *pg_batch_stats(PgBatchObject *self, PyObject *args) {
    int clear = 1;
    if (!PyArg_ParseTuple(args, "|p", &clear)) return NULL;
    if (pg_check_ready(self)) return NULL;
    PgBatch *pg = &self->env->pg;
    int k = PG_NUM_STATS, width = 1 + 2 * PG_NUM_STATS;
    double totals[1 + 2 * PG_NUM_STATS];
    memset(totals, 0, sizeof(totals));
    for (int i = 0; i < pg->num_envs; i++) {
        double *row = pg->stats + (size_t)i * width;
        for (int s = 0; s < width; s++) totals[s] += row[s];
        if (clear) memset(row, 0, (size_t)width * sizeof(double));
    }
    PyObject *sums = PyTuple_New(k), *squares = PyTuple_New(k);
    if (!sums || !squares) {
        Py_XDECREF(sums);
        Py_XDECREF(squares);
        return NULL;
    }
    for (int s = 0; s < k; s++) {
        PyTuple_SET_ITEM(sums, s, PyFloat_FromDouble(totals[1 + s]));
        PyTuple_SET_ITEM(squares, s, PyFloat_FromDouble(totals[1 + k + s]));
    }
    return Py_BuildValue("(LNN)", (long long)totals[0], sums, squares);
}

/* Per-instance rows as bytes (a copy, float64 [num_envs, 1 + 2k]: count,
 * sums, sums of squares), clearing them by default: lets a caller attribute
 * each instance's episodes to it, which the aggregate cannot. */
static PyObject *pg_batch_instance_stats(PgBatchObject *self, PyObject *args) {
    int clear = 1;
    if (!PyArg_ParseTuple(args, "|p", &clear)) return NULL;
    if (pg_check_ready(self)) return NULL;
    PgBatch *pg = &self->env->pg;
    size_t size = (size_t)pg->num_envs * (1 + 2 * PG_NUM_STATS) * sizeof(double);
    PyObject *out = PyBytes_FromStringAndSize((const char *)pg->stats, (Py_ssize_t)size);
    if (out && clear) memset(pg->stats, 0, size);
    return out;
}

static PyObject *pg_batch_get_state(PgBatchObject *self, PyObject *args) {
    int instance;
    if (!PyArg_ParseTuple(args, "i", &instance)) return NULL;
    if (pg_check_ready(self) || pg_check_instance(self, instance)) return NULL;
    int n = env_state_size(self->env);
    double *values = (double *)calloc((size_t)n + 1, sizeof(double));
    if (!values) return PyErr_NoMemory();
    env_get_state(self->env, instance, values);
    PyObject *out = PyTuple_New(n);
    for (int i = 0; out && i < n; i++) PyTuple_SET_ITEM(out, i, PyFloat_FromDouble(values[i]));
    free(values);
    return out;
}

static PyObject *pg_batch_set_state(PgBatchObject *self, PyObject *args) {
    int instance;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "iO", &instance, &seq)) return NULL;
    if (pg_check_ready(self) || pg_check_instance(self, instance)) return NULL;
    int n = env_state_size(self->env);
    PyObject *fast = PySequence_Fast(seq, "state must be a sequence of numbers");
    if (!fast) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "state has %zd values, expected %d",
                     PySequence_Fast_GET_SIZE(fast), n);
        Py_DECREF(fast);
        return NULL;
    }
    double *values = (double *)calloc((size_t)n + 1, sizeof(double));
    if (!values) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < n; i++) {
        values[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (PyErr_Occurred() || !isfinite(values[i])) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "state value %d must be a finite number", i);
            Py_DECREF(fast);
            free(values);
            return NULL;
        }
    }
    Py_DECREF(fast);
    int rc = env_set_state(self->env, instance, values);
    free(values);
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, "state values are inconsistent for this env");
        return NULL;
    }
    pg_write_states(self->env, instance, instance + 1);
    Py_RETURN_NONE;
}

/* attach_states(states, final_states): float32 [num_envs, state_dim] buffers the
 * batch writes the global state into from now on (pg_env.h, ENV_GLOBAL_STATE);
 * the current states are written at once. Attaching again replaces them. */
static PyObject *pg_batch_attach_states(PgBatchObject *self, PyObject *args) {
    PyObject *objs[2];
    if (!PyArg_ParseTuple(args, "OO", &objs[0], &objs[1])) return NULL;
    if (pg_check_ready(self)) return NULL;
    PgBatch *pg = &self->env->pg;
    if (pg->state_dim < 1) {
        PyErr_Format(PyExc_ValueError, "%s has no global state (state_dim 0)", ENV_MODULE_NAME);
        return NULL;
    }
    if (atomic_load(&self->busy)) {
        PyErr_SetString(PyExc_RuntimeError, "cannot attach states while the Batch is stepping");
        return NULL;
    }
    static const char *names[2] = {"states", "final_states"};
    Py_buffer views[2];
    Py_ssize_t count = (Py_ssize_t)pg->num_envs * pg->state_dim;
    for (int b = 0; b < 2; b++) {
        if (pg_get_buffer(objs[b], &views[b], names[b], 'f', count, 1) != 0) {
            if (b) PyBuffer_Release(&views[0]);
            return NULL;
        }
    }
    if ((char *)views[0].buf < (char *)views[1].buf + views[1].len &&
        (char *)views[1].buf < (char *)views[0].buf + views[0].len) {
        PyBuffer_Release(&views[0]);
        PyBuffer_Release(&views[1]);
        PyErr_SetString(PyExc_ValueError, "states and final_states overlap in memory");
        return NULL;
    }
    if (self->have_state_views) {
        PyBuffer_Release(&self->state_views[0]);
        PyBuffer_Release(&self->state_views[1]);
    }
    self->state_views[0] = views[0];
    self->state_views[1] = views[1];
    self->have_state_views = 1;
    pg->states = (float *)views[0].buf;
    pg->final_states = (float *)views[1].buf;
    memset(pg->final_states, 0, (size_t)count * sizeof(float));
    pg_write_states(self->env, 0, pg->num_envs);
    Py_RETURN_NONE;
}

static PyObject *pg_batch_close(PgBatchObject *self, PyObject *Py_UNUSED(ignored)) {
    if (atomic_load(&self->busy)) {
        PyErr_SetString(PyExc_RuntimeError, "cannot close a Batch while it is stepping");
        return NULL;
    }
    pg_batch_release(self);
    Py_RETURN_NONE;
}

static PyObject *pg_batch_get_state_size(PgBatchObject *self, void *Py_UNUSED(closure)) {
    if (pg_check_ready(self)) return NULL;
    return PyLong_FromLong(env_state_size(self->env));
}

static PyObject *pg_batch_get_num_threads(PgBatchObject *self, void *Py_UNUSED(closure)) {
    if (pg_check_ready(self)) return NULL;
    return PyLong_FromLong(self->pool->started + 1);
}

static PyMethodDef pg_batch_methods[] = {
    {"seed", (PyCFunction)pg_batch_seed, METH_O, "Give every instance its own stream."},
    {"seed_instance", (PyCFunction)pg_batch_seed_instance, METH_VARARGS,
     "Restart one instance's stream from its own seed."},
    {"reset", (PyCFunction)pg_batch_reset, METH_VARARGS,
     "Start fresh episodes everywhere, or in the masked instances."},
    {"step", (PyCFunction)pg_batch_step, METH_VARARGS,
     "Step every instance once, except the held ones."},
    {"stats", (PyCFunction)pg_batch_stats, METH_VARARGS,
     "(episodes, sums, sums_of_squares) of finished episodes; clears by default."},
    {"instance_stats", (PyCFunction)pg_batch_instance_stats, METH_VARARGS,
     "Per-instance statistic rows as float64 bytes; clears by default."},
    {"get_state", (PyCFunction)pg_batch_get_state, METH_VARARGS, "State of one instance."},
    {"set_state", (PyCFunction)pg_batch_set_state, METH_VARARGS, "Overwrite one instance."},
    {"rng_states", (PyCFunction)pg_batch_rng_states, METH_NOARGS,
     "Every instance's random stream position (uint64 [num_envs] as bytes)."},
    {"set_rng_states", (PyCFunction)pg_batch_set_rng_states, METH_O,
     "Restore the positions rng_states returned (a uint64 [num_envs] array)."},
    {"close", (PyCFunction)pg_batch_close, METH_NOARGS, "Stop threads, release buffers."},
    {"attach_states", (PyCFunction)pg_batch_attach_states, METH_VARARGS,
     "Write the global state into (states, final_states) from now on."},
    {"repair_actions", (PyCFunction)pg_batch_repair_actions, METH_O,
     "Repair and count bad actions as the device batches do (errors: uint64 [2])."},
    {"layout", (PyCFunction)pg_batch_layout, METH_NOARGS,
     "The Env's address, size, pg_alloc arrays and buffer pointer offsets."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef pg_batch_getset[] = {
    {"state_size", (getter)pg_batch_get_state_size, NULL, "doubles per instance state", NULL},
    {"num_threads", (getter)pg_batch_get_num_threads, NULL, "threads stepping", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PgBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "peregrine.envs." ENV_MODULE_NAME ".Batch",
    .tp_basicsize = sizeof(PgBatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of native env instances writing into caller-owned buffers.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pg_batch_init,
    .tp_dealloc = (destructor)pg_batch_dealloc,
    .tp_methods = pg_batch_methods,
    .tp_getset = pg_batch_getset,
};

/* ---- module functions ----------------------------------------------------- */

static PyObject *pg_config_fields_fn(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
    PyObject *out = PyTuple_New(PG_NUM_CONFIG);
    for (int i = 0; out && i < PG_NUM_CONFIG; i++) {
        const PgConfigField *f = &pg_config_fields[i];
        PyTuple_SET_ITEM(out, i, Py_BuildValue("(sdddO)", f->name, f->default_value,
                                               f->min_value, f->max_value,
                                               f->is_integer ? Py_True : Py_False));
    }
    return out;
}

static PyObject *pg_stat_names_fn(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
    PyObject *out = PyTuple_New(PG_NUM_STATS);
    for (int i = 0; out && i < PG_NUM_STATS; i++)
        PyTuple_SET_ITEM(out, i, PyUnicode_FromString(pg_stat_names[i]));
    return out;
}

/* An env's named layout constants, for Python to read instead of restating them:
 * ENV_CONSTANTS(X) with X(name, value) (optional; an empty dict without it). */
static PyObject *pg_constants_fn(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
    PyObject *out = PyDict_New();
#ifdef ENV_CONSTANTS
#define PG_CONSTANT_ITEM(name, value)                                                  \
    if (out) {                                                                          \
        PyObject *item = PyLong_FromLong((long)(value));                                \
        if (!item || PyDict_SetItemString(out, #name, item) != 0) Py_CLEAR(out);        \
        Py_XDECREF(item);                                                               \
    }
    ENV_CONSTANTS(PG_CONSTANT_ITEM)
#undef PG_CONSTANT_ITEM
#endif
    return out;
}

static PyObject *pg_describe_fn(PyObject *Py_UNUSED(m), PyObject *config_obj) {
    double config[PG_NUM_CONFIG];
    if (pg_read_config(config_obj, config) != 0) return NULL;
    Env *env = pg_env_new(config, 1);
    if (!env) return NULL;
    PgBatch *pg = &env->pg;
    PyObject *nvec = PyTuple_New(pg->action_kind == PG_ACTION_CONTINUOUS ? 0 : pg->action_dim);
    for (int i = 0; nvec && i < PyTuple_GET_SIZE(nvec); i++)
        PyTuple_SET_ITEM(nvec, i, PyLong_FromLong(pg->action_nvec[i]));
    static const char *kinds[] = {"discrete", "multidiscrete", "continuous"};
    PyObject *out = Py_BuildValue(
        "{s:i,s:s,s:i,s:s,s:i,s:N,s:i,s:i}", "obs_dim", pg->obs_dim, "obs_dtype",
        pg->obs_is_uint8 ? "uint8" : "float32", "agents_per_env", pg->agents_per_env,
        "action_kind", kinds[pg->action_kind], "action_dim", pg->action_dim, "action_nvec",
        nvec, "state_size", env_state_size(env), "global_state_dim", pg->state_dim);
    pg_env_delete(env);
    return out;
}

static PyMethodDef pg_module_methods[] = {
    {"config_fields", pg_config_fields_fn, METH_NOARGS,
     "((name, default, min, max, is_integer), ...) in config order."},
    {"stat_names", pg_stat_names_fn, METH_NOARGS, "Episode statistic names."},
    {"constants", pg_constants_fn, METH_NOARGS,
     "The env's named layout constants (ENV_CONSTANTS), {name: int}."},
    {"describe", pg_describe_fn, METH_O, "Dimensions for a config (validates it)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef pg_module_def = {PyModuleDef_HEAD_INIT, ENV_MODULE_NAME,
                                           "Native Peregrine env (generic binding).", -1,
                                           pg_module_methods, NULL, NULL, NULL, NULL};

#define PG_CONCAT_(a, b) a##b
#define PG_CONCAT(a, b) PG_CONCAT_(a, b)

PyMODINIT_FUNC PG_CONCAT(PyInit_, ENV_MODULE_IDENT)(void) {
    if (PyType_Ready(&PgBatchType) < 0) return NULL;
    PyObject *module = PyModule_Create(&pg_module_def);
    if (!module) return NULL;
    if (PyModule_AddIntConstant(module, "MAX_NUM_ENVS", PG_MAX_NUM_ENVS) < 0 ||
        PyModule_AddIntConstant(module, "MAX_THREADS", PG_MAX_THREADS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&PgBatchType);
    if (PyModule_AddObject(module, "Batch", (PyObject *)&PgBatchType) < 0) {
        Py_DECREF(&PgBatchType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

#endif /* PEREGRINE_BINDING_H */
