"""The model families TorchTitan 0.3.0 cannot build (refused at emit by ``planner.output.emit.support.check_family``;
its emitter refuses every other family outside its own list in ``torchtitan.model_entry``). TorchTitan 0.3.0's
models are llama3, qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7 (+ flux, muse_glimmer)."""

from __future__ import annotations

TITLES = {"torchtitan": "TorchTitan 0.3.0"}
# Hybrid families (issue 23)
TORCHTITAN_CANNOT_HYBRID = {
    "qwen3_next": "Qwen3-Next model (its Gated DeltaNet is inside the multimodal qwen3_5 model only, with M-RoPE "
                  "and another layer layout)",
    "nemotron_h": "Mamba-2 layer",
    "deepseek_v32": "DeepSeek sparse attention (the lightning indexer; its deepseek_v3 model is dense MLA)",
}


def why_not(model, seq_len: int) -> str | None:
    """Why TorchTitan cannot build ``model`` (None: it can, or its emitter decides)."""
    lacks = TORCHTITAN_CANNOT_HYBRID.get(model.family)
    return f"it has no {lacks}" if lacks else None
