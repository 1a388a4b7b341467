"""TorchTitan's recipe settings: the ``planner.config.Recipe`` fields this package owns (it also runs
Megatron's ``cuda_graph_impl`` as its ``training.disable_cuda_graphs`` switch)."""

from __future__ import annotations

from pydantic import Field

FIELDS = {
    "torch_compile": (bool | None, Field(
        None, description="TorchTitan: torch.compile of the model (config.compile.enable with 'model' in "
                          "config.compile.components: each transformer block compiled, its elementwise ops fused; "
                          "priced with the profile's mem.elementwise, eager with mem.elementwise_eager). None = what "
                          "the model's TorchTitan 0.3.0 registry function does (llama3_405b compiles the model; the "
                          "others compile at most the loss: planner.trainers.torchtitan.rules.TORCHTITAN_COMPILED). Independent of CUDA "
                          "graphs (training.disable_cuda_graphs). TorchTitan only: Megatron and MaxText refuse it")),
}

OFF = {"torch_compile": None}   # planner.trainers.RECIPE_OFF: not a setting of the other trainers

