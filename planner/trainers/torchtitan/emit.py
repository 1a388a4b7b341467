"""TorchTitan launch files: the 0.3 command line and, for 0.2 users, the TOML job file.

TorchTitan 0.3.0 picks a ``config_registry`` function with ``--module M --config C`` and overrides it
with tyro flags ``--section.key value``; activation checkpointing is the subcommand
``activation-checkpoint:{none,selective,full}``. Models with a flavour but no registry function
(Qwen3-235B-A22B) get a small ``topoplan_config.py`` registry next to the command. Its mesh is
``[pp, dp_replicate, dp_shard, cp, tp]`` (tp innermost) for dense layers and
``[pp, dp_replicate, efsdp, ep]`` for experts, so with dp_replicate = 1 its TP, CP, DP and PP
groups equal Megatron's (order tp-cp-ep-dp-pp) and its EP groups are Megatron's expert groups with
ETP = 1: EP borrows ranks from dp_shard * cp * tp. There is no expert tensor parallel degree.
Keys: torchtitan 0.3.0 ``torchtitan/config/configs.py`` (``parallelism``, ``training``, ``compile``), overridden as
tyro flags ``--<section>.<field>``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from planner.errors import InputError
from planner.model.pipeline import pipeline_layout
from planner.output.emit import EmitContext
from planner.trainers.torchtitan import NAME, toml02
from planner.trainers.torchtitan.rules import effective_recipe, graphs_problem, torch_compile_on

# catalog model -> (module, config function or None, model_registry flavour)
MODELS = {
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
    "llama3.1-405b": ("llama3", "llama3_405b", "405B"),
    "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-8b": ("llama3", "llama3_8b", "8B"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", None, "235B-A22B"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", "120b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b", "20b"),
}
# a registry function of the same module whose recipe the custom flavour starts from
BASE_CONFIG = {"qwen3": "qwen3_30b_a3b"}
# A user's config.json of a family torchtitan 0.3.0 builds (HF model_type) -> (module, the registry
# function whose recipe - optimizer, data, checkpointing - the written config starts from). Its model
# is written out from the ModelSpec with the module's own layer builders as flavour USER_FLAVOUR.
USER_FAMILIES = {"llama": ("llama3", "llama3_8b"), "qwen3": ("qwen3", "qwen3_14b"),
                 "qwen3_moe": ("qwen3", "qwen3_30b_a3b"), "deepseek_v3": ("deepseek_v3", "deepseek_v3_671b"),
                 "gpt_oss": ("gpt_oss", "gpt_oss_20b")}
USER_FLAVOUR = "topoplan"
CUSTOM_MODULE = "topoplan_config"
# The low-precision recipe a built-in registry function already applies (torchtitan 0.3.0:
# llama3_405b carries a rowwise Float8Linear converter; the others train in BF16).
BASE_PRECISION = {"llama3.1-405b": "fp8-block"}
# The CompileConfig of the registry functions a launch starts from (torchtitan 0.3.0, config/configs.py:291-310
# defaults enable=False, components ["model", "loss"], no async TP): (enable, components, async TP).
# planner.rules.TORCHTITAN_COMPILED holds the models whose function compiles the model; tests check both
# against the functions themselves.
BASE_COMPILE = {
    "llama3_405b": (True, ("model", "loss"), True),   # models/llama3/config_registry.py:295-299
    "deepseek_v3_671b": (True, ("loss",), False),     # models/deepseek_v3/config_registry.py:241
}
DEFAULT_COMPILE = (False, ("model", "loss"), False)
# model_registry keyword arguments the built-in functions pass besides the flavour
REGISTRY_KWARGS = {"deepseek_v3": 'attn_backend="flex", '}
# planner precision -> torchtitan 0.3.0 converters (torchtitan.components.quantization) for the
# Linear layers and, on MoE models, the grouped experts. FP8 tensorwise is torchao's recipe name
# (accepted though 0.3.0 documents only the rowwise ones); per-block FP8 has no torchao recipe, so
# fp8-block uses rowwise scaling, the nearest.
CONVERTERS = {
    "fp8": ('Float8LinearConverter.Config(recipe_name="tensorwise", filter_fqns=["lm_head", "router.gate"], '
            "model_compile_enabled=COMPILED)", "Float8GroupedExpertsConverter.Config(model_compile_enabled=COMPILED)"),
    "fp8-block": ('Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head", "router.gate"], '
                  "model_compile_enabled=COMPILED)",
                  "Float8GroupedExpertsConverter.Config(model_compile_enabled=COMPILED)"),
    "mxfp8": ("MXFP8LinearConverter.Config(fqns=FQNS, model_compile_enabled=COMPILED)",
              "MXFP8GroupedExpertsConverter.Config(pad_multiple=128, model_compile_enabled=COMPILED)"),
    "nvfp4": ("NVFP4LinearConverter.Config(model_compile_enabled=COMPILED)", None),
}


def model_entry(ctx: EmitContext) -> tuple[str, str | None, str]:
    """(module, registry function or None, flavour): a catalog model's own, or for a user's config.json
    of a family torchtitan builds, the module and the flavour the written registry adds."""
    key = ctx.model.name.lower()
    if key in MODELS:
        return MODELS[key]
    if is_user_model(ctx.model):
        return USER_FAMILIES[ctx.model.family][0], None, USER_FLAVOUR
    fams = ", ".join(f"{f} ({m})" for f, (m, _) in USER_FAMILIES.items())
    raise InputError(f"--trainer torchtitan: torchtitan 0.3.0 has no model definition for {ctx.model.name!r} "
                     f"(model_type {ctx.model.family!r}; it has the catalog models {', '.join(sorted(MODELS))} and "
                     f"builds config.json files of model_type {fams}); emit megatron or maxtext instead")


def is_user_model(m) -> bool:
    """A model that is not in MODELS but whose family torchtitan builds, in a shape its builders express
    (raises InputError naming the field when the shape is one they cannot)."""
    if m.name.lower() in MODELS or m.family not in USER_FAMILIES:
        return False
    moe = m.family in ("qwen3_moe", "deepseek_v3", "gpt_oss")
    problems = []
    if m.family == "qwen3_moe" and not all(m.moe_layers):
        problems.append("mlp_only_layers / decoder_sparse_step: torchtitan's qwen3 MoE makes every layer MoE")
    if m.family == "qwen3_moe" and m.shared_ffn_hidden_size:
        problems.append("shared experts: torchtitan's qwen3 has none")
    if not moe and m.num_experts:
        problems.append(f"num_experts {m.num_experts}: torchtitan's {m.family} is dense")
    if m.family == "llama" and m.head_dim * m.num_attention_heads != m.hidden_size:
        problems.append(f"head_dim {m.head_dim}: torchtitan's llama3 uses hidden_size / num_attention_heads")
    if m.family == "deepseek_v3":
        k = m.moe_layers.index(True) if any(m.moe_layers) else len(m.moe_layers)
        if m.attention != "mla" or not all(m.moe_layers[k:]):
            problems.append("attention or MoE pattern: torchtitan's deepseek_v3 is MLA with dense layers first")
        if not m.shared_ffn_hidden_size or m.shared_ffn_hidden_size % max(1, m.moe_ffn_hidden_size):
            problems.append("shared experts: a whole number of moe_intermediate_size experts")
    elif m.attention != "gqa":
        problems.append("attention: MLA")
    if m.family == "gpt_oss":
        if not (m.attention_sinks and m.attention_bias and m.mlp_bias and m.router_bias and all(m.moe_layers)):
            problems.append("GPT-OSS shape: torchtitan's gpt_oss has sinks, biases and MoE on every layer")
        if m.shared_ffn_hidden_size:
            problems.append("shared experts: torchtitan's gpt_oss has none")
    elif m.attention_bias or m.mlp_bias or m.sliding_window or not m.gated_mlp:
        problems.append("attention or MLP variant (biases, sliding window or a non-gated MLP)")
    rs = m.rope_scaling
    if rs is not None and (rs.kind == "linear" or (rs.kind == "llama3" and m.family != "llama")):
        problems.append(f"rope_scaling {rs.kind}: torchtitan's {m.family} RoPE has "
                        + ("YaRN only" if m.family != "llama" else "llama3 and YaRN scaling only"))
    if m.partial_rotary_factor < 1.0:
        problems.append("partial_rotary_factor: torchtitan rotates the whole head")
    if m.family.startswith("qwen3") and not m.qk_norm:
        problems.append("qk_norm: torchtitan's qwen3 always normalises q and k")
    if problems:
        raise InputError(f"--trainer torchtitan: {m.name} ({m.source or 'config.json'}): {'; '.join(problems)}; "
                         "emit megatron instead")
    return True


def batch(ctx: EmitContext) -> tuple[int, int, int]:
    """(local_batch_size, global_batch_size, pipeline microbatch size).

    Without PP a step of ``local_batch_size = mbs`` per DP rank is repeated (gradient accumulation)
    up to the global batch; with PP the whole per-rank batch enters the pipeline in micro-batches of
    ``mbs`` (TorchTitan asserts ``local_batch_size % pipeline_parallel_microbatch_size == 0``)."""
    c, gbs = ctx.config, ctx.training.global_batch
    if c.pp > 1:
        return gbs // ctx.dp, gbs, c.mbs
    return c.mbs, gbs, c.mbs


def ac_mode(ctx: EmitContext) -> str:
    r = ctx.config.recompute
    return "none" if r == "none" else ("full" if r == "full" else "selective")


def parallelism(ctx: EmitContext) -> dict[str, object]:
    c = ctx.config
    p: dict[str, object] = {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": ctx.dp,
        "tensor_parallel_degree": c.tp,
        "pipeline_parallel_degree": c.pp,
        "context_parallel_degree": c.cp,
        "expert_parallel_degree": c.ep if ctx.model.num_experts else 1,
    }
    if c.tp > 1:
        p["enable_sequence_parallel"] = True
    if c.pp > 1:
        p["pipeline_parallel_schedule"] = "Interleaved1F1B" if c.vpp > 1 else "1F1B"
        p["pipeline_parallel_microbatch_size"] = c.mbs
        # the plan's own split, stage by stage (stage v*pp + r runs on rank r, as in Megatron):
        # pipeline_parallel_layers_per_stage cannot say it (TorchTitan adds one layer's weight for the
        # embedding and one for the output, so an even split gets one stage too many) and without
        # it looped schedules get 2 stages per rank whatever the plan's VPP
        p["module_fqns_per_model_part"] = stage_fqns(ctx)
    return p


def stage_fqns(ctx: EmitContext) -> list[list[str]]:
    """TorchTitan module names per pipeline stage, from planner.model.pipeline's layout."""
    c = ctx.config
    layout = pipeline_layout(ctx.model, c.pp, c.vpp, c.pp_first, c.pp_last, seq_len=ctx.training.seq_len)
    out = []
    for st in layout.stages:
        names = (["tok_embeddings"] if st.embedding else []) + [f"layers.{i}" for i in st.layers]
        if st.loss:
            names += ["norm", "lm_head"]
        out.append(names)
    return out


