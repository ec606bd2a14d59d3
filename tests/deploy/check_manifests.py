#!/usr/bin/env python3
"""Checks deploy/kubernetes against the binaries it runs: every manifest the
kustomization lists exists and parses, every container runs a kvtier server
with flags that server's --help lists, and its gRPC port, probes,
--listen and --health-listen agree; when the cache puts its fast path socket in a directory,
every decode and prefill container mounts that directory.
Usage: check_manifests.py DEPLOY_DIR BIN_DIR"""
import pathlib
import subprocess
import sys

import yaml


def main(deploy_dir, bin_dir):
    k8s = pathlib.Path(deploy_dir) / "kubernetes"
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    errors, containers = [], 0
    socket_dirs, mounts = set(), []  # cache socket directories; (where, binary, mount paths)
    for resource in kustomization["resources"]:
        path = k8s / resource
        if not path.exists():
            errors.append(f"{resource}: listed in kustomization.yaml but missing")
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                containers += 1
                where = f"{resource}: container {c['name']}"
                binary = pathlib.Path(bin_dir) / c["command"][0]
                help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True).stdout
                if "--listen" not in help_text:
                    errors.append(f"{where}: {binary} --help does not list --listen")
                # --name=value, or --name alone for a boolean
                args = dict((a[2:].split("=", 1) + [""])[:2] for a in c.get("args", []))
                for flag in args:
                    if f"--{flag}\n" not in help_text:
                        errors.append(f"{where}: {c['command'][0]} has no flag --{flag}")
                grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
                if not args.get("listen", "").endswith(f":{grpc_port}"):
                    errors.append(f"{where}: --listen {args.get('listen')} is not the grpc port {grpc_port}")
                socket = args.get("fast-path-socket", "")
                if c["command"][0] == "kvtier-cache" and socket and not socket.startswith("@"):
                    socket_dirs.add(str(pathlib.PurePosixPath(socket).parent))
                mounts.append((where, c["command"][0], {m["mountPath"] for m in c.get("volumeMounts", [])}))
                # Behind TLS the probes read the plaintext --health-listen port.
                health = args.get("health-listen", "")
                probe_port = int(health.rsplit(":", 1)[1]) if health else grpc_port
                if health and probe_port not in [p["containerPort"] for p in c["ports"]]:
                    errors.append(f"{where}: --health-listen port {probe_port} is not a container port")
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe in c and c[probe]["grpc"]["port"] != probe_port:
                        errors.append(f"{where}: {probe} checks port {c[probe]['grpc']['port']}, not {probe_port}")
    for where, binary, paths in mounts:
        for d in socket_dirs:
            if binary in ("kvtier-decode", "kvtier-prefill") and d not in paths:
                errors.append(f"{where}: does not mount {d}, where the cache shards' fast path sockets are")
    if containers < 3:
        errors.append(f"only {containers} containers found; expected cache, decode and prefill")
    for e in errors:
        print("error:", e)
    print(f"{containers} containers checked, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
