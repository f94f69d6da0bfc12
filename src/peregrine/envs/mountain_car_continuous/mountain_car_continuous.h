/*
 * mountain_car_continuous.h -- MountainCarContinuous-v0, the batch of N
 * instances, in C.
 *
 * Same rules as Gymnasium's MountainCarContinuous-v0:
 *   force     = clip(action, -1, 1)
 *   velocity' = clip(velocity + force power - 0.0025 cos(3 position),
 *                    -max_speed, max_speed)             (power 0.0015)
 *   position' = clip(position + velocity', -1.2, 0.6)
 *   velocity' = 0 if position' hit the left wall (== -1.2) while moving left
 *   reward    = (100 if the goal is reached) - 0.1 action^2
 * Terminal when position' >= goal_position (0.45) and velocity' >=
 * goal_velocity (0); truncated after max_steps (999) steps. Reset: position
 * uniform in [-0.6, -0.4), velocity 0.
 *
 * Actions: Box(-1, 1, (1,)) float32, the generic continuous space, which is
 * also Gymnasium's. As in Gymnasium the action cost uses the action as given,
 * before clipping (a policy pays for out-of-range outputs); to keep the
 * reward finite for any input action^2 saturates at 1e12. NaN/inf actions
 * count as 0.
 *
 * Differences from Gymnasium, by design: float32 arithmetic and pg_sincosf
 * (one step from the same state agrees to ~1e-6 in the reward and ~1e-8 in
 * the state; the goal test can differ only when the new position lies within
 * ~1e-7 of the goal). An episode that reaches the goal on its last allowed
 * step is reported as terminal only.
 *
 * Layout: structure-of-arrays state; a branch-free physics pass that the
 * compiler vectorizes, then a reset pass over the (few) instances that ended.
 */
#ifndef PEREGRINE_MOUNTAIN_CAR_CONTINUOUS_H
#define PEREGRINE_MOUNTAIN_CAR_CONTINUOUS_H


#include "../mountain_car/mountain_car_common.h"

/* X(name, default, min, max, is_integer) */
#define ENV_CONFIG(X)                          \
    X(max_steps, 999, 1, 1e9, 1)               \
    X(goal_position, 0.45, -1.2, 0.6, 0)       \
    X(goal_velocity, 0.0, -1, 1, 0)            \
    X(power, 0.0015, 0, 1, 0)                  \
    X(gravity, 0.0025, 0, 1, 0)                \
    X(max_speed, 0.07, 1e-6, 1, 0)             \
    X(goal_reward, 100.0, -1e6, 1e6, 0)        \
    X(action_cost, 0.1, 0, 1e3, 0)

enum { ENV_CONFIG(PG_CONFIG_INDEX) }; /* CFG_max_steps, CFG_goal_position, ... */

#define MOUNTAIN_CAR_MAX_ACTION_SQUARED 1e12f /* the action cost saturates here */

struct Env {
    PgBatch pg;
    /* constants, in float32 as the step uses them */
    int max_steps;
    float goal_position, goal_velocity, power, gravity, max_speed, goal_reward, action_cost;
    MountainCarState car;
    /* scratch: this step's actions with NaN/inf replaced by 0 */
    float *finite_actions;
};
typedef struct Env Env;

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
static int env_init(Env *env, const double *config, char *err, size_t errlen) {
    env->max_steps = (int)config[CFG_max_steps];
    env->goal_position = (float)config[CFG_goal_position];
    env->goal_velocity = (float)config[CFG_goal_velocity];
    env->power = (float)config[CFG_power];
    env->gravity = (float)config[CFG_gravity];
    env->max_speed = (float)config[CFG_max_speed];
    env->goal_reward = (float)config[CFG_goal_reward];
    env->action_cost = (float)config[CFG_action_cost];

    PgBatch *pg = &env->pg;
    pg->obs_dim = 2;
    pg->obs_is_uint8 = 0;
    pg->agents_per_env = 1;
    pg->action_kind = PG_ACTION_CONTINUOUS;
    pg->action_dim = 1;
    size_t n = (size_t)pg->num_envs;
    if (PG_ALLOC(env, finite_actions, n)) {
        snprintf(err, errlen, "out of memory for %zu MountainCarContinuous instances", n);
        return -1;
    }
    return mountain_car_alloc(pg, &env->car, n, err, errlen);
}

