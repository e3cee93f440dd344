"""Renders a kustomization with `kubectl kustomize` and validates every object it renders:
core Kubernetes objects with kubernetes-validate in strict mode, custom resources against the
vendored CRDs in k8s/schemas/ with unknown fields refused, as the API server's strict field
validation would. Prints the rendered objects as a JSON list; exits 1, naming each problem,
when any object fails.

usage: validate_manifests.py KUBECTL KUSTOMIZATION_DIR
"""
import copy
import glob
import json
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

# The Kubernetes releases the core objects are checked against: the oldest fairway supports
# (docs/kubernetes.md) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
SCHEMAS = os.path.join(os.path.dirname(__file__), "..", "k8s", "schemas")


def strict(schema):
    """The schema with unknown fields refused wherever the CRD lists an object's fields, and
    OpenAPI's int-or-string and nullable spelled as JSON Schema."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        pattern = node.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern[1:]:
            # Go's regular expressions take inline flags anywhere; Python's only first.
            node["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for key in ("properties", "patternProperties"):
            for child in node.get(key, {}).values():
                walk(child)
        for key in ("items", "additionalProperties", "not"):
            walk(node.get(key))
        for key in ("allOf", "anyOf", "oneOf"):
            for child in node.get(key, []):
                walk(child)

    walk(schema)
    return schema


def crd_schemas():
    """(apiVersion, kind) -> JSON schema, from every vendored CRD."""
    schemas = {}
    for path in sorted(glob.glob(os.path.join(SCHEMAS, "*.yaml"))):
        with open(path) as file:
            crd = yaml.safe_load(file)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            # metadata is the API server's to check; the CRD leaves it open.
            schema["properties"]["metadata"] = {"type": "object"}
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def main(kubectl, directory):
    rendered = subprocess.run(
        [kubectl, "kustomize", directory], check=True, capture_output=True, text=True
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    schemas = crd_schemas()
    problems = []
    for obj in objects:
        name = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        key = (obj.get("apiVersion"), obj.get("kind"))
        try:
            group = key[0].split("/")[0] if "/" in key[0] else ""
            if key in schemas:
                for error in jsonschema.Draft7Validator(schemas[key]).iter_errors(obj):
                    problems.append(f"{name}: {error.message} at {list(error.path)}")
            elif "." in group and not group.endswith(".k8s.io"):
                problems.append(f"{name}: no vendored CRD schema for {key}")
            else:
                for version in KUBERNETES_VERSIONS:
                    kubernetes_validate.validate(obj, version, strict=True)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as error:
            problems.append(f"{name}: {error.message} at {list(error.path)}")
        except kubernetes_validate.SchemaNotFoundError as error:
            problems.append(f"{name}: {error}")
    json.dump(objects, sys.stdout)
    for problem in problems:
        print(f"{directory}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
