"""The Numba kernels: the options record every kernel takes (:mod:`~flashlab.kernels.options`), the
tile operations they share (:mod:`~flashlab.kernels.tile`, with the scalar per-row update of
:mod:`~flashlab.kernels.rowstep` and the scores stage's scalar steps of
:mod:`~flashlab.kernels.scorestep`, both also compiled for the GPU twin), the tiled
forward (:mod:`~flashlab.kernels.forward`), the backward (:mod:`~flashlab.kernels.backward`),
split-KV decoding (:mod:`~flashlab.kernels.decode`) and the BLAS calls with alpha and beta they
share (:mod:`~flashlab.kernels.blas`)."""
