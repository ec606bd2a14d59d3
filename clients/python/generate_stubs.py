#!/usr/bin/env python3
"""Builds the importable package: kvtier/*.py copied to OUT/kvtier, and the
gRPC stubs generated from proto/ into OUT/kvtier/v1 with protoc's Python
output and Debian's grpc_python_plugin. Stubs are never checked in.
Usage: generate_stubs.py OUT [PROTO_DIR]   (PROTO_DIR: ../../proto)"""
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def build(out, proto_dir=HERE.parent.parent / "proto"):
    out, proto_dir = pathlib.Path(out), pathlib.Path(proto_dir).resolve()
    package = out / "kvtier"
    package.mkdir(parents=True, exist_ok=True)
    for source in (HERE / "kvtier").glob("*.py"):
        shutil.copyfile(source, package / source.name)
    protos = sorted(str(p.relative_to(proto_dir)) for p in proto_dir.glob("kvtier/v1/*.proto"))
    if not protos:
        sys.exit(f"generate_stubs: no kvtier/v1/*.proto under {proto_dir}")
    plugin = shutil.which("grpc_python_plugin") or "/usr/bin/grpc_python_plugin"
    subprocess.run(["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_out={out}",
                    f"--plugin=protoc-gen-grpc={plugin}", *protos], check=True)
    (package / "v1" / "__init__.py").touch()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    build(*sys.argv[1:])
