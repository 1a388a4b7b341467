"""Importers of topology descriptions clusters already have, each to a ``Cluster``:
Slurm topology.conf and topology.yaml, NCCL topology XML, Kubernetes node labels."""

from topologies.importers.k8s import import_k8s
from topologies.importers.nccl_xml import import_nccl_xml
from topologies.importers.slurm import import_slurm_conf, import_slurm_yaml

FORMATS = ("slurm", "slurm-yaml", "nccl-xml", "k8s")

__all__ = ["FORMATS", "import_slurm_conf", "import_slurm_yaml", "import_nccl_xml", "import_k8s"]
