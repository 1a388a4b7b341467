"""The hardware: GPU catalog, cluster schema and presets, the networkx graph, collective costs,
importers of real topology files."""

from topologies.loader import load_cluster, load_job

__all__ = ["load_cluster", "load_job"]
