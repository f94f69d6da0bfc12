/*
 * mountain_car.h -- MountainCar-v0, the batch of N instances, in C.
 *
 * Same rules as Gymnasium's MountainCar-v0 (Moore 1990; Sutton & Barto):
 *   velocity' = clip(velocity + (action - 1) force - gravity cos(3 position),
 *                    -max_speed, max_speed)       (force 0.001, gravity 0.0025)
 *   position' = clip(position + velocity', -1.2, 0.6)
 *   velocity' = 0 if position' hit the left wall (== -1.2) while moving left
 * Actions: 0 push left, 1 no push, 2 push right. Reward -1 on every step.
 * Terminal when position' >= goal_position (0.5) and velocity' >=
 * goal_velocity (0); truncated after max_steps (200) steps. Reset: position
 * uniform in [-0.6, -0.4), velocity 0.
 *
 * Differences from Gymnasium, by design: float32 arithmetic and pg_sincosf
 * (Gymnasium computes in float64 and returns float32 observations; one step
 * from the same state agrees to ~1e-8, and the goal test can differ only when
 * the new position lies within ~1e-7 of the goal). An episode that reaches
 * the goal on its last allowed step is reported as terminal only.
 *
 * Layout: structure-of-arrays state; a branch-free physics pass that the
 * compiler vectorizes, then a reset pass over the (few) instances that ended.
 */
#ifndef PEREGRINE_MOUNTAIN_CAR_H
#define PEREGRINE_MOUNTAIN_CAR_H

#include <stdlib.h>

#include "pg_env.h"
#include "pg_math.h"

/* X(name, default, min, max, is_integer) */
#define ENV_CONFIG(X)                          \
    X(max_steps, 200, 1, 1e9, 1)               \
    X(goal_position, 0.5, -1.2, 0.6, 0)        \
    X(goal_velocity, 0.0, -1, 1, 0)            \
    X(force, 0.001, 0, 1, 0)                   \
    X(gravity, 0.0025, 0, 1, 0)                \
    X(max_speed, 0.07, 1e-6, 1, 0)

#define ENV_STATS(X) X(episode_return) X(episode_length) X(success)

#define MOUNTAIN_CAR_MIN_POSITION -1.2f
#define MOUNTAIN_CAR_MAX_POSITION 0.6f

struct Env {
    PgBatch pg;
    /* constants, in float32 as the step uses them */
    int max_steps;
    float goal_position, goal_velocity, force, gravity, max_speed;
    /* state, one entry per instance */
    float *position, *velocity;
    int32_t *steps;
};
typedef struct Env Env;

static int env_init(Env *env, const double *config, char *err, size_t errlen) {
    env->max_steps = (int)config[0];
    env->goal_position = (float)config[1];
    env->goal_velocity = (float)config[2];
    env->force = (float)config[3];
    env->gravity = (float)config[4];
    env->max_speed = (float)config[5];

    PgBatch *pg = &env->pg;
    pg->obs_dim = 2;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = 1;
    pg->action_kind = PG_ACTION_DISCRETE;
    pg->action_dim = 1;
    pg->action_nvec[0] = 3;

    size_t n = (size_t)pg->num_envs;
    env->position = (float *)calloc(n, sizeof(float));
    env->velocity = (float *)calloc(n, sizeof(float));
    env->steps = (int32_t *)calloc(n, sizeof(int32_t));
    if (!env->position || !env->velocity || !env->steps) {
        snprintf(err, errlen, "out of memory for %zu MountainCar instances", n);
        return -1;
    }
    return 0;
}

static void env_free(Env *env) {
    free(env->position);
    free(env->velocity);
    free(env->steps);
}

static inline void mountain_car_write_obs(const Env *env, float *row, int i) {
    row[0] = env->position[i];
    row[1] = env->velocity[i];
}

static void mountain_car_reset_one(Env *env, int i) {
    env->position[i] = pg_uniform_range(&env->pg.rng[i], -0.6f, -0.4f);
    env->velocity[i] = 0.0f;
    env->steps[i] = 0;
    mountain_car_write_obs(env, (float *)env->pg.observations + 2 * (size_t)i, i);
}

static void env_reset(Env *env, int start, int end) {
    for (int i = start; i < end; i++) mountain_car_reset_one(env, i);
}

/* Pass 1 of a step: dynamics for `count` instances, branch-free, on restrict
 * pointers offset to the first instance and a size_t index, so it becomes
 * SIMD code (see cartpole.h).
 *
 * MOUNTAIN_CAR_COS note: only the cosine of pg_sincosf is needed, and left
 * alone GCC sinks the sine polynomial into a branch on the quadrant, which it
 * then may not if-convert (float ops could trap), so the loop stays scalar.
 * Adding 0 * sin keeps both polynomials live and branch-free; for finite
 * values it changes nothing (the NumPy reference does the same). */
