"""Importers of topology descriptions clusters already have, each to a ``Cluster``:
Slurm topology.conf and topology.yaml, NCCL topology XML, Kubernetes node labels. Each returns ``Imported(cluster, assumed)``: ``assumed`` lists, one sentence
each, what the import took for granted because the file does not say it."""

from topologies.importers.common import Imported
from topologies.importers.k8s import import_k8s
from topologies.importers.nccl_xml import import_nccl_xml
from topologies.importers.slurm import import_slurm_conf, import_slurm_yaml

FORMATS = ("slurm", "slurm-yaml", "nccl-xml", "k8s")

__all__ = ["FORMATS", "Imported", "import_slurm_conf", "import_slurm_yaml", "import_nccl_xml", "import_k8s"]