def command_args(ctx: EmitContext) -> list[str]:
    """Arguments after ``-m torchtitan.train`` (0.3.0)."""
    module, config, _ = model_entry(ctx)
    if config is None or needs_converters(ctx) or model_fixes(ctx):
        module, config = CUSTOM_MODULE, _custom_name(ctx)
    local, gbs, _ = batch(ctx)
    a = ["--module", module, "--config", config]
    for k, v in parallelism(ctx).items():
        if isinstance(v, bool):  # tyro booleans are flags: --x / --no-x
            a.append(f"--parallelism.{k}" if v else f"--parallelism.no_{k}")
        elif isinstance(v, list):  # list[list[str]]: stages space-separated, modules comma-separated
            a += [f"--parallelism.{k}", *(",".join(stage) for stage in v)]
        else:
            a += [f"--parallelism.{k}", str(v)]
    a += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(gbs),
          "--training.seq_len", str(ctx.training.seq_len)]
    # explicit both ways: some registry functions (deepseek_v3_671b) switch graphs off themselves
    a.append("--training.no_disable_cuda_graphs" if cuda_graphs(ctx) else "--training.disable_cuda_graphs")
    enable, components, async_tp = compile_setting(ctx)
    # torchtitan parses list options comma-separated (``--compile.components model,loss``)
    a += ["--compile.enable" if enable else "--compile.no_enable", "--compile.components", ",".join(components)]
    if not async_tp and base_compile(ctx)[2]:
        a.append("--compile.no_enable_async_tensor_parallel")
    a.append(f"activation-checkpoint:{ac_mode(ctx)}")
    return a


