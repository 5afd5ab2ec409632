"""The host side of the Numba backend: launching kernels on torch tensors, and recording which
elements a simulated kernel read or wrote."""
