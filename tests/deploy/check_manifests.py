#!/usr/bin/env python3
"""Checks rendered manifests against the binaries they run: every container
runs a kvtier server with flags that server's --help lists, and its gRPC
port, probes, --listen and --health-listen agree; when the cache puts its
fast path socket in a directory, every decode and prefill container mounts
that directory.
Usage: check_manifests.py KUSTOMIZATION_DIR BIN_DIR [COMPONENT_DIR...]"""
import pathlib
import subprocess
import sys

from render import pod_spec, render


def errors_against_binaries(objects, bin_dir):
    errors, containers = [], 0
    socket_dirs, mounts = set(), []  # cache socket directories; (where, binary, mount paths)
    helps = {}
    for doc in objects:
        for c in (pod_spec(doc) or {}).get("containers", []):
            containers += 1
            where = f"{doc['kind']} {doc['metadata']['name']}: container {c['name']}"
            program = c["command"][0]
            if program not in helps:
                binary = pathlib.Path(bin_dir) / program
                helps[program] = subprocess.run([str(binary), "--help"], capture_output=True, text=True).stdout
            help_text = helps[program]
            if "--listen" not in help_text:
                errors.append(f"{where}: {program} --help does not list --listen")
            # --name=value, or --name alone for a boolean
            args = dict((a[2:].split("=", 1) + [""])[:2] for a in c.get("args", []))
            for flag in args:
                if f"--{flag}\n" not in help_text:
                    errors.append(f"{where}: {program} has no flag --{flag}")
            grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
            if not args.get("listen", "").endswith(f":{grpc_port}"):
                errors.append(f"{where}: --listen {args.get('listen')} is not the grpc port {grpc_port}")
            socket = args.get("fast-path-socket", "")
            if program == "kvtier-cache" and socket and not socket.startswith("@"):
                socket_dirs.add(str(pathlib.PurePosixPath(socket).parent))
            mounts.append((where, program, {m["mountPath"] for m in c.get("volumeMounts", [])}))
            # The probes read the plaintext --health-listen port, if any.
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
    return errors


if __name__ == "__main__":
    found = errors_against_binaries(render(sys.argv[1], sys.argv[3:]), sys.argv[2])
    for e in found:
        print("error:", e)
    sys.exit(1 if found else 0)