def base_function(ctx: EmitContext) -> str:
    """The registry function a launch starts from (the catalog model's, or the one a written registry calls)."""
    module, config, _ = model_entry(ctx)
    if config is not None:
        return config
    return USER_FAMILIES[ctx.model.family][1] if is_user_model(ctx.model) else BASE_CONFIG[module]


def base_compile(ctx: EmitContext) -> tuple[bool, tuple, bool]:
    """(enable, components, async TP) of the registry function's CompileConfig (``BASE_COMPILE``)."""
    return BASE_COMPILE.get(base_function(ctx), DEFAULT_COMPILE)


def compile_setting(ctx: EmitContext) -> tuple[bool, tuple, bool]:
    """(compile.enable, compile.components, compile.enable_async_tensor_parallel) that run the plan's
    ``Recipe.torch_compile`` (planner.trainers.torchtitan.rules.torch_compile_on): compiled = "model" in the components and
    enabled; the loss keeps the registry function's setting. Model compile off also switches off async TP,
    which needs it (CompileConfig.__post_init__, config/configs.py:303-310)."""
    enable, components, async_tp = base_compile(ctx)
    tr = ctx.training.model_copy(update={"trainer": NAME})
    if torch_compile_on(ctx.model, ctx.config, tr):
        return True, ("model",) + tuple(c for c in components if c != "model"), async_tp
    rest = tuple(c for c in components if c != "model")
    return bool(enable and rest), rest or ("loss",), False


def cuda_graphs(ctx: EmitContext) -> bool:
    """TorchTitan captures CUDA graphs (``training.disable_cuda_graphs`` off): the recipe as TorchTitan
    runs the layout (planner.trainers.torchtitan.rules.effective_recipe). Trainer.Config.
    _validate_cuda_graphs refuses graphs with PP or with the all-to-all EP dispatcher, so those layouts
    run without them whatever the plan's recipe asked for."""
    tr = ctx.training.model_copy(update={"trainer": NAME})
    impl = effective_recipe(ctx.model, ctx.config, tr).cuda_graph_impl
    return impl != "none" and graphs_problem(ctx.model, ctx.config, tr, impl) is None


def needs_converters(ctx: EmitContext) -> bool:
    """The plan's precision differs from what the built-in registry function trains in."""
    if is_user_model(ctx.model):
        return ctx.training.precision != "bf16"
    return ctx.training.precision != BASE_PRECISION.get(ctx.model.name.lower(), "bf16")


def custom_stem(model_name: str) -> str:
    """The registry function's name for a model: a Python identifier (``qwen3_235b_a22b``)."""
    stem = re.sub(r"\W", "_", model_name.lower().replace("-", "_").replace(".", "_"))
    return stem if stem[:1].isalpha() else f"model_{stem}"


