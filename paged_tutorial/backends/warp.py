"""The warp, as every Numba kernel and the simulator's shim see it: the one definition of its
width and of the mask that names all of its lanes.  (Kept outside ``numba_cuda`` so that the
teaching code can name it without importing Numba.)"""

#: threads in a warp on every NVIDIA GPU this package targets
WARP_SIZE = 32
#: a shuffle or vote mask naming all WARP_SIZE lanes (the article's WARP_FULL_MASK)
FULL_MASK = 0xFFFFFFFF
