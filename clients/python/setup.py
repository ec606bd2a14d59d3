"""pip install clients/python (no network needed: Debian's setuptools,
protoc and grpc_python_plugin). The stubs are generated as it builds."""
import os
import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import generate_stubs  # noqa: E402


class BuildWithStubs(build_py):
    def run(self):
        generate_stubs.build(self.build_lib, os.environ.get("KVTIER_PROTO_DIR", generate_stubs.HERE.parent.parent /
                                                           "proto"))


setup(
    name="kvtier",
    version="0.1.0",
    description="Python client of kvtier, the KV-cache tier for MLA models",
    packages=["kvtier"],  # kvtier.v1 is generated into the build by build_py
    python_requires=">=3.9",
    install_requires=["grpcio", "protobuf", "numpy", "crc32c"],
    cmdclass={"build_py": BuildWithStubs},
)
