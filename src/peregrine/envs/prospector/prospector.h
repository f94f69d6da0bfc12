/*
 * prospector.h -- Prospector, an asteroid-belt prospecting game, in C.
 *
 * The full rules, the 260-float observation and the 69 actions are specified
 * in docs/prospector.md; reference.py is the same game in readable Python.
 * This header reads top to bottom like that spec:
 *
 *   config and stats  -> the instance struct -> reset (RNG draw order)
 *   -> the action mask and the observation (one pass, shared by both)
 *   -> the step: action, motion, storms, hazards, respawns, market, end
 *   -> state get/set (a flat float64 layout, documented in the doc).
 *
 * Frozen interface: observation 260 float32, Discrete(69) int32 actions.
 *
 * Cost: every instance is a fixed-size struct (no pointers, no allocation
 * per step); the world is small (12 asteroids, 4 stations, 3 storms, 4 ore
 * types) and all geometry uses squared distances; the only square roots are
 * for steering and the four "nearest known asteroid" distances. The market
 * takes one splitmix64 draw per station per step (four 16-bit noises each).
 *
 * Parity: float32 throughout, built with -ffp-contract=off; every expression
 * is written in the operation order reference.py uses.
 */
#ifndef PEREGRINE_PROSPECTOR_H
#define PEREGRINE_PROSPECTOR_H


#include "pg_env.h"

/* The GPU step's observation pass keeps the nearest scanned asteroid's distance
 * and index per ore type (4 + 4 values), indexed by each asteroid's ore at run
 * time: 32 bytes of stack at sm_90. */
PG_GPU_STACK(64, "nearest asteroid per ore type, indexed by ore at run time")

/* ---- sizes (frozen by the interface) -------------------------------------- */
#define PR_ASTEROIDS 12
#define PR_STATIONS 4
#define PR_STORMS 3
#define PR_ORES 4
#define PR_MAX_LEVEL 3
#define PR_OBS_DIM 260
#define PR_ACTIONS 69

/* observation blocks: first index of each */
#define PR_OBS_SHIP 0
#define PR_OBS_ASTEROIDS 24 /* 12 x 9 */
#define PR_OBS_STATIONS 132 /* 4 x 9 */
#define PR_OBS_STORMS 168   /* 3 x 5 */
#define PR_OBS_BEST_PRICE 183
#define PR_OBS_NEAREST_ORE 187
#define PR_OBS_MASK 191 /* 69 */
#define PR_ASTEROID_FEATURES 9
#define PR_STATION_FEATURES 9
#define PR_STORM_FEATURES 5
#define PR_NO_ASTEROID_DISTANCE 2.0f

/* actions: first index of each group */
#define PR_A_WAIT 0
#define PR_A_THRUST 1  /* 8 compass directions N, NE, E, SE, S, SW, W, NW */
#define PR_A_BOOST 9   /* same 8 directions, boost_factor x thrust */
#define PR_A_BRAKE 17
#define PR_A_WIDE_SCAN 18
#define PR_A_SCAN 19   /* 12: scan asteroid i */
#define PR_A_MINE 31   /* 12: mine asteroid i */
#define PR_A_DOCK 43
#define PR_A_UNDOCK 44
#define PR_A_SELL 45   /* 4: sell all ore of type k */
#define PR_A_SELL_ALL 49
#define PR_A_BUY_FUEL 50
#define PR_A_FILL_FUEL 51
#define PR_A_REPAIR 52
#define PR_A_FULL_REPAIR 53
#define PR_A_JETTISON 54 /* 4: dump ore of type k */
#define PR_A_UPGRADE 58  /* 3: hold, drill, shield */
#define PR_A_STEER_STATION 61 /* 4: thrust toward station j */
#define PR_A_STEER_ORE 65     /* 4: thrust toward the nearest known asteroid of ore k */

/* X(name, default, min, max, is_integer) */
#define ENV_CONFIG(X)                          \
    X(max_steps, 1000, 1, 1e7, 1)              \
    X(world_size, 100, 10, 1e4, 0)             \
    X(start_credits, 50, 0, 1e6, 0)            \
    X(fuel_capacity, 100, 1, 1e6, 0)           \
    X(hull_max, 100, 1, 1e6, 0)                \
    X(thrust_accel, 0.25, 0, 100, 0)           \
    X(boost_factor, 2, 1, 10, 0)               \
    X(max_speed, 2, 0.01, 1000, 0)             \
    X(drag, 0.9, 0, 1, 0)                      \
    X(brake_factor, 0.25, 0, 1, 0)             \
    X(thrust_fuel, 0.3, 0, 1e3, 0)             \
    X(boost_fuel, 1.0, 0, 1e3, 0)              \
    X(idle_fuel, 0.02, 0, 1e3, 0)              \
    X(scan_fuel, 0.1, 0, 1e3, 0)               \
    X(wide_scan_fuel, 0.5, 0, 1e3, 0)          \
    X(mine_fuel, 0.1, 0, 1e3, 0)               \
    X(scan_range, 25, 0, 1e5, 0)               \
    X(wide_scan_range, 12, 0, 1e5, 0)          \
    X(mine_range, 3, 0, 1e5, 0)                \
    X(dock_range, 4, 0, 1e5, 0)                \
    X(dock_speed, 0.5, 0, 1e3, 0)              \
    X(collision_radius, 1, 0, 1e3, 0)          \
    X(safe_speed, 0.5, 0, 1e3, 0)              \
    X(collision_damage, 5, 0, 1e6, 0)          \
    X(storm_damage, 2, 0, 1e6, 0)              \
    X(storm_radius_min, 4, 0, 1e4, 0)          \
    X(storm_radius_max, 10, 0, 1e4, 0)         \
    X(storm_speed, 0.4, 0, 1e3, 0)             \
    X(hold_base, 20, 1, 1e6, 0)                \
    X(hold_step, 10, 0, 1e6, 0)                \
    X(drill_base, 1, 0.01, 1e6, 0)             \
    X(drill_step, 1, 0, 1e6, 0)                \
    X(shield_step, 0.2, 0, 0.33, 0)            \
    X(upgrade_cost, 250, 0, 1e9, 0)            \
    X(ore_min, 5, 0.01, 1e6, 0)                \
    X(ore_max, 40, 0.01, 1e6, 0)               \
    X(respawn_delay, 40, 1, 1e6, 1)            \
    X(price_ice, 4, 0.01, 1e6, 0)              \
    X(price_iron, 8, 0.01, 1e6, 0)             \
    X(price_cobalt, 16, 0.01, 1e6, 0)          \
    X(price_platinum, 32, 0.01, 1e6, 0)        \
    X(station_spread, 0.3, 0, 0.9, 0)          \
    X(price_reversion, 0.05, 0, 1, 0)          \
    X(price_volatility, 0.05, 0, 1, 0)         \
    X(price_min_frac, 0.5, 0.01, 1, 0)         \
    X(price_max_frac, 2, 1, 100, 0)            \
    X(sale_impact, 0.01, 0, 1, 0)              \
    X(fuel_price, 1, 0, 1e6, 0)                \
    X(repair_price, 2, 0, 1e6, 0)              \
    X(reward_scale, 0.01, 0, 1e3, 0)           \
    X(death_penalty, 1, 0, 1e6, 0)              \
    X(cargo_shaping, 0, 0, 10, 0)

