"""kvtier's Python client: the wire contract (layout ids, block keys, block
records, the latent codecs in numpy) and clients of the three services.
See clients/python/README.md and docs/protocol.md."""
from kvtier.cache import CacheClient
from kvtier.codecs import dequantize, encoded_bytes, quantize
from kvtier.decode import DecodeClient
from kvtier.errors import KvtierError
from kvtier.keys import block_hashes, chain_hash
from kvtier.layout import LatentLayout, model_id_of
from kvtier.prefill import PrefillClient
from kvtier.records import Record, encode_payloads, encode_record, parse_record
from kvtier.tokenizer import ByteTokenizer, tokenizer_for

__version__ = "0.1.0"
__all__ = ["ByteTokenizer", "CacheClient", "DecodeClient", "KvtierError", "LatentLayout", "PrefillClient", "Record",
           "block_hashes", "chain_hash", "dequantize", "encode_payloads", "encode_record", "encoded_bytes",
           "model_id_of", "parse_record", "quantize", "tokenizer_for"]
