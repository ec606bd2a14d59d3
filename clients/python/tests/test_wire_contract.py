"""The wire contract in Python equals the C++ code's, both ways, on fresh
random inputs: layout ids, hash chains, records of every codec (latents with
outlier channels) in both formats (2: with indexer keys), and the fixed
vectors docs/protocol.md lists."""
import base64
import json
import random
import subprocess

import grpc
import numpy as np
import pytest

from conftest import binary
from kvtier import KvtierError, LatentLayout, block_hashes, encode_record, parse_record
from kvtier.layout import CODECS, INDEXER_FP8


def fresh_seed():
    seed = random.SystemRandom().randrange(1 << 48)
    print(f"seed {seed}")
    return seed


def test_documented_vectors():
    # docs/protocol.md, "Test vectors"; tests/kvblock/layout_test.cc checks the same.
    lite = LatentLayout("deepseek-ai/DeepSeek-V2-Lite", 27, 512, 64, 64, "int8")
    assert f"{lite.layout_id:016x}" == "f7031e4b3c2f58fe"
    tiny = LatentLayout("m", 1, 4, 2, 2, "bf16")
    assert block_hashes("default", tiny, [1, 2, 3, 4, 5])[1].hex() == "6ed84cc4bce8f5454dd594e32bdfe6d93b5ea70ffb88d71fd39904b9713f018d"
    v32 = LatentLayout("deepseek-ai/DeepSeek-V3.2", 61, 512, 64, 64, "fp8", indexer_dim=128,
                       indexer_encoding=INDEXER_FP8)
    assert v32.block_format_version == 2 and v32.indexer_part_bytes == 64 * 132
    assert f"{v32.layout_id:016x}" == V32_LAYOUT_ID


# docs/protocol.md, "Test vectors"; tests/kvblock/layout_test.cc checks the same.
V32_LAYOUT_ID = "a0310fb54efa66ff"


def indexer_parts(case, layout):
    """A case's indexer keys, one bytes a layer (none for format 1)."""
    keys = base64.b64decode(case.get("indexer_parts", ""))
    per = layout.indexer_part_bytes
    return [keys[i * per:(i + 1) * per] for i in range(layout.num_layers)] if per else None


def test_cxx_vectors_hold_in_python(tmp_path):
    out = tmp_path / "cxx.json"
    subprocess.run([binary("KVTIER_WIRE_VECTORS"), "make", str(fresh_seed()), str(out)], check=True)
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 16  # 4 shapes (one with indexer keys) x 4 codecs
    for case in cases:
        layout = LatentLayout(**case["layout"])
        assert f"{layout.layout_id:016x}" == case["layout_id"], case["layout"]
        assert [h.hex() for h in block_hashes(case["namespace"], layout, case["token_ids"])] == case["block_hashes"]
        latents = np.frombuffer(base64.b64decode(case["latents"]), dtype="<f4").reshape(
            layout.num_layers, layout.tokens_per_block, layout.dim)
        record = base64.b64decode(case["record"])
        keys = indexer_parts(case, layout)
        assert encode_record(layout, 0, latents, keys) == record, case["layout"]
        parsed = parse_record(record, layout)
        assert parsed.layer_count == layout.num_layers
        assert [bytes(p) for p in parsed.indexer_parts] == (keys or [])


def random_indexer_parts(rng, layout):
    """Indexer keys as the model makes them: any code but NaN's, power-of-two scales."""
    if not layout.indexer_dim:
        return None
    tokens = layout.tokens_per_block
    parts = []
    for _ in range(layout.num_layers):
        codes = rng.integers(0, 0x7f, size=tokens * layout.indexer_dim, dtype=np.uint8) | \
            (rng.integers(0, 2, size=tokens * layout.indexer_dim, dtype=np.uint8) << 7)
        scales = np.ldexp(np.float32(1), rng.integers(-20, 4, size=tokens)).astype("<f4")
        parts.append(codes.tobytes() + scales.tobytes())
    return parts


