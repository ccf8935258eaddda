"""Regenerate the vendored KubeRay CRD schemas from the CRDs' YAML (README.md beside this file says which):

    python tests/infra/crds/update.py ray.io_rayjobs.yaml ray.io_rayclusters.yaml

Writes <plural>.<group>.v1.json.gz here for each file: the CRD's group, kind and version and that version's
openAPIV3Schema, as it is (KubeRay generates its CRDs without descriptions). Byte for byte reproducible: sorted
keys, compact JSON, gzip without a timestamp."""

import gzip
import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
VERSION = "v1"


def vendored(crd: dict, version: str = VERSION) -> tuple[str, bytes]:
    """(file name, gzipped JSON) of one CRD's schema at `version`."""
    assert crd["kind"] == "CustomResourceDefinition", crd.get("kind")
    spec = crd["spec"]
    (ver,) = [v for v in spec["versions"] if v["name"] == version]
    doc = {
        "group": spec["group"],
        "kind": spec["names"]["kind"],
        "version": version,
        "openAPIV3Schema": ver["schema"]["openAPIV3Schema"],
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return f"{spec['names']['plural']}.{spec['group']}.{version}.json.gz", gzip.compress(text.encode(), 9, mtime=0)


def main(paths: list[str]) -> None:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the RayJob CRD is 1.3 MB: libyaml reads it at once
    for path in paths:
        name, data = vendored(yaml.load(Path(path).read_text(), Loader=loader))
        (HERE / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
