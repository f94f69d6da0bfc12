/*
 * mountain_car_common.h -- what MountainCar-v0 and MountainCarContinuous-v0
 * share: the track (a wall on the left at -1.2, the right edge at 0.6), the
 * move rule, the per-instance state (position, velocity, steps, return so
 * far), reset, the end-of-episode pass and state get/set. Each variant's
 * header adds only its config, its force and reward, and its physics loop.
 *
 * A variant's Env struct must have `PgBatch pg; MountainCarState car;` and a
 * `max_steps` and `max_speed` field; the helpers below use only those.
 */
#ifndef PEREGRINE_MOUNTAIN_CAR_COMMON_H
#define PEREGRINE_MOUNTAIN_CAR_COMMON_H


#include "pg_env.h"
#include "pg_math.h"

#define MOUNTAIN_CAR_MIN_POSITION -1.2f
#define MOUNTAIN_CAR_MAX_POSITION 0.6f
#define MOUNTAIN_CAR_STATE_SIZE 4 /* position, velocity, steps, return so far */

#define ENV_STATS(X) X(episode_return) X(episode_length) X(success)

typedef struct {
    float *position, *velocity, *returns;
    int32_t *steps;
} MountainCarState;

#ifndef PG_GPU /* host only: config checks and allocation (the GPU batch's Env is built on the host) */
/* `car` is a member of the Env that starts with `pg`. */
static int mountain_car_alloc(PgBatch *pg, MountainCarState *car, size_t n, char *err,
                              size_t errlen) {
    if (pg_alloc(pg, &car->position, n, sizeof(float)) ||
        pg_alloc(pg, &car->velocity, n, sizeof(float)) ||
        pg_alloc(pg, &car->returns, n, sizeof(float)) ||
        pg_alloc(pg, &car->steps, n, sizeof(int32_t))) {
        snprintf(err, errlen, "out of memory for %zu MountainCar instances", n);
        return -1;
    }
    return 0;
}
#endif /* host only */

/* cos(3 position) through pg_sincosf. Adding 0 * sin keeps both polynomials
 * live and branch-free: with only the cosine used, GCC sinks the sine into a
 * branch on the quadrant that it then may not if-convert, and the loop stays
 * scalar. For finite values it changes nothing (the references do the same). */
PG_DEVICE static inline float mountain_car_cos3(float position) {
    float sin_3x, cos_3x;
    pg_sincosf(3.0f * position, &sin_3x, &cos_3x);
    return cos_3x + 0.0f * sin_3x;
}

/* One move: velocity += acceleration (clipped to +-max_speed), position +=
 * velocity (clipped to the track). The left wall is inelastic: Gymnasium stops
 * a car whose clipped position equals the wall while moving left; positions
 * never start left of it, so that is exactly "the unclipped position is at or
 * past the wall", and this form keeps the caller's loop free of branches.
 * Returns whether the goal was reached. */
PG_DEVICE static inline int mountain_car_move(float *position_io, float *velocity_io, float acceleration,
                                    float max_speed, float goal_position, float goal_velocity) {
    float velocity = *velocity_io + acceleration;
    velocity = velocity < -max_speed ? -max_speed : velocity;
    velocity = velocity > max_speed ? max_speed : velocity;
    float position = *position_io + velocity;
    int at_wall = position <= MOUNTAIN_CAR_MIN_POSITION;
    position = at_wall ? MOUNTAIN_CAR_MIN_POSITION : position;
    position = position > MOUNTAIN_CAR_MAX_POSITION ? MOUNTAIN_CAR_MAX_POSITION : position;
    velocity = at_wall ? 0.0f : velocity;
    *position_io = position;
    *velocity_io = velocity;
    return (position >= goal_position) & (velocity >= goal_velocity);
}

PG_DEVICE static inline void mountain_car_write_obs(const MountainCarState *car, PgBatch *pg, int i) {
    float *row = (float *)pg->observations + 2 * (size_t)i;
    row[0] = car->position[i];
    row[1] = car->velocity[i];
}

/* Reset draws the position uniformly from [-0.6, -0.4); velocity 0. */
PG_DEVICE static void mountain_car_reset_one(MountainCarState *car, PgBatch *pg, int i) {
    car->position[i] = pg_uniform_range(&pg->rng[i], -0.6f, -0.4f);
    car->velocity[i] = 0.0f;
    car->returns[i] = 0.0f;
    car->steps[i] = 0;
    mountain_car_write_obs(car, pg, i);
}

PG_DEVICE static void mountain_car_reset_range(MountainCarState *car, PgBatch *pg, int start, int end) {
    for (int i = start; i < end; i++) mountain_car_reset_one(car, pg, i);
}

/* Pass 2 of a step: finished episodes keep their last observation, record
 * (return, length, success) and reset. */
PG_DEVICE static void mountain_car_finish_episodes(MountainCarState *car, PgBatch *pg, int start, int end) {
    const uint8_t *terminals = pg->terminals, *truncations = pg->truncations;
    float *obs = (float *)pg->observations, *final_obs = (float *)pg->final_observations;
    for (int i = pg_next_ended(terminals, truncations, start, end); i < end;
         i = pg_next_ended(terminals, truncations, i + 1, end)) {
        memcpy(final_obs + 2 * (size_t)i, obs + 2 * (size_t)i, 2 * sizeof(float));
        double episode[3] = {(double)car->returns[i], (double)car->steps[i],
                             (double)terminals[i]};
        pg_stats_record(pg, i, episode);
        mountain_car_reset_one(car, pg, i);
    }
}

PG_DEVICE static void mountain_car_get_state(const MountainCarState *car, int i, double *out) {
    out[0] = car->position[i];
    out[1] = car->velocity[i];
    out[2] = car->steps[i];
    out[3] = car->returns[i];
}

/* Refuses positions off the track, speeds past max_speed, step counts outside
 * [0, max_steps) and absurd returns. */
PG_DEVICE static int mountain_car_set_state(MountainCarState *car, PgBatch *pg, int i, const double *in,
                                  float max_speed, int max_steps) {
    if (!(fabs(in[0]) <= 10.0 && fabs(in[1]) <= 10.0 && fabs(in[3]) <= 1e30)) return -1;
    float position = (float)in[0], velocity = (float)in[1];
    if (!(position >= MOUNTAIN_CAR_MIN_POSITION && position <= MOUNTAIN_CAR_MAX_POSITION))
        return -1;
    if (!(velocity >= -max_speed && velocity <= max_speed)) return -1;
    if (in[2] < 0 || in[2] >= max_steps || in[2] != (double)(int32_t)in[2]) return -1;
    car->position[i] = position;
    car->velocity[i] = velocity;
    car->steps[i] = (int32_t)in[2];
    car->returns[i] = (float)in[3];
    mountain_car_write_obs(car, pg, i);
    return 0;
}

#endif /* PEREGRINE_MOUNTAIN_CAR_COMMON_H */
