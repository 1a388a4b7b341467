"""The hardware: GPU catalog, cluster schema and presets, the networkx graph, collective costs,
importers of real topology files."""


def __getattr__(name):
    if name == "load_cluster":
        from topologies.loader import load_cluster

        return load_cluster
    raise AttributeError(name)
