"""The two ways topoplan refuses a request (exit 2 bad input, exit 3 infeasible).

The classes live in :mod:`topologies.errors`, the lowest layer, so that the hardware layer can raise
them without importing the planner; every planner module imports them from here.
"""

from topologies.errors import InfeasibleError, InputError, TopoplanError, not_utf8, pydantic_message

__all__ = ["InfeasibleError", "InputError", "TopoplanError", "not_utf8", "pydantic_message"]
