#!/usr/bin/env python3
"""Turns the rendered manifests (render.py's JSON) into pods that podman
4.3's `kube play` runs on one host, for container_test.sh, changing only
what podman or a one-host test cannot take as written. ADAPTATIONS says
each change and why; everything else (the image, the commands and their
flags, TLS and tenants, the pod and container security contexts, the
probes, which podman 4.3 ignores) is as the manifests have it.

Usage: podman_play.py OBJECTS.json OUT_DIR IMAGE HOST_DIRS.json
HOST_DIRS.json: {"ips": {"kvtier-cache": IP, ...}, "secrets": {SECRET: DIR},
"model": DIR}. Writes OUT_DIR/NAME.yaml, one Pod each."""
import json
import pathlib
import re
import sys

import yaml

ADAPTATIONS = [
    "StatefulSets and Deployments become single Pods: podman 4.3 has no StatefulSet, and one host runs one "
    "replica of each",
    "--cache=srv:... and --decode=srv:... become the pods' fixed IP:PORT: podman has no cluster DNS and no SRV "
    "records",
    "Secret volumes become hostPath directories: podman 4.3's secret volumes read podman's own secret store "
    "(and crash without optional: false)",
    "the model's PersistentVolumeClaim becomes a hostPath directory and the disk tier's claim template an "
    "emptyDir: there is no storage provisioner",
    "container ports are dropped: kube play would publish them on the host's 0.0.0.0; the pods are reached at "
    "their own addresses",
    "resources are dropped and the cache's capacities made small: podman refuses CPU limits above the host's "
    "cores, and this host runs all three pods",
    "Services, NetworkPolicies, PodDisruptionBudgets and the Namespace are left out: podman runs none of them",
]

SMALL_CACHE = {"--device-capacity": "256MiB", "--host-capacity": "1GiB", "--disk-capacity": "1GiB"}
PORTS = {"kvtier-cache": 7070, "kvtier-decode": 7072}


def adapt_args(args, ips):
    out = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if value.startswith("srv:"):
            service = re.search(r"_grpc\._tcp\.([a-z-]+)", value).group(1)
            arg = f"{flag}={ips[service]}:{PORTS[service]}"
        elif flag in SMALL_CACHE:
            arg = f"{flag}={SMALL_CACHE[flag]}"
        out.append(arg)
    return out


def adapt(workload, image, hosts):
    name = workload["metadata"]["name"]
    spec = workload["spec"]["template"]["spec"]
    for c in spec["containers"]:
        c["image"] = image
        c["args"] = adapt_args(c.get("args", []), hosts["ips"])
        c.pop("ports", None)
        c.pop("resources", None)
    volumes = []
    for v in spec.get("volumes", []):
        if "secret" in v:
            v = {"name": v["name"], "hostPath": {"path": hosts["secrets"][v["secret"]["secretName"]],
                                                  "type": "Directory"}}
        elif "persistentVolumeClaim" in v:
            v = {"name": v["name"], "hostPath": {"path": hosts["model"], "type": "Directory"}}
        volumes.append(v)
    for claim in workload["spec"].get("volumeClaimTemplates", []):
        volumes.append({"name": claim["metadata"]["name"], "emptyDir": {}})
    spec["volumes"] = volumes
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def main():
    objects = json.loads(pathlib.Path(sys.argv[1]).read_text())
    out, image = pathlib.Path(sys.argv[2]), sys.argv[3]
    hosts = json.loads(pathlib.Path(sys.argv[4]).read_text())
    out.mkdir(parents=True, exist_ok=True)
    for o in objects:
        if o["kind"] in ("StatefulSet", "Deployment"):
            pod = adapt(o, image, hosts)
            (out / f"{pod['metadata']['name']}.yaml").write_text(yaml.safe_dump(pod, sort_keys=False))
    for a in ADAPTATIONS:
        print(f"adapted for podman: {a}")


if __name__ == "__main__":
    main()
