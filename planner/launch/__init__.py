"""Launch time: put a plan on the hosts a scheduler granted (``place``), read allocations in the forms
launchers have (``allocation``), the stdlib-only core both use (``core``, also shipped as
``slurm/place.py``), and put a plan on hosts again when hardware fails (``replan``, ``spares``,
``inprocess``). docs/launch.md, docs/resilience.md."""
