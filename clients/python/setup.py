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
# kvtier._native: as clients/python/CMakeLists.txt builds it. Absolute
# paths for the checkout's files keep their objects in the build folder.
NATIVE_SOURCES = ["native/module.cc", "native/crc32c.cc", "native/codecs.cc"]
SERVICE_SOURCES = ["services/kvblock/crc32c.cc", "kernels/cpu/codec.cc", "kernels/cpu/codec_bf16.cc",
                   "kernels/cpu/codec_fp8.cc", "kernels/cpu/codec_int8.cc", "kernels/cpu/codec_int4.cc"]


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
                           sources=[*NATIVE_SOURCES, *(str(REPO / s) for s in SERVICE_SOURCES)],
                           include_dirs=[str(HERE), str(REPO), str(REPO / "kernels" / "include")],
                           extra_compile_args=["-std=c++20", "-O3", "-ffp-contract=off"])],
    cmdclass={"build_py": BuildWithStubs},
)
