"""The native batch: the C contract every env header is written against
(`pg_env.h`, the generic binding `binding.h`, `pg_math.h`, and `pg_gpu.h`
for the NVRTC build) and its Python face, `batch.NativeEnv`."""
