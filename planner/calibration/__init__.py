"""Calibration: the cost model (``planner.cost``) checked against and fitted to measured runs.

``runs`` reads trainer logs (with the trainers' parsers) into rows in the schema of calibration.csv,
``validate`` turns a row into a case and predicts it, ``priors`` is where a fit starts, ``calibrate``
fits a stack profile, ``memfit`` fits the memory reserve terms to measured peaks, ``crosscheck``
predicts published reference runs before and after a fit, ``bands`` is the statistic the uncertainty
table is fitted with, ``retention`` compares predicted and measured scaling per series. Imports ``planner.cost``,
``planner.model``, ``topologies`` and the shared vocabulary; the search and the output may import it,
never the cost model."""