enum { ENV_CONFIG(PG_CONFIG_INDEX) }; /* CFG_max_steps, CFG_world_size, ... */

#define ENV_STATS(X)                                                                   \
    X(episode_return) X(episode_length) X(ore_mined) X(ore_sold) X(credits) X(destroyed) \
    X(out_of_fuel) X(invalid_actions) X(upgrades)

/* Ore spawn odds (ice, iron, cobalt, platinum): cumulative thresholds on u. */
PG_TABLE float PR_ORE_CUMULATIVE[PR_ORES - 1] = {0.4f, 0.7f, 0.9f};
/* Compass unit vectors for thrust/boost: N, NE, E, SE, S, SW, W, NW. */
#define PR_DIAG 0.70710677f
PG_TABLE float PR_DIR_X[8] = {0.0f, PR_DIAG, 1.0f, PR_DIAG, 0.0f, -PR_DIAG, -1.0f, -PR_DIAG};
PG_TABLE float PR_DIR_Y[8] = {1.0f, PR_DIAG, 0.0f, -PR_DIAG, -1.0f, -PR_DIAG, 0.0f, PR_DIAG};
#define PR_CREDIT_OBS_SCALE 0.001f
#define PR_LEVEL_OBS_SCALE 0.33333334f
#define PR_STEER_MIN_DIST2 1e-6f

/* One game instance: fixed size, no pointers. */
typedef struct {
    /* ship */
    float x, y, vx, vy, fuel, hull, credits;
    float cargo[PR_ORES];
    int32_t docked; /* 0 = in flight, j + 1 = docked at station j */
    int32_t hold_level, drill_level, shield_level;
    int32_t steps, last_invalid;
    /* episode accumulators (for ENV_STATS) */
    float episode_return, ore_mined, ore_sold;
    int32_t invalid_actions, upgrades;
    /* asteroids: active iff timer == 0 */
    float ast_x[PR_ASTEROIDS], ast_y[PR_ASTEROIDS], ast_ore[PR_ASTEROIDS];
    int32_t ast_type[PR_ASTEROIDS], ast_scanned[PR_ASTEROIDS], ast_timer[PR_ASTEROIDS];
    /* stations */
    float st_x[PR_STATIONS], st_y[PR_STATIONS];
    float st_fuel_price[PR_STATIONS], st_repair_price[PR_STATIONS];
    float st_base[PR_STATIONS][PR_ORES], st_price[PR_STATIONS][PR_ORES];
    /* storms */
    float storm_x[PR_STORMS], storm_y[PR_STORMS], storm_vx[PR_STORMS], storm_vy[PR_STORMS];
    float storm_r[PR_STORMS];
    /* derived by prospector_observe (not part of the saved state) */
    uint64_t mask[2];              /* bit a: action a is valid */
    int32_t nearest_ore[PR_ORES];  /* nearest active scanned asteroid per ore, or -1 */
} PrInstance;

struct Env {
    PgBatch pg;
    /* config, float32 as the step uses it */
    int max_steps, respawn_delay;
    float world, start_credits, fuel_capacity, hull_max, thrust_accel, boost_accel, max_speed;
    float drag, brake_factor, thrust_fuel, boost_fuel, idle_fuel, scan_fuel, wide_scan_fuel;
    float mine_fuel, scan_range2, wide_scan_range2, mine_range2, dock_range2, dock_speed2;
    float collision_radius2, safe_speed2, collision_damage, storm_damage, storm_radius_min;
    float storm_radius_max, storm_speed, hold_base, hold_step, drill_base, drill_step;
    float shield_step, upgrade_cost, ore_min, ore_max, station_spread, price_reversion;
    float price_volatility, sale_impact, fuel_price, repair_price, reward_scale, death_penalty;
    float cargo_shaping;
    float ore_price[PR_ORES], price_lo[PR_ORES], price_hi[PR_ORES];
    /* observation scales (0 where the quantity they divide by is 0) */
    float inv_world, inv_max_speed, inv_fuel_capacity, inv_hull_max, inv_max_capacity;
    float inv_ore_max, inv_ore_price[PR_ORES], inv_fuel_price, inv_repair_price;
    float inv_storm_speed, inv_max_steps;
    PrInstance *instances;
};
typedef struct Env Env;

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
static float pr_inverse(float value) {
    return value > 0.0f ? 1.0f / value : 0.0f;
}

