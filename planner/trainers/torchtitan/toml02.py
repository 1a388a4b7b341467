"""TorchTitan 0.2's model for a user's config.json: a flavour module that job.toml names.

torchtitan v0.2.0 ``train.py`` imports ``[experimental] custom_import`` before it asks
``get_train_spec(model.name)`` and builds ``train_spec.model_args[model.flavor]``; the TrainSpec of each
model (``models/<module>/__init__.py`` ``get_train_spec``) holds that module's args table itself, so a
module that adds an entry to the table adds a flavour. The emitted ``topoplan_flavour_v02.py`` adds
flavour ``topoplan`` with the config's numbers in the 0.2 model args (``TransformerModelArgs``,
``Qwen3ModelArgs``, ``DeepSeekV3ModelArgs`` with ``MoEArgs``); job.toml names the module, the model and
the flavour. What 0.2's models cannot express is refused in one line naming the config's field: then
no job.toml is written and command.txt says why (the 0.3 command line still builds the config).
"""

from __future__ import annotations

MODULE = "topoplan_flavour_v02"
FLAVOUR = "topoplan"
# torchtitan 0.2.0 module -> its args table (models/<module>/__init__.py)
TABLES = {"llama3": "llama3_args", "qwen3": "qwen3_args", "deepseek_v3": "deepseekv3_args"}


def refusal(m, module: str) -> str | None:
    """Why torchtitan 0.2.0's ``module`` cannot build ``m`` (a model emit.is_user_model accepts), or None."""
    if module not in TABLES:
        return f"torchtitan 0.2.0 has no {module} model (model_type {m.family!r})"
    if m.activation != "silu":
        return f"its MLPs are SwiGLU (hidden_act {m.activation!r})"
    rs = m.rope_scaling
    if module == "llama3":
        if m.tied_embeddings:
            return "its llama3 has no tied embeddings (tie_word_embeddings)"
        if rs is not None and rs.kind != "llama3":
            return f"its llama3 RoPE has llama3 scaling only (rope_scaling {rs.kind})"
    if module == "qwen3" and rs is not None:
        return f"its qwen3 RoPE has no scaling (rope_scaling {rs.kind})"
    if module == "deepseek_v3":
        return _deepseek_refusal(m)
    return None


def _deepseek_refusal(m) -> str | None:
    rs = m.rope_scaling
    if m.tied_embeddings:
        return "its deepseek_v3 has no tied embeddings (tie_word_embeddings)"
    if m.n_group > 1:   # DeepSeekV3ModelArgs.n_expert_groups: "node-limited routing is not supported yet"
        return f"its MoE router has no group-limited routing (n_group {m.n_group}, topk_group {m.topk_group})"
    if m.router_score not in ("softmax", "sigmoid"):
        return f"its MoE router scores with softmax or sigmoid only (scoring_func {m.router_score!r})"
    if rs is not None and rs.kind != "yarn":
        return f"its deepseek_v3 RoPE has YaRN scaling only (rope_scaling {rs.kind})"
    if rs is not None and rs.truncate is False:
        return "its YaRN rounds the correction range to integers (rope_scaling.truncate false)"
    if rs is not None and rs.mscale and rs.mscale_all_dim and rs.mscale != rs.mscale_all_dim:
        return (f"its YaRN leaves cos/sin unscaled (rope_scaling.mscale {rs.mscale:g} differs from "
                f"mscale_all_dim {rs.mscale_all_dim:g})")
    return None


def flavour_source(m, module: str) -> str:
    """Python source of the custom_import module: flavour FLAVOUR of torchtitan 0.2.0's ``module``."""
    head = (f'"""TorchTitan 0.2 flavour written by topoplan for {m.name} ({m.source or "config.json"}): job.toml\'s\n'
            f"[experimental] custom_import imports this module before torchtitan builds the model; it adds flavour\n"
            f'{FLAVOUR!r} to torchtitan.models.{module}.{TABLES[module]}, the table the TrainSpec reads."""\n\n'
            f"from torchtitan.models.{module} import {TABLES[module]} as _table\n")
    body = {"llama3": _llama3, "qwen3": _qwen3, "deepseek_v3": _deepseek}[module](m)
    return head + body + f"\n_table[{FLAVOUR!r}] = _ARGS\n"


