"""Megatron-LM ``pretrain_gpt.py`` arguments (megatron-core 0.19.2 flag names) and their environment.

``megatron_args(ctx)`` returns the argument list: the model architecture from the ModelSpec, the
parallel layout, the batch, recompute, optimizer sharding, overlap flags, MoE dispatcher and the
precision recipe. ``megatron_env(ctx)`` returns the environment the launcher must export
(``CUDA_DEVICE_MAX_CONNECTIONS=1`` where ``validate_args`` asserts it: TP>1 or CP>1 on sm<100 without
FSDP). Flag names and rules: megatron-core 0.19.2 ``megatron/training/arguments.py`` (``add_megatron_arguments``,
``validate_args``); the tests run megatron-core's
own ``parse_args`` / ``validate_args`` / ``TransformerConfig`` / ``initialize_model_parallel`` on them.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from planner.cost.hybridep import hybrid_ep_ranks_per_domain
from planner.errors import InputError
from planner.model.pipeline import pipeline_layout
from planner.model.spec import catalog_entry
from planner.output.emit import EmitContext
from planner.rules import effective_recipe
from planner.trainers.megatron.rules import reuse_grad_buf_for_mxfp8

# Megatron precision recipe per planner precision (--fp8-format / --fp8-recipe, --fp4-format / --fp4-recipe).
PRECISION_FLAGS = {
    "bf16": [],
    "fp8": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "fp8-block": ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
    "mxfp8": ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "nvfp4": ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
}

_D, _B = "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend"
DISPATCHER_FLAGS = {
    "alltoall": [_D, "alltoall"],
    "allgather": [_D, "allgather"],
    "flex-deepep": [_D, "flex", _B, "deepep"],
    "flex-hybridep": [_D, "flex", _B, "hybridep"],
}


# Layout and batch flags: the one place their names are written (the emitter and planner.output.emit.
# readback both use these).
LAYOUT_FLAGS = {
    "tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size", "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size", "mbs": "--micro-batch-size",
    "gbs": "--global-batch-size", "seq_len": "--seq-length", "layout": "--pipeline-model-parallel-layout",
    "sp": "--sequence-parallel", "tp_pp_dp": "--use-tp-pp-dp-mapping",
    "recompute_granularity": "--recompute-granularity", "recompute_method": "--recompute-method",
    "recompute_num_layers": "--recompute-num-layers", "recompute_modules": "--recompute-modules",
    "megatron_fsdp": "--use-megatron-fsdp", "torch_fsdp2": "--use-torch-fsdp2",
    "dist_opt": "--use-distributed-optimizer", "dispatcher": "--moe-token-dispatcher-type",
    "flex_backend": "--moe-flex-dispatcher-backend",
}
# Recipe settings (planner.config.Recipe field -> megatron-core 0.19.2 flag); booleans are store_true.
RECIPE_FLAGS = {
    "cuda_graph_impl": "--cuda-graph-impl",
    "cuda_graph_modules": "--cuda-graph-modules",
    "overlap_moe_expert_parallel_comm": "--overlap-moe-expert-parallel-comm",
    "delay_wgrad_compute": "--delay-wgrad-compute",
    "tp_comm_overlap": "--tp-comm-overlap",
    "moe_permute_fusion": "--moe-permute-fusion",
    "moe_router_fusion": "--moe-router-fusion",
    "cross_entropy_loss_fusion": "--cross-entropy-loss-fusion",
    "moe_router_enable_expert_bias": "--moe-router-enable-expert-bias",
    # megatron/training/arguments.py:1869-1870 turns cpu_offloading on when this is > 0
    "cpu_offload_layers": "--cpu-offloading-num-layers",
    # megatron/training/arguments.py:1935 (fp8 parameters, TransformerConfig.fp8_param via argument_utils.py:312)
    "fp8_param_gather": "--fp8-param-gather",
    # arguments.py:1931 (NVFP4 parameters, TransformerConfig.fp4_param via argument_utils.py:313)
    "fp4_param_gather": "--fp4-param-gather",
    # arguments.py:2785 (default 1.0 there, 0.0 in OptimizerConfig: always written) and 2791
    "optimizer_offload_fraction": "--optimizer-offload-fraction",
    "overlap_cpu_optimizer_d2h_h2d": "--overlap-cpu-optimizer-d2h-h2d",
}
# arguments.py:2781 turns the optimizer offload on; 1803-1807 requires the precision-aware optimizer beside it
OPTIMIZER_OFFLOAD_FLAGS = ("--optimizer-cpu-offload", "--use-precision-aware-optimizer")
# arguments.py:2927; written with --fp8-param-gather for MXFP8 under the distributed optimizer
# (planner.trainers.megatron.rules.reuse_grad_buf_for_mxfp8); read back as implied by the two, refused when it disagrees
REUSE_GRAD_BUF_FLAG = "--reuse-grad-buf-for-mxfp8-param-ag"
RECIPE_BOOLS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "tp_comm_overlap", "moe_permute_fusion",
                "moe_router_fusion", "cross_entropy_loss_fusion", "moe_router_enable_expert_bias", "fp8_param_gather",
                "fp4_param_gather")


def hf_extras(model) -> dict:
    """HF fields the ModelSpec does not carry (Llama 4's no_rope_layer_interval), from the packaged catalog
    (planner/data/models.json) when the model is a catalog entry, else {} (the family's default applies)."""
    try:
        entry = catalog_entry(model.name)
    except Exception:  # noqa: BLE001 - a user's config.json model: family defaults apply
        return {}
    # multimodal configs (Llama 4) keep the language model's fields under text_config
    return {**entry, **(entry.get("text_config") or {})}


def moe_layer_freq(moe_layers) -> str:
    """Megatron's ``--moe-layer-freq`` for a per-layer MoE pattern: ``1`` when every layer is MoE,
    else a run-length Python list expression such as ``([0]*3+[1]*58)``."""
    flags = [1 if x else 0 for x in moe_layers]
    if all(flags):
        return "1"
    for period in range(2, len(flags) // 2 + 1):   # a repeated block, e.g. Llama 4 Maverick's ([0]*1+[1]*1)*24
        if len(flags) % period == 0 and flags == flags[:period] * (len(flags) // period):
            return moe_layer_freq(flags[:period])[:-1] + f")*{len(flags) // period}"
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def window_skip_freq(swa_layers) -> int | None:
    """``--window-attn-skip-freq``: Megatron runs full attention on every n-th layer (layer i+1
    divisible by n); returns n when the pattern is exactly that, None when every layer is windowed."""
    n_layers = len(swa_layers)
    if all(swa_layers):
        return None
    for n in range(2, n_layers + 1):
        if all((not swa_layers[i]) == ((i + 1) % n == 0) for i in range(n_layers)):
            return n
    return None


# megatron-core 0.19.2's MLATransformerConfig YaRN fields that pretrain_gpt.py has no flag for
# (argument_utils.py copies only same-named arguments; --yarn-* reach only the non-MLA config): their defaults.
MLA_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def rotary_base(m) -> int:
    """``--rotary-base``: type=int in megatron-core (megatron/training/arguments.py:2335), so a fractional
    base (HunYuan's NTK-alpha base 11158839.93) goes as the nearest integer, a relative change under 1e-7."""
    return round(m.rope_theta)


def rope_args(m) -> list[str]:
    """RoPE as the config sets it: base, the rotated share of each head, and the scaling (YaRN: MLA's
    own --rotary-scaling-factor / --mscale / --mscale-all-dim, or --position-embedding-type yarn with
    the --yarn-* flags; llama3: --use-rope-scaling; linear: --rotary-seq-len-interpolation-factor)."""
    a = ["--position-embedding-type", "rope", "--rotary-base", str(rotary_base(m))]
    if m.partial_rotary_factor < 1.0:   # GLM-4.5: RoPE on half of each head
        a.extend(["--rotary-percent", _num(m.partial_rotary_factor)])
    rs = m.rope_scaling
    if m.attention == "mla":   # MLATransformerConfig.rope_type defaults to yarn: say which
        if rs is None:   # TransformerConfig: "apply_rope_fusion for MLA only works with YARN RoPE"
            return a + ["--rope-type", "rope", "--no-rope-fusion"]
        if rs.kind != "yarn":
            raise _refuse(m, f"{rs.kind} RoPE scaling with Multi-head Latent Attention")
        return a + ["--rope-type", "yarn", "--rotary-scaling-factor", _num(rs.factor),
                    "--mscale", _num(1.0 if rs.mscale is None else rs.mscale),
                    "--mscale-all-dim", _num(0.0 if rs.mscale_all_dim is None else rs.mscale_all_dim)]
    if rs is None:
        return a
    if rs.kind == "llama3":
        # rotary_pos_embedding.py _apply_scaling: low 1, high 4, original 8192 are fixed there
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for k, v in fixed.items():
            if getattr(rs, k) not in (None, v):
                raise _refuse(m, f"llama3 RoPE scaling with {k}={getattr(rs, k)} (megatron-core fixes {v})")
        return a + ["--use-rope-scaling", "--rope-scaling-factor", _num(rs.factor)]
    if rs.kind == "linear":
        if not float(rs.factor).is_integer():
            raise _refuse(m, f"linear RoPE scaling by {rs.factor} (--rotary-seq-len-interpolation-factor is an integer)")
        return a + ["--rotary-seq-len-interpolation-factor", str(int(rs.factor))]
    a[1] = "yarn"
    a.extend(["--rotary-scaling-factor", _num(rs.factor)])
    for flag, v in (("--yarn-original-max-position-embeddings", rs.original_max_position_embeddings),
                    ("--yarn-beta-fast", rs.beta_fast), ("--yarn-beta-slow", rs.beta_slow),
                    ("--mscale", rs.mscale), ("--mscale-all-dim", rs.mscale_all_dim)):
        if v is not None:
            a.extend([flag, _num(v) if flag != "--yarn-original-max-position-embeddings" else str(int(v))])
    if rs.truncate is not None:
        a.append("--yarn-correction-range-round-to-int" if rs.truncate else "--no-yarn-correction-range-round-to-int")
    return a


def mla_yarn_unexpressed(m) -> dict:
    """YaRN settings of an MLA config that megatron-core 0.19.2's command line cannot carry (field ->
    (config value, what Megatron-LM runs)); Megatron-Bridge's provider sets them (bridge.py)."""
    rs = m.rope_scaling
    if m.attention != "mla" or rs is None or rs.kind != "yarn":
        return {}
    return {k: (getattr(rs, k), d) for k, d in MLA_YARN_DEFAULTS.items()
            if getattr(rs, k) is not None and float(getattr(rs, k)) != d}


def activation_args(m) -> list[str]:
    """The MLP activation: SwiGLU, GPT-OSS's clamped quick-GELU GLU, or plain GELU (Megatron's default)."""
    if m.gated_mlp and m.activation == "silu":
        return ["--swiglu"]
    if m.gated_mlp and m.activation == "quick_gelu":  # GPT-OSS: clamped, offset gated quick-GELU
        a = ["--quick-geglu", "--glu-linear-offset", "1.0"]
        if m.activation_clamp:
            a.extend(["--activation-func-clamp-value", _num(m.activation_clamp)])
        return a
    if not m.gated_mlp and m.activation in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        return []
    if not m.gated_mlp and m.activation == "relu2":   # Nemotron-H: squared ReLU
        return ["--squared-relu"]
    raise _refuse(m, f"a {'gated' if m.gated_mlp else 'plain'} {m.activation} MLP (pretrain_gpt.py has --swiglu, "
                     "--quick-geglu and plain GELU)")


def router_args(ctx: EmitContext) -> list[str]:
    """Router as the config sets it: score function, aux-loss-free expert bias (only with a sigmoid
    router: TransformerConfig refuses it with softmax), top-k renormalisation (softmax after top-k,
    Megatron's default, is HF's norm_topk_prob; softmax before it is --moe-router-pre-softmax), scale."""
    m = ctx.model
    a = ["--moe-router-score-function", m.router_score]
    if m.router_score != "softmax":
        a.extend(["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4"])
    else:
        a.extend(["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-3"])
        if not m.norm_topk_prob and m.top_k > 1:
            a.append("--moe-router-pre-softmax")
    if recipe_of(ctx).moe_router_enable_expert_bias:  # aux-loss-free routing (noaux_tc)
        a.extend([RECIPE_FLAGS["moe_router_enable_expert_bias"], "--moe-router-bias-update-rate", "1e-3"])
    if m.router_scale != 1.0:
        a.extend(["--moe-router-topk-scaling-factor", _num(m.router_scale)])
    if m.n_group > 1:
        a.extend(["--moe-router-num-groups", str(m.n_group), "--moe-router-group-topk", str(m.topk_group)])
    return a


def linear_attention_freq(mixers) -> str:
    """``--linear-attention-freq``: N when every N-th layer is full attention and the rest Gated DeltaNet
    (megatron-core: layer i is linear unless (i+1) % N == 0), else a list expression (1 = linear)."""
    flags = [1 if x == "gdn" else 0 for x in mixers]
    for n in range(2, len(flags) + 1):
        if flags == [0 if (i + 1) % n == 0 else 1 for i in range(len(flags))]:
            return str(n)
    return moe_layer_freq([bool(f) for f in flags]) if not all(flags) else "([1]*%d)" % len(flags)


def entry_script(m) -> str:
    """Megatron-LM's training script for the model: ``pretrain_hybrid.py`` for a Mamba hybrid layer
    pattern (megatron-core's HybridModel), else ``pretrain_gpt.py``."""
    return "pretrain_hybrid.py" if hybrid_pattern(m) else "pretrain_gpt.py"


HYBRID_FLAG = "--hybrid-layer-pattern"
# the flags hybrid_args writes for the mixers (read back and compared by planner.output.emit.readback)
MIXER_FLAGS = ("--experimental-attention-variant", "--linear-attention-freq", "--linear-key-head-dim",
               "--linear-value-head-dim", "--linear-num-key-heads", "--linear-num-value-heads",
               "--linear-conv-kernel-dim", "--dsa-indexer-n-heads", "--dsa-indexer-head-dim", "--dsa-indexer-topk",
               "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-groups", "--mamba-num-heads",
               "--attention-output-gate", "--moe-shared-expert-gate", "--apply-layernorm-1p")


def hybrid_pattern(m, stages=None) -> str | None:
    """Megatron's ``--hybrid-layer-pattern`` for a Mamba hybrid (Nemotron-H): one symbol per block, M
    Mamba, * attention, - MLP, E MoE (megatron/core/models/hybrid/hybrid_layer_allocation.py), with
    ``|`` between pipeline segments when ``stages`` (each stage's layer indices, virtual stage order:
    planner.model.pipeline) is given; None for the models pretrain_gpt.py builds."""
    if "mamba" not in m.mixers and all(m.mlp_layers):
        return None
    sym = {"mamba": "M", "attention": "*", "gdn": "G"}
    out = []
    for i, x in enumerate(m.mixers):
        if x != "none" and m.mlp_layers[i]:
            raise _refuse(m, f"layer {i} with both a {x} mixer and an MLP in a hybrid layer pattern")
        out.append(sym[x] if x != "none" else ("E" if m.moe_layers[i] else "-"))
    if m.mtp_layers:
        raise _refuse(m, "MTP layers beside a hybrid layer pattern (topoplan does not write the '/' MTP pattern)")
    if stages is None:
        return "".join(out)
    return "|".join("".join(out[i] for i in st) for st in stages)


def hybrid_stages(ctx: EmitContext):
    """Each pipeline stage's layers (virtual stage order) when the model needs a hybrid layer pattern and
    PP > 1: the pattern carries the split (megatron-core refuses --pipeline-model-parallel-layout beside it)."""
    c = ctx.config
    if c.pp == 1 or hybrid_pattern(ctx.model) is None:
        return None
    lay = pipeline_layout(ctx.model, c.pp, c.vpp, c.pp_first, c.pp_last, seq_len=ctx.training.seq_len)
    return [st.layers for st in lay.stages]


def hybrid_args(m, stages=None) -> list[str]:
    """The token mixers beside softmax attention: Mamba-2 blocks (``--hybrid-layer-pattern`` and the
    ``--mamba-*`` widths), Gated DeltaNet layers (``--experimental-attention-variant gated_delta_net``
    with ``--linear-*``), DeepSeek sparse attention (``dsa`` with the ``--dsa-indexer-*`` widths), and
    Qwen3-Next's gated attention output (megatron-core 0.19.2 TransformerConfig fields)."""
    a: list[str] = []
    pattern = hybrid_pattern(m, stages)
    if pattern:
        a.extend([HYBRID_FLAG, pattern])
    if m.mamba is not None:
        mb = m.mamba
        a.extend(["--mamba-state-dim", str(mb.state_size), "--mamba-head-dim", str(mb.head_dim),
                  "--mamba-num-groups", str(mb.n_groups), "--mamba-num-heads", str(mb.num_heads)])
    if m.gdn is not None:
        g = m.gdn
        a.extend(["--experimental-attention-variant", "gated_delta_net",
                  "--linear-attention-freq", linear_attention_freq(m.mixers),
                  "--linear-key-head-dim", str(g.key_head_dim), "--linear-value-head-dim", str(g.value_head_dim),
                  "--linear-num-key-heads", str(g.num_key_heads), "--linear-num-value-heads", str(g.num_value_heads),
                  "--linear-conv-kernel-dim", str(g.conv_kernel)])
    if m.dsa is not None:   # TransformerConfig: "RoPE fusion is not supported for DSAttention"
        a.extend(["--no-rope-fusion", "--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", str(m.dsa.n_heads),
                  "--dsa-indexer-head-dim", str(m.dsa.head_dim), "--dsa-indexer-topk", str(m.dsa.topk)])
    if m.attention_output_gate:
        a.append("--attention-output-gate")
    if m.shared_expert_gate:
        a.append("--moe-shared-expert-gate")
    if m.norm_zero_centered:   # TransformerConfig.layernorm_zero_centered_gamma
        a.append("--apply-layernorm-1p")
    return a


def _refuse(m, what: str) -> InputError:
    return InputError(f"--trainer megatron: {m.name} ({m.source or m.family}) has {what}, which megatron-core "
                      "0.19.2's pretrain_gpt.py cannot run; emit for another trainer (--trainer torchtitan or "
                      "bridge) or change the config")


def model_args(ctx: EmitContext) -> list[str]:
    m = ctx.model
    hf = hf_extras(m)
    a: list[str] = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size if m.ffn_hidden_size else m.moe_ffn_hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
        "--kv-channels", str(m.head_dim),
        "--seq-length", str(ctx.training.seq_len),
        "--max-position-embeddings", str(ctx.training.seq_len),
        *(rope_args(m) if m.position_embedding == "rope" else ["--position-embedding-type", m.position_embedding]),
        "--normalization", "LayerNorm" if m.layer_norm else "RMSNorm",
        "--norm-epsilon", _num(m.norm_eps),
        "--make-vocab-size-divisible-by", str(m.make_vocab_divisible_by),
        # pretraining without dropout (the HF configs' 0.0); Megatron's 0.1 default also forbids graphed
        # recompute of attention/MLP (TransformerConfig: "... dropout is not supported with graphed ...")
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        *activation_args(m),
    ]
    if m.attention_sinks:
        a.extend(["--softmax-type", "learnable"])
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.attention_bias and not m.mlp_bias:
        a.append("--disable-bias-linear")
    elif m.attention_bias and not m.mlp_bias:
        a.extend(["--disable-bias-linear", "--add-qkv-bias"])
    if m.qk_norm:
        a.append("--qk-layernorm")
    if m.family == "llama4":
        a.extend(llama4_args(m, hf, recipe_of(ctx).overlap_moe_expert_parallel_comm))
    if m.attention == "mla":
        a.append("--multi-latent-attention")
        if m.q_lora_rank:
            a.extend(["--q-lora-rank", str(m.q_lora_rank)])
        a.extend(["--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_nope_head_dim),
                  "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim", str(m.v_head_dim)])
    elif m.num_kv_heads != m.num_attention_heads:
        a.extend(["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)])
    if m.sliding_window and any(m.swa_layers):
        a.extend(["--window-size", f"{m.sliding_window - 1},0"])
        n = window_skip_freq(m.swa_layers)
        if n:
            a.extend(["--window-attn-skip-freq", str(n)])
    if m.num_experts:
        a.extend([
            "--num-experts", str(m.num_experts),
            "--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size),
            "--moe-router-topk", str(m.top_k),
            "--moe-layer-freq", moe_layer_freq(m.moe_layers),
            "--moe-grouped-gemm",
            "--moe-router-dtype", "fp32",
        ])
        if m.shared_ffn_hidden_size:
            a.extend(["--moe-shared-expert-intermediate-size", str(m.shared_ffn_hidden_size)])
        a.extend(router_args(ctx))
    if m.mtp_layers:
        a.extend(["--mtp-num-layers", str(m.mtp_layers), "--mtp-loss-scaling-factor", "0.1"])
    return a + hybrid_args(m, hybrid_stages(ctx))


def llama4_args(m, hf: dict, a2a_overlap: bool = False) -> list[str]:
    """Llama 4 as Megatron-Bridge's Llama4ModelProvider runs it: interleaved RoPE skipped on every 4th
    layer (iRoPE's NoPE layers), L2 q/k norm where the config has use_qk_norm (Scout), sigmoid top-1
    routing whose probability scales the expert's input, the shared expert overlapped (RoPE scaling, Scout's
    llama3 factor 8, is the config's: rope_args). Chunked attention
    (attention_chunk_size 8192) is Bridge's layer spec, not a Megatron flag: at sequence lengths up to
    the chunk it is plain causal attention. The shared-expert overlap gives way to the all-to-all overlap
    (TransformerConfig: "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm")."""
    a = ["--rotary-interleaved", "--no-rope-freq", str(int(hf.get("no_rope_layer_interval") or 4)),
         "--moe-apply-probs-on-input"]   # the sigmoid router: router_args
    if not a2a_overlap:
        a.append("--moe-shared-expert-overlap")
    if m.qk_l2_norm:
        a.append("--qk-l2-norm")
    return a


def pipeline_args(ctx: EmitContext) -> list[str]:
    """The pipeline split: Megatron's ``--pipeline-model-parallel-layout`` from planner.model.pipeline (it
    carries VPP, uneven first/last stages, embedding, loss and MTP placement)."""
    c = ctx.config
    if c.pp == 1 or hybrid_stages(ctx) is not None:
        return []
    layout = pipeline_layout(ctx.model, c.pp, c.vpp, c.pp_first, c.pp_last,
                             seq_len=ctx.training.seq_len).megatron_layout()
    return [LAYOUT_FLAGS["layout"], layout]


def recipe_of(ctx: EmitContext):
    """The recipe as Megatron runs this layout (planner.rules.effective_recipe): what is written and priced."""
    return effective_recipe(ctx.model, ctx.config, ctx.training)


def precision_args(precision: str, recipe) -> list[str]:
    """``PRECISION_FLAGS`` of ``precision``, with ``--fp8-recipe delayed`` where the recipe asks for
    Transformer Engine's delayed scaling (``Recipe.fp8_recipe``; megatron-core's own default)."""
    flags = list(PRECISION_FLAGS[precision])
    if precision == "fp8" and recipe.fp8_recipe == "delayed":
        flags[flags.index("--fp8-recipe") + 1] = "delayed"
    return flags


def recipe_args(ctx: EmitContext) -> list[str]:
    """The recipe settings (docs/emitters.md, table of recipe settings): CUDA graphs and their scope,
    the all-to-all and TP overlaps, the fused kernels. Expert bias goes with the router flags."""
    r = recipe_of(ctx)
    a: list[str] = []
    if r.cuda_graph_impl != "none":
        a.extend([RECIPE_FLAGS["cuda_graph_impl"], r.cuda_graph_impl])
        if r.cuda_graph_modules:   # none given = the whole layer (megatron-core's default)
            a.extend([RECIPE_FLAGS["cuda_graph_modules"], *r.cuda_graph_modules])
        if r.cuda_graph_impl == "full_iteration":
            a.append("--no-check-for-nan-in-loss-and-grad")   # validate_args requires it
    for name in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "tp_comm_overlap",
                 "moe_permute_fusion", "moe_router_fusion"):
        if getattr(r, name):
            a.append(RECIPE_FLAGS[name])
    if r.cross_entropy_loss_fusion:   # megatron-core 0.19.2 refuses the TE implementation
        a.extend([RECIPE_FLAGS["cross_entropy_loss_fusion"], "--cross-entropy-fusion-impl", "native"])
    if r.cpu_offload_layers:   # activations of the first N layers to the CPU (weights stay: the default)
        a.extend([RECIPE_FLAGS["cpu_offload_layers"], str(r.cpu_offload_layers)])
    if r.fp8_param_gather:   # FP8 parameters: no BF16 weight copy, FP8 (MXFP8: BF16 via the grad buffer) gather
        a.append(RECIPE_FLAGS["fp8_param_gather"])
        if reuse_grad_buf_for_mxfp8(ctx.model, ctx.config, ctx.training):
            a.append(REUSE_GRAD_BUF_FLAG)
    if r.fp4_param_gather:   # NVFP4 parameters: no BF16 weight copy, packed 4-bit gather
        a.append(RECIPE_FLAGS["fp4_param_gather"])
    if r.optimizer_offload_fraction:   # the optimizer's share on the host (HybridDeviceOptimizer)
        a.extend([*OPTIMIZER_OFFLOAD_FLAGS, RECIPE_FLAGS["optimizer_offload_fraction"], f"{r.optimizer_offload_fraction:g}"])
        if r.overlap_cpu_optimizer_d2h_h2d:
            a.append(RECIPE_FLAGS["overlap_cpu_optimizer_d2h_h2d"])
    return a


def parallel_args(ctx: EmitContext) -> list[str]:
    c, m = ctx.config, ctx.model
    F = LAYOUT_FLAGS
    a = [F["tp"], str(c.tp), F["pp"], str(c.pp), F["cp"], str(c.cp)]
    if m.num_experts:
        a.extend([F["ep"], str(c.ep), F["etp"], str(c.etp_eff)])
    if c.tp > 1:
        a.append(F["sp"])
    if c.cp > 1 and m.dsa is not None:   # TransformerConfig: DSAttention's CP supports only all-gather
        a.extend(["--cp-comm-type", "all_gather"])
    a.extend(pipeline_args(ctx))
    if ctx.order == "tp-cp-ep-pp-dp":
        a.append(F["tp_pp_dp"])
    a.extend([F["mbs"], str(c.mbs), F["gbs"], str(ctx.training.global_batch)])
    if c.recompute == "full":
        a.extend([F["recompute_granularity"], "full", F["recompute_method"], "uniform", F["recompute_num_layers"], "1"])
    elif c.recompute != "none":
        a.extend([F["recompute_granularity"], "selective", F["recompute_modules"], *c.recompute_modules])
    r = recipe_of(ctx)
    if c.fsdp and r.fsdp_impl == "torch":
        a.extend([F["torch_fsdp2"], "--no-gradient-accumulation-fusion", "--ckpt-format", "torch_dist",
                  "--overlap-grad-reduce"])
    elif c.fsdp:
        a.extend([F["megatron_fsdp"], "--data-parallel-sharding-strategy", "optim_grads_params",
                  "--ckpt-format", "fsdp_dtensor", "--overlap-grad-reduce", "--overlap-param-gather"])
    else:
        a.extend([F["dist_opt"], "--overlap-grad-reduce", "--overlap-param-gather"])
    if m.num_experts:
        a.extend(DISPATCHER_FLAGS[c.dispatcher])
    # bf16 gradient buffer and reduction, as NVIDIA's performance recipes set (grad_reduce_in_fp32=False)
    # and planner.cost.memory counts (2 B/param); without it validate_args turns fp32 accumulation on
    a.extend(["--bf16", "--grad-reduce-in-bf16"])
    a.extend(precision_args(ctx.training.precision, recipe_of(ctx)))
    if ctx.training.precision in ("fp8", "fp8-block", "mxfp8", "nvfp4") and m.num_experts:
        a.append("--moe-router-padding-for-quantization")
    a.extend(recipe_args(ctx))
    return a


def run_args(ctx: EmitContext) -> list[str]:
    """Data, tokenizer and schedule for a throughput run on mock data (edit for real training)."""
    return [
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(ctx.model.vocab_size),
        "--train-iters", "100", "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine",
        "--lr-warmup-iters", "10", "--weight-decay", "0.1", "--clip-grad", "1.0",
        "--log-interval", "1", "--eval-iters", "0",
    ]


def megatron_args(ctx: EmitContext) -> list[str]:
    """The full ``pretrain_gpt.py`` argument list (model, parallel layout, run)."""
    return model_args(ctx) + parallel_args(ctx) + run_args(ctx)


def needs_max_connections(ctx: EmitContext) -> bool:
    """validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP>1 or CP>1 before Blackwell, unless
    FSDP (which asserts the opposite) is used."""
    c = ctx.config
    return (c.tp > 1 or c.cp > 1) and ctx.sm < 100 and not c.fsdp


def megatron_env(ctx: EmitContext) -> dict[str, str]:
    env = {"WORLD_SIZE": str(ctx.world)}
    if needs_max_connections(ctx):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if ctx.config.dispatcher == "flex-hybridep" and ctx.model.num_experts:
        env["NVLINK_DOMAIN_SIZE"] = str(ctx.domain_size)
        env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = str(
            hybrid_ep_ranks_per_domain(ctx.config, ctx.world, ctx.order, ctx.domains))
        if ctx.domain_size > 8:
            env["USE_MNNVL"] = "1"
    return env


def render_args(args: list[str]) -> str:
    """Shell syntax: one flag (with its values) per line, joined by backslash continuations."""
    lines: list[list[str]] = []
    for tok in args:
        if tok.startswith("--") or not lines:
            lines.append([tok])
        else:
            lines[-1].append(tok)
    return " \\\n".join(" ".join(shlex.quote(t) for t in line) for line in lines) + "\n"


def parse_args_file(text: str) -> list[str]:
    """Inverse of :func:`render_args` (shell word splitting after joining continuations)."""
    return shlex.split(text.replace("\\\n", " "))


def files(ctx: EmitContext) -> dict[str, str]:
    env = megatron_env(ctx)
    env_lines = [
        f"# Environment for megatron/args.txt (source it before {entry_script(ctx.model)}).",
        f"# Plan {ctx.index}: {ctx.model.name}, {ctx.config.short()}, {ctx.world} x {ctx.gpu}.",
    ]
    if not needs_max_connections(ctx):
        env_lines.append("# CUDA_DEVICE_MAX_CONNECTIONS is left unset: " + (
            "Megatron FSDP asserts it is not 1." if ctx.config.fsdp else
            "no TP/CP, or Blackwell (sm>=100) where Megatron no longer asserts it."))
    gaps = mla_yarn_unexpressed(ctx.model)
    if gaps:   # the config's YaRN settings megatron-core 0.19.2's pretrain_gpt.py has no flag for
        env_lines.append("# The config's MLA YaRN " + ", ".join(f"{k}={float(v)!r}" for k, (v, _) in gaps.items())
                         + ": pretrain_gpt.py has no flag for them and runs " + ", ".join(
                             f"{k}={float(d)!r}" for k, (_, d) in gaps.items())
                         + "; the Megatron-Bridge files (--trainer bridge) set them.")
    if recipe_of(ctx).optimizer_offload_fraction:   # the host runs the optimizer: give it threads
        env_lines.append("# Optimizer CPU offload: torch's CPU Adam runs on OMP_NUM_THREADS threads per rank (torchrun "
                         "sets 1); set it to the host's cores per GPU (planner/cost/terms/cpu_optimizer.py assumes "
                         "one rank's measured rate each).")
    env_lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    return {
        "megatron/args.txt": render_args(megatron_args(ctx)),
        "megatron/env.sh": "\n".join(env_lines) + "\n",
    }


def _num(x) -> str:
    f = float(x)
    return str(int(f)) if f.is_integer() and abs(f) >= 1 else repr(f)


def for_trial(directory, iters: int) -> None:
    """``topoplan trial``: the emitted args.txt under ``directory`` runs ``iters`` iterations, logging each one
    (throughput, and the memory report once, at the end)."""
    p = Path(directory) / "megatron" / "args.txt"
    lines = [ln.rstrip().removesuffix("\\").rstrip() for ln in p.read_text().strip().splitlines()]
    set_flags = {"--train-iters": str(iters), "--log-interval": "1", "--log-memory-interval": str(iters)}
    out, seen = [], set()
    for ln in lines:
        flag = ln.split(" ", 1)[0]
        if flag in set_flags:
            ln = f"{flag} {set_flags[flag]}"
            seen.add(flag)
        out.append(ln)
    out += [f"{f} {v}" for f, v in set_flags.items() if f not in seen]
    out += [f for f in ("--log-throughput", "--log-device-memory-used") if f not in lines]
    p.write_text(" \\\n".join(out) + "\n")


# -- slurm/task.sh and the Kubernetes pods (planner.output.emit.slurm.trainer_shell) ----------------------

def task_env(ctx: EmitContext) -> str:
    """The shell that sets the environment megatron-core asserts or reads (``megatron_env``)."""
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in megatron_env(ctx).items())


def task_command(ctx: EmitContext) -> str:
    """The ``trainer_cmd`` case arm: prints Megatron-LM's command line ($2: python or the torchrun prefix)."""
    return """      local args
      if [ "${TOPOPLAN_DATA_ARGS:-mock}" = mock ]; then args=$(cat "$ROOT/megatron/args.txt")
      else args=$(grep -v -x -e '--mock-data [\\]' -e '--mock-data' "$ROOT/megatron/args.txt"); fi
      printf '%s %q %s %s\\n' "$2" "${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}/""" + entry_script(ctx.model) + """" "$args" "$data" ;;"""
