"""Strict validation of Kubernetes manifests without a cluster.

Custom resources: against the official CRDs pinned in tests/data/k8s (README there: repository, tag,
commit, path), their ``openAPIV3Schema`` made strict as the API server's field validation
(``kubectl --validate=strict``) is: an object schema that does not set
``x-kubernetes-preserve-unknown-fields`` or ``additionalProperties`` gets ``additionalProperties: false``
(an object with no ``properties`` then admits no field: the server would prune them all). The root's
``metadata`` is the server's ObjectMeta, checked like core objects.

Core objects (ConfigMap, object metadata, the pod templates the custom resources embed): the
``kubernetes-validate`` package's strict JSON schemas of the Kubernetes OpenAPI definitions.

Kueue's Configuration (a file Kueue reads, not an API object, so no CRD): every key must be a json tag
of its Go struct in apis/config/v1beta2/configuration_types.go (pinned beside the CRDs), recursively,
as Kueue's strict decoding of its config file requires.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

CRD_DIR = Path(__file__).parent / "data" / "k8s"
K8S_VERSION = "1.34"   # DRA (resource.k8s.io/v1, pod resourceClaimTemplateName) is GA from 1.34


def strict(schema):
    """A copy of a CRD schema with ``additionalProperties: false`` on every closed object."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (out.get("type") == "object" and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict schema of every served version of every pinned CRD."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            if not v.get("served"):
                continue
            schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            out[(f"{group}/{v['name']}", kind)] = strict(schema)
    return out


KUEUE_CONFIG = ("config.kueue.x-k8s.io/v1beta2", "Configuration")
GO_TYPES = CRD_DIR / "kueue_config_v1beta2_configuration_types.go"
GO_FIELD = re.compile(r"^\s*(?:(\w+)\s+)?([\[\]*.\w]+)\s+`json:\"([^\",]*)", re.M)


@functools.cache
def go_structs() -> dict[str, dict[str, str]]:
    """struct name -> {json key: Go type name} of the pinned Kueue configuration types (inline members
    merged in by their own structs' keys, under the key "")."""
    text = GO_TYPES.read_text()
    out = {}
    for name, body in re.findall(r"^type (\w+) struct \{\n(.*?)^\}", text, flags=re.M | re.S):
        fields = {}
        for field, typ, key in GO_FIELD.findall(body):
            if key == "":                     # an inline (embedded) struct
                fields.setdefault("", []).append(typ)
            else:
                fields[key] = typ.lstrip("[]*")
        out[name] = fields
    return out


def _go_keys(struct: str) -> dict[str, str]:
    fields = dict(go_structs().get(struct, {}))
    for inline in fields.pop("", []):
        base = inline.split(".")[-1]
        fields.update({"apiVersion": "string", "kind": "string"} if base == "TypeMeta" else _go_keys(base))
    return fields


def go_problems(value, struct: str, path: str = "") -> list[str]:
    """Keys of ``value`` that are not json tags of Go struct ``struct`` (recursively)."""
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in go_problems(v, struct, f"{path}[{i}]")]
    if not isinstance(value, dict) or struct not in go_structs():
        return []
    keys = _go_keys(struct)
    out = []
    for k, v in value.items():
        if k not in keys:
            out.append(f"{path}.{k}: not a field of {struct}")
        else:
            out += go_problems(v, keys[k], f"{path}.{k}")
    return out


def _core(obj: dict) -> list[str]:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{obj.get('apiVersion')} {obj.get('kind')}: neither a pinned CRD nor a core kind ({exc.message})"]
    return []


def pod_templates(obj, path="") -> list[tuple[str, dict]]:
    """Every embedded pod template (a dict with ``spec.containers``) and where it sits."""
    found = []
    if isinstance(obj, dict):
        spec = obj.get("spec")
        if isinstance(spec, dict) and "containers" in spec and path:
            found.append((path, obj))
        for k, v in obj.items():
            found += pod_templates(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += pod_templates(v, f"{path}[{i}]")
    return found


def problems(obj: dict) -> list[str]:
    """Every schema violation of one manifest (empty list: valid)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key == KUEUE_CONFIG:
        return go_problems(obj, "Configuration")
    schema = crd_schemas().get(key)
    if schema is None:                     # a core object: the Kubernetes schema, strictly
        return _core(obj)
    out = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
           for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    # the root metadata is an ObjectMeta; the embedded pod templates are core PodTemplateSpecs
    out += [f"metadata: {p}" for p in _core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata")})]
    for where, tpl in pod_templates(obj.get("spec", {}), "spec"):
        out += [f"{where}: {p}" for p in _core({"apiVersion": "v1", "kind": "PodTemplate",
                                                 "metadata": {"name": "check"}, "template": tpl})]
    return out


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