static int env_init(Env *env, const double *config, char *err, size_t errlen) {
    env->max_steps = (int)config[CFG_max_steps];
    env->world = (float)config[CFG_world_size];
    env->start_credits = (float)config[CFG_start_credits];
    env->fuel_capacity = (float)config[CFG_fuel_capacity];
    env->hull_max = (float)config[CFG_hull_max];
    env->thrust_accel = (float)config[CFG_thrust_accel];
    float boost_factor = (float)config[CFG_boost_factor];
    env->boost_accel = env->thrust_accel * boost_factor;
    env->max_speed = (float)config[CFG_max_speed];
    env->drag = (float)config[CFG_drag];
    env->brake_factor = (float)config[CFG_brake_factor];
    env->thrust_fuel = (float)config[CFG_thrust_fuel];
    env->boost_fuel = (float)config[CFG_boost_fuel];
    env->idle_fuel = (float)config[CFG_idle_fuel];
    env->scan_fuel = (float)config[CFG_scan_fuel];
    env->wide_scan_fuel = (float)config[CFG_wide_scan_fuel];
    env->mine_fuel = (float)config[CFG_mine_fuel];
    float scan_range = (float)config[CFG_scan_range];
    float wide_scan_range = (float)config[CFG_wide_scan_range];
    float mine_range = (float)config[CFG_mine_range];
    float dock_range = (float)config[CFG_dock_range];
    float dock_speed = (float)config[CFG_dock_speed];
    float collision_radius = (float)config[CFG_collision_radius];
    float safe_speed = (float)config[CFG_safe_speed];
    env->scan_range2 = scan_range * scan_range;
    env->wide_scan_range2 = wide_scan_range * wide_scan_range;
    env->mine_range2 = mine_range * mine_range;
    env->dock_range2 = dock_range * dock_range;
    env->dock_speed2 = dock_speed * dock_speed;
    env->collision_radius2 = collision_radius * collision_radius;
    env->safe_speed2 = safe_speed * safe_speed;
    env->collision_damage = (float)config[CFG_collision_damage];
    env->storm_damage = (float)config[CFG_storm_damage];
    env->storm_radius_min = (float)config[CFG_storm_radius_min];
    env->storm_radius_max = (float)config[CFG_storm_radius_max];
    env->storm_speed = (float)config[CFG_storm_speed];
    env->hold_base = (float)config[CFG_hold_base];
    env->hold_step = (float)config[CFG_hold_step];
    env->drill_base = (float)config[CFG_drill_base];
    env->drill_step = (float)config[CFG_drill_step];
    env->shield_step = (float)config[CFG_shield_step];
    env->upgrade_cost = (float)config[CFG_upgrade_cost];
    env->ore_min = (float)config[CFG_ore_min];
    env->ore_max = (float)config[CFG_ore_max];
    env->respawn_delay = (int)config[CFG_respawn_delay];
    /* ore_price[k] in ore order: ice, iron, cobalt, platinum */
    env->ore_price[0] = (float)config[CFG_price_ice];
    env->ore_price[1] = (float)config[CFG_price_iron];
    env->ore_price[2] = (float)config[CFG_price_cobalt];
    env->ore_price[3] = (float)config[CFG_price_platinum];
    env->station_spread = (float)config[CFG_station_spread];
    env->price_reversion = (float)config[CFG_price_reversion];
    env->price_volatility = (float)config[CFG_price_volatility];
    float price_min_frac = (float)config[CFG_price_min_frac];
    float price_max_frac = (float)config[CFG_price_max_frac];
    env->sale_impact = (float)config[CFG_sale_impact];
    env->fuel_price = (float)config[CFG_fuel_price];
    env->repair_price = (float)config[CFG_repair_price];
    env->reward_scale = (float)config[CFG_reward_scale];
    env->death_penalty = (float)config[CFG_death_penalty];
    env->cargo_shaping = (float)config[CFG_cargo_shaping];

    if (env->storm_radius_min > env->storm_radius_max) {
        snprintf(err, errlen, "config field 'storm_radius_min' = %g must be <= storm_radius_max = %g",
                 (double)env->storm_radius_min, (double)env->storm_radius_max);
        return -1;
    }
    if (env->ore_min > env->ore_max) {
        snprintf(err, errlen, "config field 'ore_min' = %g must be <= ore_max = %g",
                 (double)env->ore_min, (double)env->ore_max);
        return -1;
    }
    for (int k = 0; k < PR_ORES; k++) {
        env->price_lo[k] = price_min_frac * env->ore_price[k];
        env->price_hi[k] = price_max_frac * env->ore_price[k];
        env->inv_ore_price[k] = pr_inverse(env->ore_price[k]);
    }
    float max_capacity = env->hold_base + (float)PR_MAX_LEVEL * env->hold_step;
    env->inv_world = pr_inverse(env->world);
    env->inv_max_speed = pr_inverse(env->max_speed);
    env->inv_fuel_capacity = pr_inverse(env->fuel_capacity);
    env->inv_hull_max = pr_inverse(env->hull_max);
    env->inv_max_capacity = pr_inverse(max_capacity);
    env->inv_ore_max = pr_inverse(env->ore_max);
    env->inv_fuel_price = pr_inverse(env->fuel_price);
    env->inv_repair_price = pr_inverse(env->repair_price);
    env->inv_storm_speed = pr_inverse(env->storm_speed);
    env->inv_max_steps = pr_inverse((float)env->max_steps);

    PgBatch *pg = &env->pg;
    pg->obs_dim = PR_OBS_DIM;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = 1;
    pg->action_kind = PG_ACTION_DISCRETE;
    pg->action_dim = 1;
    pg->action_nvec[0] = PR_ACTIONS;
    if (PG_ALLOC(env, instances, pg->num_envs)) {
        snprintf(err, errlen, "out of memory for %d Prospector instances", pg->num_envs);
        return -1;
    }
    return 0;
}

static void env_free(Env *env) { (void)env; /* every array came from PG_ALLOC */ }
#endif /* host only */

/* ---- small rules shared by reset, step and observation --------------------- */

PG_DEVICE static inline float pr_capacity(const Env *env, const PrInstance *s) {
    return env->hold_base + (float)s->hold_level * env->hold_step;
}

PG_DEVICE static inline float pr_drill_rate(const Env *env, const PrInstance *s) {
    return env->drill_base + (float)s->drill_level * env->drill_step;
}

PG_DEVICE static inline float pr_shield_factor(const Env *env, const PrInstance *s) {
    return 1.0f - env->shield_step * (float)s->shield_level;
}

PG_DEVICE static inline float pr_cargo_total(const PrInstance *s) {
    return ((s->cargo[0] + s->cargo[1]) + s->cargo[2]) + s->cargo[3];
}

/* The hold at the ores' base prices: the potential of the optional shaping. */
PG_DEVICE static inline float pr_hold_value(const Env *env, const PrInstance *s) {
    return ((s->cargo[0] * env->ore_price[0] + s->cargo[1] * env->ore_price[1]) +
            s->cargo[2] * env->ore_price[2]) + s->cargo[3] * env->ore_price[3];
}

PG_DEVICE static inline float pr_upgrade_price(const Env *env, int level) {
    return env->upgrade_cost * (float)(level + 1);
}

/* Draws a fresh asteroid: x, y, ore type, ore amount (4 draws). */
PG_DEVICE static void pr_spawn_asteroid(const Env *env, PrInstance *s, uint64_t *rng, int i) {
    s->ast_x[i] = pg_uniform_range(rng, 0.0f, env->world);
    s->ast_y[i] = pg_uniform_range(rng, 0.0f, env->world);
    float u = pg_uniform(rng);
    int type = 0;
    while (type < PR_ORES - 1 && u >= PR_ORE_CUMULATIVE[type]) type++;
    s->ast_type[i] = type;
    s->ast_ore[i] = pg_uniform_range(rng, env->ore_min, env->ore_max);
    s->ast_scanned[i] = 0;
    s->ast_timer[i] = 0;
}

/* ---- observation and action mask ------------------------------------------
 * One pass over the state writes the 260 floats and, as a by-product, the
 * mask bits the next step checks its action against and the nearest known
 * asteroid of each ore (the target of the steer-to-ore actions).
 *
 * Speed: the per-asteroid geometry runs as small fixed-length loops the
 * compiler vectorizes; validity is collected as bits, group by group, and
 * the 69 mask floats are written from the bits 4 at a time through a
 * 16-entry table instead of one branchy store per action. */

