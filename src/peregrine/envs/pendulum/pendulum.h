/*
 * pendulum.h -- Pendulum-v1, the batch of N instances, in C.
 *
 * Same rules as Gymnasium's Pendulum-v1 (the swing-up problem):
 *   torque  u = clip(action, -max_torque, max_torque)            (max_torque 2)
 *   cost      = angle^2 + 0.1 * angle_dot^2 + 0.001 * u^2, reward = -cost,
 *               computed on the state BEFORE the step, angle in [-pi, pi]
 *   angle_dot' = clip(angle_dot + (3 g / (2 l) sin(angle) + 3 / (m l^2) u) dt,
 *                     -max_speed, max_speed)                      (max_speed 8)
 *   angle'    = angle + angle_dot' dt
 *   observation = (cos(angle'), sin(angle'), angle_dot')
 * with g = 10, m = l = 1, dt = 0.05. Never terminal; truncated after
 * max_steps (200) steps. Reset draws angle uniformly from [-pi, pi) and
 * angle_dot from [-1, 1).
 *
 * The action space is Gymnasium's Box(-max_torque, max_torque, (1,)), not the
 * generic Box(-1, 1): an action IS the torque (pendulum/__init__.py overrides
 * the space). NaN/inf actions count as 0 torque; larger ones are clipped.
 *
 * Differences from Gymnasium, by design: float32 arithmetic and pg_sincosf
 * (Gymnasium computes in float64; one step from the same state agrees to
 * ~1e-6). The stored angle is kept wrapped to [-pi, pi] after every step
 * (Gymnasium lets it grow and wraps only inside the cost): this is the same
 * angle, keeps float32 precision over long episodes, and keeps pg_sincosf in
 * its accurate range.
 *
 * Layout: structure-of-arrays state; a branch-free physics pass that the
 * compiler vectorizes, then a reset pass over the (few) instances that ended.
 */
#ifndef PEREGRINE_PENDULUM_H
#define PEREGRINE_PENDULUM_H


#include "pg_env.h"
#include "pg_math.h"

/* X(name, default, min, max, is_integer) */
#define ENV_CONFIG(X)                 \
    X(max_steps, 200, 1, 1e9, 1)      \
    X(gravity, 10.0, 0, 1e3, 0)       \
    X(mass, 1.0, 1e-3, 1e3, 0)        \
    X(length, 1.0, 1e-3, 1e3, 0)      \
    X(dt, 0.05, 1e-4, 1, 0)           \
    X(max_speed, 8.0, 1e-3, 1e3, 0)   \
    X(max_torque, 2.0, 0, 1e3, 0)

enum { ENV_CONFIG(PG_CONFIG_INDEX) }; /* CFG_max_steps, CFG_gravity, ... */

#define ENV_STATS(X) X(episode_return) X(episode_length)

struct Env {
    PgBatch pg;
    /* constants, in float32 as the step uses them */
    int max_steps;
    float gravity_term; /* 3 g / (2 l) */
    float torque_term;  /* 3 / (m l^2) */
    float dt, max_speed, max_torque;
    /* state, one entry per instance */
    float *theta, *theta_dot, *returns;
    int32_t *steps;
};
typedef struct Env Env;

/* 2 pi split in two float32 parts: the high part has 8 significant bits, so
 * k * PENDULUM_TWO_PI_HI is exact for the small integers k that occur. */
#define PENDULUM_TWO_PI_HI 6.28125f
#define PENDULUM_TWO_PI_LO 1.9353071795864769e-3f
#define PENDULUM_INV_TWO_PI 0.159154943091895336f

/* angle - 2 pi round(angle / 2 pi), in [-pi, pi] up to an ulp; branch-free. */
PG_DEVICE static inline float pendulum_wrap_angle(float angle) {
    float k = (angle * PENDULUM_INV_TWO_PI + PG_ROUND_MAGIC) - PG_ROUND_MAGIC;
    return (angle - k * PENDULUM_TWO_PI_HI) - k * PENDULUM_TWO_PI_LO;
}

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
static int env_init(Env *env, const double *config, char *err, size_t errlen) {
    env->max_steps = (int)config[CFG_max_steps];
    double gravity = config[CFG_gravity], mass = config[CFG_mass], length = config[CFG_length];
    env->gravity_term = (float)(3.0 * gravity / (2.0 * length));
    env->torque_term = (float)(3.0 / (mass * length * length));
    env->dt = (float)config[CFG_dt];
    env->max_speed = (float)config[CFG_max_speed];
    env->max_torque = (float)config[CFG_max_torque];

    PgBatch *pg = &env->pg;
    pg->obs_dim = 3;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = 1;
    pg->action_kind = PG_ACTION_CONTINUOUS;
    pg->action_dim = 1;

    size_t n = (size_t)pg->num_envs;
    if (PG_ALLOC(env, theta, n) || PG_ALLOC(env, theta_dot, n) || PG_ALLOC(env, returns, n) ||
        PG_ALLOC(env, steps, n)) {
        snprintf(err, errlen, "out of memory for %zu Pendulum instances", n);
        return -1;
    }
    return 0;
}

static void env_free(Env *env) { (void)env; /* every array came from PG_ALLOC */ }
#endif /* host only */

PG_DEVICE static inline void pendulum_write_obs(const Env *env, float *row, int i) {
    float sin_theta, cos_theta;
    pg_sincosf(env->theta[i], &sin_theta, &cos_theta);
    row[0] = cos_theta;
    row[1] = sin_theta;
    row[2] = env->theta_dot[i];
}

