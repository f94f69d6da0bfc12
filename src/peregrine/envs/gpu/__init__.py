"""The device path: `compiler` builds an env's C header for the GPU with NVRTC,
`batch.DeviceEnv` is the same env on torch-tensor buffers (CUDA or CPU)."""