def _custom_name(ctx: EmitContext) -> str:
    name = custom_stem(ctx.model.name)
    return name if not needs_converters(ctx) else f"{name}_{ctx.training.precision.replace('-', '_')}"


def converters(ctx: EmitContext) -> list[str]:
    """The converter constructors (Python source) the plan's precision needs."""
    if ctx.training.precision == "bf16":
        return []
    linear, experts = CONVERTERS[ctx.training.precision]
    out = [linear]
    if ctx.model.num_experts:
        if experts is None:
            raise InputError(f"--trainer torchtitan: torchtitan 0.3.0 has no {ctx.training.precision} converter for "
                             "grouped experts; plan this MoE model with --precision mxfp8 or fp8")
        out.append(experts)
    return out


def custom_registry(ctx: EmitContext) -> str | None:
    module, config, flavour = model_entry(ctx)
    fixes = model_fixes(ctx)
    if config is not None and not needs_converters(ctx) and not fixes:
        return None
    user = is_user_model(ctx.model)
    base = config or (USER_FAMILIES[ctx.model.family][1] if user else BASE_CONFIG[module])
    conv = converters(ctx)
    names = sorted({c.split(".", 1)[0] for c in conv})
    imports = f"from torchtitan.components.quantization import {', '.join(names)}\n" if names else ""
    why = (f"the plan trains in {ctx.training.precision}, so the model gets the converters below" if conv else
           "the plan trains in BF16, so the model is built without converters")
    fix_src, flavour_src = "", ""
    if fixes:   # the built-in flavour differs from the catalog's config.json: set the config's values
        why += ("; torchtitan's flavour differs from the model's config.json, so its "
                + ("RMSNorm epsilon and RoPE are" if fixes["rope"] else "RMSNorm epsilon is") + " set as the config says")
        flavour_src = _AS_CONFIG_IMPORTS + _AS_CONFIG_SRC
        fix_src = f"    _as_config(config.model_spec.model, {fixes['eps']!r}, {fixes['rope']!r})\n"
    # MX layers: the attention and MLP/expert projections (not the router gate or the output head,
    # torchtitan's deepseek_v3_debugmodel_mxfp8 choice)
    fqns = '["attention", "shared_experts", "feed_forward"]' if ctx.model.num_experts else '["attention", "feed_forward"]'
    conv_src = ("[" + ", ".join(c.replace("COMPILED", "compiled").replace("FQNS", fqns) for c in conv) + "]"
                if conv else "None")
    if user:
        where = (f"{ctx.model.source or 'config.json'}, written out below as flavour {flavour!r} of "
                 f"torchtitan.models.{module}")
        flavour_src = user_flavour(ctx.model, module)
        vocab = ("    # the loss's vocabulary is the model's\n"
                 "    fn = getattr(config.loss, 'loss_fn', config.loss)\n"
                 "    if hasattr(fn, 'global_vocab_size'):\n"
                 "        fn.global_vocab_size = decoder_vocab_size(config.model_spec)\n")
        assets = f"    config.hf_assets_path = {_user_assets(ctx.model)!r}\n"
    else:
        where, vocab = f"{flavour!r} in torchtitan.models.{module}", ""
        assets = "" if config is not None else f'    config.hf_assets_path = "./assets/hf/{_hf_dir(ctx)}"\n'
    enable, components, async_tp = compile_setting(ctx)
    compile_src = (f"    # torch.compile of the model as the plan prices it (also on the command line)\n"
                   f"    config.compile.enable = {enable}\n"
                   f"    config.compile.components = {list(components)!r}\n"
                   f"    config.compile.enable_async_tensor_parallel = {async_tp}\n")
    return f'''"""TorchTitan 0.3.0 config registry written by topoplan for {ctx.model.name} ({where}): it
starts from {base}() and rebuilds the model spec; {why}.
Put this directory on PYTHONPATH and pass --module {CUSTOM_MODULE} --config {_custom_name(ctx)}."""

{imports}from torchtitan.models.{module} import model_registry
from torchtitan.models.{module}.config_registry import {base} as _base_config
{flavour_src}

def {_custom_name(ctx)}():
    config = _base_config()   # {base}()
{compile_src}    compiled = config.compile.enable and "model" in config.compile.components
    config.model_spec = model_registry({flavour!r}, {REGISTRY_KWARGS.get(module, "")}converters={conv_src})
{fix_src}{vocab}{assets}    return config
'''


