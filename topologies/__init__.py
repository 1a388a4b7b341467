"""The hardware: GPU catalog, cluster schema and presets, the networkx graph, collective costs,
importers of real topology files.

``load_cluster`` loads on first use (module ``__getattr__``), so that importing a light submodule
(``topologies.errors``, as every command does at start-up) does not build the pydantic cluster schema."""

__all__ = ["load_cluster"]


def __getattr__(name: str):
    """``load_cluster``, imported when first asked for and bound here."""
    if name != "load_cluster":
        raise AttributeError(f"module 'topologies' has no attribute {name!r}")
    from topologies.loader import load_cluster
    globals()[name] = load_cluster
    return load_cluster
