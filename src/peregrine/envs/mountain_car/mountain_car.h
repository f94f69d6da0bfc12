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

#include "mountain_car_common.h"

/* X(name, default, min, max, is_integer) */
#define ENV_CONFIG(X)                          \
    X(max_steps, 200, 1, 1e9, 1)               \
    X(goal_position, 0.5, -1.2, 0.6, 0)        \
    X(goal_velocity, 0.0, -1, 1, 0)            \
    X(force, 0.001, 0, 1, 0)                   \
    X(gravity, 0.0025, 0, 1, 0)                \
    X(max_speed, 0.07, 1e-6, 1, 0)

enum { ENV_CONFIG(PG_CONFIG_INDEX) }; /* CFG_max_steps, CFG_goal_position, ... */

struct Env {
    PgBatch pg;
    /* constants, in float32 as the step uses them */
    int max_steps;
    float goal_position, goal_velocity, force, gravity, max_speed;
    MountainCarState car;
};
typedef struct Env Env;

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
static int env_init(Env *env, const double *config, char *err, size_t errlen) {
    env->max_steps = (int)config[CFG_max_steps];
    env->goal_position = (float)config[CFG_goal_position];
    env->goal_velocity = (float)config[CFG_goal_velocity];
    env->force = (float)config[CFG_force];
    env->gravity = (float)config[CFG_gravity];
    env->max_speed = (float)config[CFG_max_speed];

    PgBatch *pg = &env->pg;
    pg->obs_dim = 2;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = 1;
    pg->action_kind = PG_ACTION_DISCRETE;
    pg->action_dim = 1;
    pg->action_nvec[0] = 3;
    return mountain_car_alloc(pg, &env->car, (size_t)pg->num_envs, err, errlen);
}

static void env_free(Env *env) { (void)env; /* every array came from pg_alloc */ }
#endif /* host only */

#include "mountain_car_env.h"

/* Pass 1 of a step: dynamics for `count` instances, branch-free, on restrict
 * pointers offset to the first instance and a size_t index, so it becomes
 * SIMD code (see cartpole.h). */
PG_DEVICE PG_SIMD_KERNEL static void mountain_car_physics(
    const Env *env, size_t count, const int32_t *PG_RESTRICT actions,
    float *PG_RESTRICT positions, float *PG_RESTRICT velocities, float *PG_RESTRICT returns,
    int32_t *PG_RESTRICT steps, float *PG_RESTRICT obs, float *PG_RESTRICT rewards,
    uint8_t *PG_RESTRICT terminals, uint8_t *PG_RESTRICT truncations) {
    const float force = env->force, neg_gravity = -env->gravity, max_speed = env->max_speed;
    const float goal_position = env->goal_position, goal_velocity = env->goal_velocity;
    const int max_steps = env->max_steps;
    for (size_t i = 0; i < count; i++) {
        float position = positions[i], velocity = velocities[i];
        float push = (float)(actions[i] - 1) * force; /* -force, 0 or +force */
        float acceleration = push + mountain_car_cos3(position) * neg_gravity;
        int terminal = mountain_car_move(&position, &velocity, acceleration, max_speed,
                                         goal_position, goal_velocity);
        int step_count = steps[i] + 1;
        positions[i] = position;
        velocities[i] = velocity;
        returns[i] = returns[i] - 1.0f;
        steps[i] = step_count;
        obs[2 * i + 0] = position;
        obs[2 * i + 1] = velocity;
        rewards[i] = -1.0f;
        terminals[i] = (uint8_t)terminal;
        truncations[i] = (uint8_t)(!terminal & (step_count >= max_steps));
    }
}

PG_DEVICE static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    MountainCarState *car = &env->car;
    size_t s = (size_t)start;
    mountain_car_physics(env, (size_t)(end - start), (const int32_t *)pg->actions + s,
                         car->position + s, car->velocity + s, car->returns + s,
                         car->steps + s, (float *)pg->observations + 2 * s, pg->rewards + s,
                         pg->terminals + s, pg->truncations + s);
    mountain_car_finish_episodes(car, pg, start, end);
}

#endif /* PEREGRINE_MOUNTAIN_CAR_H */
