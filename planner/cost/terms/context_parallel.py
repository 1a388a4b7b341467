"""Context-parallel exchange of keys and values (ring attention, Megatron's p2p CP).

Each of the ``cp`` ranks holds ``mbs * s / cp`` tokens. Per layer and micro-batch the forward passes
its K and V shards around the ring in ``cp - 1`` steps; the backward passes K, V and their gradients
(2x). Bytes per step: ``mbs * s/cp * kv_width/tp * 2`` where ``kv_width`` is ``2 n_kv d`` (GQA) or
``n_h (d_qk + d_v)`` (MLA, keys and values after up-projection). The transfers hide behind the
attention core they feed::

    t_cp = 3 (cp - 1) p2p(bytes);   exposed = max((1 - o) t_cp, t_cp - t_attn_core)
"""

from __future__ import annotations



def kv_width(model) -> float:
    if model.attention == "mla":
        return model.num_attention_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    return 2.0 * model.num_kv_heads * model.head_dim


def cp_time(fabric, tier: int, cp: int, mbs: int, seq_len: int, width: float, tp: int) -> float:
    """Seconds of K/V exchange for one layer and micro-batch, forward + backward."""
    if cp <= 1:
        return 0.0
    nbytes = mbs * seq_len / cp * width / tp * 2.0
    return 3.0 * (cp - 1) * fabric.p2p(nbytes, tier)
