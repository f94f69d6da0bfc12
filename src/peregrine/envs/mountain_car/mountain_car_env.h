/*
 * mountain_car_env.h -- the binding's reset and state functions, the same for
 * MountainCar-v0 and MountainCarContinuous-v0. Include it after the variant's
 * `struct Env` (which has `PgBatch pg; MountainCarState car;` and `max_steps`,
 * `max_speed` fields, see mountain_car_common.h).
 */
#ifndef PEREGRINE_MOUNTAIN_CAR_ENV_H
#define PEREGRINE_MOUNTAIN_CAR_ENV_H

PG_DEVICE static void env_reset(Env *env, int start, int end) {
    mountain_car_reset_range(&env->car, &env->pg, start, end);
}

/* State per instance: position (within [-1.2, 0.6]), velocity (within
 * +-max_speed), steps taken (0 <= steps < max_steps), return so far. */
PG_DEVICE static int env_state_size(const Env *env) {
    (void)env;
    return MOUNTAIN_CAR_STATE_SIZE;
}

PG_DEVICE static void env_get_state(const Env *env, int i, double *out) {
    mountain_car_get_state(&env->car, i, out);
}

PG_DEVICE static int env_set_state(Env *env, int i, const double *in) {
    return mountain_car_set_state(&env->car, &env->pg, i, in, env->max_speed, env->max_steps);
}

#endif /* PEREGRINE_MOUNTAIN_CAR_ENV_H */
