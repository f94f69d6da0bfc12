/*
 * pg_gpu.h -- the GPU batch's kernels: an env header, unchanged, stepped one
 * GPU thread per instance.
 *
 * peregrine/envs/gpu/compiler.py compiles, with NVRTC, a two-line source that includes
 * the env's header and then this file. The Env struct lives in device memory:
 * the GPU batch builds it on the host with the env's own env_init (through the
 * CPU binding), copies every pg_alloc array to the device and patches the
 * pointers (pg_env.h), so the kernels see the same layout the CPU build uses.
 * Instances never share state, so thread i runs env_step(env, i, i + 1) with
 * nothing but its own rows, exactly as one CPU thread would run a range.
 */
#ifndef PEREGRINE_PG_GPU_H
#define PEREGRINE_PG_GPU_H

/* This thread's instance, in 64 bits. blockIdx.x * blockDim.x is an unsigned
 * 32-bit product that wraps past 2^32 threads, and an int cast of it goes
 * negative past 2^31 - 1, where a negative index would pass a `>= num_envs`
 * test. compiler.launch_config keeps today's launches below both (one thread per
 * instance, at most 2^31 - 1 instances, 128-thread blocks); the 64-bit index
 * keeps the guard right for any grid. */
__device__ static inline unsigned long long pg_thread_index(void) {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

/* Instance i's global state into pg.states, when one is attached (pg_env.h,
 * ENV_GLOBAL_STATE); as the CPU binding's pg_write_states. */
__device__ static void pg_write_state(Env *env, int i) {
#ifdef ENV_GLOBAL_STATE
    if (env->pg.states)
        env_global_state(env, i, env->pg.states + (size_t)i * (size_t)env->pg.state_dim);
#else
    (void)env, (void)i;
#endif
}

/* One step of every instance: bad actions repaired and counted first
 * (pg_repair_actions), then the env's own step, auto-reset included, then the
 * global state when one is attached. */
extern "C" __global__ void pg_step(Env *env, unsigned long long *errors) {
    const unsigned long long thread = pg_thread_index();
    if (thread >= (unsigned long long)env->pg.num_envs) return;
    const int i = (int)thread; /* < num_envs, an int */
    pg_repair_actions(&env->pg, i, errors);
    env_step(env, i, i + 1);
    pg_write_state(env, i);
}

/* Every instance's global state from the current env state (after states are
 * attached, or after the host wrote instances' exact states). */
extern "C" __global__ void pg_states(Env *env) {
    const unsigned long long thread = pg_thread_index();
    if (thread >= (unsigned long long)env->pg.num_envs) return;
    pg_write_state(env, (int)thread);
}

/* Fresh episodes everywhere, as the CPU batch's reset: with `reseed`, every
 * instance's stream restarts from (seed, instance) first. */
extern "C" __global__ void pg_reset(Env *env, unsigned long long seed, int reseed) {
    const unsigned long long thread = pg_thread_index();
    if (thread >= (unsigned long long)env->pg.num_envs) return;
    const int i = (int)thread;
    if (reseed) env->pg.rng[i] = pg_seed_instance(seed, (uint64_t)i);
    pg_clear_instance(&env->pg, i, 1);
    env_reset(env, i, i + 1);
    pg_write_state(env, i);
}

#endif /* PEREGRINE_PG_GPU_H */