static void env_free(Env *env) { (void)env; /* every array came from pg_alloc */ }
#endif /* host only */

#include "../mountain_car/mountain_car_env.h"

/* Pass 1 of a step: dynamics for `count` instances, branch-free, on restrict
 * pointers offset to the first instance and a size_t index, so it becomes
 * SIMD code (see cartpole.h).
 *
 * GCC partially evaluates float ops on the path where a NaN action became the
 * constant 0 and then refuses to if-convert; that is why NaN handling is a
 * loop of its own writing a scratch array, and why the force is clipped after
 * multiplying by power: clip(a, -1, 1) * power equals clip(a * power, -power,
 * power) exactly, since rounding is monotonic. */
PG_DEVICE PG_SIMD_KERNEL static void mountain_car_continuous_physics(
    const Env *env, size_t count, const float *PG_RESTRICT actions,
    float *PG_RESTRICT finite_actions, float *PG_RESTRICT positions,
    float *PG_RESTRICT velocities, float *PG_RESTRICT returns, int32_t *PG_RESTRICT steps,
    float *PG_RESTRICT obs, float *PG_RESTRICT rewards, uint8_t *PG_RESTRICT terminals,
    uint8_t *PG_RESTRICT truncations) {
    const float power = env->power, gravity = env->gravity, max_speed = env->max_speed;
    const float goal_position = env->goal_position, goal_velocity = env->goal_velocity;
    const float goal_reward = env->goal_reward, action_cost = env->action_cost;
    const float max_action_squared = MOUNTAIN_CAR_MAX_ACTION_SQUARED;
    const int max_steps = env->max_steps;
    for (size_t i = 0; i < count; i++) {
        float action = actions[i];
        finite_actions[i] = fabsf(action) <= FLT_MAX ? action : 0.0f; /* NaN, inf -> 0 */
    }
    for (size_t i = 0; i < count; i++) {
        float position = positions[i], velocity = velocities[i];
        float action = finite_actions[i];
        /* clip(action, -1, 1) * power, the same float32 value as Gymnasium's order */
        float push = action * power;
        push = push < -power ? -power : push;
        push = push > power ? power : push;
        float action_squared = action * action; /* the cost uses the unclipped action */
        action_squared = action_squared > max_action_squared ? max_action_squared : action_squared;
        float acceleration = push - gravity * mountain_car_cos3(position);
        int terminal = mountain_car_move(&position, &velocity, acceleration, max_speed,
                                         goal_position, goal_velocity);
        float reward = (terminal ? goal_reward : 0.0f) - action_squared * action_cost;
        int step_count = steps[i] + 1;
        positions[i] = position;
        velocities[i] = velocity;
        returns[i] = returns[i] + reward;
        steps[i] = step_count;
        obs[2 * i + 0] = position;
        obs[2 * i + 1] = velocity;
        rewards[i] = reward;
        terminals[i] = (uint8_t)terminal;
        truncations[i] = (uint8_t)(!terminal & (step_count >= max_steps));
    }
}

PG_DEVICE static void env_step(Env *env, int start, int end) {
    PgBatch *pg = &env->pg;
    MountainCarState *car = &env->car;
    size_t s = (size_t)start;
    mountain_car_continuous_physics(
        env, (size_t)(end - start), (const float *)pg->actions + s, env->finite_actions + s,
        car->position + s, car->velocity + s, car->returns + s, car->steps + s,
        (float *)pg->observations + 2 * s, pg->rewards + s, pg->terminals + s,
        pg->truncations + s);
    mountain_car_finish_episodes(car, pg, start, end);
}

#endif /* PEREGRINE_MOUNTAIN_CAR_CONTINUOUS_H */