def random_case(rng, codec, indexed=False):
    latent = int(rng.integers(1, 700))
    rope = int(rng.integers(0, 80))
    indexer = {"indexer_dim": int(rng.integers(1, 200)), "indexer_encoding": INDEXER_FP8} if indexed else {}
    layout = LatentLayout(f"python-{rng.integers(1 << 30)}", int(rng.integers(1, 4)), latent, rope,
                          int(rng.integers(1, 40)), codec, **indexer)
    x = rng.standard_normal((layout.num_layers, layout.tokens_per_block, layout.dim)).astype(np.float32)
    for layer in x:  # outlier channels and a spiking token
        layer[:, rng.integers(0, layout.dim, size=3)] *= 40
        layer[rng.integers(0, layout.tokens_per_block)] *= 8
    tokens = [int(t) for t in rng.integers(0, 102400, size=3 * layout.tokens_per_block + 2)]
    ns = f"ns-{rng.integers(1000)}"
    keys = random_indexer_parts(rng, layout)
    case = {"layout": {"model_id": layout.model_id, "num_layers": layout.num_layers,
                       "kv_lora_rank": layout.kv_lora_rank, "rope_dim": layout.rope_dim,
                       "tokens_per_block": layout.tokens_per_block, "codec": layout.codec,
                       "block_format_version": layout.block_format_version, "indexer_dim": layout.indexer_dim,
                       "indexer_encoding": layout.indexer_encoding},
            "layout_id": f"{layout.layout_id:016x}", "namespace": ns, "token_ids": tokens,
            "block_hashes": [h.hex() for h in block_hashes(ns, layout, tokens)],
            "latents": base64.b64encode(x.astype("<f4").tobytes()).decode(),
            "record": base64.b64encode(encode_record(layout, 0, x, keys)).decode()}
    if keys:
        case["indexer_parts"] = base64.b64encode(b"".join(keys)).decode()
    return case


def test_python_vectors_hold_in_cxx(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    cases = [random_case(rng, codec, indexed) for codec in CODECS for indexed in (False, True) for _ in range(2)]
    path = tmp_path / "python.json"
    path.write_text(json.dumps({"cases": cases}))
    checked = subprocess.run([binary("KVTIER_WIRE_VECTORS"), "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == f"{len(cases)} cases agree"


def test_checker_catches_a_wrong_byte(tmp_path):
    """The C++ checker is not a rubber stamp: one flipped record byte fails it."""
    case = random_case(np.random.default_rng(7), "int4")
    record = bytearray(base64.b64decode(case["record"]))
    record[40] ^= 1
    case["record"] = base64.b64encode(bytes(record)).decode()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"cases": [case]}))
    checked = subprocess.run([binary("KVTIER_WIRE_VECTORS"), "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 1 and "record differs from byte 40" in checked.stderr, checked.stderr


def test_indexer_keys_are_checked_like_latents():
    """Format 2 in Python: the keys round-trip, a flipped key byte is DATA_LOSS,
    and a record of the other format is FAILED_PRECONDITION for the layout."""
    rng = np.random.default_rng(fresh_seed())
    case = random_case(rng, "int8", indexed=True)
    layout = LatentLayout(**case["layout"])
    record = bytearray(base64.b64decode(case["record"]))
    parsed = parse_record(bytes(record), layout)
    codes, scales = parsed.indexer_keys()
    keys = base64.b64decode(case["indexer_parts"])
    per = layout.indexer_part_bytes
    first = np.frombuffer(keys[:per], np.uint8, layout.tokens_per_block * layout.indexer_dim)
    assert (codes[0].reshape(-1) == first).all() and (scales > 0).all()
    record[40 + per // 2 + len(parsed.payloads[0])] ^= 4  # inside layer 0's indexer keys
    with pytest.raises(KvtierError) as e:
        parse_record(bytes(record), layout)
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    plain = LatentLayout(layout.model_id, layout.num_layers, layout.kv_lora_rank, layout.rope_dim,
                         layout.tokens_per_block, layout.codec)
    x = np.zeros((layout.num_layers, layout.tokens_per_block, layout.dim), np.float32)
    with pytest.raises(KvtierError) as e:
        parse_record(encode_record(plain, 0, x), layout)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(KvtierError) as e:
        encode_record(layout, 0, x)  # keys missing
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
