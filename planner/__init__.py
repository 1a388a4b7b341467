"""topoplan's planner: model specs, FLOPs, memory, the step-time model, plan/predict, emitters, CLI.

Python API (for launchers)::

    import planner, topologies
    model = planner.load_model("deepseek-v3")
    job = topologies.load_job("gb300-nvl72", gpus=256)   # as --cluster gb300-nvl72 --gpus 256
    training = planner.Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    best = planner.plan(model, job, training, top=3)
    cluster = topologies.load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    pred = planner.predict(model, cluster, planner.ParallelConfig(pp=2, vpp=8, ep=32), training)  # a planner.Prediction
    placed = planner.place("launch/plan.json", "granted.txt")   # at job start: rank -> granted host
    open("hostfile", "w").write(placed.hostfile())
    after = planner.replan(best.to_dict(), "gb300-r02-t07")   # hosts failed: spares or a new plan

The names load on first use (module ``__getattr__``), so that importing a light submodule (the CLI
starting, ``planner.errors``) does not import the cost model, the solver and numpy with it.
"""

from planner.errors import InfeasibleError, InputError, TopoplanError  # noqa: F401

__all__ = ["ParallelConfig", "Training", "InfeasibleError", "InputError", "TopoplanError", "load_model",
           "predict", "Prediction", "plan", "place", "replan"]


def __getattr__(name: str):
    """``ParallelConfig``, ``Training``, ``load_model``, ``predict`` (and its result type ``Prediction``), ``plan``,
    ``place`` and ``replan``, imported when first asked
    for and bound here (``planner.plan`` stays the function: no submodule of ``planner`` has these names)."""
    if name in ("ParallelConfig", "Training"):
        from planner import config as mod
    elif name == "load_model":
        from planner.model import spec as mod
    elif name == "predict":
        from planner.cost import predict as mod
    elif name == "Prediction":
        from planner.cost import prediction as mod
    elif name == "plan":
        from planner.search import plan as mod
    elif name == "place":
        from planner.launch import place as mod
    elif name == "replan":
        from planner.launch import replan as mod
    else:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    value = getattr(mod, name)
    globals()[name] = value
    return value
