"""The cost model: one module per step-time term (``terms``), their composition (``steptime``),
memory per GPU (``memory``), rank placement on the hardware (``placement``), software-stack profiles
(``profiles``), the ``predict`` API and its one result type (``prediction.Prediction``), the
uncertainty band applied to a prediction (``uncertainty``).
Fitting and checking against measured runs is ``planner.calibration``, a layer above. Imports
``planner.model``, ``topologies`` and the shared vocabulary; never the calibration, the search or the
output."""
