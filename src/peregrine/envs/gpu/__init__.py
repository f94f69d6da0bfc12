"""The device path: `compiler` builds an env's C header for the GPU with NVRTC,
`batch.DeviceEnv` is the same env on torch-tensor buffers (CUDA or CPU), `audit`
checks without a GPU that the NVRTC build lays out the Env struct as the host
compiler does and that its kernels neither spill nor keep an undeclared stack."""
