"""Device functions shared by the kernels, and the shim that lets the same kernel source run in
Numba's CUDA simulator."""
