"""The hardware: GPU catalog, cluster schema and presets, the networkx graph, collective costs,
importers of real topology files."""

from topologies.loader import load_cluster

__all__ = ["load_cluster"]
