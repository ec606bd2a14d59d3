#!/usr/bin/env python3
"""Checks that each folder of services/ includes only the layers below it
(docs/architecture.md), and that the layers meant to be free of gRPC are.
Prints each include that breaks a rule; exits 1 if there is one."""
import pathlib
import re
import sys

# folder -> the folders of services/ its files may include (its own too).
BELOW = {
    "base": [],
    "kvblock": ["base"],
    "rpc": ["base", "kvblock"],
    "server": ["base", "rpc"],
    "runtime": ["base"],
    "cache/store": ["base", "kvblock"],
    "cache/fast_path": ["base", "kvblock", "rpc", "cache/store", "cache/client"],
    "cache/server": ["base", "kvblock", "rpc", "server", "cache/store", "cache/fast_path"],
    "cache/client": ["base", "kvblock", "rpc", "cache/fast_path"],
    "serving": ["base", "kvblock", "rpc", "server", "runtime", "cache/client"],
    "prefill": ["base", "kvblock", "rpc", "server", "runtime", "cache/client", "serving"],
    "decode": ["base", "kvblock", "rpc", "server", "runtime", "cache/client", "serving"],
    "cli": ["base", "kvblock", "rpc", "server", "runtime", "cache/client", "serving"],
}
# Layers that must build without gRPC (protobuf messages are fine).
NO_GRPC = {"base", "kvblock", "runtime", "cache/store"}
GRPC_INCLUDE = re.compile(r'#include [<"](grpc|grpcpp)/|#include ".*\.grpc\.pb\.h"')
SERVICES_INCLUDE = re.compile(r'#include "services/([^"]+)/[^/"]+"')


def folder_of(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "cache" else parts[0]


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    services = root / "services"
    problems = []
    for file in sorted(services.rglob("*")):
        if file.suffix not in (".h", ".cc", ".cu", ".cuh"):
            continue
        folder = folder_of(str(file.relative_to(services)))
        if folder not in BELOW:
            problems.append(f"{file.relative_to(root)}: folder {folder} has no rule in scripts/check_layers.py")
            continue
        allowed = set(BELOW[folder]) | {folder}
        for number, line in enumerate(file.read_text().splitlines(), 1):
            where = f"{file.relative_to(root)}:{number}"
            match = SERVICES_INCLUDE.match(line)
            if match and folder_of(match.group(1)) not in allowed:
                problems.append(f"{where}: {folder} may not include {match.group(1)} ({line.strip()})")
            if folder in NO_GRPC and GRPC_INCLUDE.match(line):
                problems.append(f"{where}: {folder} must build without gRPC ({line.strip()})")
    for kernel in sorted((root / "kernels").rglob("*")):
        if kernel.is_file() and '#include "services/' in kernel.read_text(errors="replace"):
            problems.append(f"{kernel.relative_to(root)}: kernels/ may not include services/")
    for p in problems:
        print(p)
    print(f"check_layers: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