/* nibble -> its 4 bits as floats, lowest bit first */
PG_TABLE float PR_NIBBLE_FLOATS[16][4] = {
    {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {1, 1, 0, 0}, {0, 0, 1, 0}, {1, 0, 1, 0},
    {0, 1, 1, 0}, {1, 1, 1, 0}, {0, 0, 0, 1}, {1, 0, 0, 1}, {0, 1, 0, 1}, {1, 1, 0, 1},
    {0, 0, 1, 1}, {1, 0, 1, 1}, {0, 1, 1, 1}, {1, 1, 1, 1}};

PG_DEVICE static inline void pr_set_bit(uint64_t *mask, int a, int ok) {
    mask[a >> 6] |= (uint64_t)(ok != 0) << (a & 63);
}

/* Ors a run of `count` (< 32) validity bits starting at action `first`; with
 * constant arguments the word choice folds away at compile time. */
PG_DEVICE static inline void pr_set_bits(uint64_t *mask, int first, uint32_t bits, int count) {
    uint64_t run = (uint64_t)bits & ((1ull << count) - 1u);
    if (first >= 64) {
        mask[1] |= run << (first - 64);
    } else {
        mask[0] |= run << first;
        if (first + count > 64) mask[1] |= run >> (64 - first);
    }
}

PG_DEVICE PG_SIMD_KERNEL static void prospector_observe(const Env *env, PrInstance *s,
                                              float *PG_RESTRICT row) {
    const float inv_world = env->inv_world;
    const int docked = s->docked != 0;
    const int flying = !docked;
    const float capacity = pr_capacity(env, s);
    const float total = pr_cargo_total(s);
    const float x = s->x, y = s->y;
    uint64_t mask[2] = {0, 0};

    /* ship */
    row[0] = x * inv_world;
    row[1] = y * inv_world;
    row[2] = s->vx * env->inv_max_speed;
    row[3] = s->vy * env->inv_max_speed;
    row[4] = s->fuel * env->inv_fuel_capacity;
    row[5] = s->hull * env->inv_hull_max;
    row[6] = total / capacity;
    row[7] = capacity * env->inv_max_capacity;
    for (int k = 0; k < PR_ORES; k++) row[8 + k] = s->cargo[k] / capacity;
    row[12] = s->credits * PR_CREDIT_OBS_SCALE;
    row[13] = (float)docked;
    for (int j = 0; j < PR_STATIONS; j++) row[14 + j] = (float)(s->docked == j + 1);
    row[18] = (float)s->hold_level * PR_LEVEL_OBS_SCALE;
    row[19] = (float)s->drill_level * PR_LEVEL_OBS_SCALE;
    row[20] = (float)s->shield_level * PR_LEVEL_OBS_SCALE;
    row[21] = (float)(env->max_steps - s->steps) * env->inv_max_steps;
    /* row[22] (inside a storm) is written with the storms below */
    row[23] = (float)s->last_invalid;

    /* asteroids: geometry and flags for all 12 first (vectorized) */
    float dx[PR_ASTEROIDS], dy[PR_ASTEROIDS], d2[PR_ASTEROIDS];
    float active_f[PR_ASTEROIDS], known_f[PR_ASTEROIDS], richness[PR_ASTEROIDS];
    int32_t known[PR_ASTEROIDS], scan_ok[PR_ASTEROIDS], wide_ok[PR_ASTEROIDS];
    int32_t mine_ok[PR_ASTEROIDS];
    const int32_t can_mine = flying & (total < capacity) & (pr_drill_rate(env, s) > 0.0f);
    const float scan_range2 = env->scan_range2, wide_scan_range2 = env->wide_scan_range2;
    const float mine_range2 = env->mine_range2, inv_ore_max = env->inv_ore_max;
    for (int i = 0; i < PR_ASTEROIDS; i++) {
        dx[i] = s->ast_x[i] - x;
        dy[i] = s->ast_y[i] - y;
        d2[i] = dx[i] * dx[i] + dy[i] * dy[i];
        int32_t active = s->ast_timer[i] == 0;
        known[i] = active & (s->ast_scanned[i] != 0);
        int32_t unscanned = flying & active & !known[i];
        scan_ok[i] = unscanned & (d2[i] <= scan_range2);
        wide_ok[i] = unscanned & (d2[i] <= wide_scan_range2);
        mine_ok[i] = can_mine & known[i] & (d2[i] <= mine_range2);
        active_f[i] = (float)active;
        known_f[i] = (float)known[i];
        /* = known ? ore * inv_ore_max : 0 exactly (ore >= 0 is finite), but
         * branch-free so that this loop vectorizes */
        richness[i] = (s->ast_ore[i] * inv_ore_max) * known_f[i];
    }
    uint32_t scan_bits = 0, mine_bits = 0, wide_bits = 0;
    for (int i = 0; i < PR_ASTEROIDS; i++) {
        scan_bits |= (uint32_t)scan_ok[i] << i;
        wide_bits |= (uint32_t)wide_ok[i] << i;
        mine_bits |= (uint32_t)mine_ok[i] << i;
    }
    float nearest_d2[PR_ORES] = {0};
    int nearest[PR_ORES] = {-1, -1, -1, -1};
    for (int i = 0; i < PR_ASTEROIDS; i++) {
        float *a = row + PR_OBS_ASTEROIDS + PR_ASTEROID_FEATURES * i;
        int type = s->ast_type[i];
        a[0] = dx[i] * inv_world;
        a[1] = dy[i] * inv_world;
        a[2] = active_f[i];
        a[3] = known_f[i];
        a[4] = richness[i];
        a[5] = 0.0f;
        a[6] = 0.0f;
        a[7] = 0.0f;
        a[8] = 0.0f;
        a[5 + (type & 3)] = known_f[i];
        if (known[i] && (nearest[type] < 0 || d2[i] < nearest_d2[type])) {
            nearest[type] = i;
            nearest_d2[type] = d2[i];
        }
    }
    pr_set_bits(mask, PR_A_SCAN, scan_bits, PR_ASTEROIDS);
    pr_set_bits(mask, PR_A_MINE, mine_bits, PR_ASTEROIDS);
    pr_set_bit(mask, PR_A_WIDE_SCAN, wide_bits != 0);

    /* stations */
    int dock_ok = 0;
    uint32_t steer_station_bits = 0;
    const float speed2 = s->vx * s->vx + s->vy * s->vy;
    float best_price[PR_ORES] = {0};
    for (int j = 0; j < PR_STATIONS; j++) {
        float *st = row + PR_OBS_STATIONS + PR_STATION_FEATURES * j;
        float sdx = s->st_x[j] - x, sdy = s->st_y[j] - y;
        float sd2 = sdx * sdx + sdy * sdy;
        int in_range = sd2 <= env->dock_range2;
        dock_ok |= flying & in_range & (speed2 <= env->dock_speed2);
        st[0] = sdx * inv_world;
        st[1] = sdy * inv_world;
        st[2] = (float)in_range;
        for (int k = 0; k < PR_ORES; k++) {
            float price = s->st_price[j][k];
            st[3 + k] = price * env->inv_ore_price[k];
            best_price[k] = price > best_price[k] ? price : best_price[k];
        }
        st[7] = s->st_fuel_price[j] * env->inv_fuel_price;
        st[8] = s->st_repair_price[j] * env->inv_repair_price;
        steer_station_bits |= (uint32_t)(flying & (sd2 > PR_STEER_MIN_DIST2)) << j;
    }
    pr_set_bits(mask, PR_A_STEER_STATION, steer_station_bits, PR_STATIONS);

    /* storms */
    int in_storm = 0;
    for (int m = 0; m < PR_STORMS; m++) {
        float *st = row + PR_OBS_STORMS + PR_STORM_FEATURES * m;
        float mdx = s->storm_x[m] - x, mdy = s->storm_y[m] - y;
        in_storm |= mdx * mdx + mdy * mdy < s->storm_r[m] * s->storm_r[m];
        st[0] = mdx * inv_world;
        st[1] = mdy * inv_world;
        st[2] = s->storm_r[m] * inv_world;
        st[3] = s->storm_vx[m] * env->inv_storm_speed;
        st[4] = s->storm_vy[m] * env->inv_storm_speed;
    }
    row[22] = (float)in_storm;

    /* market summary and nearest known asteroid per ore */
    uint32_t steer_ore_bits = 0;
    for (int k = 0; k < PR_ORES; k++) {
        row[PR_OBS_BEST_PRICE + k] = best_price[k] * env->inv_ore_price[k];
        row[PR_OBS_NEAREST_ORE + k] =
            nearest[k] < 0 ? PR_NO_ASTEROID_DISTANCE : sqrtf(nearest_d2[k]) * inv_world;
        s->nearest_ore[k] = nearest[k];
        steer_ore_bits |=
            (uint32_t)(flying & (nearest[k] >= 0) & (nearest_d2[k] > PR_STEER_MIN_DIST2)) << k;
    }
    pr_set_bits(mask, PR_A_STEER_ORE, steer_ore_bits, PR_ORES);

    /* the rest of the mask */
    const int moving = (s->vx != 0.0f) | (s->vy != 0.0f);
    pr_set_bit(mask, PR_A_WAIT, 1);
    pr_set_bits(mask, PR_A_THRUST, flying ? 0xFFFFu : 0u, 16); /* thrust and boost */
    pr_set_bit(mask, PR_A_BRAKE, flying & moving);
    pr_set_bit(mask, PR_A_DOCK, dock_ok);
    pr_set_bit(mask, PR_A_UNDOCK, docked);
    uint32_t sell_bits = 0, jettison_bits = 0;
    for (int k = 0; k < PR_ORES; k++) {
        int has = s->cargo[k] > 0.0f;
        sell_bits |= (uint32_t)(docked & has) << k;
        jettison_bits |= (uint32_t)(flying & has) << k;
    }
    pr_set_bits(mask, PR_A_SELL, sell_bits, PR_ORES);
    pr_set_bits(mask, PR_A_JETTISON, jettison_bits, PR_ORES);
    pr_set_bit(mask, PR_A_SELL_ALL, docked & (total > 0.0f));
    if (docked) {
        int station = s->docked - 1;
        int fuel_ok = (s->fuel < env->fuel_capacity) &
                      ((s->st_fuel_price[station] == 0.0f) | (s->credits > 0.0f));
        int repair_ok = (s->hull < env->hull_max) &
                        ((s->st_repair_price[station] == 0.0f) | (s->credits > 0.0f));
        pr_set_bits(mask, PR_A_BUY_FUEL, fuel_ok ? 3u : 0u, 2);
        pr_set_bits(mask, PR_A_REPAIR, repair_ok ? 3u : 0u, 2);
        const int32_t levels[3] = {s->hold_level, s->drill_level, s->shield_level};
        for (int u = 0; u < 3; u++)
            pr_set_bit(mask, PR_A_UPGRADE + u,
                       (levels[u] < PR_MAX_LEVEL) &
                           (s->credits >= pr_upgrade_price(env, levels[u])));
    }
    s->mask[0] = mask[0];
    s->mask[1] = mask[1];

    /* the 69 mask floats, 4 at a time */
    float *out = row + PR_OBS_MASK;
    for (int a = 0; a < 64; a += 4) memcpy(out + a, PR_NIBBLE_FLOATS[(mask[0] >> a) & 15u], 16);
    memcpy(out + 64, PR_NIBBLE_FLOATS[mask[1] & 15u], 16);
    out[68] = (float)((mask[1] >> 4) & 1u);
}

/* ---- reset -----------------------------------------------------------------
 * Draw order (per instance stream): for each station j: x, y, four ore price
 * multipliers, fuel multiplier, repair multiplier; for each asteroid i: x, y,
 * ore type, ore amount; for each storm m: x, y, vx, vy, radius; then the home
 * station (randint 4). The ship starts docked at home, tanks full. */
PG_DEVICE static void prospector_reset_one(Env *env, int i) {
    PrInstance *s = &env->instances[i];
    uint64_t *rng = &env->pg.rng[i];
    memset(s, 0, sizeof(*s));
    const float lo = 0.1f * env->world, hi = 0.9f * env->world;
    const float mult_lo = 1.0f - env->station_spread, mult_hi = 1.0f + env->station_spread;
    for (int j = 0; j < PR_STATIONS; j++) {
        s->st_x[j] = pg_uniform_range(rng, lo, hi);
        s->st_y[j] = pg_uniform_range(rng, lo, hi);
        for (int k = 0; k < PR_ORES; k++) {
            float base = env->ore_price[k] * pg_uniform_range(rng, mult_lo, mult_hi);
            s->st_base[j][k] = base;
            s->st_price[j][k] = pg_clampf(base, env->price_lo[k], env->price_hi[k]);
        }
        s->st_fuel_price[j] = env->fuel_price * pg_uniform_range(rng, mult_lo, mult_hi);
        s->st_repair_price[j] = env->repair_price * pg_uniform_range(rng, mult_lo, mult_hi);
    }
    for (int a = 0; a < PR_ASTEROIDS; a++) pr_spawn_asteroid(env, s, rng, a);
    for (int m = 0; m < PR_STORMS; m++) {
        s->storm_x[m] = pg_uniform_range(rng, 0.0f, env->world);
        s->storm_y[m] = pg_uniform_range(rng, 0.0f, env->world);
        s->storm_vx[m] = pg_uniform_range(rng, -env->storm_speed, env->storm_speed);
        s->storm_vy[m] = pg_uniform_range(rng, -env->storm_speed, env->storm_speed);
        s->storm_r[m] = pg_uniform_range(rng, env->storm_radius_min, env->storm_radius_max);
    }
    int home = pg_randint(rng, PR_STATIONS);
    s->x = s->st_x[home];
    s->y = s->st_y[home];
    s->docked = home + 1;
    s->fuel = env->fuel_capacity;
    s->hull = env->hull_max;
    s->credits = env->start_credits;
    prospector_observe(env, s, (float *)env->pg.observations + (size_t)PR_OBS_DIM * (size_t)i);
}

PG_DEVICE static void env_reset(Env *env, int start, int end) {
    for (int i = start; i < end; i++) prospector_reset_one(env, i);
}

/* ---- the step ---------------------------------------------------------------- */

PG_DEVICE static inline int pr_is_valid(const PrInstance *s, int action) {
    return (int)((s->mask[action >> 6] >> (action & 63)) & 1u);
}

/* Adds accel * (dir_x, dir_y) to the velocity, each component clamped. */
PG_DEVICE static inline void pr_push(const Env *env, PrInstance *s, float accel, float dir_x, float dir_y) {
    s->vx = pg_clampf(s->vx + accel * dir_x, -env->max_speed, env->max_speed);
    s->vy = pg_clampf(s->vy + accel * dir_y, -env->max_speed, env->max_speed);
}

PG_DEVICE static inline void pr_steer(const Env *env, PrInstance *s, float target_x, float target_y) {
    float dx = target_x - s->x, dy = target_y - s->y;
    float dist = sqrtf(dx * dx + dy * dy);
    pr_push(env, s, env->thrust_accel, dx / dist, dy / dist);
    s->fuel -= env->thrust_fuel;
}

PG_DEVICE static inline void pr_sell(const Env *env, PrInstance *s, int k) {
    int j = s->docked - 1;
    float units = s->cargo[k];
    float price = s->st_price[j][k];
    s->credits += units * price;
    s->ore_sold += units;
    s->cargo[k] = 0.0f;
    /* market impact: the price drops by sale_impact per unit sold */
    float impact = 1.0f - env->sale_impact * units;
    s->st_price[j][k] = pg_clampf(price * impact, env->price_lo[k], env->price_hi[k]);
}

/* Buys up to `wanted` units at `price` each, no more than the credits cover. */
PG_DEVICE static inline float pr_buy(PrInstance *s, float wanted, float price) {
    float amount = wanted;
    if (price > 0.0f) {
        float affordable = s->credits / price;
        if (affordable < amount) amount = affordable;
    }
    s->credits = s->credits - amount * price;
    if (s->credits < 0.0f) s->credits = 0.0f;
    return amount;
}

PG_DEVICE static void pr_apply_action(Env *env, PrInstance *s, int action) {
    if (action >= PR_A_THRUST && action < PR_A_BOOST) {
        int d = action - PR_A_THRUST;
        pr_push(env, s, env->thrust_accel, PR_DIR_X[d], PR_DIR_Y[d]);
        s->fuel -= env->thrust_fuel;
    } else if (action >= PR_A_BOOST && action < PR_A_BRAKE) {
        int d = action - PR_A_BOOST;
        pr_push(env, s, env->boost_accel, PR_DIR_X[d], PR_DIR_Y[d]);
        s->fuel -= env->boost_fuel;
    } else if (action == PR_A_BRAKE) {
        s->vx *= env->brake_factor;
        s->vy *= env->brake_factor;
        s->fuel -= env->thrust_fuel;
    } else if (action == PR_A_WIDE_SCAN) {
        for (int i = 0; i < PR_ASTEROIDS; i++) {
            float dx = s->ast_x[i] - s->x, dy = s->ast_y[i] - s->y;
            if (s->ast_timer[i] == 0 && dx * dx + dy * dy <= env->wide_scan_range2)
                s->ast_scanned[i] = 1;
        }
        s->fuel -= env->wide_scan_fuel;
    } else if (action >= PR_A_SCAN && action < PR_A_MINE) {
        s->ast_scanned[action - PR_A_SCAN] = 1;
        s->fuel -= env->scan_fuel;
    } else if (action >= PR_A_MINE && action < PR_A_DOCK) {
        int i = action - PR_A_MINE;
        float amount = pr_drill_rate(env, s);
        if (s->ast_ore[i] < amount) amount = s->ast_ore[i];
        float space = pr_capacity(env, s) - pr_cargo_total(s);
        if (space < amount) amount = space;
        s->ast_ore[i] -= amount;
        s->cargo[s->ast_type[i]] += amount;
        s->ore_mined += amount;
        s->fuel -= env->mine_fuel;
        if (s->ast_ore[i] <= 0.0f) { /* depleted: gone until it respawns */
            s->ast_ore[i] = 0.0f;
            s->ast_timer[i] = env->respawn_delay;
            s->ast_scanned[i] = 0;
        }
    } else if (action == PR_A_DOCK) {
        for (int j = 0; j < PR_STATIONS; j++) {
            float dx = s->st_x[j] - s->x, dy = s->st_y[j] - s->y;
            if (dx * dx + dy * dy <= env->dock_range2) {
                s->docked = j + 1;
                break;
            }
        }
        s->vx = 0.0f;
        s->vy = 0.0f;
    } else if (action == PR_A_UNDOCK) {
        s->docked = 0;
    } else if (action >= PR_A_SELL && action < PR_A_SELL_ALL) {
        pr_sell(env, s, action - PR_A_SELL);
    } else if (action == PR_A_SELL_ALL) {
        for (int k = 0; k < PR_ORES; k++)
            if (s->cargo[k] > 0.0f) pr_sell(env, s, k);
    } else if (action == PR_A_BUY_FUEL || action == PR_A_FILL_FUEL) {
        float missing = env->fuel_capacity - s->fuel;
        float quarter = 0.25f * env->fuel_capacity;
        float wanted = (action == PR_A_BUY_FUEL && quarter < missing) ? quarter : missing;
        s->fuel += pr_buy(s, wanted, s->st_fuel_price[s->docked - 1]);
        if (s->fuel > env->fuel_capacity) s->fuel = env->fuel_capacity;
    } else if (action == PR_A_REPAIR || action == PR_A_FULL_REPAIR) {
        float missing = env->hull_max - s->hull;
        float quarter = 0.25f * env->hull_max;
        float wanted = (action == PR_A_REPAIR && quarter < missing) ? quarter : missing;
        s->hull += pr_buy(s, wanted, s->st_repair_price[s->docked - 1]);
        if (s->hull > env->hull_max) s->hull = env->hull_max;
    } else if (action >= PR_A_JETTISON && action < PR_A_UPGRADE) {
        s->cargo[action - PR_A_JETTISON] = 0.0f;
    } else if (action >= PR_A_UPGRADE && action < PR_A_STEER_STATION) {
        int32_t *level = action == PR_A_UPGRADE       ? &s->hold_level
                         : action == PR_A_UPGRADE + 1 ? &s->drill_level
                                                      : &s->shield_level;
        s->credits -= pr_upgrade_price(env, *level);
        *level += 1;
        s->upgrades += 1;
    } else if (action >= PR_A_STEER_STATION && action < PR_A_STEER_ORE) {
        int j = action - PR_A_STEER_STATION;
        pr_steer(env, s, s->st_x[j], s->st_y[j]);
    } else if (action >= PR_A_STEER_ORE && action < PR_ACTIONS) {
        int i = s->nearest_ore[action - PR_A_STEER_ORE];
        pr_steer(env, s, s->ast_x[i], s->ast_y[i]);
    }
    /* PR_A_WAIT: nothing */
}

/* Moves a storm in a straight line; it bounces off the walls. */
PG_DEVICE static inline void pr_move_storm(const Env *env, float *pos, float *vel) {
    *pos += *vel;
    if (*pos < 0.0f) {
        *pos = 0.0f;
        *vel = fabsf(*vel);
    } else if (*pos > env->world) {
        *pos = env->world;
        *vel = -fabsf(*vel);
    }
}

/* One step of one instance; returns 1 if it ended (terminal or truncated). */
PG_DEVICE static inline int prospector_step_one(Env *env, PrInstance *s, uint64_t *rng, int action,
                                       float *reward, uint8_t *terminal, uint8_t *truncation) {
    const float credits_before = s->credits;
    const float hold_before = pr_hold_value(env, s);

    /* 1. the action: an invalid one is a no-op (the same as wait) */
    if (!pr_is_valid(s, action)) {
        action = PR_A_WAIT;
        s->last_invalid = 1;
        s->invalid_actions += 1;
    } else {
        s->last_invalid = 0;
    }
    pr_apply_action(env, s, action);

    /* 2. motion and life support (in flight only) */
    const int flying = s->docked == 0;
    if (flying) {
        s->x += s->vx;
        s->y += s->vy;
        if (s->x < 0.0f) { s->x = 0.0f; s->vx = 0.0f; }
        if (s->x > env->world) { s->x = env->world; s->vx = 0.0f; }
        if (s->y < 0.0f) { s->y = 0.0f; s->vy = 0.0f; }
        if (s->y > env->world) { s->y = env->world; s->vy = 0.0f; }
        s->vx *= env->drag;
        s->vy *= env->drag;
        s->fuel -= env->idle_fuel;
    }

    /* 3. storms drift (always) */
    for (int m = 0; m < PR_STORMS; m++) {
        pr_move_storm(env, &s->storm_x[m], &s->storm_vx[m]);
        pr_move_storm(env, &s->storm_y[m], &s->storm_vy[m]);
    }

    /* 4. hazards (a docked ship is shielded by its station) */
    if (flying) {
        const float shield = pr_shield_factor(env, s);
        const float speed2 = s->vx * s->vx + s->vy * s->vy;
        int collided = 0;
        for (int i = 0; i < PR_ASTEROIDS; i++) {
            float dx = s->ast_x[i] - s->x, dy = s->ast_y[i] - s->y;
            collided |= (s->ast_timer[i] == 0) & (dx * dx + dy * dy < env->collision_radius2);
        }
        if (collided && speed2 > env->safe_speed2) {
            s->hull -= env->collision_damage * speed2 * shield;
            s->vx *= -0.5f;
            s->vy *= -0.5f;
        }
        for (int m = 0; m < PR_STORMS; m++) {
            float dx = s->storm_x[m] - s->x, dy = s->storm_y[m] - s->y;
            if (dx * dx + dy * dy < s->storm_r[m] * s->storm_r[m])
                s->hull -= env->storm_damage * shield;
        }
    }

    /* 5. depleted asteroids count down and respawn (4 draws each, in index order) */
    for (int i = 0; i < PR_ASTEROIDS; i++) {
        if (s->ast_timer[i] > 0) {
            s->ast_timer[i] -= 1;
            if (s->ast_timer[i] == 0) pr_spawn_asteroid(env, s, rng, i);
        }
    }

    /* 6. the market: one draw per station, four 16-bit noises in [-1, 1) from
     * it (ore k uses bits 16k..16k+15); mean-reverting random walk, bounded. */
    for (int j = 0; j < PR_STATIONS; j++) {
        uint64_t bits = pg_next_u64(rng);
        for (int k = 0; k < PR_ORES; k++) {
            float noise = (float)((int32_t)((bits >> (16 * k)) & 0xFFFFu) - 32768) * 0x1.0p-15f;
            float base = s->st_base[j][k], price = s->st_price[j][k];
            float pull = env->price_reversion * (base - price);
            float shock = (env->price_volatility * base) * noise;
            s->st_price[j][k] = pg_clampf((price + pull) + shock, env->price_lo[k], env->price_hi[k]);
        }
    }

    /* 7. the end: destruction, then an empty tank (terminal); step limit (truncation) */
    const int destroyed = s->hull <= 0.0f;
    const int out_of_fuel = !destroyed & (s->fuel <= 0.0f);
    if (s->hull < 0.0f) s->hull = 0.0f;
    if (s->fuel < 0.0f) s->fuel = 0.0f;
    s->steps += 1;
    const int is_terminal = destroyed | out_of_fuel;
    const int is_truncated = !is_terminal & (s->steps >= env->max_steps);
    float r = (s->credits - credits_before) * env->reward_scale;
    /* optional potential-based shaping: the change in the hold's value at base
     * prices (a terminal state's potential is 0, so dying loses the cargo) */
    float hold_after = is_terminal ? 0.0f : pr_hold_value(env, s);
    r = r + (env->cargo_shaping * env->reward_scale) * (hold_after - hold_before);
    if (is_terminal) r -= env->death_penalty;
    s->episode_return += r;
    *reward = r;
    *terminal = (uint8_t)is_terminal;
    *truncation = (uint8_t)is_truncated;
    return is_terminal | is_truncated;
}

PG_DEVICE static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    const int32_t *actions = (const int32_t *)pg->actions;
    float *obs = (float *)pg->observations;
    float *final_obs = (float *)pg->final_observations;
    for (int i = start; i < end; i++) {
        PrInstance *s = &env->instances[i];
        float *row = obs + (size_t)PR_OBS_DIM * (size_t)i;
        int ended = prospector_step_one(env, s, &pg->rng[i], actions[i], &pg->rewards[i],
                                        &pg->terminals[i], &pg->truncations[i]);
        if (!ended) {
            prospector_observe(env, s, row);
            continue;
        }
        /* finished: the last observation goes to final_observations, then reset */
        prospector_observe(env, s, final_obs + (size_t)PR_OBS_DIM * (size_t)i);
        double episode[9] = {(double)s->episode_return,
                             (double)s->steps,
                             (double)s->ore_mined,
                             (double)s->ore_sold,
                             (double)s->credits,
                             (double)(s->hull <= 0.0f),
                             (double)(pg->terminals[i] && s->hull > 0.0f),
                             (double)s->invalid_actions,
                             (double)s->upgrades};
        pg_stats_record(pg, i, episode);
        prospector_reset_one(env, i);
    }
}

