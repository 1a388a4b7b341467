"""The cost model: one module per step-time term (``terms``), their composition (``steptime``),
memory per GPU (``memory``), rank placement on the hardware (``placement``), software-stack profiles
(``profiles``), the ``predict`` API, and fitting / checking against measured runs (``calibrate``,
``validate``). Imports ``planner.model``, ``topologies`` and the shared vocabulary; never the search
or the output."""
