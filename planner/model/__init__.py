"""The model side: architecture specs (``spec``), training FLOPs and parameter counts (``flops``) and
the split of layers into pipeline stages (``pipeline``). Imports only ``topologies`` and the
planner's shared vocabulary (``planner.config``, ``planner.errors``)."""
