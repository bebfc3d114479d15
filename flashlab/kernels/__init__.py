"""The Numba kernels: the tile operations they share (:mod:`~flashlab.kernels.tile`), the tiled
forward (:mod:`~flashlab.kernels.forward`), the backward (:mod:`~flashlab.kernels.backward`),
split-KV decoding (:mod:`~flashlab.kernels.decode`) and the BLAS calls with alpha and beta they
share (:mod:`~flashlab.kernels.blas`)."""
