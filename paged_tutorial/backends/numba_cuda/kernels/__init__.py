"""The Numba CUDA kernels, one module per family; each module's wrapper functions are what
``NumbaBackend`` launches."""