PG_SIMD_KERNEL static void mountain_car_physics(
    const Env *env, size_t count, const int32_t *restrict actions,
    float *restrict positions, float *restrict velocities, int32_t *restrict steps,
    float *restrict obs, float *restrict rewards, uint8_t *restrict terminals,
    uint8_t *restrict truncations) {
    const float force = env->force, neg_gravity = -env->gravity, max_speed = env->max_speed;
    const float goal_position = env->goal_position, goal_velocity = env->goal_velocity;
    const float min_position = MOUNTAIN_CAR_MIN_POSITION;
    const float max_position = MOUNTAIN_CAR_MAX_POSITION;
    const int max_steps = env->max_steps;
    for (size_t i = 0; i < count; i++) {
        float position = positions[i], velocity = velocities[i];
        float push = (float)(actions[i] - 1) * force; /* -force, 0 or +force */
        float sin_3x, cos_3x;
        pg_sincosf(3.0f * position, &sin_3x, &cos_3x);
        cos_3x = cos_3x + 0.0f * sin_3x; /* see MOUNTAIN_CAR_COS note above */
        velocity = velocity + (push + cos_3x * neg_gravity);
        velocity = velocity < -max_speed ? -max_speed : velocity;
        velocity = velocity > max_speed ? max_speed : velocity;
        position = position + velocity;
        /* An inelastic wall on the left: Gymnasium stops a car whose clipped
         * position equals min_position while moving left. Positions never start
         * left of the wall, so that is exactly "the unclipped position is at
         * or past the wall" (it can be only when velocity < 0, or velocity is
         * 0 already); this form keeps the loop free of branches. */
        int at_wall = position <= min_position;
        position = at_wall ? min_position : position;
        position = position > max_position ? max_position : position;
        velocity = at_wall ? 0.0f : velocity;
        int terminal = (position >= goal_position) & (velocity >= goal_velocity);
        int step_count = steps[i] + 1;
        positions[i] = position;
        velocities[i] = velocity;
        steps[i] = step_count;
        obs[2 * i + 0] = position;
        obs[2 * i + 1] = velocity;
        rewards[i] = -1.0f;
        terminals[i] = (uint8_t)terminal;
        truncations[i] = (uint8_t)(!terminal & (step_count >= max_steps));
    }
}

static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    float *obs = (float *)pg->observations;
    uint8_t *terminals = pg->terminals, *truncations = pg->truncations;
    size_t s = (size_t)start;
    mountain_car_physics(env, (size_t)(end - start), (const int32_t *)pg->actions + s,
                         env->position + s, env->velocity + s, env->steps + s, obs + 2 * s,
                         pg->rewards + s, terminals + s, truncations + s);

    /* Pass 2: finished episodes keep their last observation, then reset. */
    float *final_obs = (float *)pg->final_observations;
    for (int i = pg_next_ended(terminals, truncations, start, end); i < end;
         i = pg_next_ended(terminals, truncations, i + 1, end)) {
        memcpy(final_obs + 2 * (size_t)i, obs + 2 * (size_t)i, 2 * sizeof(float));
        /* reward is -1 per step, so the return is minus the length */
        double episode[3] = {-(double)env->steps[i], (double)env->steps[i],
                             (double)terminals[i]};
        pg_stats_record(pg, i, episode);
        mountain_car_reset_one(env, i);
    }
}

/* State per instance: position (within [-1.2, 0.6]), velocity (within
 * +-max_speed), steps taken (0 <= steps < max_steps). */
static int env_state_size(const Env *env) {
    (void)env;
    return 3;
}

static void env_get_state(const Env *env, int i, double *out) {
    out[0] = env->position[i];
    out[1] = env->velocity[i];
    out[2] = env->steps[i];
}

static int env_set_state(Env *env, int i, const double *in) {
    if (!(fabs(in[0]) <= 10.0 && fabs(in[1]) <= 10.0)) return -1; /* before the casts */
    float position = (float)in[0], velocity = (float)in[1];
    if (!(position >= MOUNTAIN_CAR_MIN_POSITION && position <= MOUNTAIN_CAR_MAX_POSITION))
        return -1;
    if (!(velocity >= -env->max_speed && velocity <= env->max_speed)) return -1;
    if (in[2] < 0 || in[2] >= env->max_steps || in[2] != (double)(int32_t)in[2]) return -1;
    env->position[i] = position;
    env->velocity[i] = velocity;
    env->steps[i] = (int32_t)in[2];
    mountain_car_write_obs(env, (float *)env->pg.observations + 2 * (size_t)i, i);
    return 0;
}

#endif /* PEREGRINE_MOUNTAIN_CAR_H */