def _deepseek_flavour(m, rope: str, common: str) -> str:
    """DeepSeek-V3-shaped config.json: MLA, dense layers first, routed plus shared experts, router
    scoring, groups and scale from the file, YaRN RoPE. No MTP layers, as torchtitan's own
    deepseek_v3_671b (num_mtp_layers=0)."""
    groups = (f"router_num_expert_groups={m.n_group}, router_num_limited_groups={m.topk_group},"
              if m.n_group > 1 else "")
    rs = m.rope_scaling
    mscale = float((rs.mscale_all_dim if rs.mscale_all_dim is not None else rs.mscale) or 1.0) if rs else 1.0
    dense = m.moe_layers.index(True)
    return f'''from torchtitan.models import deepseek_v3 as _family
from torchtitan.models.common import ComplexRoPE
{common}

def _topoplan_model(attn_backend, moe_comm_backend, non_blocking_capacity_factor=None, num_mtp_layers=0):
    dim, vocab = {m.hidden_size}, {m.vocab_size}
    layers = _family._build_dsv3_layers(
        n_layers={m.num_layers}, n_dense_layers={dense}, dim=dim, n_heads={m.num_attention_heads},
        q_lora_rank={m.q_lora_rank or 0}, kv_lora_rank={m.kv_lora_rank}, qk_nope_head_dim={m.qk_nope_head_dim},
        qk_rope_head_dim={m.qk_rope_head_dim}, v_head_dim={m.v_head_dim}, mscale={mscale!r},
        dense_hidden_dim={m.ffn_hidden_size}, moe_hidden_dim={m.moe_ffn_hidden_size}, num_experts={m.num_experts},
        num_shared_experts={m.shared_ffn_hidden_size // m.moe_ffn_hidden_size}, router_top_k={m.top_k},
        router_score_func={m.router_score!r}, {groups}
        router_route_scale={m.router_scale!r},
        router_route_norm={m.norm_topk_prob},
        attn_backend=attn_backend, moe_comm_backend=moe_comm_backend,
        non_blocking_capacity_factor=non_blocking_capacity_factor,
        rope=ComplexRoPE.Config(dim={m.qk_rope_head_dim}, max_seq_len={int(m.max_position_embeddings or 16384)}, \
{rope}))
    return _as_config(_family.DeepSeekV3Model.Config(
        vocab_size=vocab, dim=dim, enable_weight_tying={m.tied_embeddings},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_family._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_family._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_family._output_linear_init(dim)),
        layers=layers,
        mtp_layers=_family._build_mtp_layers(layers[-1], dim=dim, num_mtp_layers=num_mtp_layers)), {m.norm_eps!r})


_family.deepseekv3_configs[{USER_FLAVOUR!r}] = _topoplan_model
'''


def _gptoss_flavour(m, rope: str, common: str) -> str:
    """GPT-OSS-shaped config.json: the layers of torchtitan's _build_gptoss_layers with the file's heads,
    KV heads, head dim and sliding-window layers (torchtitan's own builder fixes 64/8/64 and a 128 window
    on even layers), sinks and biases, softmax top-k routing, YaRN RoPE."""
    windows = [m.sliding_window if w else None for w in m.swa_layers]
    return f'''from torchtitan.models import gpt_oss as _family
{common}

def _topoplan_model(moe_comm_backend, attn_backend="varlen"):
    dim, vocab, n_experts, top_k = {m.hidden_size}, {m.vocab_size}, {m.num_experts}, {m.top_k}
    rope = _family.CosSinRoPE.Config(dim={m.head_dim}, max_seq_len={int(m.max_position_embeddings or 131072)}, \
{rope})
    windows = {windows!r}
    layers = []
    for i, window in enumerate(windows):
        layers.append(_family.GptOssTransformerBlock.Config(
            attention=_family._make_gptoss_attn_config(
                dim=dim, layer_id=i, attn_backend=attn_backend, n_heads={m.num_attention_heads},
                n_kv_heads={m.num_kv_heads}, head_dim={m.head_dim}, sliding_window_size=window, fuse_qkv=True,
                rope=rope),
            attention_norm=RMSNorm.Config(normalized_shape=dim, param_init=_family._NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init=_family._NORM_INIT),
            moe=_family.GptOssMoE.Config(
                num_experts=n_experts, load_balance_coeff=1e-3,
                routed_experts=_family._make_gptoss_experts_config(
                    dim=dim, hidden_dim={m.moe_ffn_hidden_size}, num_experts=n_experts, layer_id=i, top_k=top_k,
                    moe_comm_backend=moe_comm_backend),
                router=_family.TokenChoiceTopKRouter.Config(
                    num_experts=n_experts, score_func="softmax", route_norm=True, top_k=top_k,
                    gate=Linear.Config(in_features=dim, out_features=n_experts, bias=True,
                                       param_init=_family._depth_init(i))))))
    return _as_config(_family.GptOssModel.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying={m.tied_embeddings},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_family._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_family._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_family._output_linear_init(dim)),
        layers=layers), {m.norm_eps!r})


_family.gptoss_configs[{USER_FLAVOUR!r}] = _topoplan_model
'''


def _user_assets(m) -> str:
    """The tokenizer's directory: the config.json's own (Hugging Face keeps them together)."""
    return str(Path(m.source).parent) if m.source and m.source.endswith(".json") else "./assets/hf/" + m.name


