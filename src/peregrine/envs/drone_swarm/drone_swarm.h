/*
 * drone_swarm.h -- DroneSwarm, search and rescue under a communication
 * constraint, as a batch of N instances with one agent row per drone.
 *
 * Rules: docs/drone_swarm_spec.md, implemented phase by phase with its
 * numbering ("One step, in order", phases 1-8: see env_step). Every choice the
 * spec leaves open (who is "live", draw order, delivery window, tie breaks,
 * reward order, the flat state layout) is written down in the package
 * docstring (peregrine/envs/drone_swarm/__init__.py); reference.py is the NumPy
 * twin and reproduces this file bit for bit: float32 throughout, the same
 * operation order, squared distances for range tests, sqrtf only where a
 * distance value is needed, no trig (spawning is rejection sampling), and the
 * same splitmix64 draws in the same order:
 *   reset: [randomisation: r_comm, p_comm_drop, t_confirm pick, m_deliver
 *          pick], [obstacles: per obstacle (w, h, x0, y0) tries until
 *          accepted], then per drone (x, y) pairs until accepted, then per
 *          victim;
 *   step:  link drops (only when p_comm_drop > 0): base links of drones
 *          0..n-1, then pairs (i < j) lexicographic, each in-range live link;
 *          detections: (scanning drone, undelivered victim within r_sense)
 *          in (drone, victim) order.
 *
 * Layout: per-instance arrays are flat across instances (drone fields
 * [num_envs * n], victim fields [num_envs * m], visited-cell bitsets of
 * 64-bit words), allocated once in env_init. A step runs in blocks of about
 * 1024 drones of consecutive instances (see env_step): phases 1-2 (movement,
 * battery) for the whole block in one vectorized kernel, then instance by
 * instance the sequential phases 3-6 (connectivity as a BFS over uint64
 * adjacency bitmasks since n_drones <= 64, confirmation, delivery,
 * detections) with what of 7 and 8 is per instance, then phase 7's rewards and
 * observations for the whole block, then phase 8's episode ends. On the CPU
 * scratch lives on the stepping thread's stack (about 100 KB at most: the
 * block scratch, 64 x 128 drone-victim distances, de-interleaved actions); on
 * the GPU in env->work (see "scratch" below). Nothing is allocated per step.
 *
 * Speed notes (each measured, see benchmarks/RESULTS.md): the kernels are
 * written so GCC's vectorizer takes them -- no select of a divisor and no
 * arithmetic used only under a condition (GCC sinks it into a branch),
 * no-trapping-math on the kernels (value-preserving), float rather than
 * uint8 flags (a uint8 lane made the loops 32 wide, so 8-drone instances ran
 * the scalar epilogue), an integer min on float bit patterns, and loops shaped
 * elementwise rather than as horizontal reductions.
 *
 * Compile with -DDS_PROFILE to count cycles per phase (rdtsc, single-thread
 * benchmarks only; timed by the step drivers around the phase calls, see
 * "profiling"); the totals are appended to the file named by the environment
 * variable PEREGRINE_DS_PROFILE when the batch is freed.
 */
#ifndef PEREGRINE_DRONE_SWARM_H
#define PEREGRINE_DRONE_SWARM_H


#include "pg_env.h"

#define DS_MAX_DRONES 64
#define DS_MAX_VICTIMS 128
#define DS_MAX_NEAREST 16
#define DS_MAX_OBSTACLES 16
#define DS_OBSTACLE_TRIES 64
#define DS_OBSTACLE_FIELDS 5 /* per obstacle slot in the state: present, x0, y0, x1, y1 */
#define DS_BLOCK_DRONES 1024 /* drones per block of a CPU step (see env_step) */
#define DS_MAX_CELLS_PER_SIDE 128
#define DS_DRONE_SPAWN_TRIES 64
#define DS_VICTIM_SPAWN_TRIES 256
#define DS_HEADER 7
#define DS_DRONE_FIELDS 7
#define DS_VICTIM_FIELDS 8
/* The global state for a centralised critic (env_global_state, layout in the
 * package docstring): a header, then per drone, per victim, per obstacle slot. */
#define ENV_GLOBAL_STATE 1
#define DS_STATE_HEADER 4
#define DS_STATE_DRONE 7
#define DS_STATE_VICTIM 6
#define DS_STATE_OBSTACLE 5
/* The layout constants Python reads from the built module (constants()), so that
 * __init__.py and the reference do not restate them. */
#define ENV_CONSTANTS(X)                                                              \
    X(max_cells_per_side, DS_MAX_CELLS_PER_SIDE) X(header_size, DS_HEADER)            \
    X(drone_fields, DS_DRONE_FIELDS) X(victim_fields, DS_VICTIM_FIELDS)               \
    X(obstacle_fields, DS_OBSTACLE_FIELDS) X(state_header, DS_STATE_HEADER)           \
    X(state_drone, DS_STATE_DRONE) X(state_victim, DS_STATE_VICTIM)                   \
    X(state_obstacle, DS_STATE_OBSTACLE)

/* X(name, default, min, max, is_integer); the only copy: __init__.py reads
 * these rows from the built module (config_fields()). -1 in base_x/base_y means
 * the centre, in spawn_radius the episode's r_comm, in a *_choice_k slot "unused". */
#define ENV_CONFIG(X)                          \
    X(world_size, 100.0, 1.0, 1000.0, 0)       \
    X(n_drones, 8, 1, 64, 1)                   \
    X(n_victims, 10, 1, 128, 1)                \
    X(base_x, -1.0, -1.0, 1000.0, 0)           \
    X(base_y, -1.0, -1.0, 1000.0, 0)           \
    X(r_comm, 15.0, 0.001, 1e4, 0)             \
    X(r_sense, 15.0, 0.001, 1e4, 0)            \
    X(r_confirm_radius, 3.0, 0.0, 1e4, 0)      \
    X(t_confirm, 4, 1, 1e6, 1)                 \
    X(m_deliver, 15, 0, 1e6, 1)                \
    X(v_max, 2.5, 0.0, 1e3, 0)                 \
    X(dt, 1.0, 0.0, 100.0, 0)                  \
    X(c_idle, 0.0003, 0.0, 1.0, 0)             \
    X(c_move, 0.0006, 0.0, 1.0, 0)             \
    X(c_scan, 0.0002, 0.0, 1.0, 0)             \
    X(max_steps, 800, 1, 1e7, 1)               \
    X(spawn_radius, -1.0, -1.0, 1e4, 0)        \
    X(victim_min_dist, 25.0, 0.0, 1e4, 0)      \
    X(victim_max_dist, 90.0, 0.0, 1e4, 0)      \
    X(obs_n_nearest, 3, 0, 16, 1)              \
    X(detect_prob_scale, 1.0, 0.0, 1e6, 0)     \
    X(cell_size, 10.0, 0.01, 1000.0, 0)        \
    X(r_time, -0.005, -1e3, 1e3, 0)            \
    X(c_energy, 0.0, -1e3, 1e3, 0)             \
    X(r_found, 30.0, -1e3, 1e3, 0)             \
    X(r_found_divide_by_n, 1, 0, 1, 1)         \
    X(r_confirm, 10.0, -1e3, 1e3, 0)           \
    X(r_explore, 0.1, -1e3, 1e3, 0)            \
    X(r_scan_near, 0.3, -1e3, 1e3, 0)          \
    X(r_dispersion, 0.05, -1e3, 1e3, 0)        \
    X(min_drone_separation, 8.0, 0.0, 1e4, 0)  \
    X(r_connect, 0.01, -1e3, 1e3, 0)           \
    X(r_deliver_owner, 0.0, -1e3, 1e3, 0)      \
    X(r_report_lost, 0.0, -1e3, 1e3, 0)        \
    X(p_comm_drop, 0.0, 0.0, 1.0, 0)           \
    X(randomise, 0, 0, 1, 1)                   \
    X(r_comm_min, 10.0, 0.001, 1e4, 0)         \
    X(r_comm_max, 20.0, 0.001, 1e4, 0)         \
    X(p_comm_drop_min, 0.0, 0.0, 1.0, 0)       \
    X(p_comm_drop_max, 0.1, 0.0, 1.0, 0)       \
    X(t_confirm_choice_0, 3, -1, 1e6, 1)       \
    X(t_confirm_choice_1, 4, -1, 1e6, 1)       \
    X(t_confirm_choice_2, 6, -1, 1e6, 1)       \
    X(t_confirm_choice_3, -1, -1, 1e6, 1)      \
    X(m_deliver_choice_0, 10, -1, 1e6, 1)      \
    X(m_deliver_choice_1, 15, -1, 1e6, 1)      \
    X(m_deliver_choice_2, 25, -1, 1e6, 1)      \
    X(m_deliver_choice_3, -1, -1, 1e6, 1)      \
    X(n_obstacles, 0, 0, 16, 1)                \
    X(obstacle_min_size, 6.0, 0.1, 1e4, 0)     \
    X(obstacle_max_size, 18.0, 0.1, 1e4, 0)    \
    X(obstacle_margin, 5.0, 0.0, 1e4, 0)       \
    X(obstacle_base_clearance, 20.0, 0.0, 1e4, 0) \
    X(obstacle_separation, 5.0, 0.0, 1e4, 0)   \
    X(obs_n_obstacles, 0, 0, 16, 1)            \
    X(obs_report, 0, 0, 1, 1)                  \
    X(obs_network, 0, 0, 1, 1)                 \
    X(obs_drone_id, 0, 0, 1, 1)                \
    X(obs_n_neighbours, 0, 0, 16, 1)

#define ENV_STATS(X)                                                                  \
    X(episode_return) X(episode_length) X(delivered) X(confirmed) X(success)         \
    X(time_to_first_delivery) X(connected_fraction) X(explored_fraction)

enum { ENV_CONFIG(PG_CONFIG_INDEX) }; /* CFG_world_size, CFG_n_drones, ... */

enum { DS_UNKNOWN = 0, DS_CONFIRMED = 1, DS_DELIVERED = 2 };

/* ---- profiling ---------------------------------------------------------------
 * Compiled with -DDS_PROFILE (benchmarks/bench_drone_swarm.py builds it so): TSC
 * cycles per bucket of a step, summed, and the split of the fastest env_step call.
 * Only the step drivers (env_step, ds_core_instance) time anything, around the
 * phase calls: DS_TICK charges the cycles since the last tick to a bucket. The
 * buckets, by spec phase (docs/drone_swarm_spec.md, "One step, in order"): */
#ifdef DS_PROFILE
#include <x86intrin.h>
enum {
    DS_PH_MOVE,       /* 1-2: movement, battery, the scan and live masks */
    DS_PH_CONNECT,    /* 3 */
    DS_PH_CONFIRM,    /* 4-5, with the drone -> victim distances that 4 and 6 read */
    DS_PH_DETECT,     /* 6 */
    DS_PH_REWARD_OBS, /* 7: rewards, observations (exploration, extra columns too) */
    DS_PH_END,        /* 8: end test, final observations, statistics, resets */
    DS_PH_COUNT
};
#define DS_TICK_START() uint64_t tick_ = __rdtsc()
#define DS_TICK(phase)                          \
    do {                                        \
        uint64_t now_ = __rdtsc();              \
        env->profile[phase] += now_ - tick_;    \
        tick_ = now_;                           \
    } while (0)
#define DS_TICK_RESTART() (tick_ = __rdtsc()) /* the time since was charged elsewhere */
#define DS_PROFILE_CALL_START()             \
    uint64_t profile_before_[DS_PH_COUNT];  \
    memcpy(profile_before_, env->profile, sizeof profile_before_)
#define DS_PROFILE_CALL_END(instances) ds_profile_call(env, profile_before_, instances)
#else
#define DS_TICK_START() ((void)0)
#define DS_TICK(phase) ((void)0)
#define DS_TICK_RESTART() ((void)0)
#define DS_PROFILE_CALL_START() ((void)0)
#define DS_PROFILE_CALL_END(instances) ((void)0)
#endif

/* ---- scratch ------------------------------------------------------------------
 * A step and a reset need per-drone scratch arrays indexed at run time. On the
 * CPU they live on the stepping thread's stack (a block of DS_BLOCK_DRONES rows,
 * see env_step). On the GPU one thread steps one instance, and such arrays
 * would become a local-memory stack that CUDA reserves for every resident
 * thread, sized for the largest swarm (it was about 39 KB a thread, 10 GiB of
 * an H200). There they are rows of env->work instead (DsRow): global memory
 * allocated in env_init, sized by this batch's n_drones, obs_n_nearest and
 * obs_n_obstacles, and interleaved by instance as local memory would be. The
 * drone -> victim distances, an n x m matrix on the CPU, are recomputed where
 * they are read on the GPU (ds_sight_d2), so nothing there scales with the
 * number of victims. The pair pass has a GPU order of its own (ds_pairs).
 *
 * Rows: X(element type, name, elements per instance on the GPU). DS_BLOCK_ROWS
 * are DsScratch's members (arrays of DS_BLOCK_DRONES on the CPU, DsRows on the
 * GPU); DS_CALL_ROWS are the arrays of single functions, declared with
 * DS_SCRATCH. The lengths read n, k (obs_n_nearest), kq (obs_n_obstacles) and heard (n
 * where obs_n_neighbours > 0, else 0). */
#define DS_BLOCK_ROWS(X)                                                                \
    X(float, speed2, n) X(float, explore, n) X(float, confirmations, n)                 \
    X(float, scan_near, n) X(float, alive, n) X(float, share, n) X(float, r_comm, n)    \
    X(float, nearest2, n) X(int32_t, cell, n) X(int32_t, active, n) X(int32_t, scan, n) \
    X(int32_t, neighbours, n) X(float, old_x, n) X(float, old_y, n)                     \
    X(uint8_t, terminal, 1) X(uint8_t, truncated, 1)
#define DS_CALL_ROWS(X)                                                                 \
    X(uint64_t, adjacency, n) X(int32_t, victim_counts, 3 * n) X(int32_t, scanners, n)  \
    X(int32_t, confirmation_count, n) X(int32_t, own_delivered, n)                      \
    X(int32_t, own_lost, n) X(float, slot_d2, k) X(float, obstacle_d2, kq)              \
    X(int32_t, obstacle_index, kq) X(float, feature_r_comm, n)                          \
    X(int32_t, observe_count, n) X(float, observe_nearest2, n)                          \
    X(uint64_t, observe_adjacency, n) X(float, neighbour_report, heard)

enum {
#define DS_ROW_INDEX(type, name, length) DS_W_##name,
    DS_BLOCK_ROWS(DS_ROW_INDEX) DS_CALL_ROWS(DS_ROW_INDEX)
#undef DS_ROW_INDEX
    DS_WORK_ROWS
};

