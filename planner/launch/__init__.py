"""Launch time: put a plan on the hosts a scheduler granted (``place``), read allocations in the forms
launchers have (``allocation``), and the stdlib-only core both use (``core``, also shipped as
``slurm/place.py``). docs/launch.md."""
