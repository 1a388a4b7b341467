"""Tensor-parallel collectives with sequence parallelism.

Per layer and micro-batch, sequence parallelism all-gathers the sequence-sharded activations before
the attention and MLP blocks and reduce-scatters their outputs: 2 all-gathers + 2 reduce-scatters in
the forward pass, the same again (transposed) in the backward pass, of the full activation array
``A = mbs * s/cp * h * 2`` bytes (BF16). With recompute, recomputed blocks repeat their forward
collectives. Time of each collective comes from the fabric (``Fabric.all_gather`` /
``reduce_scatter`` on the worst TP group's shape); the stack hides ``tp.overlap`` of it behind the
GEMMs it feeds (userbuffer / async-TP overlap), never more than that compute::

    t_tp = n_ag * AG(A) + n_rs * RS(A);   exposed = max((1 - overlap) * t_tp, t_tp - t_gemm)
"""

from __future__ import annotations



def activation_bytes(mbs: int, seq_len: int, cp: int, hidden: int, dtype_bytes: float = 2.0) -> float:
    """Bytes of one full (gathered) activation array of a micro-batch on one CP rank."""
    return mbs * seq_len / cp * hidden * dtype_bytes


def tp_comm_time(fabric, shape, nbytes: float, n_all_gather: int = 4, n_reduce_scatter: int = 4) -> float:
    """Seconds of the TP collectives of one layer and micro-batch (0 when tp = 1)."""
    if shape is None or shape.size <= 1:
        return 0.0
    return n_all_gather * fabric.all_gather(shape, nbytes) + n_reduce_scatter * fabric.reduce_scatter(shape, nbytes)
