"""The hardware: GPU catalog, cluster schema and presets, the networkx graph, collective costs,
importers of real topology files.

``load_cluster`` and ``load_job`` load on first use (module ``__getattr__``), so that importing a light submodule
(``topologies.errors``, as every command does at start-up) does not build the pydantic cluster schema."""

__all__ = ["load_cluster", "load_job"]


def __getattr__(name: str):
    """``load_cluster`` and ``load_job``, imported when first asked for and bound here."""
    if name not in __all__:
        raise AttributeError(f"module 'topologies' has no attribute {name!r}")
    from topologies import loader
    value = getattr(loader, name)
    globals()[name] = value
    return value
