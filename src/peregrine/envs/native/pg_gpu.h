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

/* One step of every instance: bad actions repaired and counted first
 * (pg_repair_actions), then the env's own step, auto-reset included. */
extern "C" __global__ void pg_step(Env *env, unsigned long long *errors) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= env->pg.num_envs) return;
    pg_repair_actions(&env->pg, i, errors);
    env_step(env, i, i + 1);
}

/* Fresh episodes everywhere, as the CPU batch's reset: with `reseed`, every
 * instance's stream restarts from (seed, instance) first. */
extern "C" __global__ void pg_reset(Env *env, unsigned long long seed, int reseed) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= env->pg.num_envs) return;
    if (reseed) env->pg.rng[i] = pg_seed_instance(seed, (uint64_t)i);
    pg_clear_instance(&env->pg, i, 1);
    env_reset(env, i, i + 1);
}

#endif /* PEREGRINE_PG_GPU_H */
