"""CLI command ``topoplan schema plan``: the JSON Schema of the plan document (plan.json).

The schema is generated from ``planner.search.document.PlanDocument``; the shipped copy,
``planner/data/plan.schema.json``, is this command's output (a test keeps the two equal)."""

from __future__ import annotations

import sys

import typer

from planner.search.document import schema_text

schema_app = typer.Typer(
    name="schema",
    help="JSON Schemas of the documents topoplan writes.\n\nExample: topoplan schema plan > plan.schema.json",
    no_args_is_help=True,
    rich_markup_mode=None,  # click's plain help: no truncated option names
)


@schema_app.command("plan")
def plan_schema_cmd():
    """Print the JSON Schema of plan.json (what 'topoplan plan --save-plan' writes and 'emit' reads).

    Example: topoplan schema plan > plan.schema.json
    """
    sys.stdout.write(schema_text())


def register(app: typer.Typer) -> None:
    """Add the ``schema`` group to the root app."""
    app.add_typer(schema_app, name="schema")
