#!/usr/bin/env python3
"""Renders a kustomization offline, for the manifest tests (kubectl and
kustomize are not Debian packages). It handles what deploy/kubernetes uses,
and refuses anything else rather than render it wrong: resources (files, or
directories with a kustomization), components, JSON 6902 patches with a
kind/name target, namespace, labels (metadata only) and images.

Usage: render.py KUSTOMIZATION_DIR [COMPONENT_DIR...] > objects.json
(extra components are added as an overlay would list them); prints a JSON
list of the objects."""
import json
import pathlib
import sys

import jsonpatch
import yaml

# Kinds that live in no namespace (of those kvtier uses).
CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
KNOWN_KEYS = {"apiVersion", "kind", "resources", "components", "patches", "namespace", "labels", "images"}


def load_kustomization(directory):
    d = pathlib.Path(directory)
    k = yaml.safe_load((d / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"{d}/kustomization.yaml: render.py does not handle {sorted(unknown)}")
    return d, k


def render(directory, extra_components=()):
    d, k = load_kustomization(directory)
    objects = []
    for resource in k.get("resources", []):
        path = d / resource
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for component in list(k.get("components", [])) + list(extra_components):
        cd, ck = load_kustomization(d / component)
        if ck.get("kind") != "Component":
            raise ValueError(f"{cd}: not a kustomize Component")
        for resource in ck.get("resources", []):
            objects += [doc for doc in yaml.safe_load_all((cd / resource).read_text()) if doc]
        apply_patches(objects, ck.get("patches", []), cd)
    apply_patches(objects, k.get("patches", []), d)
    if "namespace" in k:
        for o in objects:
            if o["kind"] not in CLUSTER_KINDS:
                o["metadata"]["namespace"] = k["namespace"]
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise ValueError("render.py adds labels to metadata only")
        for o in objects:
            o["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in k.get("images", []):
        for o in objects:
            for c in containers(o):
                if c.get("image", "").split(":")[0] == image["name"]:
                    c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return objects


def apply_patches(objects, patches, where):
    for p in patches:
        target = p.get("target", {})
        if set(target) - {"kind", "name"} or "patch" not in p:
            raise ValueError(f"{where}: render.py takes JSON 6902 patches with a kind/name target only")
        ops = yaml.safe_load(p["patch"])
        hits = [i for i, o in enumerate(objects)
                if o["kind"] == target.get("kind", o["kind"])
                and o["metadata"]["name"] == target.get("name", o["metadata"]["name"])]
        if not hits:
            raise ValueError(f"{where}: patch target {target} matches nothing")
        for i in hits:
            objects[i] = jsonpatch.apply_patch(objects[i], ops)


def pod_spec(o):
    """The pod template's spec of a workload, or None."""
    return o.get("spec", {}).get("template", {}).get("spec")


def containers(o):
    spec = pod_spec(o) or {}
    return spec.get("containers", []) + spec.get("initContainers", [])


if __name__ == "__main__":
    json.dump(render(sys.argv[1], sys.argv[2:]), sys.stdout, indent=1)