def _llama3(m) -> str:
    # FeedForward: 4 dim -> int(2 x / 3) -> int(multiplier x) -> rounded up to multiple_of; with multiple_of = F
    # and multiplier F / int(8 dim / 3) the width is F exactly (int() may give F - 1, which rounds up to F)
    third = int(2 * (4 * m.hidden_size) / 3)
    rs = m.rope_scaling
    scaling = ("scaling_factor=1.0" if rs is None else   # factor 1: llama3 scaling leaves every frequency as is
               f"scaling_factor={float(rs.factor)!r}, low_freq_factor={float(rs.low_freq_factor or 1.0)!r}, "
               f"high_freq_factor={float(rs.high_freq_factor or 4.0)!r}, "
               f"original_max_position_embeddings={int(rs.original_max_position_embeddings or 8192)}")
    return f'''from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs

_ARGS = TransformerModelArgs(
    dim={m.hidden_size}, n_layers={m.num_layers}, n_heads={m.num_attention_heads}, n_kv_heads={m.num_kv_heads},
    vocab_size={m.vocab_size}, norm_eps={m.norm_eps!r}, rope_theta={float(m.rope_theta)!r},
    # MLP width {m.ffn_hidden_size}: FeedForward rounds int({m.ffn_hidden_size / third!r} x {third}) up to a multiple of {m.ffn_hidden_size}
    multiple_of={m.ffn_hidden_size}, ffn_dim_multiplier={m.ffn_hidden_size / third!r},
    rope_scaling_args=RoPEScalingArgs({scaling}),
    max_seq_len={int(m.max_position_embeddings or 131072)},
)
'''


def _moe_args(m, shared: int, score: str) -> str:
    return (f"MoEArgs(num_experts={m.num_experts}, num_shared_experts={shared}, top_k={m.top_k}, "
            f"score_func={score!r}, route_norm={m.norm_topk_prob}, route_scale={float(m.router_scale)!r}, "
            "score_before_experts=False)")


def _qwen3(m) -> str:
    moe = ""
    if m.num_experts:
        moe = (f"    moe_enabled=True, moe_inter_dim={m.moe_ffn_hidden_size},\n"
               f"    moe_args={_moe_args(m, 0, 'softmax')},\n")
    return f'''from torchtitan.models.moe import MoEArgs
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs

_ARGS = Qwen3ModelArgs(
    dim={m.hidden_size}, n_layers={m.num_layers}, n_heads={m.num_attention_heads}, n_kv_heads={m.num_kv_heads},
    head_dim={m.head_dim}, hidden_dim={m.ffn_hidden_size}, vocab_size={m.vocab_size}, norm_eps={m.norm_eps!r},
    rope_theta={float(m.rope_theta)!r}, qk_norm={m.qk_norm}, enable_weight_tying={m.tied_embeddings},
    max_seq_len={int(m.max_position_embeddings or 4096)},
{moe})
'''


def _deepseek(m) -> str:
    rs = m.rope_scaling
    # MLA's softmax scale x (0.1 mscale ln(factor) + 1)^2: transformers' mscale_all_dim; factor 1 without YaRN
    mscale = float((rs.mscale_all_dim if rs.mscale_all_dim is not None else rs.mscale) or 1.0) if rs else 1.0
    yarn = (f"original_seq_len={int(rs.original_max_position_embeddings or 4096)}, rope_factor={float(rs.factor)!r}, "
            f"beta_fast={_int(rs.beta_fast or 32)!r}, beta_slow={_int(rs.beta_slow or 1)!r}, mscale={mscale!r}"
            if rs else "rope_factor=1.0, mscale=1.0")
    return f'''from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
from torchtitan.models.moe import MoEArgs

_ARGS = DeepSeekV3ModelArgs(
    vocab_size={m.vocab_size}, dim={m.hidden_size}, inter_dim={m.ffn_hidden_size}, moe_inter_dim={m.moe_ffn_hidden_size},
    n_layers={m.num_layers}, n_dense_layers={list(m.moe_layers).index(True)}, n_heads={m.num_attention_heads},
    norm_eps={m.norm_eps!r},
    moe_args={_moe_args(m, m.shared_ffn_hidden_size // m.moe_ffn_hidden_size, m.router_score)},
    q_lora_rank={m.q_lora_rank or 0}, kv_lora_rank={m.kv_lora_rank}, qk_nope_head_dim={m.qk_nope_head_dim},
    qk_rope_head_dim={m.qk_rope_head_dim}, v_head_dim={m.v_head_dim},
    use_flex_attn=True, attn_mask_type="block_causal",   # as torchtitan 0.2.0's own 671B flavour
    rope_theta={float(m.rope_theta)!r}, {yarn},
    max_seq_len={int(m.max_position_embeddings or 16384)},
)

# torchtitan 0.2.0's DeepSeekV3Model builds its final RMSNorm without eps (torch's default: the dtype's
# machine epsilon); the config's eps goes on it too
from torchtitan.models.deepseek_v3.model.model import DeepSeekV3Model as _Model  # noqa: E402

_built = _Model.__init__


def _init(self, model_args):
    _built(self, model_args)
    if self.norm.eps is None:
        self.norm.eps = model_args.norm_eps


_Model.__init__ = _init
'''


def _int(v: float):
    return int(v) if float(v).is_integer() else float(v)