def rope_kwargs(m) -> str:
    """RoPE.Config keywords after dim and max_seq_len (torchtitan 0.3.0 models/common/rope.py): the
    config's base and scaling (YaRN: rope_factor, beta_fast/slow, original_seq_len, truncate; llama3:
    scaling="llama" with its factors). Fields the config leaves out keep torchtitan's defaults, which
    are HF's (beta 32/1, original 4096, truncate on; llama3 1/4/8192)."""
    kw = f"theta={m.rope_theta!r}"
    rs = m.rope_scaling
    if rs is None:
        return kw
    if rs.kind == "yarn":
        kw += f', scaling="yarn", rope_factor={float(rs.factor)!r}'
        for name, v in (("beta_fast", rs.beta_fast), ("beta_slow", rs.beta_slow)):
            if v is not None:
                kw += f", {name}={float(v)!r}"
        if rs.original_max_position_embeddings is not None:
            kw += f", original_seq_len={rs.original_max_position_embeddings}"
        return kw + ("" if rs.truncate is None else f", truncate={rs.truncate}")
    kw += f', scaling="llama", scaling_factor={float(rs.factor)!r}'   # llama3 (is_user_model refuses linear)
    for name in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if getattr(rs, name) is not None:
            kw += f", {name}={getattr(rs, name)!r}"
    return kw


_AS_CONFIG_SRC = '''

def _as_config(model, eps, rope=None):
    """The config.json's RMSNorm epsilon on every norm and, when given, its RoPE settings on every RoPE."""
    for _fqn, norm, _parent, _attr in model.traverse(RMSNorm.Config):
        norm.eps = eps
    for _fqn, rotary, _parent, _attr in model.traverse(RoPE.Config) if rope else ():
        for key, value in rope.items():
            setattr(rotary, key, value)
    return model
'''
_AS_CONFIG_IMPORTS = "from torchtitan.models.common import RMSNorm\nfrom torchtitan.models.common.rope import RoPE\n"

