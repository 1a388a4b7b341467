"""The model families MaxText 0.x cannot build as their config says (refused at emit by
``planner.output.emit.support.check_family``), and the MaxText model file a catalog model is built from.
A user's config.json of a family MaxText has a decoder block for is written as MaxText's model keys
(:mod:`planner.trainers.maxtext.model_keys`), which refuse what the block cannot express."""

from __future__ import annotations

from planner.trainers.maxtext import model_keys

TITLES = {"maxtext": "MaxText"}
MAXTEXT_CANNOT = ("dbrx", "olmoe", "minimax_m2", "phimoe", "granitemoe", "ernie4_5_moe", "hunyuan_v1_moe",
                  "ministral3")
# Hybrid families (issue 23)
MAXTEXT_CANNOT_HYBRID = {
    "nemotron_h": "Mamba-2 decoder block",
    "deepseek_v32": "full-size DeepSeek-V3.2 model (configs/models/deepseek3.2-671b.yml is a reduced test shape: "
                    "1024 wide, 5 layers, index_topk 64)",
}
# MaxText's own file of a family's published model: (configs/models/<name>.yml, the shape it fixes: layers,
# hidden, experts, top-k); a config of that shape names it, another is written as keys (model_keys)
MAXTEXT_BUILTIN = {"qwen3_next": ("qwen3-next-80b-a3b", (48, 2048, 512, 10))}


# planner catalog name -> MaxText model_name (configs/models/<name>.yml)
MODEL_NAMES = {
    "deepseek-v3": "deepseek3-671b",
    "kimi-k2": "kimi-k2-1t",
    "llama3-8b": "llama3-8b",
    "llama3-70b": "llama3-70b",
    "llama3.1-405b": "llama3.1-405b",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "qwen3-235b-a22b": "qwen3-235b-a22b",
    "gpt-oss-120b": "gpt-oss-120b",
    "gpt-oss-20b": "gpt-oss-20b",
    "mixtral-8x7b": "mixtral-8x7b",
    "mixtral-8x22b": "mixtral-8x22b",
}


def maxtext_model_name(model) -> str | None:
    """MaxText's model_name for ``model`` (None: MaxText ships no model config for it)."""
    return MODEL_NAMES.get(model.name.lower()) or maxtext_builtin(model)


def maxtext_builtin(model) -> str | None:
    """MaxText's model_name for a config of the shape of MaxText's own file of its family; None otherwise."""
    name, shape = MAXTEXT_BUILTIN.get(model.family, (None, None))
    if name and (model.num_layers, model.hidden_size, model.num_experts, model.top_k) == shape:
        return name
    return None


def why_not(model, seq_len: int) -> str | None:
    """Why MaxText cannot build ``model`` (None: it can)."""
    family = model.family
    if family in MAXTEXT_CANNOT:
        return "it has no decoder block for this family"
    if family in MAXTEXT_CANNOT_HYBRID:
        return f"it has no {MAXTEXT_CANNOT_HYBRID[family]}"
    # the overrides carry MaxText's model keys for this config (model_keys), over MaxText's own file if any
    return model_keys.refusal(model)
