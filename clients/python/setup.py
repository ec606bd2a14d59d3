"""pip install clients/python (no network needed: Debian's setuptools,
protoc and grpc_python_plugin). The stubs are generated as it builds, and
kvtier._native compiled where g++ and Python's headers are (python3-dev);
without it the package checks records with python3-crc32c and quantizes
with numpy instead (the same bytes, slower)."""
import os
import pathlib
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import generate_stubs  # noqa: E402

HERE = generate_stubs.HERE
# The checkout whose proto/ and C++ (the CRC32C and the codecs) the package
# is built from; KVTIER_SOURCE_DIR where the folder was copied out of it.
REPO = pathlib.Path(os.environ.get("KVTIER_SOURCE_DIR", HERE.parent.parent))
# kvtier._native's sources, as CMake builds it: absolute paths keep their
# objects in the build folder.
NATIVE_SOURCES = [str(REPO / line) for line in (HERE / "native" / "sources.txt").read_text().splitlines()
                  if line and not line.startswith("#")]


class BuildWithStubs(build_py):
    def run(self):
        generate_stubs.build(self.build_lib, REPO / "proto")


setup(
    name="kvtier",
    version="0.1.0",
    description="Python client of kvtier, the KV-cache tier for MLA models",
    packages=["kvtier"],  # kvtier.v1 is generated into the build by build_py
    python_requires=">=3.9",
    install_requires=["grpcio", "protobuf", "numpy"],
    ext_modules=[Extension("kvtier._native", language="c++", optional=True,
                           sources=NATIVE_SOURCES,
                           include_dirs=[str(HERE), str(REPO), str(REPO / "kernels" / "include")],
                           extra_compile_args=["-std=c++20", "-O3", "-ffp-contract=off"])],
    cmdclass={"build_py": BuildWithStubs},
)
