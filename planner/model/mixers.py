"""Token mixers beside softmax attention: Gated DeltaNet (Qwen3-Next), Mamba-2 (Nemotron-H) and the
lightning indexer of DeepSeek sparse attention (DeepSeek-V3.2). Each is a frozen value with its widths
and the one place its parameters and multiply-adds per token are written.

Multiply-adds (MACs) per token, forward, as megatron-core 0.19.2 counts them
(``megatron/training/training.py`` ``num_floating_point_operations``: ``gdn_layer_flops``,
``mamba_layer_flops``), so that ``planner.model.flops`` reproduces its FLOPs::

    Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv:2412.06464), k = n_k*d_k, v = n_v*d_v:
        in_proj  h * (2k + 2v + 2 n_v)           q, k, v, the output gate z, beta and the decay a
        conv1d   K * (2k + v)                    causal depthwise convolution, kernel K
        delta    4 * n_v * d_k * d_v             KK^T, VK^T, S(a(I - b KK^T)) and SQ: linear in the
                                                 sequence (a d_k x d_v state per value head)
        out_proj v * h
    Mamba-2 (Dao, Gu 2024, arXiv:2405.21060), d = n_heads * d_head, G groups, N state:
        in_proj  h * (2d + 2 G N + n_heads)      x, z, B, C, dt
        scan     3.5 * d * N                     the SSD scan (megatron-core counts 7 d N FLOPs);
                                                 linear in the sequence
        out_proj d * h
      (megatron-core writes d = 2h, Mamba's default expand; here d = n_heads * d_head, the same for
      Nemotron-H 8B/47B/56B and exact for Nemotron 3 Nano, where d = 4096 and 2h = 5376)
    Lightning indexer (DeepSeek-V3.2-Exp technical report, DeepSeek_V3_2.pdf in
    github.com/deepseek-ai/DeepSeek-V3.2-Exp, s2.1; its inference/model.py ``Indexer``): H index heads of width d_I
    score every earlier token, I(t,s) = sum_j w(t,j) ReLU(q(t,j) . k(s)):
        projections  q_r * H d_I + h * d_I + h * H   (query from the MLA query latent, one shared key,
                                                      per-head weights)
        scores       H * (d_I + 1) * c,  c = s/2     O(L^2), at a small width
      and the main attention reads only the top-k keys: its core costs MLA's per-key work times
      c_k = k - k(k-1)/(2s) (the causal average of min(i, k): the sliding-window formula with W = k).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIXERS = ("attention", "gdn", "mamba", "none")   # per layer; "none": an MLP-only block (Nemotron-H '-', 'E')
# Megatron's hybrid layer pattern symbols (megatron/core/models/hybrid/hybrid_layer_allocation.py)
PATTERN_MIXER = {"M": "mamba", "G": "gdn", "*": "attention", "D": "attention", "-": "none", "E": "none"}


class GatedDeltaNet(BaseModel):
    """Gated DeltaNet linear attention [linear_num_key_heads, linear_key_head_dim, linear_num_value_heads,
    linear_value_head_dim, linear_conv_kernel_dim]."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_key_heads: int = Field(..., ge=1)
    key_head_dim: int = Field(..., ge=1)
    num_value_heads: int = Field(..., ge=1)
    value_head_dim: int = Field(..., ge=1)
    conv_kernel: int = Field(4, ge=1)

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def in_width(self) -> int:
        """Output columns of the input projection (q, k, v, z, beta, a)."""
        return 2 * self.key_dim + 2 * self.value_dim + 2 * self.num_value_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def proj_macs(self, h: int) -> float:
        return float(h * self.in_width + self.value_dim * h)

    def core_macs(self) -> float:
        """Convolution and the gated delta rule per token (linear in the sequence)."""
        return float(self.conv_kernel * self.conv_dim + 4 * self.num_value_heads * self.key_head_dim * self.value_head_dim)

    def params(self, h: int) -> int:
        """in_proj_qkvz + in_proj_ba, conv1d (no bias), dt_bias, A_log, the gated RMSNorm (one head's
        width, shared), out_proj (HF Qwen3NextGatedDeltaNet)."""
        return (h * self.in_width + self.conv_dim * self.conv_kernel + 2 * self.num_value_heads
                + self.value_head_dim + self.value_dim * h)

    def state_elements(self) -> int:
        """Recurrent state of one sequence: a d_k x d_v matrix per value head."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim


class Mamba2(BaseModel):
    """Mamba-2 selective state-space mixer [mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups,
    conv_kernel]."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_heads: int = Field(..., ge=1)
    head_dim: int = Field(..., ge=1)
    state_size: int = Field(..., ge=1)
    n_groups: int = Field(1, ge=1)
    conv_kernel: int = Field(4, ge=1)
    chunk_size: int = Field(128, ge=1, description="SSD chunk length [chunk_size]")

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def in_width(self) -> int:
        """Output columns of in_proj: x and z (d each), B and C (G N each), dt (one per head)."""
        return 2 * self.inner + 2 * self.n_groups * self.state_size + self.num_heads

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.n_groups * self.state_size

    def proj_macs(self, h: int) -> float:
        return float(h * self.in_width + self.inner * h)

    def core_macs(self) -> float:
        """The SSD scan per token: megatron-core's 7 d N FLOPs, as multiply-adds."""
        return 3.5 * self.inner * self.state_size

    def params(self, h: int) -> int:
        """in_proj, conv1d (weights and bias), dt_bias, A_log, D, the gated RMSNorm, out_proj (HF
        NemotronHMamba2Mixer, megatron-core MambaMixer)."""
        return (h * self.in_width + self.conv_dim * (self.conv_kernel + 1) + 3 * self.num_heads + self.inner
                + self.inner * h)

    def state_elements(self) -> int:
        """SSM state of one sequence: n_heads x d_head x N."""
        return self.inner * self.state_size


class SparseIndexer(BaseModel):
    """DeepSeek sparse attention's lightning indexer [index_n_heads, index_head_dim, index_topk]."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_heads: int = Field(..., ge=1)
    head_dim: int = Field(..., ge=1)
    topk: int = Field(..., ge=1, description="keys each query attends to")

    def proj_macs(self, h: int, q_lora_rank: int) -> float:
        return float(q_lora_rank * self.n_heads * self.head_dim + h * self.head_dim + h * self.n_heads)

    def score_macs(self, context: float) -> float:
        """Scores of one query against ``context`` keys (the causal average s/2: O(L^2) per sequence)."""
        return float(self.n_heads * (self.head_dim + 1)) * context

    def params(self, h: int, q_lora_rank: int) -> int:
        """wq_b (from the query latent), wk, k_norm (LayerNorm weight and bias), weights_proj."""
        return q_lora_rank * self.n_heads * self.head_dim + h * self.head_dim + 2 * self.head_dim + h * self.n_heads
