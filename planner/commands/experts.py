"""CLI commands: experts (placeholder registration; the owning module fills it in)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
