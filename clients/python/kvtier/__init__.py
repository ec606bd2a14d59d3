"""kvtier's Python client: the wire contract (layout ids, block keys, block
records, the latent codecs) and clients of the three services.
See clients/python/README.md and docs/protocol.md."""
import importlib
import importlib.util
import sys


def _require_packages():
    """Says which packages are missing, and how to get them, before any
    module fails on one."""
    needed = {"numpy": "python3-numpy", "grpc": "python3-grpcio", "google.protobuf": "python3-protobuf"}
    if importlib.util.find_spec("kvtier._native") is None:  # built without it: the package's CRC32C instead
        needed["crc32c"] = "python3-crc32c"
    missing = []
    for module, package in needed.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append((module, package))
    if missing:
        raise ImportError(
            f"kvtier needs {', '.join(m for m, _ in missing)}, which {sys.executable} cannot import. On Debian: "
            f"apt-get install {' '.join(p for _, p in missing)}, then run Debian's /usr/bin/python3 (a python3 "
            "from pyenv or a virtualenv first on PATH does not see Debian's packages)")


_require_packages()

# After the check: these import those packages.
from kvtier.cache import CacheClient
from kvtier.codecs import dequantize, encoded_bytes, quantize
from kvtier.decode import DecodeClient
from kvtier.errors import KvtierError
from kvtier.heap import keep_freed_heap
from kvtier.keys import block_hashes, chain_hash, restore_point_key
from kvtier.layout import LatentLayout, model_id_of
from kvtier.prefill import PrefillClient
from kvtier.records import Record, V4Part, encode_payloads, encode_record, encode_v4_record, parse_record
from kvtier.tokenizer import ByteTokenizer, tokenizer_for

__version__ = "0.1.0"
__all__ = ["ByteTokenizer", "CacheClient", "DecodeClient", "KvtierError", "LatentLayout", "PrefillClient", "Record",
           "V4Part", "block_hashes", "chain_hash", "dequantize", "encode_payloads", "encode_record",
           "encode_v4_record", "encoded_bytes", "keep_freed_heap", "model_id_of", "parse_record", "quantize",
           "restore_point_key", "tokenizer_for"]
