"""CP-SAT programs: layout with placement (``solver.layout``) and expert placement
(``solver.experts``). Plain arrays in, plain results out: no files, no CLI, no pydantic."""
