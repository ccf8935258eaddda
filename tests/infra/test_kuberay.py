"""The KubeRay manifests (infra/kuberay-*.yaml) against KubeRay's own RayJob/RayCluster CRD schemas, offline and as
strictly as `kubeconform -strict`: an unknown field or a key given twice is an error. The API server would prune an
unknown field without a word, so a misspelled one (`rayClusterSpecc`, `imagePullPolicyy`) would simply vanish.
The schemas are vendored under tests/infra/crds/ (README.md there: the KubeRay tag, commit and update command).

Not checked: the CRDs' CEL rules (x-kubernetes-validations; none is on a field the manifest sets), list-map key
uniqueness, and `format` (int32, date-time: Kubernetes' own formats)."""

import copy
import functools
import gzip
import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft4Validator

ROOT = Path(__file__).resolve().parents[2]
CRDS = Path(__file__).resolve().parent / "crds"
MANIFESTS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "infra").glob("kuberay-*.yaml"))
# KubeRay's operator refuses longer names (utils/validation.go: its services append to the cluster's name)
MAX_NAME = {"RayCluster": 53, "RayJob": 47}
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


class StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping, as kubeconform -strict does (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_all(text: str) -> list[dict]:
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]


def strict(schema: dict) -> dict:
    """A CRD's structural schema as plain JSON Schema, with Kubernetes' OpenAPI extensions given their meaning and
    unknown fields refused on every object that lists its fields."""
    s = dict(schema)
    if "properties" in s:
        s["properties"] = {name: strict(sub) for name, sub in s["properties"].items()}
        if not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            s[key] = strict(s[key])
    for key in SUBSCHEMA_LISTS:
        if key in s:
            s[key] = [strict(sub) for sub in s[key]]
    if s.get("x-kubernetes-int-or-string"):  # it may come without the anyOf that spells it out
        s["type"] = ["integer", "string"]
    if s.get("nullable") and "type" in s:  # OpenAPI 3.0's null; JSON Schema has a type for it
        s["type"] = [s["type"], "null"] if isinstance(s["type"], str) else [*s["type"], "null"]
    return s


@functools.cache
def crds() -> dict[str, dict]:
    """The vendored CRDs by kind: group, version and the strict schema."""
    out = {}
    for path in sorted(CRDS.glob("*.json.gz")):
        crd = json.loads(gzip.decompress(path.read_bytes()))
        out[crd["kind"]] = {**crd, "schema": strict(crd["openAPIV3Schema"])}
    return out


def _path(parts) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def problems(doc: dict) -> list[str]:
    """What the API server and KubeRay would refuse in one RayJob/RayCluster document, each naming its path."""
    crd = crds().get(doc.get("kind"))
    if crd is None:
        return [f"$.kind: {doc.get('kind')!r} is none of {sorted(crds())}"]
    out = []
    if doc.get("apiVersion") != f"{crd['group']}/{crd['version']}":
        out.append(f"$.apiVersion: {doc.get('apiVersion')!r} is not {crd['group']}/{crd['version']}")
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        out.append(f"$.metadata.name: {name!r} is not a DNS-1035 label (lower case, digits, '-')")
    elif len(name) > MAX_NAME[crd["kind"]]:
        out.append(f"$.metadata.name: {name!r} is longer than {MAX_NAME[crd['kind']]} characters")
    for e in Draft4Validator(crd["schema"]).iter_errors(doc):
        if e.validator == "additionalProperties" and e.validator_value is False:
            # one line per unknown field, its own path (jsonschema names the object that holds them)
            known = e.schema.get("properties", {})
            out += [f"{_path([*e.absolute_path, f])}: unknown field" for f in e.instance if f not in known]
        else:
            out.append(f"{_path(e.absolute_path)}: {e.message}")
    return sorted(out)


def kuberay_documents(text: str) -> list[dict]:
    """The documents KubeRay's CRDs cover: every ray.io one (a misspelled kind must not slip past as 'other')."""
    return [d for d in load_all(text) if str(d.get("apiVersion", "")).startswith("ray.io/")]