struct Env {
    PgBatch pg;
    /* configuration, in float32 as the step uses it */
    int n, m, k, obs_dim, max_steps, randomise, divide_found;
    int n_obstacles, k_obstacles; /* obstacles drawn per episode; obstacle slots per drone */
    int report, network, drone_id; /* obs_report, obs_network, obs_drone_id: trailing columns */
    int k_neighbours;              /* obs_n_neighbours: neighbour slots, after them */
    float obstacle_min_size, obstacle_max_size, obstacle_margin, obstacle_clearance;
    float obstacle_separation;
    int t_confirm, m_deliver;
    int t_choices[4], m_choices[4], num_t_choices, num_m_choices;
    int cells_per_side, cells, words64, words32;
    float world_size, base_x, base_y, r_comm, r_sense, r_confirm_radius, v_max, dt;
    float c_idle, c_move, c_scan, spawn_radius, victim_min_dist, victim_max_dist;
    float detect_prob_scale, cell_size, r_time, c_energy, r_found, r_confirm, r_explore;
    float r_scan_near, r_dispersion, min_drone_separation, r_connect, p_comm_drop;
    float r_deliver_owner, r_report_lost;
    float r_comm_min, r_comm_max, p_comm_drop_min, p_comm_drop_max;
    /* per instance */
    int32_t *step, *ep_t_confirm, *ep_m_deliver, *first_delivery;
    uint8_t *victims_pending; /* some victim has a confirmation going or a waiting report */
    int64_t *connected_steps;
    float *ep_r_comm, *ep_p_drop;
    int32_t *obstacle_count;   /* obstacles placed this episode (<= n_obstacles) */
    float *obstacles;          /* [num_envs * n_obstacles * 4]: x0, y0, x1, y1, placed first */
    /* per drone [num_envs * n] */
    float *x, *y, *battery, *returns;
    int32_t *age;
    float *connected; /* 1.0f / 0.0f: the kernels read it as a float lane */
    uint8_t *scanning;
    /* per victim [num_envs * m] */
    float *vx, *vy;
    int32_t *status, *confirm_drone, *progress, *owner, *window;
    uint8_t *ever_confirmed;
    /* exploration bitsets: [num_envs * words64], [num_envs * n * words64] */
    uint64_t *visited, *own_visited;
    /* GPU scratch (see "scratch" above): row r starts at byte work_at[r];
     * allocated on the host too (the GPU batch mirrors every array), never
     * written there */
    uint64_t *work;
    size_t work_at[DS_WORK_ROWS];
#ifdef DS_PROFILE
    uint64_t profile[DS_PH_COUNT];
    uint64_t profile_steps;
    double profile_fastest[DS_PH_COUNT], profile_fastest_total;
#endif
};
typedef struct Env Env;

/* ---- configuration ---------------------------------------------------------- */

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
static int ds_fail(char *err, size_t errlen, const char *message) {
    snprintf(err, errlen, "%s", message);
    return -1;
}

/* The four slots of each episode-choice list, by name. */
static const int ds_t_confirm_choices[4] = {CFG_t_confirm_choice_0, CFG_t_confirm_choice_1,
                                            CFG_t_confirm_choice_2, CFG_t_confirm_choice_3};
static const int ds_m_deliver_choices[4] = {CFG_m_deliver_choice_0, CFG_m_deliver_choice_1,
                                            CFG_m_deliver_choice_2, CFG_m_deliver_choice_3};

/* Cross-field rules (the Python class checks the same with the same words). */
static int ds_check_config(const double *c, char *err, size_t errlen) {
    double size = c[CFG_world_size];
    double base[2] = {c[CFG_base_x], c[CFG_base_y]};
    const char *base_names[2] = {"base_x", "base_y"};
    for (int a = 0; a < 2; a++) {
        if (base[a] == -1.0) base[a] = size / 2.0;
        else if (!(base[a] >= 0.0 && base[a] <= size)) {
            snprintf(err, errlen,
                     "config field '%s' = %g must be -1 (centre) or in [0, world_size = %g]",
                     base_names[a], base[a], size);
            return -1;
        }
    }
    if (!(c[CFG_spawn_radius] == -1.0 || c[CFG_spawn_radius] >= 0.0))
        return ds_fail(err, errlen, "config field 'spawn_radius' must be -1 (= r_comm) or >= 0");
    if (c[CFG_victim_min_dist] > c[CFG_victim_max_dist]) {
        snprintf(err, errlen, "config field 'victim_min_dist' = %g must be <= victim_max_dist = %g",
                 c[CFG_victim_min_dist], c[CFG_victim_max_dist]);
        return -1;
    }
    double far_x = base[0] > size - base[0] ? base[0] : size - base[0];
    double far_y = base[1] > size - base[1] ? base[1] : size - base[1];
    double farthest = sqrt(far_x * far_x + far_y * far_y);
    if (c[CFG_victim_min_dist] > farthest) {
        snprintf(err, errlen,
                 "config field 'victim_min_dist' = %g puts the victim annulus outside the world: "
                 "the farthest point of the world is %g from the base",
                 c[CFG_victim_min_dist], farthest);
        return -1;
    }
    double side = ceil(size / c[CFG_cell_size]);
    if (side > DS_MAX_CELLS_PER_SIDE) {
        snprintf(err, errlen,
                 "config field 'cell_size' = %g gives %g cells per side for world_size %g; "
                 "at most %d allowed",
                 c[CFG_cell_size], side, size, DS_MAX_CELLS_PER_SIDE);
        return -1;
    }
    if (c[CFG_r_comm_min] > c[CFG_r_comm_max])
        return ds_fail(err, errlen, "config field 'r_comm_min' must be <= r_comm_max");
    if (c[CFG_p_comm_drop_min] > c[CFG_p_comm_drop_max])
        return ds_fail(err, errlen, "config field 'p_comm_drop_min' must be <= p_comm_drop_max");
    if (c[CFG_n_obstacles] > 0) {
        if (c[CFG_obstacle_min_size] > c[CFG_obstacle_max_size]) {
            snprintf(err, errlen,
                     "config field 'obstacle_min_size' = %g must be <= obstacle_max_size = %g",
                     c[CFG_obstacle_min_size], c[CFG_obstacle_max_size]);
            return -1;
        }
        if (c[CFG_obstacle_max_size] + 2.0 * c[CFG_obstacle_margin] > size) {
            snprintf(err, errlen,
                     "config field 'obstacle_max_size' = %g plus twice obstacle_margin = %g "
                     "must fit in world_size = %g",
                     c[CFG_obstacle_max_size], c[CFG_obstacle_margin], size);
            return -1;
        }
    }
    const char *t_names[4] = {"t_confirm_choice_0", "t_confirm_choice_1", "t_confirm_choice_2",
                              "t_confirm_choice_3"};
    for (int i = 0; i < 4; i++) {
        if (c[ds_t_confirm_choices[i]] == 0.0) {
            snprintf(err, errlen, "config field '%s' = 0 must be -1 (unused) or >= 1", t_names[i]);
            return -1;
        }
    }
    return 0;
}

#define DS_ALLOC(field, count)                                          \
    do {                                                                \
        if (PG_ALLOC(env, field, count)) {                              \
            snprintf(err, errlen, "out of memory for %d DroneSwarm instances", pg->num_envs); \
            return -1;                                                  \
        }                                                               \
    } while (0)

