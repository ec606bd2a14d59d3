"""How latent blocks are laid out, and the layout id that fingerprints it.

The id is the first 8 bytes (little-endian) of SHA-256 over
"kvtier.layout.v1" || u32 len(model_id) || model_id || u32 num_layers ||
u32 kv_lora_rank || u32 rope_dim || u32 tokens_per_block || u32 codec ||
u32 block_format_version (docs/protocol.md, "Layout id").
"""
import dataclasses
import hashlib
import json
import pathlib
import struct

from kvtier.v1 import layout_pb2

BLOCK_FORMAT_VERSION = 1

# Codec numbers: the codec byte of a record and kvtier.v1.KvCodec.
BF16, FP8, INT8, INT4 = 1, 2, 3, 4
CODECS = {"bf16": BF16, "fp8": FP8, "int8": INT8, "int4": INT4}
CODEC_NAMES = {number: name for name, number in CODECS.items()}


def codec_number(codec):
    """A codec given as its name ("int8") or number (3), as its number."""
    if isinstance(codec, str):
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}; one of {sorted(CODECS)}")
        return CODECS[codec]
    if codec not in CODEC_NAMES:
        raise ValueError(f"unknown codec number {codec}")
    return int(codec)


@dataclasses.dataclass(frozen=True)
class LatentLayout:
    """Everything that changes the bytes of a block (kvtier.v1.LatentLayout)."""
    model_id: str
    num_layers: int
    kv_lora_rank: int = 512
    rope_dim: int = 64
    tokens_per_block: int = 64
    codec: int = INT8
    block_format_version: int = BLOCK_FORMAT_VERSION

    def __post_init__(self):
        object.__setattr__(self, "codec", codec_number(self.codec))
        if not 1 <= len(self.model_id.encode()) <= 256:
            raise ValueError("model_id must be 1..256 bytes")
        for name in ("num_layers", "kv_lora_rank", "tokens_per_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")

    @property
    def dim(self):
        return self.kv_lora_rank + self.rope_dim

    @property
    def layout_id(self):
        model = self.model_id.encode()
        canonical = b"kvtier.layout.v1" + struct.pack("<I", len(model)) + model + struct.pack(
            "<IIIIII", self.num_layers, self.kv_lora_rank, self.rope_dim, self.tokens_per_block, self.codec,
            self.block_format_version)
        return struct.unpack("<Q", hashlib.sha256(canonical).digest()[:8])[0]

    def to_proto(self):
        return layout_pb2.LatentLayout(model_id=self.model_id, num_layers=self.num_layers,
                                       kv_lora_rank=self.kv_lora_rank, rope_dim=self.rope_dim,
                                       tokens_per_block=self.tokens_per_block, codec=self.codec,
                                       block_format_version=self.block_format_version, layout_id=self.layout_id)

    @classmethod
    def from_proto(cls, p):
        return cls(model_id=p.model_id, num_layers=p.num_layers, kv_lora_rank=p.kv_lora_rank, rope_dim=p.rope_dim,
                   tokens_per_block=p.tokens_per_block, codec=p.codec, block_format_version=p.block_format_version)


def model_id_of(checkpoint_dir):
    """The model_id kvtier's servers derive from a checkpoint directory:
    config.json's model_type ("deepseek_v2", "deepseek_v3", "kimi_k2"), "-",
    and 16 hex digits of SHA-256 over, for config.json and then each
    *.safetensors file by name: "NAME:SIZE:", its first MiB, and its last
    MiB (what follows the first, for files under 2 MiB)."""
    d = pathlib.Path(checkpoint_dir)
    model_type = json.loads((d / "config.json").read_text())["model_type"]
    files = [d / "config.json"] + sorted(d.glob("*.safetensors"), key=lambda p: p.name.encode())
    edge = 1 << 20
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f:
            digest.update(f"{path.name}:{size}:".encode())
            digest.update(f.read(edge))
            if size > edge:
                tail = min(size - edge, edge)
                f.seek(size - tail)
                digest.update(f.read(tail))
    return model_type + "-" + digest.hexdigest()[:16]