@pytest.fixture(scope="module")
def rayjob() -> dict:
    (job,) = kuberay_documents((ROOT / "infra" / "kuberay-rayjob.yaml").read_text())
    return job


def test_both_crds_are_vendored():
    assert {k: (c["group"], c["version"]) for k, c in crds().items()} == {
        "RayCluster": ("ray.io", "v1"),
        "RayJob": ("ray.io", "v1"),
    }


@pytest.mark.parametrize("rel", MANIFESTS)
def test_the_kuberay_manifests_pass_the_crds_strictly(rel):
    docs = kuberay_documents((ROOT / rel).read_text())
    assert docs, f"{rel} holds no ray.io document"
    for doc in docs:
        assert problems(doc) == [], (rel, doc["kind"])


def test_the_rayjobs_cluster_is_also_a_valid_raycluster(rayjob):
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "augssl"}}
    assert problems({**cluster, "spec": rayjob["spec"]["rayClusterSpec"]}) == []


def _broken(job: dict, how: str) -> dict:
    """A copy of the RayJob with one mistake in it."""
    job = copy.deepcopy(job)
    spec, cluster = job["spec"], job["spec"]["rayClusterSpec"]
    if how == "misspelled field":
        spec["rayClusterSpecc"] = spec.pop("rayClusterSpec")
    elif how == "string replicas":
        cluster["workerGroupSpecs"][0]["replicas"] = "two"
    elif how == "unknown container field":
        cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    elif how == "auth mode":
        cluster["authOptions"]["mode"] = "tokens"
    elif how == "quantity":
        cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "16 cores"
    elif how == "int-or-string":
        cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = [8]
    elif how == "apiVersion":
        job["apiVersion"] = "ray.io/v1alpha2"
    elif how == "name":
        job["metadata"] = {"name": "augssl_pretrain"}
    return job


HEAD = "$.spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]"
WORKER = "$.spec.rayClusterSpec.workerGroupSpecs[0]"


@pytest.mark.parametrize(
    "how, expected",
    [
        ("misspelled field", "$.spec.rayClusterSpecc: unknown field"),
        ("string replicas", f"{WORKER}.replicas: 'two' is not of type 'integer'"),
        ("unknown container field", f"{HEAD}.imagePullPolicyy: unknown field"),
        ("auth mode", "$.spec.rayClusterSpec.authOptions.mode: 'tokens' is not one of ['disabled', 'token']"),
        ("quantity", f"{WORKER}.template.spec.containers[0].resources.limits.cpu: '16 cores' does not match"),
        ("int-or-string", f"{HEAD}.resources.limits.cpu: [8] is not of type 'integer', 'string'"),
        ("apiVersion", "$.apiVersion: 'ray.io/v1alpha2' is not ray.io/v1"),
        ("name", "$.metadata.name: 'augssl_pretrain' is not a DNS-1035 label"),
    ],
)
def test_a_broken_manifest_is_refused_naming_the_path(rayjob, how, expected):
    found = problems(_broken(rayjob, how))
    assert any(p.startswith(expected) for p in found), found


def test_a_key_given_twice_is_refused():
    text = (ROOT / "infra" / "kuberay-rayjob.yaml").read_text()
    line = "  submissionMode: K8sJobMode\n"
    assert line in text
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'submissionMode'"):
        kuberay_documents(text.replace(line, line + "  submissionMode: HTTPMode\n"))


def test_kubernetes_extensions_mean_what_the_api_server_reads():
    schema = strict(
        {
            "type": "object",
            "properties": {
                "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "bare": {"x-kubernetes-int-or-string": True},  # the extension alone: still int or string
                "when": {"type": "string", "format": "date-time", "nullable": True},
                "count": {"type": "integer", "format": "int32"},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {}}},
            },
        }
    )

    def ok(doc):
        return not list(Draft4Validator(schema).iter_errors(doc))

    assert ok({"port": 8265, "bare": "http", "when": None, "count": 3, "free": {"a": 1, "anything": 2}})
    assert ok({"port": "dashboard", "bare": 8, "when": "2025-11-21T00:00:00Z"})
    assert not ok({"port": 1.5}) and not ok({"bare": [1]}) and not ok({"count": None}) and not ok({"other": 1})