/* ---- state get/set: the flat float64 layout (docs/prospector.md) ------------
 * ship: x y vx vy fuel hull credits cargo[4] docked hold_level drill_level
 *       shield_level steps last_invalid                                  (17)
 * episode: return ore_mined ore_sold invalid_actions upgrades            (5)
 * asteroids, 12 x: x y ore type scanned timer                            (72)
 * stations, 4 x: x y fuel_price repair_price base[4] price[4]            (48)
 * storms, 3 x: x y vx vy radius                                          (15)   = 157 */
#define PR_STATE_SIZE 157

PG_DEVICE static int env_state_size(const Env *env) {
    (void)env;
    return PR_STATE_SIZE;
}

PG_DEVICE static void env_get_state(const Env *env, int i, double *out) {
    const PrInstance *s = &env->instances[i];
    int n = 0;
    const float ship[7] = {s->x, s->y, s->vx, s->vy, s->fuel, s->hull, s->credits};
    for (int f = 0; f < 7; f++) out[n++] = ship[f];
    for (int k = 0; k < PR_ORES; k++) out[n++] = s->cargo[k];
    const int32_t ints[6] = {s->docked, s->hold_level, s->drill_level,
                             s->shield_level, s->steps, s->last_invalid};
    for (int f = 0; f < 6; f++) out[n++] = ints[f];
    out[n++] = s->episode_return;
    out[n++] = s->ore_mined;
    out[n++] = s->ore_sold;
    out[n++] = s->invalid_actions;
    out[n++] = s->upgrades;
    for (int a = 0; a < PR_ASTEROIDS; a++) {
        out[n++] = s->ast_x[a];
        out[n++] = s->ast_y[a];
        out[n++] = s->ast_ore[a];
        out[n++] = s->ast_type[a];
        out[n++] = s->ast_scanned[a];
        out[n++] = s->ast_timer[a];
    }
    for (int j = 0; j < PR_STATIONS; j++) {
        out[n++] = s->st_x[j];
        out[n++] = s->st_y[j];
        out[n++] = s->st_fuel_price[j];
        out[n++] = s->st_repair_price[j];
        for (int k = 0; k < PR_ORES; k++) out[n++] = s->st_base[j][k];
        for (int k = 0; k < PR_ORES; k++) out[n++] = s->st_price[j][k];
    }
    for (int m = 0; m < PR_STORMS; m++) {
        out[n++] = s->storm_x[m];
        out[n++] = s->storm_y[m];
        out[n++] = s->storm_vx[m];
        out[n++] = s->storm_vy[m];
        out[n++] = s->storm_r[m];
    }
}

