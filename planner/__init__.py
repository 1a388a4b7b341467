"""topoplan's planner: model specs, FLOPs, memory, the step-time model, plan/predict, emitters, CLI.

Python API (for launchers)::

    import planner, topologies
    model = planner.load_model("deepseek-v3")
    job = topologies.load_job("gb300-nvl72", gpus=256)   # as --cluster gb300-nvl72 --gpus 256
    training = planner.Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    best = planner.plan(model, job, training, top=3)
    cluster = topologies.load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    pred = planner.predict(model, cluster, planner.ParallelConfig(pp=2, vpp=8, ep=32), training)
    placed = planner.place("launch/plan.json", "granted.txt")   # at job start: rank -> granted host
    open("hostfile", "w").write(placed.hostfile())
    after = planner.replan(best.to_dict(), "gb300-r02-t07")   # hosts failed: spares or a new plan
"""

from planner.config import ParallelConfig, Training  # noqa: F401
from planner.errors import InfeasibleError, InputError, TopoplanError  # noqa: F401


# The API functions are bound here, after their modules are imported, so that ``planner.cost.predict`` and
# ``planner.search.plan`` stay the functions (importing a submodule would otherwise rebind the package
# attribute to the module).
from planner.model.spec import load_model  # noqa: E402,F401
from planner.cost.predict import predict  # noqa: E402,F401
from planner.search.plan import plan  # noqa: E402,F401
from planner.launch.place import place  # noqa: E402,F401
from planner.launch.replan import replan  # noqa: E402,F401