PG_DEVICE static void pendulum_reset_one(Env *env, int i) {
    uint64_t *rng = &env->pg.rng[i];
    /* draw order: angle, then angular velocity */
    env->theta[i] = pg_uniform_range(rng, -3.14159265358979f, 3.14159265358979f);
    env->theta_dot[i] = pg_uniform_range(rng, -1.0f, 1.0f);
    env->returns[i] = 0.0f;
    env->steps[i] = 0;
    pendulum_write_obs(env, (float *)env->pg.observations + 3 * (size_t)i, i);
}

PG_DEVICE static void env_reset(Env *env, int start, int end) {
    for (int i = start; i < end; i++) pendulum_reset_one(env, i);
}

/* Pass 1 of a step: dynamics for `count` instances, branch-free, on restrict
 * pointers offset to the first instance and a size_t index, so it becomes
 * SIMD code (see cartpole.h). */
PG_DEVICE PG_SIMD_KERNEL static void pendulum_physics(
    const Env *env, size_t count, const float *PG_RESTRICT actions, float *PG_RESTRICT thetas,
    float *PG_RESTRICT theta_dots, float *PG_RESTRICT returns, int32_t *PG_RESTRICT steps,
    float *PG_RESTRICT obs, float *PG_RESTRICT rewards, uint8_t *PG_RESTRICT terminals,
    uint8_t *PG_RESTRICT truncations) {
    const float gravity_term = env->gravity_term, torque_term = env->torque_term;
    const float dt = env->dt, max_speed = env->max_speed, max_torque = env->max_torque;
    const int max_steps = env->max_steps;
    for (size_t i = 0; i < count; i++) {
        float theta = thetas[i], theta_dot = theta_dots[i];
        float torque = actions[i];
        torque = fabsf(torque) <= FLT_MAX ? torque : 0.0f; /* NaN, inf -> 0 */
        torque = torque < -max_torque ? -max_torque : torque;
        torque = torque > max_torque ? max_torque : torque;
        /* the cost of the state the action was taken in */
        float cost = theta * theta + 0.1f * (theta_dot * theta_dot) + 0.001f * (torque * torque);
        float sin_theta, cos_theta;
        pg_sincosf(theta, &sin_theta, &cos_theta);
        /* Only the sine is needed here; left alone GCC sinks the cosine
         * polynomial into a branch on the quadrant, which it may not
         * if-convert (float ops could trap), and the AVX2 loop stays scalar.
         * 0 * cos keeps it live and branch-free, changing no finite value. */
        sin_theta = sin_theta + 0.0f * cos_theta;
        theta_dot = theta_dot + (gravity_term * sin_theta + torque_term * torque) * dt;
        theta_dot = theta_dot < -max_speed ? -max_speed : theta_dot;
        theta_dot = theta_dot > max_speed ? max_speed : theta_dot;
        theta = pendulum_wrap_angle(theta + theta_dot * dt);
        pg_sincosf(theta, &sin_theta, &cos_theta);
        float reward = -cost;
        int step_count = steps[i] + 1;
        thetas[i] = theta;
        theta_dots[i] = theta_dot;
        returns[i] = returns[i] + reward;
        steps[i] = step_count;
        obs[3 * i + 0] = cos_theta;
        obs[3 * i + 1] = sin_theta;
        obs[3 * i + 2] = theta_dot;
        rewards[i] = reward;
        terminals[i] = 0;
        truncations[i] = (uint8_t)(step_count >= max_steps);
    }
}

PG_DEVICE static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    float *obs = (float *)pg->observations;
    uint8_t *terminals = pg->terminals, *truncations = pg->truncations;
    size_t s = (size_t)start;
    pendulum_physics(env, (size_t)(end - start), (const float *)pg->actions + s, env->theta + s,
                     env->theta_dot + s, env->returns + s, env->steps + s, obs + 3 * s,
                     pg->rewards + s, terminals + s, truncations + s);

    /* Pass 2: finished episodes keep their last observation, then reset. */
    float *final_obs = (float *)pg->final_observations;
    for (int i = pg_next_ended(terminals, truncations, start, end); i < end;
         i = pg_next_ended(terminals, truncations, i + 1, end)) {
        memcpy(final_obs + 3 * (size_t)i, obs + 3 * (size_t)i, 3 * sizeof(float));
        double episode[2] = {(double)env->returns[i], (double)env->steps[i]};
        pg_stats_record(pg, i, episode);
        pendulum_reset_one(env, i);
    }
}

/* State per instance: angle (any finite value; stored wrapped to [-pi, pi]),
 * angular velocity (within +-max_speed), steps taken (0 <= steps < max_steps),
 * return so far. */
PG_DEVICE static int env_state_size(const Env *env) {
    (void)env;
    return 4;
}

PG_DEVICE static void env_get_state(const Env *env, int i, double *out) {
    out[0] = env->theta[i];
    out[1] = env->theta_dot[i];
    out[2] = env->steps[i];
    out[3] = env->returns[i];
}

PG_DEVICE static int env_set_state(Env *env, int i, const double *in) {
    if (fabs(in[0]) > 1e9 || fabs(in[1]) > env->max_speed || fabs(in[3]) > 1e30) return -1;
    if (in[2] < 0 || in[2] >= env->max_steps || in[2] != (double)(int32_t)in[2]) return -1;
    env->theta[i] = (float)remainder(in[0], 2.0 * 3.14159265358979323846);
    env->theta_dot[i] = (float)in[1];
    env->steps[i] = (int32_t)in[2];
    env->returns[i] = (float)in[3];
    pendulum_write_obs(env, (float *)env->pg.observations + 3 * (size_t)i, i);
    return 0;
}

#endif /* PEREGRINE_PENDULUM_H */