/* Range checks that keep every later step finite and in bounds. */
PG_DEVICE static int pr_in(double v, double lo, double hi) {
    return v >= lo && v <= hi;
}

PG_DEVICE static int pr_int_in(double v, int lo, int hi) {
    return pr_in(v, lo, hi) && v == floor(v);
}

PG_DEVICE static int env_set_state(Env *env, int i, const double *in) {
    const double big = 1e30, world = env->world;
    /* validate everything first: a refused state changes nothing */
    int ok = 1;
    ok &= pr_in(in[0], 0, world) && pr_in(in[1], 0, world);
    ok &= pr_in(in[2], -env->max_speed, env->max_speed) && pr_in(in[3], -env->max_speed, env->max_speed);
    ok &= pr_in(in[4], 0, env->fuel_capacity) && in[4] > 0;
    ok &= pr_in(in[5], 0, env->hull_max) && in[5] > 0;
    ok &= pr_in(in[6], 0, big);
    for (int k = 0; k < PR_ORES; k++) ok &= pr_in(in[7 + k], 0, big);
    ok &= pr_int_in(in[11], 0, PR_STATIONS);
    for (int f = 12; f < 15; f++) ok &= pr_int_in(in[f], 0, PR_MAX_LEVEL);
    ok &= pr_int_in(in[15], 0, env->max_steps - 1) && pr_int_in(in[16], 0, 1);
    ok &= pr_in(in[17], -big, big) && pr_in(in[18], 0, big) && pr_in(in[19], 0, big);
    ok &= pr_int_in(in[20], 0, env->max_steps) && pr_int_in(in[21], 0, 3 * env->max_steps);
    if (ok) { /* the hold as the game adds it up (float32), one rounding of slack */
        float capacity = env->hold_base + (float)in[12] * env->hold_step;
        float total = (((float)in[7] + (float)in[8]) + (float)in[9]) + (float)in[10];
        ok &= total <= capacity * (1.0f + 1e-6f);
    }
    int n = 22;
    for (int a = 0; a < PR_ASTEROIDS; a++, n += 6) {
        ok &= pr_in(in[n], 0, world) && pr_in(in[n + 1], 0, world) && pr_in(in[n + 2], 0, big);
        ok &= pr_int_in(in[n + 3], 0, PR_ORES - 1) && pr_int_in(in[n + 4], 0, 1);
        ok &= pr_int_in(in[n + 5], 0, env->respawn_delay);
    }
    for (int j = 0; j < PR_STATIONS; j++, n += 12) {
        ok &= pr_in(in[n], 0, world) && pr_in(in[n + 1], 0, world);
        ok &= pr_in(in[n + 2], 0, big) && pr_in(in[n + 3], 0, big);
        for (int k = 0; k < PR_ORES; k++) {
            ok &= pr_in(in[n + 4 + k], 0, big);
            ok &= pr_in(in[n + 8 + k], env->price_lo[k], env->price_hi[k]);
        }
    }
    for (int m = 0; m < PR_STORMS; m++, n += 5) {
        ok &= pr_in(in[n], 0, world) && pr_in(in[n + 1], 0, world);
        ok &= pr_in(in[n + 2], -big, big) && pr_in(in[n + 3], -big, big);
        ok &= pr_in(in[n + 4], 0, 1e15);
    }
    if (!ok) return -1;

    PrInstance *s = &env->instances[i];
    s->x = (float)in[0];
    s->y = (float)in[1];
    s->vx = (float)in[2];
    s->vy = (float)in[3];
    s->fuel = (float)in[4];
    s->hull = (float)in[5];
    s->credits = (float)in[6];
    for (int k = 0; k < PR_ORES; k++) s->cargo[k] = (float)in[7 + k];
    s->docked = (int32_t)in[11];
    s->hold_level = (int32_t)in[12];
    s->drill_level = (int32_t)in[13];
    s->shield_level = (int32_t)in[14];
    s->steps = (int32_t)in[15];
    s->last_invalid = (int32_t)in[16];
    s->episode_return = (float)in[17];
    s->ore_mined = (float)in[18];
    s->ore_sold = (float)in[19];
    s->invalid_actions = (int32_t)in[20];
    s->upgrades = (int32_t)in[21];
    n = 22;
    for (int a = 0; a < PR_ASTEROIDS; a++) {
        s->ast_x[a] = (float)in[n++];
        s->ast_y[a] = (float)in[n++];
        s->ast_ore[a] = (float)in[n++];
        s->ast_type[a] = (int32_t)in[n++];
        s->ast_scanned[a] = (int32_t)in[n++];
        s->ast_timer[a] = (int32_t)in[n++];
    }
    for (int j = 0; j < PR_STATIONS; j++) {
        s->st_x[j] = (float)in[n++];
        s->st_y[j] = (float)in[n++];
        s->st_fuel_price[j] = (float)in[n++];
        s->st_repair_price[j] = (float)in[n++];
        for (int k = 0; k < PR_ORES; k++) s->st_base[j][k] = (float)in[n++];
        for (int k = 0; k < PR_ORES; k++) s->st_price[j][k] = (float)in[n++];
    }
    for (int m = 0; m < PR_STORMS; m++) {
        s->storm_x[m] = (float)in[n++];
        s->storm_y[m] = (float)in[n++];
        s->storm_vx[m] = (float)in[n++];
        s->storm_vy[m] = (float)in[n++];
        s->storm_r[m] = (float)in[n++];
    }
    prospector_observe(env, s, (float *)env->pg.observations + (size_t)PR_OBS_DIM * (size_t)i);
    return 0;
}

#endif /* PEREGRINE_PROSPECTOR_H */
