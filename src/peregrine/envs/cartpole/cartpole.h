/*
 * cartpole.h -- CartPole-v1, the batch of N instances, in C.
 *
 * Same rules as Gymnasium's CartPole-v1 (Barto, Sutton & Anderson 1983):
 * Euler integration with tau = 0.02; force +-force_mag for action 1/0;
 * termination when |x| > 2.4 or |theta| > 12 degrees; reward 1 on every step,
 * the terminating one included; truncation after max_steps (500) steps; reset
 * draws all four state variables uniformly from [-0.05, 0.05).
 *
 * Differences from Gymnasium, by design: float32 arithmetic (Gymnasium uses
 * float64 then casts; the two agree to ~1e-6) and pg_sincosf instead of libm.
 * An episode that terminates on its last allowed step is reported as
 * terminal only, since its true continuation value is zero.
 *
 * Layout: the state is kept structure-of-arrays so the physics loop compiles
 * to SIMD; observations are written row-major [N, 4]. The step is two passes:
 * physics for every instance (branch-free), then resets for the few that
 * ended.
 */
#ifndef PEREGRINE_CARTPOLE_H
#define PEREGRINE_CARTPOLE_H

#include "pg_env.h"
#include "pg_math.h"

/* X(name, default, min, max, is_integer) */
#define ENV_CONFIG(X)                                \
    X(max_steps, 500, 1, 1e9, 1)                     \
    X(gravity, 9.8, 0, 1e4, 0)                       \
    X(masscart, 1.0, 1e-6, 1e6, 0)                   \
    X(masspole, 0.1, 1e-6, 1e6, 0)                   \
    X(length, 0.5, 1e-6, 1e6, 0)                     \
    X(force_mag, 10.0, 0, 1e6, 0)                    \
    X(tau, 0.02, 1e-6, 10, 0)                        \
    X(x_threshold, 2.4, 1e-6, 1e6, 0)                \
    X(theta_threshold, 0.20943951023931956, 1e-6, 3.14159, 0)

enum { ENV_CONFIG(PG_CONFIG_INDEX) }; /* CFG_max_steps, CFG_gravity, ... */

#define ENV_STATS(X) X(episode_return) X(episode_length)

struct Env {
    PgBatch pg;
    /* constants, in float32 as the step uses them */
    int max_steps;
    float gravity, masspole, total_mass, length, polemass_length, force_mag, tau;
    float x_threshold, theta_threshold;
    /* state, one entry per instance */
    float *x, *x_dot, *theta, *theta_dot;
    int32_t *steps;
};
typedef struct Env Env;

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
static int env_init(Env *env, const double *config, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    env->max_steps = (int)config[CFG_max_steps];
    env->gravity = (float)config[CFG_gravity];
    float masscart = (float)config[CFG_masscart];
    env->masspole = (float)config[CFG_masspole];
    env->length = (float)config[CFG_length];
    env->force_mag = (float)config[CFG_force_mag];
    env->tau = (float)config[CFG_tau];
    env->x_threshold = (float)config[CFG_x_threshold];
    env->theta_threshold = (float)config[CFG_theta_threshold];
    env->total_mass = env->masspole + masscart;
    env->polemass_length = env->masspole * env->length;

    PgBatch *pg = &env->pg;
    pg->obs_dim = 4;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = 1;
    pg->action_kind = PG_ACTION_DISCRETE;
    pg->action_dim = 1;
    pg->action_nvec[0] = 2;

    size_t n = (size_t)pg->num_envs;
    if (PG_ALLOC(env, x, n) || PG_ALLOC(env, x_dot, n) || PG_ALLOC(env, theta, n) ||
        PG_ALLOC(env, theta_dot, n) || PG_ALLOC(env, steps, n)) {
        snprintf(err, errlen, "out of memory for %zu CartPole instances", n);
        return -1;
    }
    return 0;
}

static void env_free(Env *env) { (void)env; /* every array came from PG_ALLOC */ }
#endif /* host only */

PG_DEVICE static inline void cartpole_write_obs(const Env *env, float *row, int i) {
    row[0] = env->x[i];
    row[1] = env->x_dot[i];
    row[2] = env->theta[i];
    row[3] = env->theta_dot[i];
}

PG_DEVICE static void cartpole_reset_one(Env *env, int i) {
    uint64_t *rng = &env->pg.rng[i];
    env->x[i] = pg_uniform_range(rng, -0.05f, 0.05f);
    env->x_dot[i] = pg_uniform_range(rng, -0.05f, 0.05f);
    env->theta[i] = pg_uniform_range(rng, -0.05f, 0.05f);
    env->theta_dot[i] = pg_uniform_range(rng, -0.05f, 0.05f);
    env->steps[i] = 0;
    cartpole_write_obs(env, (float *)env->pg.observations + 4 * (size_t)i, i);
}