static int env_init(Env *env, const double *c, char *err, size_t errlen) {
    if (ds_check_config(c, err, errlen) != 0) return -1;
    env->n = (int)c[CFG_n_drones];
    env->m = (int)c[CFG_n_victims];
    env->k = (int)c[CFG_obs_n_nearest];
    env->n_obstacles = (int)c[CFG_n_obstacles];
    env->k_obstacles = (int)c[CFG_obs_n_obstacles];
    env->report = (int)c[CFG_obs_report];
    env->network = (int)c[CFG_obs_network];
    env->drone_id = (int)c[CFG_obs_drone_id];
    env->k_neighbours = (int)c[CFG_obs_n_neighbours];
    env->obs_dim = 10 + 3 * env->k + 4 * env->k_obstacles + env->report + 3 * env->network +
                   env->drone_id + 4 * env->k_neighbours;
    env->obstacle_min_size = (float)c[CFG_obstacle_min_size];
    env->obstacle_max_size = (float)c[CFG_obstacle_max_size];
    env->obstacle_margin = (float)c[CFG_obstacle_margin];
    env->obstacle_clearance = (float)c[CFG_obstacle_base_clearance];
    env->obstacle_separation = (float)c[CFG_obstacle_separation];
    env->max_steps = (int)c[CFG_max_steps];
    env->randomise = (int)c[CFG_randomise];
    env->divide_found = (int)c[CFG_r_found_divide_by_n];
    env->t_confirm = (int)c[CFG_t_confirm];
    env->m_deliver = (int)c[CFG_m_deliver];
    env->num_t_choices = env->num_m_choices = 0;
    for (int i = 0; i < 4; i++) {
        int t = (int)c[ds_t_confirm_choices[i]], md = (int)c[ds_m_deliver_choices[i]];
        if (t != -1) env->t_choices[env->num_t_choices++] = t;
        if (md != -1) env->m_choices[env->num_m_choices++] = md;
    }
    double size = c[CFG_world_size];
    env->world_size = (float)size;
    env->base_x = (float)(c[CFG_base_x] == -1.0 ? size / 2.0 : c[CFG_base_x]);
    env->base_y = (float)(c[CFG_base_y] == -1.0 ? size / 2.0 : c[CFG_base_y]);
    env->r_comm = (float)c[CFG_r_comm];
    env->r_sense = (float)c[CFG_r_sense];
    env->r_confirm_radius = (float)c[CFG_r_confirm_radius];
    env->v_max = (float)c[CFG_v_max];
    env->dt = (float)c[CFG_dt];
    env->c_idle = (float)c[CFG_c_idle];
    env->c_move = (float)c[CFG_c_move];
    env->c_scan = (float)c[CFG_c_scan];
    env->spawn_radius = (float)c[CFG_spawn_radius];
    env->victim_min_dist = (float)c[CFG_victim_min_dist];
    env->victim_max_dist = (float)c[CFG_victim_max_dist];
    env->detect_prob_scale = (float)c[CFG_detect_prob_scale];
    env->cell_size = (float)c[CFG_cell_size];
    env->r_time = (float)c[CFG_r_time];
    env->c_energy = (float)c[CFG_c_energy];
    env->r_found = (float)c[CFG_r_found];
    env->r_confirm = (float)c[CFG_r_confirm];
    env->r_explore = (float)c[CFG_r_explore];
    env->r_scan_near = (float)c[CFG_r_scan_near];
    env->r_dispersion = (float)c[CFG_r_dispersion];
    env->min_drone_separation = (float)c[CFG_min_drone_separation];
    env->r_connect = (float)c[CFG_r_connect];
    env->r_deliver_owner = (float)c[CFG_r_deliver_owner];
    env->r_report_lost = (float)c[CFG_r_report_lost];
    env->p_comm_drop = (float)c[CFG_p_comm_drop];
    env->r_comm_min = (float)c[CFG_r_comm_min];
    env->r_comm_max = (float)c[CFG_r_comm_max];
    env->p_comm_drop_min = (float)c[CFG_p_comm_drop_min];
    env->p_comm_drop_max = (float)c[CFG_p_comm_drop_max];
    int side = (int)ceil(size / c[CFG_cell_size]);
    env->cells_per_side = side < 1 ? 1 : side;
    env->cells = env->cells_per_side * env->cells_per_side;
    env->words64 = (env->cells + 63) / 64;
    env->words32 = (env->cells + 31) / 32;

    PgBatch *pg = &env->pg;
    pg->obs_dim = env->obs_dim;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = env->n;
    pg->action_kind = PG_ACTION_CONTINUOUS;
    pg->action_dim = 3;
    pg->state_dim = DS_STATE_HEADER + DS_STATE_DRONE * env->n + DS_STATE_VICTIM * env->m +
                    DS_STATE_OBSTACLE * env->n_obstacles;

    size_t envs = (size_t)pg->num_envs, drones = envs * (size_t)env->n;
    size_t victims = envs * (size_t)env->m;
    DS_ALLOC(step, envs);
    DS_ALLOC(ep_t_confirm, envs);
    DS_ALLOC(ep_m_deliver, envs);
    DS_ALLOC(first_delivery, envs);
    DS_ALLOC(victims_pending, envs);
    DS_ALLOC(connected_steps, envs);
    DS_ALLOC(ep_r_comm, envs);
    DS_ALLOC(ep_p_drop, envs);
    DS_ALLOC(obstacle_count, envs);
    DS_ALLOC(obstacles, envs * (size_t)(4 * (env->n_obstacles > 0 ? env->n_obstacles : 1)));
    DS_ALLOC(x, drones);
    DS_ALLOC(y, drones);
    DS_ALLOC(battery, drones);
    DS_ALLOC(returns, drones);
    DS_ALLOC(age, drones);
    DS_ALLOC(connected, drones);
    DS_ALLOC(scanning, drones);
    DS_ALLOC(vx, victims);
    DS_ALLOC(vy, victims);
    DS_ALLOC(status, victims);
    DS_ALLOC(confirm_drone, victims);
    DS_ALLOC(progress, victims);
    DS_ALLOC(owner, victims);
    DS_ALLOC(window, victims);
    DS_ALLOC(ever_confirmed, victims);
    DS_ALLOC(visited, envs * (size_t)env->words64);
    DS_ALLOC(own_visited, drones * (size_t)env->words64);
    /* The GPU's scratch rows (DsRow), each `length` elements of every instance,
     * from an 8-byte boundary. The CPU build never reads or writes them. */
    const int n = env->n, k = env->k, kq = env->k_obstacles;
    const int heard = env->k_neighbours > 0 ? n : 0; /* drones, where neighbour slots are on */
    size_t bytes = 0;
#define DS_ROW_AT(type, name, length)                                 \
    env->work_at[DS_W_##name] = bytes;                                \
    bytes += ((size_t)(length) * envs * sizeof(type) + 7) / 8 * 8;
    DS_BLOCK_ROWS(DS_ROW_AT) DS_CALL_ROWS(DS_ROW_AT)
#undef DS_ROW_AT
    DS_ALLOC(work, bytes / 8);
    return 0;
}

#ifdef DS_PROFILE
/* After an env_step call over `instances` instances: the cycles each bucket gained
 * (since `before`) per instance, kept when the call is the fastest so far. */
static void ds_profile_call(Env *env, const uint64_t *before, int instances) {
    env->profile_steps += (uint64_t)instances;
    double split[DS_PH_COUNT], total = 0.0;
    for (int p = 0; p < DS_PH_COUNT; p++) {
        split[p] = (double)(env->profile[p] - before[p]) / (double)instances;
        total += split[p];
    }
    if (env->profile_fastest_total == 0.0 || total < env->profile_fastest_total) {
        memcpy(env->profile_fastest, split, sizeof split);
        env->profile_fastest_total = total;
    }
}
#endif

static void env_free(Env *env) {
    (void)env;
#ifdef DS_PROFILE
    /* One JSON line: TSC cycles per phase summed over every step call, and the
     * split of the fastest call per instance (other jobs on the machine add
     * their time to the sums, rarely to the fastest call). */
    static const char *names[DS_PH_COUNT] = {"movement", "connectivity",
                                             "confirmation_delivery", "detections",
                                             "rewards_observations", "end_reset"};
    const char *path = getenv("PEREGRINE_DS_PROFILE");
    FILE *out = path ? fopen(path, "a") : NULL;
    if (out) {
        fprintf(out, "{\"steps\": %llu", (unsigned long long)env->profile_steps);
        for (int p = 0; p < DS_PH_COUNT; p++)
            fprintf(out, ", \"%s\": %llu", names[p], (unsigned long long)env->profile[p]);
        for (int p = 0; p < DS_PH_COUNT; p++)
            fprintf(out, ", \"fastest_%s\": %.2f", names[p], env->profile_fastest[p]);
        fprintf(out, "}\n");
        fclose(out);
    }
#endif
    /* every array came from PG_ALLOC: the binding frees them */
}
#endif /* host only */

/* ---- shared pieces ---------------------------------------------------------- */

/* A scratch row as the functions that take one see it: on the CPU a pointer to
 * an array on the stack; on the GPU a DsRow, one instance's row of env->work,
 * interleaved by instance as CUDA lays out local memory (element e of every
 * instance side by side), so that a warp's threads, stepping consecutive
 * instances through the same loop, read and write consecutive words. The GPU
 * build is C++ (NVRTC): DsRow indexes and offsets like a pointer. */
#ifdef PG_GPU
template <typename T> struct DsRow {
    T *at;         /* element 0 of this instance's row */
    size_t stride; /* elements from one of its elements to the next: num_envs */
    PG_DEVICE T &operator[](size_t e) const { return at[e * stride]; }
    PG_DEVICE DsRow operator+(size_t e) const {
        DsRow row = {at + e * stride, stride};
        return row;
    }
};

/* Row `row` (DS_W_*) of instance i. */
template <typename T> PG_DEVICE static inline DsRow<T> ds_row(const Env *env, int i, int row) {
    DsRow<T> r = {(T *)((char *)env->work + env->work_at[row]) + i, (size_t)env->pg.num_envs};
    return r;
}
/* Row parameters: DS_ROW written, DS_CROW only read; DS_OUT / DS_IN the same
 * for the vectorized kernels, whose CPU pointers are restrict. */
#define DS_ROW(type) DsRow<type>
#define DS_CROW(type) DsRow<type>
#define DS_OUT(type) DsRow<type>
#define DS_IN(type) DsRow<type>
#else
#define DS_ROW(type) type *
#define DS_CROW(type) const type *
#define DS_OUT(type) type *PG_RESTRICT
#define DS_IN(type) const type *PG_RESTRICT
#endif

/* A function's scratch array `name` (a DS_CALL_ROWS row), in a function where
 * env and the instance i are in scope: cpu_count elements on the CPU stack,
 * the instance's row on the GPU. */
#ifdef PG_GPU
#define DS_SCRATCH(type, name, cpu_count) DsRow<type> name = ds_row<type>(env, i, DS_W_##name)
#else
#define DS_SCRATCH(type, name, cpu_count) type name[cpu_count]
#endif

PG_DEVICE static inline int ds_cell(const Env *env, float x, float y) {
    int side = env->cells_per_side;
    int cx = (int)(x / env->cell_size), cy = (int)(y / env->cell_size);
    cx = cx < side - 1 ? cx : side - 1;
    cy = cy < side - 1 ? cy : side - 1;
    return cy * side + cx;
}

/* ---- obstacles -----------------------------------------------------------------
 * Axis-aligned rectangles [x0, x1] x [y0, y1], placed at every reset. A point is
 * inside when it is strictly inside (the faces are outside), so a drone stopped
 * on a face is not inside. Drones never end a step inside one; a segment from a
 * drone to a victim that crosses an interior hides the victim (no detection, no
 * confirmation, no scan-near). Radio links are not blocked. Nothing here runs
 * when n_obstacles is 0. */

PG_DEVICE static inline const float *ds_obstacles_of(const Env *env, int i) {
    return env->obstacles + (size_t)i * 4 * (size_t)env->n_obstacles;
}

PG_DEVICE static inline int ds_inside_any(const float *ob, int count, float x, float y) {
    int inside = 0;
    for (int o = 0; o < count; o++, ob += 4)
        inside |= (x > ob[0]) & (x < ob[2]) & (y > ob[1]) & (y < ob[3]);
    return inside;
}

/* Squared distance from (x, y) to the rectangle (0 on or inside it). */
PG_DEVICE static inline float ds_rect_d2(const float *o, float x, float y) {
    float gx = o[0] - x, gx2 = x - o[2], gy = o[1] - y, gy2 = y - o[3];
    gx = gx > gx2 ? gx : gx2;
    gy = gy > gy2 ? gy : gy2;
    gx = gx > 0.0f ? gx : 0.0f;
    gy = gy > 0.0f ? gy : 0.0f;
    return gx * gx + gy * gy;
}

/* Does the segment a -> b cross the open interior of rectangle o? Slab test:
 * on each axis with a non-zero step the segment parameter t is strictly inside
 * the slab on the open interval between the two face crossings; with a zero
 * step the point must be strictly inside the slab. Blocked when the two
 * intervals overlap within [0, 1]. */
PG_DEVICE static inline int ds_segment_blocked(const float *o, float ax, float ay, float bx, float by) {
    /* A segment whose bounding box stays off the open interior cannot cross it:
     * the slab test below says so too (monotonic rounding puts its entry at
     * t >= 1 or its exit at t <= 0), so this only skips the divisions. */
    float min_x = ax < bx ? ax : bx, max_x = ax < bx ? bx : ax;
    float min_y = ay < by ? ay : by, max_y = ay < by ? by : ay;
    if ((max_x <= o[0]) | (min_x >= o[2]) | (max_y <= o[1]) | (min_y >= o[3])) return 0;
    float dx = bx - ax, dy = by - ay;
    float lo = -INFINITY, hi = INFINITY;
    if (dx != 0.0f) {
        float t1 = (o[0] - ax) / dx, t2 = (o[2] - ax) / dx;
        lo = t1 < t2 ? t1 : t2;
        hi = t1 < t2 ? t2 : t1;
    } else if (!(ax > o[0] && ax < o[2])) {
        return 0;
    }
    if (dy != 0.0f) {
        float t1 = (o[1] - ay) / dy, t2 = (o[3] - ay) / dy;
        float tlo = t1 < t2 ? t1 : t2, thi = t1 < t2 ? t2 : t1;
        lo = lo > tlo ? lo : tlo;
        hi = hi < thi ? hi : thi;
    } else if (!(ay > o[1] && ay < o[3])) {
        return 0;
    }
    return (lo < hi) & (lo < 1.0f) & (hi > 0.0f);
}

/* Obstacles of instance i, drawn in order: per obstacle up to DS_OBSTACLE_TRIES
 * tries of (w, h, x0, y0); a try is kept when the rectangle is at least
 * obstacle_base_clearance from the base and obstacle_separation from every
 * obstacle kept before (gap along x or along y); an obstacle with no good try
 * is left out. */
PG_DEVICE static void ds_place_obstacles(Env *env, int i, uint64_t *rng) {
    float *placed = env->obstacles + (size_t)i * 4 * (size_t)env->n_obstacles;
    const float size = env->world_size, margin = env->obstacle_margin;
    const float lo = env->obstacle_min_size, hi = env->obstacle_max_size;
    const float clear2 = env->obstacle_clearance * env->obstacle_clearance;
    const float sep = env->obstacle_separation;
    int count = 0;
    for (int o = 0; o < env->n_obstacles; o++) {
        for (int t = 0; t < DS_OBSTACLE_TRIES; t++) {
            float w = pg_uniform_range(rng, lo, hi), h = pg_uniform_range(rng, lo, hi);
            float x0 = pg_uniform_range(rng, margin, size - margin - w);
            float y0 = pg_uniform_range(rng, margin, size - margin - h);
            float x1 = x0 + w, y1 = y0 + h;
            float rect[4] = {x0, y0, x1 < size ? x1 : size, y1 < size ? y1 : size};
            int ok = ds_rect_d2(rect, env->base_x, env->base_y) >= clear2;
            for (int q = 0; q < count && ok; q++) {
                const float *other = placed + 4 * q;
                float gap_x = other[0] - rect[2], gap_x2 = rect[0] - other[2];
                float gap_y = other[1] - rect[3], gap_y2 = rect[1] - other[3];
                gap_x = gap_x > gap_x2 ? gap_x : gap_x2;
                gap_y = gap_y > gap_y2 ? gap_y : gap_y2;
                ok = (gap_x >= sep) | (gap_y >= sep);
            }
            if (ok) {
                for (int f = 0; f < 4; f++) placed[4 * count + f] = rect[f];
                count++;
                break;
            }
        }
    }
    for (int f = 4 * count; f < 4 * env->n_obstacles; f++) placed[f] = 0.0f;
    env->obstacle_count[i] = count;
}

/* The obstacle slots of every drone row of instance i: the k_obstacles nearest
 * placed obstacles (squared distance to the rectangle, ties to the lower
 * index), each as its corners relative to the drone, (x0 - x, y0 - y, x1 - x,
 * y1 - y) / world_size; zero where there are fewer. */
PG_DEVICE static void ds_obstacle_slots(const Env *env, int i, float *obs) {
    const int n = env->n, dim = env->obs_dim, kq = env->k_obstacles;
    const int count = env->obstacle_count[i];
    const size_t od = (size_t)i * n;
    const float *ob = ds_obstacles_of(env, i);
    const float size = env->world_size;
    const int first = 10 + 3 * env->k;
    for (int d = 0; d < n; d++) {
        const float px = env->x[od + d], py = env->y[od + d];
        float *slots = obs + (od + d) * dim + first;
        /* the nearest so far, ascending */
        DS_SCRATCH(float, obstacle_d2, DS_MAX_OBSTACLES);
        DS_SCRATCH(int32_t, obstacle_index, DS_MAX_OBSTACLES);
        int found = 0;
        for (int o = 0; o < count; o++) {
            float d2 = ds_rect_d2(ob + 4 * o, px, py);
            if (found == kq && !(d2 < obstacle_d2[kq - 1])) continue;
            int pos = found < kq ? found++ : kq - 1;
            while (pos > 0 && obstacle_d2[pos - 1] > d2) {
                obstacle_d2[pos] = obstacle_d2[pos - 1];
                obstacle_index[pos] = obstacle_index[pos - 1];
                pos--;
            }
            obstacle_d2[pos] = d2;
            obstacle_index[pos] = o;
        }
        for (int s = 0; s < kq; s++) {
            if (s >= found) {
                for (int f = 0; f < 4; f++) slots[4 * s + f] = 0.0f;
                continue;
            }
            const float *o = ob + 4 * obstacle_index[s];
            slots[4 * s + 0] = pg_clampf((o[0] - px) / size, -1.0f, 1.0f);
            slots[4 * s + 1] = pg_clampf((o[1] - py) / size, -1.0f, 1.0f);
            slots[4 * s + 2] = pg_clampf((o[2] - px) / size, -1.0f, 1.0f);
            slots[4 * s + 3] = pg_clampf((o[3] - py) / size, -1.0f, 1.0f);
        }
    }
}

/* The vectorized kernels: PG_SIMD_KERNEL (an AVX2 clone beside the baseline)
 * plus no-trapping-math, which lets GCC if-convert the selects (it otherwise
 * sinks arithmetic into branches because it might raise FP exceptions), and
 * the unlimited vector cost model, without which GCC keeps 8-drone loops on
 * the scalar path (its threshold was 16-32 iterations). Values are unchanged:
 * no reassociation, no contraction, same rounding. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(PG_GPU)
#define DS_NO_TRAP __attribute__((optimize("no-trapping-math", "vect-cost-model=unlimited")))
#else
#define DS_NO_TRAP
#endif
#define DS_KERNEL PG_SIMD_KERNEL DS_NO_TRAP

/* Helpers the kernels call carry the same options, or GCC will not inline them
 * (pg_finite_or_zero is always_inline for that reason). ds_clampf is pg_clampf
 * with both comparisons always evaluated: the same value whenever lo <= hi (NaN
 * passes through both, -0 too), and no comparison executed only under a
 * condition, which if-conversion needs; pg_clampf's nested form, forced inline
 * here, made the AVX2 ds_move 926 instructions instead of 618. */
PG_DEVICE static inline DS_NO_TRAP float ds_clampf(float x, float lo, float hi) {
    float upper = x > hi ? hi : x;
    return upper < lo ? lo : upper;
}

/* Movement along one axis for n drones (instance i's obstacles): from `from`
 * towards `to` at the other coordinate `across`, a drone stops on the first
 * face in its way (lo/hi: the rectangles' faces on this axis, a_lo/a_hi: on
 * the other). Branch-free and drone-major so it vectorizes; per drone the
 * obstacles apply in index order. */
PG_DEVICE static inline DS_NO_TRAP float ds_stop_at_face(float lo, float hi, float a_lo, float a_hi,
                                                    float f, float t, float a) {
    int32_t in = (a > a_lo) & (a < a_hi);
    int32_t forward = in & (t > f) & (f <= lo) & (t > lo);
    t = forward ? lo : t;
    int32_t back = in & (t < f) & (f >= hi) & (t < hi);
    return back ? hi : t;
}

PG_DEVICE DS_KERNEL static void ds_stop_at_faces(size_t n, const float *ob, int count, int axis,
                                       const float *PG_RESTRICT from, float *PG_RESTRICT to,
                                       const float *PG_RESTRICT across) {
    for (int o = 0; o < count; o++) {
        const float lo = ob[4 * o + axis], hi = ob[4 * o + axis + 2];
        const float a_lo = ob[4 * o + 1 - axis], a_hi = ob[4 * o + 3 - axis];
        for (size_t d = 0; d < n; d++)
            to[d] = ds_stop_at_face(lo, hi, a_lo, a_hi, from[d], to[d], across[d]);
    }
}

/* Phase 1 with obstacles, instance i (after the block's free movement): the
 * move is resolved axis by axis, x first at the old y, then y at the new x; a
 * drone stops on the face of the first obstacle in its way and slides along
 * it. Cells are recomputed from the resolved positions. */
PG_DEVICE static void ds_obstacle_move(Env *env, int i, DS_CROW(float) old_x, DS_CROW(float) old_y,
                             DS_ROW(int32_t) cell) {
    const int n = env->n, count = env->obstacle_count[i];
    if (count == 0) return;
    const float *ob = ds_obstacles_of(env, i);
    float *x = env->x + (size_t)i * n, *y = env->y + (size_t)i * n;
#ifdef PG_GPU
    /* drone by drone (the old positions are scratch rows): the same tests in
     * the same order for each drone as the two passes below */
    for (int d = 0; d < n; d++) {
        const float fx = old_x[d], fy = old_y[d];
        float tx = x[d], ty = y[d];
        for (int q = 0; q < count; q++) {
            const float *o = ob + 4 * q;
            tx = ds_stop_at_face(o[0], o[2], o[1], o[3], fx, tx, fy);
        }
        for (int q = 0; q < count; q++) {
            const float *o = ob + 4 * q;
            ty = ds_stop_at_face(o[1], o[3], o[0], o[2], fy, ty, tx);
        }
        x[d] = tx;
        y[d] = ty;
    }
#else
    ds_stop_at_faces((size_t)n, ob, count, 0, old_x, x, old_y);
    ds_stop_at_faces((size_t)n, ob, count, 1, old_y, y, x);
#endif
    for (int d = 0; d < n; d++) cell[d] = ds_cell(env, x[d], y[d]);
}

/* Is the segment a -> b blocked by one of `count` obstacles (tested in index
 * order, up to the first that blocks)? */
PG_DEVICE static inline int ds_hidden(const float *ob, int count, float ax, float ay, float bx,
                                      float by) {
    int hidden = 0;
    for (int o = 0; o < count && !hidden; o++)
        hidden = ds_segment_blocked(ob + 4 * o, ax, ay, bx, by);
    return hidden;
}

/* Line of sight for phases 4 and 6, instance i: hidden victims' squared
 * distances become +inf for that drone, then the per-drone counts are
 * recomputed. Only pairs within reach2 (the largest range) are tested, each
 * with a bounding-box reject first (scalar: a branch-free version that ran
 * the divisions for every pair measured 4x slower). */
PG_DEVICE static void ds_occlude(const Env *env, int i, int num_scanners, const int32_t *scanners,
                       const float *x, const float *y, const float *vx, const float *vy,
                       const int32_t *status, float rc2, float rs2, float near2, float *victim_d2,
                       int32_t *counts) {
    const int m = env->m, count = env->obstacle_count[i];
    if (count == 0) return;
    const float *ob = ds_obstacles_of(env, i);
    float reach2 = rs2 > rc2 ? rs2 : rc2;
    reach2 = reach2 > near2 ? reach2 : near2;
    for (int j = 0; j < num_scanners; j++) {
        const int d = scanners[j];
        float *row = victim_d2 + (size_t)d * m;
        int32_t confirm = 0, sense = 0, near = 0;
        for (int v = 0; v < m; v++) {
            if (row[v] <= reach2 && ds_hidden(ob, count, x[d], y[d], vx[v], vy[v]))
                row[v] = INFINITY;
            confirm += row[v] <= rc2;
            sense += row[v] <= rs2;
            near += (status[v] == DS_UNKNOWN) & (row[v] <= near2);
        }
        counts[3 * d + 0] = confirm;
        counts[3 * d + 1] = sense;
        counts[3 * d + 2] = near;
    }
}

#ifdef PG_GPU
/* The GPU's squared distance from drone d to victim v of instance i, computed
 * where it is read instead of kept in an n x m matrix per thread (see
 * "scratch"): ds_victim_scan's expression, then +inf for a victim hidden by an
 * obstacle within reach2, as ds_occlude writes it; the same bits as the CPU's
 * matrix. */
PG_DEVICE static inline float ds_sight_d2(const Env *env, int i, int d, int v, float reach2) {
    const size_t od = (size_t)i * env->n, ov = (size_t)i * env->m;
    const float xd = env->x[od + d], yd = env->y[od + d];
    const float px = env->vx[ov + v], py = env->vy[ov + v];
    float dx = px - xd, dy = py - yd;
    float d2 = dx * dx + dy * dy;
    if (env->n_obstacles && d2 <= reach2 &&
        ds_hidden(ds_obstacles_of(env, i), env->obstacle_count[i], xd, yd, px, py))
        d2 = INFINITY;
    return d2;
}

/* The counts of ds_victim_scan after ds_occlude, from ds_sight_d2. */
PG_DEVICE static void ds_sight_counts(const Env *env, int i, int num_scanners,
                                      DsRow<int32_t> scanners, float rc2, float rs2, float near2,
                                      float reach2, DsRow<int32_t> counts) {
    const int m = env->m;
    const int32_t *status = env->status + (size_t)i * m;
    for (int j = 0; j < num_scanners; j++) {
        const int d = scanners[j];
        int32_t confirm = 0, sense = 0, near = 0;
        for (int v = 0; v < m; v++) {
            float d2 = ds_sight_d2(env, i, d, v, reach2);
            confirm += d2 <= rc2;
            sense += d2 <= rs2;
            near += (status[v] == DS_UNKNOWN) & (d2 <= near2);
        }
        counts[3 * d + 0] = confirm;
        counts[3 * d + 1] = sense;
        counts[3 * d + 2] = near;
    }
}
#endif

/* Phases 1-2 for n <= DS_BLOCK_DRONES consecutive drone rows (any number of
 * instances), branch-free so it vectorizes (AVX2 clone where the CPU has
 * it): actions -> velocity, position, battery, cell index, scan/active
 * flags. Dividing by max(norm, 1) leaves in-disc velocities exact (x / 1 ==
 * x) without a data-dependent branch. */
PG_DEVICE DS_KERNEL static void ds_move(const Env *env, size_t n, const float *PG_RESTRICT actions,
                                   float *PG_RESTRICT x, float *PG_RESTRICT y,
                                   float *PG_RESTRICT battery, DS_OUT(float) speed2,
                                   DS_OUT(int32_t) cell, DS_OUT(int32_t) active_out,
                                   DS_OUT(int32_t) scan_out) {
    const float v_max = env->v_max, dt = env->dt, size = env->world_size;
    const float c_idle = env->c_idle, c_move = env->c_move, c_scan = env->c_scan;
    const float cell_size = env->cell_size;
    const int last = env->cells_per_side - 1, side = env->cells_per_side;
#ifdef PG_GPU
    /* one instance: the interleaved actions are read in place (no scratch) */
    const float *in_x = actions, *in_y = actions + 1, *in_scan = actions + 2;
    const size_t stride = 3;
#else
    /* de-interleave first: GCC does not vectorize the stride-3 loads below */
    float in_x[DS_BLOCK_DRONES], in_y[DS_BLOCK_DRONES], in_scan[DS_BLOCK_DRONES];
    for (size_t d = 0; d < n; d++) {
        in_x[d] = actions[3 * d + 0];
        in_y[d] = actions[3 * d + 1];
        in_scan[d] = actions[3 * d + 2];
    }
    const size_t stride = 1;
#endif
    for (size_t d = 0; d < n; d++) {
        float ax = ds_clampf(pg_finite_or_zero(in_x[stride * d]), -1.0f, 1.0f);
        float ay = ds_clampf(pg_finite_or_zero(in_y[stride * d]), -1.0f, 1.0f);
        float as = ds_clampf(pg_finite_or_zero(in_scan[stride * d]), -1.0f, 1.0f);
        int active = battery[d] > 0.0f;
        float norm2 = ax * ax + ay * ay;
        /* norm if > 1, else exactly 1 (norm * 0 + 1). Written with arithmetic,
         * not a select of the divisor, and selecting before dividing: GCC
         * turns x / (c ? a : b) or a division used under a condition into a
         * branch, which stops the vectorizer. */
        float big = norm2 > 1.0f ? 1.0f : 0.0f;
        float norm = sqrtf(norm2) * big + (1.0f - big);
        ax = (active ? ax : 0.0f) / norm;
        ay = (active ? ay : 0.0f) / norm;
        int scan = as > 0.0f ? active : 0;
        float s2 = ax * ax + ay * ay;
        float px = ds_clampf(x[d] + (ax * v_max) * dt, 0.0f, size);
        float py = ds_clampf(y[d] + (ay * v_max) * dt, 0.0f, size);
        int cx = (int)(px / cell_size), cy = (int)(py / cell_size);
        cx = cx < last ? cx : last;
        cy = cy < last ? cy : last;
        float drain = (c_idle + c_move * s2 + c_scan * (scan ? 1.0f : 0.0f)) * dt;
        float b = battery[d] - drain;
        x[d] = px;
        y[d] = py;
        battery[d] = b > 0.0f ? b : 0.0f;
        speed2[d] = s2;
        cell[d] = cy * side + cx;
        active_out[d] = active;
        scan_out[d] = scan;
    }
}

/* Observation features 0..9 of `count` consecutive drone rows (any number of
 * instances; r_comm is per drone because it is per episode), written straight
 * into the rows (stride dim). Vectorizes across drones. */
PG_DEVICE DS_KERNEL static void ds_features(const Env *env, size_t count, DS_IN(float) r_comm,
                                  const float *PG_RESTRICT x, const float *PG_RESTRICT y,
                                  const float *PG_RESTRICT battery,
                                  const float *PG_RESTRICT connected,
                                  const int32_t *PG_RESTRICT age,
                                  DS_IN(int32_t) neighbours,
                                  DS_IN(float) nearest2, float *PG_RESTRICT obs,
                                  size_t dim) {
    const float size = env->world_size, bx = env->base_x, by = env->base_y;
    const float max_steps = (float)env->max_steps;
    const float neighbour_scale = env->n > 1 ? (float)(env->n - 1) : 1.0f;
    const float neighbour_on = env->n > 1 ? 1.0f : 0.0f;
    for (size_t d = 0; d < count; d++) {
        float px = x[d], py = y[d];
        float dbx = bx - px, dby = by - py;
        float dist = sqrtf(dbx * dbx + dby * dby);
        float safe = dist + (dist > 0.0f ? 0.0f : 1.0f); /* dist, or 1 at the base */
        float near = sqrtf(nearest2[d]) / r_comm[d];
        near = near < 1.0f ? near : 1.0f;
        float *row = obs + d * dim;
        row[0] = ds_clampf(px / size, -1.0f, 1.0f);
        row[1] = ds_clampf(py / size, -1.0f, 1.0f);
        row[2] = ds_clampf(battery[d], -1.0f, 1.0f);
        row[3] = ds_clampf(dist / size, -1.0f, 1.0f);
        row[4] = connected[d];
        row[5] = ds_clampf((float)age[d] / max_steps, -1.0f, 1.0f);
        row[6] = ds_clampf((float)neighbours[d] / neighbour_scale, -1.0f, 1.0f) * neighbour_on;
        row[7] = ds_clampf(near, -1.0f, 1.0f);
        /* at the base (dist == 0) this is (dbx, dby) / 1 == (0, 0) */
        row[8] = ds_clampf(dbx / safe, -1.0f, 1.0f);
        row[9] = ds_clampf(dby / safe, -1.0f, 1.0f);
    }
}

/* The drone-drone pass, column by column: for each drone b, every drone a
 * gets d2(a, b) in one elementwise (vectorizable) sweep, so nothing needs a
 * horizontal reduction. Per drone a: live neighbours within r_comm, the
 * squared distance to the nearest live neighbour (+inf if none) and its
 * adjacency bits (both live, within r_comm). d2(a, b) = (x_a - x_b)^2 +
 * (y_a - y_b)^2, the same float seen from either end. The minimum is kept on
 * the float bit patterns as integers (monotonic for d2 >= 0): same result,
 * integer min vectorizes without -ffinite-math-only. */
PG_DEVICE DS_KERNEL static void ds_pair_columns(size_t n, const float *PG_RESTRICT x, const float *PG_RESTRICT y,
                                      const int32_t *PG_RESTRICT alive, float r2,
                                      int32_t *PG_RESTRICT count, int32_t *PG_RESTRICT nearest2_bits,
                                      uint64_t *PG_RESTRICT adjacency) {
    for (size_t a = 0; a < n; a++) {
        count[a] = 0;
        nearest2_bits[a] = 0x7F800000; /* +inf */
        adjacency[a] = 0;
    }
    for (size_t b = 0; b < n; b++) {
        const float xb = x[b], yb = y[b];
        const int32_t alive_b = alive[b];
        for (size_t a = 0; a < n; a++) {
            float dx = x[a] - xb, dy = y[a] - yb;
            float d2 = dx * dx + dy * dy;
            int32_t d2_bits;
            memcpy(&d2_bits, &d2, sizeof d2_bits);
            int32_t valid = alive_b & (a != b);
            int32_t linked = valid & (d2 <= r2);
            count[a] += linked;
            int32_t candidate = valid ? d2_bits : 0x7F800000;
            nearest2_bits[a] = candidate < nearest2_bits[a] ? candidate : nearest2_bits[a];
            adjacency[a] |= (uint64_t)(linked & alive[a]) << b;
        }
    }
}

/* Squared distances from each scanning drone to every victim (phases 4 and 6
 * share them, row d at out + d * m) and three counts per drone that let most
 * steps skip the per-victim work: victims within r_confirm_radius, within
 * r_sense, and unknown ones within 2 * r_confirm_radius (with the statuses
 * before this step's phases 4-5). */
PG_DEVICE DS_KERNEL static void ds_victim_scan(size_t count, const int32_t *PG_RESTRICT drones,
                                     const float *PG_RESTRICT x, const float *PG_RESTRICT y, size_t m,
                                     const float *PG_RESTRICT vx, const float *PG_RESTRICT vy,
                                     const int32_t *PG_RESTRICT status, float rc2, float rs2,
                                     float near2, float *PG_RESTRICT out,
                                     int32_t *PG_RESTRICT counts) {
    for (size_t j = 0; j < count; j++) {
        size_t d = (size_t)drones[j];
        const float xd = x[d], yd = y[d];
        float *row = out + d * m;
        int32_t confirm = 0, sense = 0, near = 0;
        for (size_t v = 0; v < m; v++) {
            float dx = vx[v] - xd, dy = vy[v] - yd;
            float d2 = dx * dx + dy * dy;
            row[v] = d2;
            confirm += d2 <= rc2;
            sense += d2 <= rs2;
            near += (status[v] == DS_UNKNOWN) & (d2 <= near2);
        }
        counts[3 * d + 0] = confirm;
        counts[3 * d + 1] = sense;
        counts[3 * d + 2] = near;
    }
}

/* Phase 7 rewards of n consecutive drone rows (any number of instances); every
 * term added in the documented order. */
PG_DEVICE DS_KERNEL static void ds_rewards(const Env *env, size_t n, DS_IN(float) share,
                                 DS_IN(float) speed2, DS_IN(float) confirmations,
                                 DS_IN(float) explore, DS_IN(float) scan_near,
                                 DS_IN(float) alive, const float *PG_RESTRICT connected,
                                 DS_IN(float) nearest2, float *PG_RESTRICT rewards,
                                 float *PG_RESTRICT returns) {
    const float sep = env->min_drone_separation, r_disp = env->r_dispersion;
    const float r_time = env->r_time, c_energy = env->c_energy, r_confirm = env->r_confirm;
    const float r_explore = env->r_explore, r_scan_near = env->r_scan_near;
    const float r_connect = env->r_connect;
    /* nearest / sep is only used when nearest < sep (so sep > 0): divide by 1 otherwise */
    const float safe_sep = sep > 0.0f ? sep : 1.0f;
    for (size_t d = 0; d < n; d++) {
        float nearest = sqrtf(nearest2[d]);
        float penalty = -(r_disp * (1.0f - nearest / safe_sep));
        float dispersion = nearest >= sep ? r_disp : penalty;
        dispersion = alive[d] > 0.0f ? dispersion : 0.0f;
        float r = r_time;
        r = r - c_energy * speed2[d];
        r = r + share[d];
        r = r + r_confirm * confirmations[d];
        r = r + r_explore * explore[d];
        r = r + (scan_near[d] > 0.0f ? r_scan_near : 0.0f);
        r = r + dispersion;
        r = r + (connected[d] > 0.0f ? r_connect : 0.0f);
        rewards[d] = r;
        returns[d] = returns[d] + r;
    }
}

/* Pairwise pass over drones of instance i: live-neighbour counts and squared
 * nearest live-neighbour distances for every drone (dead ones too: they still
 * observe), and the drone-drone adjacency (live pairs within r_comm) as
 * bitmasks. */
PG_DEVICE static inline void ds_pairs(const Env *env, int i, uint64_t alive, float r2,
                                     DS_ROW(int32_t) count, DS_ROW(float) nearest2,
                                     DS_ROW(uint64_t) adjacency) {
    const int n = env->n;
    const float *x = env->x + (size_t)i * n, *y = env->y + (size_t)i * n;
#ifdef PG_GPU
    /* Row by row (drone a outer), each drone's three results kept in registers
     * and stored once: the outputs are rows of env->work in global memory, and
     * ds_pair_columns' column order would store to them for every pair. The
     * same values: d2 as ds_pair_columns computes it, and a count, a minimum (of
     * the bit patterns) and a union do not depend on the order. */
    for (int a = 0; a < n; a++) {
        const float xa = x[a], ya = y[a];
        const int32_t alive_a = (int32_t)((alive >> a) & 1);
        int32_t linked_count = 0, best_bits = 0x7F800000; /* +inf */
        uint64_t links = 0;
        for (int b = 0; b < n; b++) {
            float dx = xa - x[b], dy = ya - y[b];
            float d2 = dx * dx + dy * dy;
            int32_t d2_bits;
            memcpy(&d2_bits, &d2, sizeof d2_bits);
            int32_t valid = (int32_t)((alive >> b) & 1) & (a != b);
            int32_t linked = valid & (d2 <= r2);
            linked_count += linked;
            int32_t candidate = valid ? d2_bits : 0x7F800000;
            best_bits = candidate < best_bits ? candidate : best_bits;
            links |= (uint64_t)(linked & alive_a) << b;
        }
        count[a] = linked_count;
        memcpy(&nearest2[a], &best_bits, sizeof(float));
        adjacency[a] = links;
    }
#else
    int32_t alive_flag[DS_MAX_DRONES], nearest2_bits[DS_MAX_DRONES];
    for (int d = 0; d < n; d++) alive_flag[d] = (int32_t)((alive >> d) & 1);
    ds_pair_columns((size_t)n, x, y, alive_flag, r2, count, nearest2_bits, adjacency);
    memcpy(nearest2, nearest2_bits, (size_t)n * sizeof(float));
#endif
}

/* Base links: live drones within r_comm of the base. */
PG_DEVICE static inline uint64_t ds_base_links(const Env *env, int i, uint64_t alive, float r2) {
    const int n = env->n;
    const float *x = env->x + (size_t)i * n, *y = env->y + (size_t)i * n;
    uint64_t links = 0;
    for (int d = 0; d < n; d++) {
        float dx = x[d] - env->base_x, dy = y[d] - env->base_y;
        links |= (uint64_t)(dx * dx + dy * dy <= r2) << d;
    }
    return links & alive;
}

/* The connected set: everything reachable from the base links. */
PG_DEVICE static inline uint64_t ds_closure(uint64_t base, DS_CROW(uint64_t) adjacency) {
    uint64_t reached = base, frontier = base;
    while (frontier) {
        int d = pg_ctz64(frontier);
        frontier &= frontier - 1;
        uint64_t fresh = adjacency[d] & ~reached;
        reached |= fresh;
        frontier |= fresh;
    }
    return reached;
}

/* The trailing columns of every drone row of instance i, after the obstacle
 * slots (what a drone knows about itself and its radio network):
 * - obs_report: 0 when the drone owns no confirmed, undelivered victim, else
 *   (window + 1) / (m_deliver + 1) of its most urgent such report, in (0, 1]
 *   (1 on the step it confirmed, 1 / (m_deliver + 1) on the last step a link
 *   can still deliver it). Without it a memoryless policy cannot tell that it
 *   carries a report to bring home.
 * - obs_network: the nearest node a report could be handed to, i.e. the base
 *   or another connected drone (squared distance, ties to the base, then the
 *   lower index): unit vector to it (0, 0 on top of it) and distance / L.
 *   The base vector alone points a far drone past a relay chain.
 * - obs_drone_id: the drone's index d / (n_drones - 1) (0 with one drone), so
 *   one shared policy can give drones different roles.
 * - obs_n_neighbours slots: what a drone hears from the other live drones in
 *   radio range (within the episode's r_comm, nearest first by squared
 *   distance, ties to the lower index): per neighbour its offset (dx, dy) /
 *   r_comm, its connected flag and its report (as the obs_report column);
 *   slots past the neighbours in range are 0. */
PG_DEVICE static inline float ds_window_left(const Env *env, int i, int32_t window) {
    return (float)(window + 1) * (1.0f / (float)(env->ep_m_deliver[i] + 1));
}

/* Each drone's report (the obs_report column and the global state): 0 when it
 * owns no confirmed, undelivered victim, else ds_window_left of its most urgent
 * one; drone d's value at out[d * stride]. */
PG_DEVICE static void ds_report_levels(const Env *env, int i, float *out, size_t stride) {
    const int n = env->n, m = env->m;
    const size_t ov = (size_t)i * m;
    for (int d = 0; d < n; d++) out[(size_t)d * stride] = 0.0f;
    for (int v = 0; v < m; v++) {
        if (env->status[ov + v] != DS_CONFIRMED) continue;
        float *slot = out + (size_t)env->owner[ov + v] * stride;
        float left = ds_window_left(env, i, env->window[ov + v]);
        if (*slot == 0.0f || left < *slot) *slot = left;
    }
}

/* The obs_n_neighbours slots of every drone row of instance i, from slots (drone
 * d's first at slots + d * dim). Each slot is chosen by a scan over the drones
 * for the nearest one after the previous pick in (d2, index) order, so nothing
 * is sorted or kept per pair. */
PG_DEVICE static void ds_neighbour_slots(const Env *env, int i, float *slots, size_t dim) {
    const int n = env->n, kn = env->k_neighbours;
    const size_t od = (size_t)i * n;
    const float *x = env->x + od, *y = env->y + od, *battery = env->battery + od;
    const float *connected = env->connected + od;
    const float r = env->ep_r_comm[i], r2 = r * r, inv_r = 1.0f / r;
    DS_SCRATCH(float, neighbour_report, DS_MAX_DRONES);
#ifdef PG_GPU
    ds_report_levels(env, i, neighbour_report.at, neighbour_report.stride);
#else
    ds_report_levels(env, i, neighbour_report, 1);
#endif
    for (int d = 0; d < n; d++) {
        float *slot = slots + (size_t)d * dim;
        float last2 = -1.0f;
        int last = -1;
        for (int s = 0; s < kn; s++, slot += 4) {
            int pick = -1;
            float pick2 = 0.0f;
            for (int e = 0; e < n; e++) {
                if (e == d || battery[e] <= 0.0f) continue;
                float ex = x[e] - x[d], ey = y[e] - y[d];
                float d2 = ex * ex + ey * ey;
                int after = d2 > last2 || (d2 == last2 && e > last);
                if (d2 <= r2 && after && (pick < 0 || d2 < pick2)) {
                    pick = e;
                    pick2 = d2;
                }
            }
            if (pick < 0) {
                for (int f = 0; f < 4; f++) slot[f] = 0.0f;
                continue;
            }
            slot[0] = pg_clampf((x[pick] - x[d]) * inv_r, -1.0f, 1.0f);
            slot[1] = pg_clampf((y[pick] - y[d]) * inv_r, -1.0f, 1.0f);
            slot[2] = connected[pick];
            slot[3] = neighbour_report[pick];
            last = pick;
            last2 = pick2;
        }
    }
}

PG_DEVICE static void ds_tail_columns(const Env *env, int i, float *obs) {
    const int n = env->n, dim = env->obs_dim;
    const size_t od = (size_t)i * n;
    float *tail = obs + od * dim +
                  (dim - env->report - 3 * env->network - env->drone_id - 4 * env->k_neighbours);
    if (env->report) {
        ds_report_levels(env, i, tail, (size_t)dim);
        tail++;
    }
    if (env->network) {
        const float *x = env->x + od, *y = env->y + od, *connected = env->connected + od;
        const float size = env->world_size;
        for (int d = 0; d < n; d++) {
            float dx = env->base_x - x[d], dy = env->base_y - y[d];
            float best2 = dx * dx + dy * dy;
            for (int e = 0; e < n; e++) {
                if (e == d || connected[e] == 0.0f) continue;
                float ex = x[e] - x[d], ey = y[e] - y[d];
                float d2 = ex * ex + ey * ey;
                if (d2 < best2) {
                    best2 = d2;
                    dx = ex;
                    dy = ey;
                }
            }
            float dist = sqrtf(best2);
            float safe = dist + (dist > 0.0f ? 0.0f : 1.0f);
            float *row = tail + (size_t)d * dim;
            row[0] = pg_clampf(dx / safe, -1.0f, 1.0f);
            row[1] = pg_clampf(dy / safe, -1.0f, 1.0f);
            row[2] = pg_clampf(dist / size, -1.0f, 1.0f);
        }
        tail += 3;
    }
    if (env->drone_id) {
        const float scale = n > 1 ? 1.0f / (float)(n - 1) : 0.0f;
        for (int d = 0; d < n; d++) tail[(size_t)d * dim] = (float)d * scale;
        tail++;
    }
    if (env->k_neighbours) ds_neighbour_slots(env, i, tail, (size_t)dim);
}

/* The columns of every drone row of instance i after the detection slots, where
 * the config asks for them: obstacle slots, then the trailing columns. */
PG_DEVICE static inline void ds_extra_columns(const Env *env, int i, float *obs) {
    if (env->k_obstacles) ds_obstacle_slots(env, i, obs);
    if (env->report | env->network | env->drone_id | env->k_neighbours)
        ds_tail_columns(env, i, obs);
}

PG_DEVICE static inline uint64_t ds_alive_mask(const Env *env, int i) {
    const float *battery = env->battery + (size_t)i * env->n;
    uint64_t alive = 0;
    for (int d = 0; d < env->n; d++) alive |= (uint64_t)(battery[d] > 0.0f) << d;
    return alive;
}

/* The first 10 features of every drone row of instance i; detection slots are
 * zeroed when zero_slots (reset, set_state). */
PG_DEVICE static void ds_write_features(const Env *env, int i, float *obs, DS_CROW(int32_t) count,
                              DS_CROW(float) nearest2, int zero_slots) {
    const int n = env->n, dim = env->obs_dim;
    const size_t od = (size_t)i * n;
    DS_SCRATCH(float, feature_r_comm, DS_MAX_DRONES);
    for (int d = 0; d < n; d++) feature_r_comm[d] = env->ep_r_comm[i];
    ds_features(env, (size_t)n, feature_r_comm, env->x + od, env->y + od, env->battery + od,
                env->connected + od, env->age + od, count, nearest2, obs + od * dim, (size_t)dim);
    if (zero_slots)
        for (int d = 0; d < n; d++)
            for (int s = 10; s < dim; s++) obs[(od + d) * dim + s] = 0.0f;
    ds_extra_columns(env, i, obs);
}

/* Observations from the stored state alone (reset, set_state): no detections. */
PG_DEVICE static void ds_observe_state(const Env *env, int i) {
    DS_SCRATCH(int32_t, observe_count, DS_MAX_DRONES);
    DS_SCRATCH(float, observe_nearest2, DS_MAX_DRONES);
    DS_SCRATCH(uint64_t, observe_adjacency, DS_MAX_DRONES);
    float r2 = env->ep_r_comm[i] * env->ep_r_comm[i];
    ds_pairs(env, i, ds_alive_mask(env, i), r2, observe_count, observe_nearest2,
             observe_adjacency);
    ds_write_features(env, i, (float *)env->pg.observations, observe_count, observe_nearest2, 1);
}

/* ---- the global state ------------------------------------------------------------
 * What a centralised critic reads (pg_env.h, ENV_GLOBAL_STATE): the whole
 * instance, every value in [-1, 1]. Layout in the package docstring. */
PG_DEVICE static void env_global_state(const Env *env, int i, float *out) {
    const int n = env->n, m = env->m;
    const size_t od = (size_t)i * n, ov = (size_t)i * m;
    const float size = env->world_size, max_steps = (float)env->max_steps;
    int explored = 0;
    const uint64_t *visited = env->visited + (size_t)i * env->words64;
    for (int w = 0; w < env->words64; w++) explored += pg_popcount64(visited[w]);
    out[0] = pg_clampf((float)env->step[i] / max_steps, -1.0f, 1.0f);
    out[1] = pg_clampf(env->ep_r_comm[i] / size, -1.0f, 1.0f);
    out[2] = env->ep_p_drop[i];
    out[3] = (float)explored / (float)env->cells;
    float *drone = out + DS_STATE_HEADER;
    ds_report_levels(env, i, drone + 6, DS_STATE_DRONE);
    for (int d = 0; d < n; d++, drone += DS_STATE_DRONE) {
        drone[0] = pg_clampf(env->x[od + d] / size, -1.0f, 1.0f);
        drone[1] = pg_clampf(env->y[od + d] / size, -1.0f, 1.0f);
        drone[2] = env->battery[od + d];
        drone[3] = env->connected[od + d];
        drone[4] = pg_clampf((float)env->age[od + d] / max_steps, -1.0f, 1.0f);
        drone[5] = (float)env->scanning[od + d];
    }
    float *victim = drone;
    const float t_confirm = (float)env->ep_t_confirm[i];
    for (int v = 0; v < m; v++, victim += DS_STATE_VICTIM) {
        const int32_t status = env->status[ov + v];
        victim[0] = pg_clampf(env->vx[ov + v] / size, -1.0f, 1.0f);
        victim[1] = pg_clampf(env->vy[ov + v] / size, -1.0f, 1.0f);
        victim[2] = status == DS_CONFIRMED ? 1.0f : 0.0f;
        victim[3] = status == DS_DELIVERED ? 1.0f : 0.0f;
        victim[4] = status == DS_CONFIRMED ? ds_window_left(env, i, env->window[ov + v]) : 0.0f;
        victim[5] = pg_clampf((float)env->progress[ov + v] / t_confirm, -1.0f, 1.0f);
    }
    float *slot = victim;
    const float *ob = ds_obstacles_of(env, i);
    for (int o = 0; o < env->n_obstacles; o++, slot += DS_STATE_OBSTACLE) {
        const int present = o < env->obstacle_count[i];
        slot[0] = present ? 1.0f : 0.0f;
        for (int f = 0; f < 4; f++) slot[1 + f] = present ? ob[4 * o + f] / size : 0.0f;
    }
}

/* ---- reset -------------------------------------------------------------------- */

PG_DEVICE static void ds_reset_instance(Env *env, int i) {
    uint64_t *rng = &env->pg.rng[i];
    const int n = env->n, m = env->m;
    const size_t od = (size_t)i * n, ov = (size_t)i * m;
    if (env->randomise) {
        env->ep_r_comm[i] = pg_uniform_range(rng, env->r_comm_min, env->r_comm_max);
        env->ep_p_drop[i] = pg_uniform_range(rng, env->p_comm_drop_min, env->p_comm_drop_max);
        env->ep_t_confirm[i] = env->num_t_choices
                                   ? env->t_choices[pg_randint(rng, env->num_t_choices)]
                                   : env->t_confirm;
        env->ep_m_deliver[i] = env->num_m_choices
                                   ? env->m_choices[pg_randint(rng, env->num_m_choices)]
                                   : env->m_deliver;
    } else {
        env->ep_r_comm[i] = env->r_comm;
        env->ep_p_drop[i] = env->p_comm_drop;
        env->ep_t_confirm[i] = env->t_confirm;
        env->ep_m_deliver[i] = env->m_deliver;
    }
    const float bx = env->base_x, by = env->base_y, size = env->world_size;
    if (env->n_obstacles) ds_place_obstacles(env, i, rng);
    const float *ob = ds_obstacles_of(env, i);
    const int num_obstacles = env->obstacle_count[i];

    /* drones: uniform in the disc around the base (outside obstacles), clipped
     * to the world */
    float radius = env->spawn_radius < 0.0f ? env->ep_r_comm[i] : env->spawn_radius;
    float lo_x = bx - radius, hi_x = bx + radius, lo_y = by - radius, hi_y = by + radius;
    lo_x = lo_x > 0.0f ? lo_x : 0.0f;
    lo_y = lo_y > 0.0f ? lo_y : 0.0f;
    hi_x = hi_x < size ? hi_x : size;
    hi_y = hi_y < size ? hi_y : size;
    float radius2 = radius * radius;
    for (int d = 0; d < n; d++) {
        float px = bx, py = by;
        int ok = 0;
        for (int t = 0; t < DS_DRONE_SPAWN_TRIES && !ok; t++) {
            px = pg_uniform_range(rng, lo_x, hi_x);
            py = pg_uniform_range(rng, lo_y, hi_y);
            float dx = px - bx, dy = py - by;
            ok = dx * dx + dy * dy <= radius2;
            if (num_obstacles) ok = ok && !ds_inside_any(ob, num_obstacles, px, py);
        }
        env->x[od + d] = ok ? px : bx;
        env->y[od + d] = ok ? py : by;
    }
    /* victims: uniform in the annulus, inside the world */
    float vmin = env->victim_min_dist, vmax = env->victim_max_dist;
    float vmin2 = vmin * vmin, vmax2 = vmax * vmax;
    lo_x = bx - vmax;
    hi_x = bx + vmax;
    lo_y = by - vmax;
    hi_y = by + vmax;
    lo_x = lo_x > 0.0f ? lo_x : 0.0f;
    lo_y = lo_y > 0.0f ? lo_y : 0.0f;
    hi_x = hi_x < size ? hi_x : size;
    hi_y = hi_y < size ? hi_y : size;
    for (int v = 0; v < m; v++) {
        float px = bx, py = by;
        int ok = 0;
        for (int t = 0; t < DS_VICTIM_SPAWN_TRIES && !ok; t++) {
            px = pg_uniform_range(rng, lo_x, hi_x);
            py = pg_uniform_range(rng, lo_y, hi_y);
            float dx = px - bx, dy = py - by, d2 = dx * dx + dy * dy;
            ok = (d2 >= vmin2) & (d2 <= vmax2);
            if (num_obstacles) ok = ok && !ds_inside_any(ob, num_obstacles, px, py);
        }
        env->vx[ov + v] = px;
        env->vy[ov + v] = py;
        env->status[ov + v] = DS_UNKNOWN;
        env->confirm_drone[ov + v] = -1;
        env->progress[ov + v] = 0;
        env->owner[ov + v] = -1;
        env->window[ov + v] = 0;
        env->ever_confirmed[ov + v] = 0;
    }

    env->step[i] = 0;
    env->first_delivery[i] = -1;
    env->victims_pending[i] = 0;
    env->connected_steps[i] = 0;
    const int words = env->words64;
    uint64_t *visited = env->visited + (size_t)i * words;
    uint64_t *own = env->own_visited + od * words;
    memset(visited, 0, (size_t)words * sizeof(uint64_t));
    memset(own, 0, (size_t)n * words * sizeof(uint64_t));
    for (int d = 0; d < n; d++) {
        env->battery[od + d] = 1.0f;
        env->age[od + d] = 0;
        env->returns[od + d] = 0.0f;
        env->scanning[od + d] = 0;
        int c = ds_cell(env, env->x[od + d], env->y[od + d]);
        visited[c >> 6] |= 1ULL << (c & 63);
        own[(size_t)d * words + (c >> 6)] |= 1ULL << (c & 63);
    }
    /* connectivity without drops, then the first observation */
    DS_SCRATCH(int32_t, observe_count, DS_MAX_DRONES);
    DS_SCRATCH(float, observe_nearest2, DS_MAX_DRONES);
    DS_SCRATCH(uint64_t, observe_adjacency, DS_MAX_DRONES);
    uint64_t alive = ds_alive_mask(env, i);
    float r2 = env->ep_r_comm[i] * env->ep_r_comm[i];
    ds_pairs(env, i, alive, r2, observe_count, observe_nearest2, observe_adjacency);
    uint64_t connected = ds_closure(ds_base_links(env, i, alive, r2), observe_adjacency);
    for (int d = 0; d < n; d++) env->connected[od + d] = (float)((connected >> d) & 1);
    ds_write_features(env, i, (float *)env->pg.observations, observe_count, observe_nearest2, 1);
}

PG_DEVICE static void env_reset(Env *env, int start, int end) {
    for (int i = start; i < end; i++) ds_reset_instance(env, i);
}

/* ---- the step --------------------------------------------------------------- */

PG_DEVICE static void ds_record_episode(Env *env, int i) {
    const int n = env->n, m = env->m;
    const size_t od = (size_t)i * n, ov = (size_t)i * m;
    double total = 0.0;
    for (int d = 0; d < n; d++) total += (double)env->returns[od + d];
    int delivered = 0, confirmed = 0;
    for (int v = 0; v < m; v++) {
        delivered += env->status[ov + v] == DS_DELIVERED;
        confirmed += env->ever_confirmed[ov + v];
    }
    int explored = 0;
    const uint64_t *visited = env->visited + (size_t)i * env->words64;
    for (int w = 0; w < env->words64; w++) explored += pg_popcount64(visited[w]);
    double length = (double)env->step[i];
    int first = env->first_delivery[i];
    double values[8] = {
        total / n,
        length,
        (double)delivered,
        (double)confirmed,
        delivered == m ? 1.0 : 0.0,
        first >= 0 ? (double)first : (double)env->max_steps,
        (double)env->connected_steps[i] / ((double)n * length),
        (double)explored / (double)env->cells,
    };
    pg_stats_record(&env->pg, i, values);
}

/* Small fills that GCC would otherwise turn into memset calls (a call per
 * drone row costs more than the stores themselves). */
#if defined(PG_GPU)
#define DS_NO_MEMSET
#elif defined(__GNUC__) && !defined(__clang__)
#define DS_NO_MEMSET __attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
#else
#define DS_NO_MEMSET __attribute__((noinline))
#endif

PG_DEVICE DS_NO_MEMSET static void ds_zero_slots(float *obs, int n, int dim) {
    for (int d = 0; d < n; d++)
        for (int s = 10; s < dim; s++) obs[(size_t)d * dim + s] = 0.0f;
}

PG_DEVICE DS_NO_MEMSET static void ds_fill_flags(uint8_t *terminals, uint8_t *truncations, int n,
                                       uint8_t terminal, uint8_t truncated) {
    for (int d = 0; d < n; d++) {
        terminals[d] = terminal;
        truncations[d] = truncated;
    }
}

/* Per-block scratch (DS_BLOCK_ROWS): per-drone inputs and outputs of the
 * block-wide passes, indexed by drone within the block (old_x/old_y: positions
 * before the move, for obstacles), and per instance of the block the
 * end-of-episode flags. On the CPU arrays on the stepping thread's stack (about
 * 58 KB); on the GPU, where a block is one instance, that instance's DsRows
 * (ds_block_rows). */
typedef struct {
#ifdef PG_GPU
#define DS_BLOCK_MEMBER(type, name, length) DsRow<type> name;
#else
#define DS_BLOCK_MEMBER(type, name, length) type name[DS_BLOCK_DRONES];
#endif
    DS_BLOCK_ROWS(DS_BLOCK_MEMBER)
#undef DS_BLOCK_MEMBER
} DsScratch;

#ifdef PG_GPU
PG_DEVICE static inline void ds_block_rows(const Env *env, int i, DsScratch *sc) {
#define DS_BLOCK_ROW(type, name, length) sc->name = ds_row<type>(env, i, DS_W_##name);
    DS_BLOCK_ROWS(DS_BLOCK_ROW)
#undef DS_BLOCK_ROW
}
#endif

/* ---- one step: spec phases 3-8 of one instance ---------------------------------
 * Called by ds_core_instance, in the spec's order ("One step, in order" in
 * docs/drone_swarm_spec.md), once phases 1-2 ran for the whole block. Each
 * function is one phase (or the per-instance part of one) and is named after
 * its number. Drone d of instance i is bit d of the uint64 masks. */

/* Phases 1-2's scan flags of instance i (scan: the block scratch's rows) as a
 * mask; they are also kept in the state (env->scanning). */
PG_DEVICE static inline uint64_t ds_scan_mask(Env *env, int i, DS_CROW(int32_t) scan) {
    const int n = env->n;
    const size_t od = (size_t)i * n;
    uint64_t scanning = 0;
    for (int d = 0; d < n; d++) {
        scanning |= (uint64_t)scan[d] << d;
        env->scanning[od + d] = (uint8_t)scan[d];
    }
    return scanning;
}

/* 3. Connectivity, instance i: live drones within r_comm of the base are
 * connected, and the connected set grows over links between live drones within
 * r_comm (with p_comm_drop > 0 each such link fails with that probability: the
 * base links of drones 0..n-1, then the pairs a < b in order); last_comm_age is
 * 0 for connected drones, else +1. The same pair pass gives every drone's
 * neighbour count and squared nearest-neighbour distance (observations, phase 7
 * dispersion). Returns the connected set. */
PG_DEVICE static uint64_t ds_phase3_connectivity(Env *env, int i, uint64_t alive,
                                                 DS_ROW(int32_t) count, DS_ROW(float) nearest2) {
    const int n = env->n;
    const size_t od = (size_t)i * n;
    uint64_t *rng = &env->pg.rng[i];
    const float r_comm = env->ep_r_comm[i], r2 = r_comm * r_comm;
    DS_SCRATCH(uint64_t, adjacency, DS_MAX_DRONES);
    ds_pairs(env, i, alive, r2, count, nearest2, adjacency);
    uint64_t base = ds_base_links(env, i, alive, r2);
    const float p_drop = env->ep_p_drop[i];
    if (p_drop > 0.0f) {
        for (int d = 0; d < n; d++)
            if ((base >> d) & 1)
                if (!(pg_uniform(rng) >= p_drop)) base &= ~(1ULL << d);
        for (int a = 0; a < n; a++) {
            /* links to b > a, ascending; (2 << 63) wraps to 0, so a = 63 has none */
            uint64_t later = adjacency[a] & ~((2ULL << a) - 1);
            while (later) {
                int b = pg_ctz64(later);
                later &= later - 1;
                if (!(pg_uniform(rng) >= p_drop)) {
                    adjacency[a] &= ~(1ULL << b);
                    adjacency[b] &= ~(1ULL << a);
                }
            }
        }
    }
    uint64_t connected = ds_closure(base, adjacency);
    int connected_count = 0;
    for (int d = 0; d < n; d++) {
        int is_connected = (int)((connected >> d) & 1);
        connected_count += is_connected;
        env->connected[od + d] = is_connected ? 1.0f : 0.0f;
        env->age[od + d] = is_connected ? 0 : env->age[od + d] + 1;
    }
    env->connected_steps[i] += connected_count;
    return connected;
}

/* The squared distances scanning drone -> victim that phases 4 and 6 read (see
 * ds_victim_sight): on the CPU an n x m matrix (row d: drone d), filled once a
 * step; on the GPU recomputed where read (ds_sight_d2, see "scratch"). DS_SIGHT
 * declares one, with the CPU's matrix on the stack. */
#ifdef PG_GPU
typedef struct {
    float reach2; /* the largest of the ranges: pairs beyond it are never tested for sight */
} DsSight;
#define DS_SIGHT(name) DsSight name
#else
typedef struct {
    float *d2;
    size_t m;
} DsSight;
#define DS_SIGHT(name)                                   \
    float name##_d2[DS_MAX_DRONES * DS_MAX_VICTIMS];     \
    DsSight name = {name##_d2, 0}
#endif

/* Drone d's squared distance to victim v (+inf when an obstacle hides it). */
PG_DEVICE static inline float ds_sight(const Env *env, int i, DsSight sight, int d, int v) {
#ifdef PG_GPU
    return ds_sight_d2(env, i, d, v, sight.reach2);
#else
    (void)env;
    (void)i;
    return sight.d2[(size_t)d * sight.m + v];
#endif
}

/* Fills *sight for the scanning drones of instance i and, per scanning drone d,
 * counts[3d .. 3d + 2] (ds_victim_scan's counts, with the statuses before phases
 * 4-5). Returns whether some scanning drone has a victim within
 * r_confirm_radius (else phase 4 has no candidate). */
PG_DEVICE static int ds_victim_sight(const Env *env, int i, uint64_t scanning, DsSight *sight,
                                     DS_ROW(int32_t) counts) {
    const float rc2 = env->r_confirm_radius * env->r_confirm_radius;
    const float rs2 = env->r_sense * env->r_sense;
    const float near_radius = 2.0f * env->r_confirm_radius, near2 = near_radius * near_radius;
    DS_SCRATCH(int32_t, scanners, DS_MAX_DRONES);
    int num_scanners = 0, any_confirm = 0;
    for (uint64_t s = scanning; s; s &= s - 1) scanners[num_scanners++] = pg_ctz64(s);
#ifdef PG_GPU
    float reach2 = rs2 > rc2 ? rs2 : rc2; /* the pairs ds_occlude tests */
    reach2 = reach2 > near2 ? reach2 : near2;
    sight->reach2 = reach2;
    ds_sight_counts(env, i, num_scanners, scanners, rc2, rs2, near2, reach2, counts);
#else
    const int m = env->m;
    const size_t od = (size_t)i * env->n, ov = (size_t)i * m;
    const float *x = env->x + od, *y = env->y + od, *vx = env->vx + ov, *vy = env->vy + ov;
    const int32_t *status = env->status + ov;
    sight->m = (size_t)m;
    if (num_scanners)
        ds_victim_scan((size_t)num_scanners, scanners, x, y, (size_t)m, vx, vy, status, rc2, rs2,
                       near2, sight->d2, counts);
    if (num_scanners && env->n_obstacles)
        ds_occlude(env, i, num_scanners, scanners, x, y, vx, vy, status, rc2, rs2, near2,
                   sight->d2, counts);
#endif
    for (int j = 0; j < num_scanners; j++) any_confirm |= counts[3 * scanners[j]];
    return any_confirm;
}

/* 4. Confirmation, instance i, for each victim not yet confirmed: the nearest
 * candidate within r_confirm_radius, ties to the lower index (candidates: the
 * scanning drones, or none when ds_victim_sight found no victim that close to
 * any). If it is the confirming drone, progress + 1; otherwise it becomes the
 * confirming drone with progress 1; with none, progress and drone reset. At
 * this episode's t_confirm the victim is confirmed, owned by that drone, with a
 * delivery window of m_deliver steps; confirmations[d] counts drone d's. */
PG_DEVICE static void ds_phase4_confirmation(Env *env, int i, DsSight sight, uint64_t candidates,
                                             DS_ROW(int32_t) confirmations) {
    const int m = env->m;
    const size_t ov = (size_t)i * m;
    int32_t *status = env->status + ov;
    const float rc2 = env->r_confirm_radius * env->r_confirm_radius;
    const int t_confirm = env->ep_t_confirm[i], m_deliver = env->ep_m_deliver[i];
    for (int v = 0; v < m; v++) {
        if (status[v] != DS_UNKNOWN) continue;
        int best = -1;
        float best2 = INFINITY;
        for (uint64_t s = candidates; s; s &= s - 1) {
            int d = pg_ctz64(s);
            float d2 = ds_sight(env, i, sight, d, v);
            if (d2 <= rc2 && d2 < best2) {
                best2 = d2;
                best = d;
            }
        }
        int32_t *progress = &env->progress[ov + v], *drone = &env->confirm_drone[ov + v];
        if (best < 0) {
            *progress = 0;
            *drone = -1;
            continue;
        }
        *progress = best == *drone ? *progress + 1 : 1;
        *drone = best;
        if (*progress >= t_confirm) {
            status[v] = DS_CONFIRMED;
            env->owner[ov + v] = best;
            env->window[ov + v] = m_deliver;
            env->ever_confirmed[ov + v] = 1;
            *progress = 0;
            *drone = -1;
            confirmations[best]++;
        }
    }
}

/* 5. Delivery, instance i, for each confirmed victim (this step's confirmations
 * too): delivered when its owner is connected; otherwise its window counts down,
 * and once it has run out the report is lost and the victim unknown again.
 * delivered[d] / lost[d] count drone d's reports (the owner's reward terms).
 * Also records the step of the first delivery, and whether a victim still has
 * a confirmation going or a report waiting (else the next step may skip phases
 * 4-5). Returns the victims delivered; *changed is set when there was a
 * confirmed victim (statuses may then differ from those before phase 4). */
PG_DEVICE static int ds_phase5_delivery(Env *env, int i, uint64_t connected,
                                        DS_ROW(int32_t) delivered, DS_ROW(int32_t) lost,
                                        int *changed) {
    const int m = env->m;
    const size_t ov = (size_t)i * m;
    int32_t *status = env->status + ov;
    int delivered_now = 0, pending = 0;
    for (int v = 0; v < m; v++) {
        if (status[v] == DS_CONFIRMED) {
            *changed = 1;
            int owner = env->owner[ov + v];
            if ((connected >> owner) & 1) {
                status[v] = DS_DELIVERED;
                delivered_now++;
                delivered[owner]++;
            } else if (env->window[ov + v] == 0) {
                status[v] = DS_UNKNOWN;
                env->owner[ov + v] = -1;
                lost[owner]++;
            } else {
                env->window[ov + v]--;
            }
        }
        pending |= (env->progress[ov + v] > 0) | (env->confirm_drone[ov + v] >= 0) |
                   (status[v] == DS_CONFIRMED);
    }
    env->victims_pending[i] = (uint8_t)pending;
    if (delivered_now > 0 && env->first_delivery[i] < 0) env->first_delivery[i] = env->step[i] + 1;
    return delivered_now;
}

/* 6. Detections, instance i, written straight into the observation slots: each
 * scanning drone detects each undelivered victim within r_sense with
 * probability p = clamp((1 - d / r_sense) * detect_prob_scale, 0, 1), one draw
 * per such pair in (drone, victim) order, and keeps the obs_n_nearest detected
 * ones, nearest first, as (dx / L, dy / L, p); slots are zero where empty and
 * for drones that do not scan. counts: ds_victim_sight's, which let a drone with
 * nothing in range skip the victims unless phases 4-5 `changed` statuses.
 * Returns the scanning drones with an unknown victim within 2 * r_confirm_radius
 * (phase 7's scan-near term). */
PG_DEVICE static uint64_t ds_phase6_detections(Env *env, int i, DsSight sight, uint64_t scanning,
                                               DS_CROW(int32_t) counts, int changed) {
    const int n = env->n, m = env->m, k = env->k, dim = env->obs_dim;
    const size_t od = (size_t)i * n, ov = (size_t)i * m;
    const float *x = env->x + od, *y = env->y + od, *vx = env->vx + ov, *vy = env->vy + ov;
    const int32_t *status = env->status + ov;
    float *obs = (float *)env->pg.observations;
    uint64_t *rng = &env->pg.rng[i];
    const float size = env->world_size, scale = env->detect_prob_scale;
    const float rs2 = env->r_sense * env->r_sense, r_sense = env->r_sense;
    const float near_radius = 2.0f * env->r_confirm_radius, near2 = near_radius * near_radius;
    uint64_t scan_near = 0;
    if (k > 0) ds_zero_slots(obs + od * dim, n, dim);
    for (uint64_t s = scanning; s; s &= s - 1) {
        int d = pg_ctz64(s);
        float *slots = obs + (od + d) * dim + 10;
        if (!changed && counts[3 * d + 1] == 0) { /* nothing in sensing range */
            scan_near |= (uint64_t)(counts[3 * d + 2] > 0) << d;
            continue;
        }
        DS_SCRATCH(float, slot_d2, DS_MAX_NEAREST);
        int found = 0, near = 0;
        for (int v = 0; v < m; v++) {
            float d2 = ds_sight(env, i, sight, d, v);
            near |= (status[v] == DS_UNKNOWN) & (d2 <= near2);
            if (!(d2 <= rs2) || status[v] == DS_DELIVERED) continue;
            float u = pg_uniform(rng);
            float p = pg_clampf((1.0f - sqrtf(d2) / r_sense) * scale, 0.0f, 1.0f);
            if (!(u < p) || k == 0) continue;
            if (found == k && !(d2 < slot_d2[k - 1])) continue;
            int pos = found < k ? found++ : k - 1;
            while (pos > 0 && slot_d2[pos - 1] > d2) {
                slot_d2[pos] = slot_d2[pos - 1];
                slots[3 * pos + 0] = slots[3 * pos - 3];
                slots[3 * pos + 1] = slots[3 * pos - 2];
                slots[3 * pos + 2] = slots[3 * pos - 1];
                pos--;
            }
            slot_d2[pos] = d2;
            slots[3 * pos + 0] = pg_clampf((vx[v] - x[d]) / size, -1.0f, 1.0f);
            slots[3 * pos + 1] = pg_clampf((vy[v] - y[d]) / size, -1.0f, 1.0f);
            slots[3 * pos + 2] = p;
        }
        scan_near |= (uint64_t)near << d;
    }
    return scan_near;
}

/* 7. The exploration term, instance i, drone by drone in index order (cell: the
 * cells after phase 1; active: drones with battery before phase 2): 1 for
 * entering a cell no drone has visited this episode, plus 0.5 for one this drone
 * has not; the visits are recorded. */
PG_DEVICE static void ds_phase7_exploration(Env *env, int i, DS_CROW(int32_t) cell,
                                            DS_CROW(int32_t) active, DS_ROW(float) explore) {
    const int n = env->n, words = env->words64;
    uint64_t *visited = env->visited + (size_t)i * words;
    uint64_t *own = env->own_visited + (size_t)i * n * words;
    for (int d = 0; d < n; d++) {
        int c = cell[d];
        uint64_t bit = 1ULL << (c & 63), on = active[d] ? bit : 0;
        uint64_t *global_word = &visited[c >> 6], *own_word = &own[(size_t)d * words + (c >> 6)];
        float global_new = (on & ~*global_word) ? 1.0f : 0.0f;
        float own_new = (on & ~*own_word) ? 0.5f : 0.0f;
        explore[d] = global_new + own_new;
        *global_word |= on;
        *own_word |= on;
    }
}

/* 7. Instance i's inputs of the block-wide rewards and observations (its rows
 * j0 .. j0 + n - 1 of the scratch; ds_rewards adds the terms), then the step
 * counter + 1. delivered_now: phase 5's deliveries; the owners' own terms are
 * added to their share in this order (the reference's). */
PG_DEVICE static void ds_phase7_reward_inputs(Env *env, int i, DsScratch *sc, int j0,
                                              int delivered_now, uint64_t alive,
                                              uint64_t scan_near,
                                              DS_CROW(int32_t) confirmations,
                                              DS_CROW(int32_t) delivered, DS_CROW(int32_t) lost) {
    const int n = env->n;
    const float r_comm = env->ep_r_comm[i];
    float share = env->r_found * (float)delivered_now;
    if (env->divide_found) share = share / (float)n;
    for (int d = 0; d < n; d++) {
        sc->confirmations[j0 + d] = (float)confirmations[d];
        sc->scan_near[j0 + d] = (float)((scan_near >> d) & 1);
        sc->alive[j0 + d] = (float)((alive >> d) & 1);
        float mine = share + env->r_deliver_owner * (float)delivered[d];
        sc->share[j0 + d] = mine + env->r_report_lost * (float)lost[d];
        sc->r_comm[j0 + d] = r_comm;
    }
    env->step[i]++;
}

/* 8. End test, instance i (acted on by ds_end_instance after the block's
 * observations are written): terminal when every victim is delivered or every
 * battery is empty, else truncated once the step counter reaches max_steps. */
PG_DEVICE static void ds_phase8_end_test(const Env *env, int i, uint64_t alive, DsScratch *sc,
                                         int b) {
    const int m = env->m;
    const int32_t *status = env->status + (size_t)i * m;
    int all_delivered = 1;
    for (int v = 0; v < m; v++) all_delivered &= status[v] == DS_DELIVERED;
    int terminal = all_delivered | (alive == 0);
    sc->terminal[b] = (uint8_t)terminal;
    sc->truncated[b] = (uint8_t)(!terminal & (env->step[i] >= env->max_steps));
}

/* Phases 3-8 of instance i, the block's b-th instance, whose drones are rows j0 ..
 * j0 + n - 1 of the block scratch: phases 1-2 already ran for the whole block;
 * phase 7's rewards and observation features, and phase 8's resets, follow for
 * the block (env_step). Profiling (DS_TICK) times the phase calls, here and in
 * env_step only. */
PG_DEVICE static void ds_core_instance(Env *env, int i, DsScratch *sc, int j0, int b) {
    const int n = env->n;
    DS_TICK_START();
    const uint64_t alive = ds_alive_mask(env, i); /* battery left after phase 2 */
    const uint64_t scanning = ds_scan_mask(env, i, sc->scan + j0);
    DS_TICK(DS_PH_MOVE);

    const uint64_t connected =
        ds_phase3_connectivity(env, i, alive, sc->neighbours + j0, sc->nearest2 + j0);
    DS_TICK(DS_PH_CONNECT);

    DS_SIGHT(sight);
    DS_SCRATCH(int32_t, victim_counts, DS_MAX_DRONES * 3);
    const int any_confirm = ds_victim_sight(env, i, scanning, &sight, victim_counts);
    DS_SCRATCH(int32_t, confirmation_count, DS_MAX_DRONES);
    DS_SCRATCH(int32_t, own_delivered, DS_MAX_DRONES);
    DS_SCRATCH(int32_t, own_lost, DS_MAX_DRONES);
    for (int d = 0; d < n; d++) confirmation_count[d] = own_delivered[d] = own_lost[d] = 0;
    int delivered_now = 0, changed = 0;
    /* With no scanning drone near a victim, no confirmation in progress and no
     * report waiting, phases 4-5 change nothing: skip them. */
    if (any_confirm || env->victims_pending[i]) {
        ds_phase4_confirmation(env, i, sight, any_confirm ? scanning : 0, confirmation_count);
        delivered_now = ds_phase5_delivery(env, i, connected, own_delivered, own_lost, &changed);
    }
    DS_TICK(DS_PH_CONFIRM);

    const uint64_t scan_near =
        ds_phase6_detections(env, i, sight, scanning, victim_counts, changed);
    DS_TICK(DS_PH_DETECT);

    /* 7, this instance's part: the observation columns after the detection
     * slots, the exploration term (nothing in phases 3-6 reads the visited
     * cells), the inputs of the block's rewards and the step counter */
    ds_extra_columns(env, i, (float *)env->pg.observations);
    ds_phase7_exploration(env, i, sc->cell + j0, sc->active + j0, sc->explore + j0);
    ds_phase7_reward_inputs(env, i, sc, j0, delivered_now, alive, scan_near, confirmation_count,
                            own_delivered, own_lost);
    DS_TICK(DS_PH_REWARD_OBS);

    ds_phase8_end_test(env, i, alive, sc, b);
    DS_TICK(DS_PH_END);
}

/* 8. End of episode, instance i: flags, and for a finished episode its final
 * observation, statistics and reset. */
PG_DEVICE static void ds_end_instance(Env *env, int i, uint8_t terminal, uint8_t truncated) {
    PgBatch *pg = &env->pg;
    const int n = env->n, dim = env->obs_dim;
    const size_t od = (size_t)i * n;
    ds_fill_flags(pg->terminals + od, pg->truncations + od, n, terminal, truncated);
    if (terminal | truncated) {
        float *obs = (float *)pg->observations;
        memcpy((float *)pg->final_observations + od * dim, obs + od * dim,
               (size_t)n * dim * sizeof(float));
        if (pg->final_states)
            env_global_state(env, i, pg->final_states + (size_t)i * (size_t)pg->state_dim);
        ds_record_episode(env, i);
        ds_reset_instance(env, i);
    }
}

/* A step runs block by block (about DS_BLOCK_DRONES drones of consecutive
 * instances, so the scratch stays in L1/L2), in the spec's phase order:
 *   phases 1-2 (movement, battery) for every drone of the block in one
 *     vectorized call (ds_move), then the obstacle stops (ds_obstacle_move);
 *   phases 3-6, and the per-instance parts of 7 and 8, instance by instance
 *     (ds_core_instance);
 *   phase 7 rewards and observation features for the whole block, two
 *     vectorized calls (ds_rewards, ds_features);
 *   phase 8, the ends of episodes and resets (ds_end_instance).
 * DS_TICK charges the time of each to its profiling bucket. */
PG_DEVICE static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    const int n = env->n, dim = env->obs_dim;
#ifdef PG_GPU
    const int per_block = 1; /* the block's rows are instance `first`'s DsRows */
#else
    const int per_block = DS_BLOCK_DRONES / n;
#endif
    DsScratch sc;
    DS_PROFILE_CALL_START();
    for (int first = start; first < end; first += per_block) {
        const int last = first + per_block < end ? first + per_block : end;
        const size_t d0 = (size_t)first * n, count = (size_t)(last - first) * n;
#ifdef PG_GPU
        ds_block_rows(env, first, &sc);
#endif
        DS_TICK_START();
        if (env->n_obstacles) {
#ifdef PG_GPU
            for (size_t d = 0; d < count; d++) {
                sc.old_x[d] = env->x[d0 + d];
                sc.old_y[d] = env->y[d0 + d];
            }
#else
            memcpy(sc.old_x, env->x + d0, count * sizeof(float));
            memcpy(sc.old_y, env->y + d0, count * sizeof(float));
#endif
        }
        ds_move(env, count, (const float *)pg->actions + d0 * 3, env->x + d0, env->y + d0,
                env->battery + d0, sc.speed2, sc.cell, sc.active, sc.scan);
        if (env->n_obstacles)
            for (int i = first; i < last; i++) {
                const size_t j0 = (size_t)(i - first) * n;
                ds_obstacle_move(env, i, sc.old_x + j0, sc.old_y + j0, sc.cell + j0);
            }
        DS_TICK(DS_PH_MOVE);
        for (int i = first; i < last; i++) ds_core_instance(env, i, &sc, (i - first) * n, i - first);
        DS_TICK_RESTART(); /* ds_core_instance charged its own time */
        ds_rewards(env, count, sc.share, sc.speed2, sc.confirmations, sc.explore, sc.scan_near,
                   sc.alive, env->connected + d0, sc.nearest2, pg->rewards + d0, env->returns + d0);
        ds_features(env, count, sc.r_comm, env->x + d0, env->y + d0, env->battery + d0,
                    env->connected + d0, env->age + d0, sc.neighbours, sc.nearest2,
                    (float *)pg->observations + d0 * dim, (size_t)dim);
        DS_TICK(DS_PH_REWARD_OBS);
        for (int i = first; i < last; i++)
            ds_end_instance(env, i, sc.terminal[i - first], sc.truncated[i - first]);
        DS_TICK(DS_PH_END);
    }
    DS_PROFILE_CALL_END(end - start);
}

/* ---- exact state ---------------------------------------------------------------- */

PG_DEVICE static int env_state_size(const Env *env) {
    return DS_HEADER + DS_DRONE_FIELDS * env->n + DS_VICTIM_FIELDS * env->m +
           env->words32 * (1 + env->n) + DS_OBSTACLE_FIELDS * env->n_obstacles;
}

PG_DEVICE static inline double ds_word32(const uint64_t *words64, int w) {
    return (double)((words64[w >> 1] >> (32 * (w & 1))) & 0xFFFFFFFFULL);
}

PG_DEVICE static void env_get_state(const Env *env, int i, double *out) {
    const int n = env->n, m = env->m;
    const size_t od = (size_t)i * n, ov = (size_t)i * m;
    out[0] = env->step[i];
    out[1] = env->ep_r_comm[i];
    out[2] = env->ep_p_drop[i];
    out[3] = env->ep_t_confirm[i];
    out[4] = env->ep_m_deliver[i];
    out[5] = env->first_delivery[i];
    out[6] = (double)env->connected_steps[i];
    double *drone = out + DS_HEADER;
    for (int d = 0; d < n; d++, drone += DS_DRONE_FIELDS) {
        drone[0] = env->x[od + d];
        drone[1] = env->y[od + d];
        drone[2] = env->battery[od + d];
        drone[3] = env->connected[od + d];
        drone[4] = env->age[od + d];
        drone[5] = env->returns[od + d];
        drone[6] = env->scanning[od + d];
    }
    double *victim = drone;
    for (int v = 0; v < m; v++, victim += DS_VICTIM_FIELDS) {
        victim[0] = env->vx[ov + v];
        victim[1] = env->vy[ov + v];
        victim[2] = env->status[ov + v];
        victim[3] = env->confirm_drone[ov + v];
        victim[4] = env->progress[ov + v];
        victim[5] = env->owner[ov + v];
        victim[6] = env->window[ov + v];
        victim[7] = env->ever_confirmed[ov + v];
    }
    double *bits = victim;
    const uint64_t *visited = env->visited + (size_t)i * env->words64;
    for (int w = 0; w < env->words32; w++) *bits++ = ds_word32(visited, w);
    for (int d = 0; d < n; d++) {
        const uint64_t *own = env->own_visited + (od + d) * env->words64;
        for (int w = 0; w < env->words32; w++) *bits++ = ds_word32(own, w);
    }
    const float *ob = ds_obstacles_of(env, i);
    for (int o = 0; o < env->n_obstacles; o++, bits += DS_OBSTACLE_FIELDS) {
        int present = o < env->obstacle_count[i];
        bits[0] = present;
        for (int f = 0; f < 4; f++) bits[1 + f] = present ? ob[4 * o + f] : 0.0;
    }
}

PG_DEVICE static inline int ds_is_int(double v, double lo, double hi) {
    return v >= lo && v <= hi && v == floor(v);
}

PG_DEVICE static int env_set_state(Env *env, int i, const double *in) {
    const int n = env->n, m = env->m;
    const double size = env->world_size;
    /* validate everything before writing anything (same rules as reference.state_is_valid) */
    if (!ds_is_int(in[0], 0, env->max_steps - 1) || !(in[1] >= 0.001 && in[1] <= 1e4) ||
        !(in[2] >= 0.0 && in[2] <= 1.0) || !ds_is_int(in[3], 1, 1e6) || !ds_is_int(in[4], 0, 1e6) ||
        !ds_is_int(in[5], -1, 1e7) || !ds_is_int(in[6], 0, 1e9))
        return -1;
    const double *drone = in + DS_HEADER;
    for (int d = 0; d < n; d++, drone += DS_DRONE_FIELDS) {
        if (!(drone[0] >= 0 && drone[0] <= size && drone[1] >= 0 && drone[1] <= size)) return -1;
        if (!(drone[2] >= 0 && drone[2] <= 1)) return -1;
        if (!ds_is_int(drone[3], 0, 1) || !ds_is_int(drone[4], 0, 1e9) || !ds_is_int(drone[6], 0, 1))
            return -1;
        if (!isfinite(drone[5]) || fabs(drone[5]) > 3.0e38) return -1;
    }
    const double *victim = drone;
    for (int v = 0; v < m; v++, victim += DS_VICTIM_FIELDS) {
        if (!(victim[0] >= 0 && victim[0] <= size && victim[1] >= 0 && victim[1] <= size)) return -1;
        if (!ds_is_int(victim[2], 0, 2) || !ds_is_int(victim[3], -1, n - 1) ||
            !ds_is_int(victim[4], 0, 1e6) || !ds_is_int(victim[5], -1, n - 1) ||
            !ds_is_int(victim[6], 0, 1e6) || !ds_is_int(victim[7], 0, 1))
            return -1;
        if (victim[2] == DS_CONFIRMED && victim[5] < 0) return -1;
    }
    const double *bits = victim;
    for (int w = 0; w < env->words32 * (1 + n); w++)
        if (!ds_is_int(bits[w], 0, 4294967295.0)) return -1;
    /* obstacles: present 0/1, corners in the world, x0 < x1, y0 < y1, interiors
     * disjoint, no drone inside one */
    const double *obst = bits + (size_t)env->words32 * (1 + n);
    for (int o = 0; o < env->n_obstacles; o++) {
        const double *a = obst + DS_OBSTACLE_FIELDS * o;
        if (!ds_is_int(a[0], 0, 1)) return -1;
        for (int f = 1; f < 5; f++)
            if (!(a[f] >= 0.0 && a[f] <= size)) return -1;
        if (a[0] == 0.0) continue;
        if (!((float)a[1] < (float)a[3] && (float)a[2] < (float)a[4])) return -1;
        float rect[4] = {(float)a[1], (float)a[2], (float)a[3], (float)a[4]};
        drone = in + DS_HEADER;
        for (int d = 0; d < n; d++, drone += DS_DRONE_FIELDS)
            if (ds_inside_any(rect, 1, (float)drone[0], (float)drone[1])) return -1;
        for (int q = 0; q < o; q++) {
            const double *b = obst + DS_OBSTACLE_FIELDS * q;
            if (b[0] != 0.0 && (float)a[1] < (float)b[3] && (float)b[1] < (float)a[3] &&
                (float)a[2] < (float)b[4] && (float)b[2] < (float)a[4])
                return -1;
        }
    }

    const size_t od = (size_t)i * n, ov = (size_t)i * m;
    env->step[i] = (int32_t)in[0];
    env->ep_r_comm[i] = (float)in[1];
    env->ep_p_drop[i] = (float)in[2];
    env->ep_t_confirm[i] = (int32_t)in[3];
    env->ep_m_deliver[i] = (int32_t)in[4];
    env->first_delivery[i] = (int32_t)in[5];
    env->connected_steps[i] = (int64_t)in[6];
    drone = in + DS_HEADER;
    for (int d = 0; d < n; d++, drone += DS_DRONE_FIELDS) {
        env->x[od + d] = (float)drone[0];
        env->y[od + d] = (float)drone[1];
        env->battery[od + d] = (float)drone[2];
        env->connected[od + d] = (float)drone[3];
        env->age[od + d] = (int32_t)drone[4];
        env->returns[od + d] = (float)drone[5];
        env->scanning[od + d] = (uint8_t)drone[6];
    }
    victim = drone;
    for (int v = 0; v < m; v++, victim += DS_VICTIM_FIELDS) {
        env->vx[ov + v] = (float)victim[0];
        env->vy[ov + v] = (float)victim[1];
        env->status[ov + v] = (int32_t)victim[2];
        env->confirm_drone[ov + v] = (int32_t)victim[3];
        env->progress[ov + v] = (int32_t)victim[4];
        env->owner[ov + v] = (int32_t)victim[5];
        env->window[ov + v] = (int32_t)victim[6];
        env->ever_confirmed[ov + v] = (uint8_t)victim[7];
    }
    int pending = 0;
    for (int v = 0; v < m; v++)
        pending |= (env->progress[ov + v] > 0) | (env->confirm_drone[ov + v] >= 0) |
                   (env->status[ov + v] == DS_CONFIRMED);
    env->victims_pending[i] = (uint8_t)pending;
    /* bitsets: 32-bit words in, 64-bit words here; bits past the last cell are dropped */
    const int words64 = env->words64, cells = env->cells;
    for (int set = 0; set <= n; set++) {
        uint64_t *dst = set == 0 ? env->visited + (size_t)i * words64
                                 : env->own_visited + (od + set - 1) * words64;
        const double *src = bits + (size_t)set * env->words32;
        for (int w = 0; w < words64; w++) dst[w] = 0;
        for (int w = 0; w < env->words32; w++)
            dst[w >> 1] |= (uint64_t)src[w] << (32 * (w & 1));
        if (cells % 64) dst[words64 - 1] &= (1ULL << (cells % 64)) - 1;
    }
    /* obstacles, the present ones first */
    float *placed = env->obstacles + (size_t)i * 4 * (size_t)env->n_obstacles;
    int count = 0;
    for (int o = 0; o < env->n_obstacles; o++) {
        const double *a = obst + DS_OBSTACLE_FIELDS * o;
        if (a[0] == 0.0) continue;
        for (int f = 0; f < 4; f++) placed[4 * count + f] = (float)a[1 + f];
        count++;
    }
    for (int f = 4 * count; f < 4 * env->n_obstacles; f++) placed[f] = 0.0f;
    env->obstacle_count[i] = count;
    ds_observe_state(env, i);
    return 0;
}

#endif /* PEREGRINE_DRONE_SWARM_H */
