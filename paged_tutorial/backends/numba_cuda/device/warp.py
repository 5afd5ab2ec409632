"""The warp, as every kernel and the simulator's shim see it: the one definition of its width
and of the mask that names all of its lanes."""

#: threads in a warp on every NVIDIA GPU this package targets
WARP_SIZE = 32
#: a shuffle or vote mask naming all WARP_SIZE lanes (the article's WARP_FULL_MASK)
FULL_MASK = 0xFFFFFFFF