# What torchtitan 0.3.0's own flavours of the catalog models build (models/<module>/__init__.py): the RoPE
# fields of rope_fields() and the RMSNorm epsilon. tests/test_emit_fidelity.py checks this table against
# torchtitan itself; where the catalog's config.json says otherwise (Llama 3 has no RoPE scaling, DeepSeek-V3's
# eps is 1e-6, Qwen3-235B-A22B's rope base 1e6) the written registry sets the config's values (model_fixes).
_LLAMA31_ROPE = {"theta": 500000.0, "scaling": "llama", "scaling_factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_GPTOSS_ROPE = {"theta": 150000.0, "scaling": "yarn", "rope_factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_seq_len": 4096, "truncate": False}
BUILTIN_MODEL = {
    "llama3-8b": (_LLAMA31_ROPE, 1e-5), "llama3-70b": (_LLAMA31_ROPE, 1e-5), "llama3.1-405b": (_LLAMA31_ROPE, 1e-5),
    "deepseek-v3": ({"theta": 10000.0, "scaling": "yarn", "rope_factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_seq_len": 4096, "truncate": True}, 1e-5),
    "qwen3-30b-a3b": ({"theta": 1000000.0, "scaling": "none"}, 1e-6),
    "qwen3-235b-a22b": ({"theta": 5000000.0, "scaling": "none"}, 1e-6),
    "gpt-oss-120b": (_GPTOSS_ROPE, 1e-5), "gpt-oss-20b": (_GPTOSS_ROPE, 1e-5),
}


def rope_fields(m) -> dict:
    """The spec's RoPE as torchtitan's RoPE.Config fields, torchtitan's defaults (HF's) where the config is silent."""
    rs = m.rope_scaling
    if rs is None:
        return {"theta": float(m.rope_theta), "scaling": "none"}
    if rs.kind == "yarn":
        return {"theta": float(m.rope_theta), "scaling": "yarn", "rope_factor": float(rs.factor),
                "beta_fast": float(32.0 if rs.beta_fast is None else rs.beta_fast),
                "beta_slow": float(1.0 if rs.beta_slow is None else rs.beta_slow),
                "original_seq_len": int(rs.original_max_position_embeddings or 4096),
                "truncate": True if rs.truncate is None else bool(rs.truncate)}
    return {"theta": float(m.rope_theta), "scaling": "llama", "scaling_factor": float(rs.factor),
            "low_freq_factor": float(rs.low_freq_factor or 1.0), "high_freq_factor": float(rs.high_freq_factor or 4.0),
            "original_max_position_embeddings": int(rs.original_max_position_embeddings or 8192)}


def model_fixes(ctx: EmitContext) -> dict:
    """{"eps": ..., "rope": {...}} where a catalog model's built-in torchtitan flavour differs from its
    config.json ({} when it builds the config, or for a user's config, whose flavour is written whole)."""
    builtin = BUILTIN_MODEL.get(ctx.model.name.lower())
    if builtin is None:
        return {}
    rope, eps = builtin
    want = rope_fields(ctx.model)
    same_rope = rope == want
    if same_rope and abs(eps - ctx.model.norm_eps) <= 1e-12:
        return {}
    return {"eps": ctx.model.norm_eps, "rope": None if same_rope else want}


def user_flavour(m, module: str) -> str:
    """Python source adding flavour USER_FLAVOUR to torchtitan.models.<module>'s config table: the
    model of the ModelSpec built with the module's own layer builders and inits (as its built-in
    flavours are; torchtitan 0.3.0's private helpers, pinned with the version)."""
    rope = rope_kwargs(m)
    max_seq = int(m.max_position_embeddings or 131072)
    common = ("from torchtitan.models.common import Embedding, Linear, RMSNorm\n"
              "from torchtitan.models.common.config_utils import decoder_vocab_size\n"
              "from torchtitan.models.common.rope import RoPE\n" + _AS_CONFIG_SRC)
    if module == "llama3":
        return f'''from torchtitan.models import llama3 as _family
from torchtitan.models.common import ComplexRoPE
{common}

def _topoplan_model(attn_backend, tp_gemm_backend="default"):
    dim, vocab = {m.hidden_size}, {m.vocab_size}
    return _as_config(_family.Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying={m.tied_embeddings},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_family._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_family._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_family._output_linear_init(dim)),
        layers=_family._build_llama3_layers(
            fuse_qkv=True, n_layers={m.num_layers}, dim=dim, n_heads={m.num_attention_heads},
            n_kv_heads={m.num_kv_heads}, hidden_dim={m.ffn_hidden_size},
            rope=ComplexRoPE.Config(dim={m.head_dim}, max_seq_len={max_seq}, {rope}),
            attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend)), {m.norm_eps!r})


_family.llama3_configs[{USER_FLAVOUR!r}] = _topoplan_model
'''
    if module == "deepseek_v3":
        return _deepseek_flavour(m, rope, common)
    if module == "gpt_oss":
        return _gptoss_flavour(m, rope, common)
    moe = m.family == "qwen3_moe"
    layers = (f"_family._build_qwen3_moe_layers(\n            fuse_qkv=True, n_layers={m.num_layers}, dim=dim, "
              f"n_heads={m.num_attention_heads}, n_kv_heads={m.num_kv_heads}, head_dim={m.head_dim},\n"
              f"            moe_hidden_dim={m.moe_ffn_hidden_size}, num_experts={m.num_experts}, top_k={m.top_k}, "
              "moe_comm_backend=moe_comm_backend," if moe else
              f"_family._build_qwen3_layers(\n            fuse_qkv=True, n_layers={m.num_layers}, dim=dim, "
              f"n_heads={m.num_attention_heads}, n_kv_heads={m.num_kv_heads}, head_dim={m.head_dim},\n"
              f"            hidden_dim={m.ffn_hidden_size},")
    sig = "attn_backend, moe_comm_backend=\"standard\"" if moe else "attn_backend"
    return f'''from torchtitan.models import qwen3 as _family
from torchtitan.models.common import CosSinRoPE
{common}

def _topoplan_model({sig}):
    dim, vocab = {m.hidden_size}, {m.vocab_size}
    return _as_config(_family.Qwen3Model.Config(
        vocab_size=vocab, dim=dim, norm=_family._qwen3_norm(dim), enable_weight_tying={m.tied_embeddings},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_family._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_family._LINEAR_INIT),
        layers={layers}
            attn_backend=attn_backend,
            rope=CosSinRoPE.Config(dim={m.head_dim}, max_seq_len={max_seq}, {rope}))), {m.norm_eps!r})


_family.qwen3_configs[{USER_FLAVOUR!r}] = _topoplan_model
'''


def _hf_dir(ctx: EmitContext) -> str:
    return {"qwen3-235b-a22b": "Qwen3-235B-A22B"}.get(ctx.model.name.lower(), ctx.model.name)


# [parallelism] keys of the 0.3 command line that torchtitan 0.2.0's Parallelism lacks (its parser refuses
# unknown fields): 0.2.0 shards sequences whenever TP > 1, with no switch
NOT_IN_02 = ("enable_sequence_parallel",)


def toml_job(ctx: EmitContext, custom: str | None = None) -> str:
    """TorchTitan 0.2 job file (``--job.config_file job.toml``); ``custom``: the module whose flavour
    toml02.FLAVOUR the written flavour module adds (toml02_plan), else the model's built-in flavour."""
    module, _, flavour = model_entry(ctx)
    flavour = toml02.FLAVOUR if custom else flavour
    local, gbs, _ = batch(ctx)
    lines = [f"# TorchTitan 0.2 job file written by topoplan (plan {ctx.index}: {ctx.config.short()}, "
             f"{ctx.world} x {ctx.gpu}).", "# torchrun ... -m torchtitan.train --job.config_file job.toml", "",
             "[job]", f'description = "topoplan plan {ctx.index} for {ctx.model.name}"', "",
             "[model]", f'name = "{module}"', f'flavor = "{flavour}"']
    if custom:   # the flavour module adds the flavour
        lines[2:2] = [f"# {toml02.MODULE}.py (beside this file, on PYTHONPATH) adds flavour {flavour!r} of {module}"]
        if is_user_model(ctx.model):   # the tokenizer sits beside the config.json
            lines.append(f"hf_assets_path = {_toml(_user_assets(ctx.model))}")
        lines += ["", "[experimental]", f"custom_import = {_toml(toml02.MODULE)}"]
    elif model_fixes(ctx):   # a flavour module cannot express the config here (toml02.refusal)
        lines[2:2] = [f"# torchtitan 0.2.0's built-in flavour {flavour!r} differs from the config.json (RMSNorm eps or "
                      f"RoPE; {toml02.refusal(ctx.model, module)}); the 0.3 command line builds the config's"]
    lines += ["", "[training]", f"local_batch_size = {local}", f"global_batch_size = {gbs}",
             f"seq_len = {ctx.training.seq_len}", "", "[parallelism]"]
    for k, v in parallelism(ctx).items():
        if k not in NOT_IN_02:
            lines.append(f"{k} = {_toml(v)}")
    if ctx.model.num_experts and ctx.config.ep > 1:
        lines.append("expert_tensor_parallel_degree = 1")
    lines += ["", "[activation_checkpoint]", f'mode = "{ac_mode(ctx)}"']
    enable, components, _ = compile_setting(ctx)   # 0.2's [compile] section: enable, components
    lines += ["", "[compile]", f"enable = {_toml(enable)}", f"components = {_toml(list(components))}"]
    return "\n".join(lines) + "\n"


def files(ctx: EmitContext) -> dict[str, str]:
    args = command_args(ctx)
    hdr = (f"# TorchTitan 0.3.0 launch for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()}, "
           f"{ctx.world} x {ctx.gpu}.\n# Per node (see slurm/sbatch.sh for node ranks): torchrun --nnodes "
           f"{len(ctx.host_order)} --nproc-per-node {ctx.gpus_per_node} --node-rank $NODE_RANK -m torchtitan.train ARGS\n")
    out = {"torchtitan/command.txt": hdr + "python -m torchtitan.train " + " ".join(shlex.quote(a) for a in args) + "\n"}
    module, why = toml02_plan(ctx)
    if why is None:
        out["torchtitan/job.toml"] = toml_job(ctx, module)
        if module:   # job.toml's custom_import: the config's model as a 0.2 flavour
            out[f"torchtitan/{toml02.MODULE}.py"] = toml02.flavour_source(ctx.model, module)
    else:
        out["torchtitan/command.txt"] = hdr + f"# No job.toml: TorchTitan 0.2 cannot build this config.json: {why}.\n" \
            + out["torchtitan/command.txt"][len(hdr):]
    reg = custom_registry(ctx)
    if reg:
        out[f"torchtitan/{CUSTOM_MODULE}.py"] = reg
    return out


def toml02_plan(ctx: EmitContext) -> tuple[str | None, str | None]:
    """(module, why) for TorchTitan 0.2: ``module`` is the torchtitan 0.2.0 module the written flavour module
    adds the config's model to (a user's config.json, or a catalog model whose built-in flavour differs from its
    config.json, model_fixes), None when job.toml names the built-in flavour; ``why`` says why no job.toml."""
    m, module = ctx.model, model_entry(ctx)[0]
    if module not in toml02.TABLES:
        return None, f"torchtitan 0.2.0 has no {module} model"
    why = toml02.refusal(m, module)
    if is_user_model(m):
        return (module, None) if why is None else (None, why)
    return (module if model_fixes(ctx) and why is None else None), None


def parse_command(text: str) -> list[str]:
    """The arguments after ``-m torchtitan.train`` from command.txt."""
    for line in text.splitlines():
        if line.startswith("python -m torchtitan.train "):
            return shlex.split(line)[3:]
    raise ValueError("no 'python -m torchtitan.train' line")


def _toml(v) -> str:
    if isinstance(v, list):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def for_trial(directory, iters: int) -> None:
    """``topoplan trial``: the emitted command line (and job.toml) under ``directory`` run ``iters`` steps,
    logging each one and printing the config."""
    d = Path(directory) / "torchtitan"
    extra = f"--training.steps {iters} --metrics.log_freq 1 --debug.print_config"
    out = []
    for ln in (d / "command.txt").read_text().splitlines():
        if ln.startswith("python ") or "torchtitan.train" in ln and not ln.startswith("#"):
            words = ln.split(" ")
            sub = next((i for i, w in enumerate(words) if re.fullmatch(r"[a-z][a-z0-9-]*:[a-z0-9-]+", w)), len(words))
            ln = " ".join(words[:sub] + extra.split(" ") + words[sub:])
        out.append(ln)
    (d / "command.txt").write_text("\n".join(out) + "\n")
    toml = d / "job.toml"
    if toml.exists():
        text = re.sub(r"(?m)^\[training\]\n", f"[training]\nsteps = {iters}\n", toml.read_text(), count=1)
        toml.write_text(text.rstrip("\n") + "\n\n[metrics]\nlog_freq = 1\n\n[debug]\nprint_config = true\n")


# -- slurm/task.sh and the Kubernetes pods (planner.output.emit.slurm.trainer_shell) ----------------------

def task_env(ctx: EmitContext) -> str:
    """The emitted registry module (torchtitan/) on the path."""
    return 'export PYTHONPATH="$ROOT/torchtitan${PYTHONPATH:+:$PYTHONPATH}"'


def task_command(ctx: EmitContext) -> str:
    """The ``trainer_cmd`` case arm: prints torchtitan.train with the emitted arguments."""
    return """      printf '%s -m torchtitan.train %s %s\\n' "$2" "$(sed -n 's/^python -m torchtitan.train //p' "$ROOT/torchtitan/command.txt")" "$data" ;;"""