PG_DEVICE static void env_reset(Env *env, int start, int end) {
    for (int i = start; i < end; i++) cartpole_reset_one(env, i);
}

/* Pass 1 of a step: physics for `count` instances, branch-free, on restrict
 * pointers already offset to the first instance and a size_t index (Python
 * builds with -fwrapv, and a wrapping int index blocks the vectorizer): the
 * compiler turns it into SIMD. */
PG_DEVICE PG_SIMD_KERNEL static void cartpole_physics(
                             const Env *env, size_t count, const int32_t *PG_RESTRICT actions,
                             float *PG_RESTRICT xs, float *PG_RESTRICT x_dots,
                             float *PG_RESTRICT thetas, float *PG_RESTRICT theta_dots,
                             int32_t *PG_RESTRICT steps, float *PG_RESTRICT obs,
                             float *PG_RESTRICT rewards, uint8_t *PG_RESTRICT terminals,
                             uint8_t *PG_RESTRICT truncations) {
    const float gravity = env->gravity, masspole = env->masspole;
    const float total_mass = env->total_mass, length = env->length;
    const float polemass_length = env->polemass_length, force_mag = env->force_mag;
    const float tau = env->tau, x_threshold = env->x_threshold;
    const float theta_threshold = env->theta_threshold;
    const int max_steps = env->max_steps;
    for (size_t i = 0; i < count; i++) {
        float x = xs[i], x_dot = x_dots[i], theta = thetas[i], theta_dot = theta_dots[i];
        float force = actions[i] == 1 ? force_mag : -force_mag;
        float sintheta, costheta;
        pg_sincosf(theta, &sintheta, &costheta);
        float temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass;
        float thetaacc = (gravity * sintheta - costheta * temp) /
                         (length * (4.0f / 3.0f - masspole * (costheta * costheta) / total_mass));
        float xacc = temp - polemass_length * thetaacc * costheta / total_mass;
        x = x + tau * x_dot;
        x_dot = x_dot + tau * xacc;
        theta = theta + tau * theta_dot;
        theta_dot = theta_dot + tau * thetaacc;
        int terminal = (x < -x_threshold) | (x > x_threshold) | (theta < -theta_threshold) |
                       (theta > theta_threshold);
        int step_count = steps[i] + 1;
        xs[i] = x;
        x_dots[i] = x_dot;
        thetas[i] = theta;
        theta_dots[i] = theta_dot;
        steps[i] = step_count;
        obs[4 * i + 0] = x;
        obs[4 * i + 1] = x_dot;
        obs[4 * i + 2] = theta;
        obs[4 * i + 3] = theta_dot;
        rewards[i] = 1.0f;
        terminals[i] = (uint8_t)terminal;
        truncations[i] = (uint8_t)(!terminal & (step_count >= max_steps));
    }
}

PG_DEVICE static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    float *obs = (float *)pg->observations;
    uint8_t *terminals = pg->terminals, *truncations = pg->truncations;
    int32_t *steps = env->steps;
    size_t s = (size_t)start;
    cartpole_physics(env, (size_t)(end - start), (const int32_t *)pg->actions + s, env->x + s,
                     env->x_dot + s, env->theta + s, env->theta_dot + s, steps + s,
                     obs + 4 * s, pg->rewards + s, terminals + s, truncations + s);

    /* Pass 2: finished episodes keep their last observation, then reset. */
    float *final_obs = (float *)pg->final_observations;
    for (int i = pg_next_ended(terminals, truncations, start, end); i < end;
         i = pg_next_ended(terminals, truncations, i + 1, end)) {
        memcpy(final_obs + 4 * (size_t)i, obs + 4 * (size_t)i, 4 * sizeof(float));
        double episode[2] = {(double)steps[i], (double)steps[i]};
        pg_stats_record(pg, i, episode);
        cartpole_reset_one(env, i);
    }
}

PG_DEVICE static int env_state_size(const Env *env) {
    (void)env;
    return 5;
}

PG_DEVICE static void env_get_state(const Env *env, int i, double *out) {
    out[0] = env->x[i];
    out[1] = env->x_dot[i];
    out[2] = env->theta[i];
    out[3] = env->theta_dot[i];
    out[4] = env->steps[i];
}

PG_DEVICE static int env_set_state(Env *env, int i, const double *in) {
    if (in[4] < 0 || in[4] >= env->max_steps || in[4] != (double)(int32_t)in[4]) return -1;
    env->x[i] = (float)in[0];
    env->x_dot[i] = (float)in[1];
    env->theta[i] = (float)in[2];
    env->theta_dot[i] = (float)in[3];
    env->steps[i] = (int32_t)in[4];
    cartpole_write_obs(env, (float *)env->pg.observations + 4 * (size_t)i, i);
    return 0;
}

#endif /* PEREGRINE_CARTPOLE_H */
