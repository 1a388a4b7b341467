"""The search: the declared space and its rules (``space``), the program of the step time (``program``:
``planner.cost.steptime``'s functions tabulated), its bounds and exhaustive search (``bounds``), ``plan``
and ``scale`` solved by ``solver.layout`` (``plan``), the plan document (``document``), and expert placement (``experts``, with DeepSeek's EPLB as the
baseline in ``eplb``). Imports the cost model, the model side, ``solver`` and ``topologies``."""
