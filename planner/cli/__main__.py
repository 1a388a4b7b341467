"""``python -m planner.cli``: the ``topoplan`` command line."""

from planner.cli import run

run()
