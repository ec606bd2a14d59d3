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
from kvtier import (KvtierError, LatentLayout, V4Part, block_hashes, encode_record, encode_v4_record, parse_record,
                    restore_point_key)
from kvtier.layout import CODECS, INDEXER_FP8, INDEXER_MXFP4
from kvtier.records import V4_BLOCK, V4_RESTORE_POINT


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
    restore = restore_point_key(block_hashes("default", tiny, [1, 2, 3, 4, 5])[1])
    assert restore.hex() == "99e9168de34035fa207dcd1e8faaec0e8138f932e38859c84c3e11f422ea9142"
    v32 = LatentLayout("deepseek-ai/DeepSeek-V3.2", 61, 512, 64, 64, "fp8", indexer_dim=128,
                       indexer_encoding=INDEXER_FP8)
    assert v32.block_format_version == 2 and v32.indexer_part_bytes == 64 * 132
    assert f"{v32.layout_id:016x}" == V32_LAYOUT_ID
    v4 = v4_flash()
    assert v4.block_format_version == 3 and f"{v4.layout_id:016x}" == "92fc17c89146260d"
    # block_format.md's V4-Flash figures
    assert v4.v4_block_bytes() == 449_824 and v4.v4_restore_point_bytes(1024) == 3_644_424


def v4_flash():
    """DeepSeek-V4-Flash's layout: 2 window-only layers, ratios 4 and 128 alternating, a last 4."""
    return LatentLayout("deepseek-ai/DeepSeek-V4-Flash", 43, 512, 64, 128, "fp8", indexer_dim=128,
                        indexer_encoding=INDEXER_MXFP4, compress_ratios=(0, 0) + (4, 128) * 20 + (4,),
                        sliding_window=128)


def test_a_v4_layout_whose_records_would_pass_4_gib_is_refused():
    # As the server refuses it (tests/kvblock/layout_test.cc): the header's
    # payload size is 32 bits.
    with pytest.raises(ValueError, match="does not fit a record"):
        LatentLayout("big", 1024, 16384, 64, 4096, "fp8", compress_ratios=(1,) * 1024, sliding_window=128)
    with pytest.raises(ValueError, match="does not fit a record"):
        LatentLayout("big", 1024, 16384, 64, 128, "fp8", compress_ratios=(0,) * 1024, sliding_window=4096)
    assert v4_flash().v4_block_bytes() < 1 << 32


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
    v4_cases = json.loads(out.read_text())["v4_cases"]
    assert [c["kind"] for c in v4_cases] == [V4_BLOCK, V4_RESTORE_POINT]
    for case in v4_cases:
        layout = LatentLayout(**case["layout"])
        assert f"{layout.layout_id:016x}" == case["layout_id"], case["layout"]
        payload, record = base64.b64decode(case["payload"]), base64.b64decode(case["record"])
        assert encode_v4_record(layout, case["kind"], payload) == record
        parsed = parse_record(record, layout)
        assert isinstance(parsed, V4Part) and parsed.kind == case["kind"] and bytes(parsed.payload) == payload


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


def random_v4_case(rng, kind):
    """A random DeepSeek-V4 layout's block or restore point of random bytes."""
    tokens = 4 * int(rng.integers(1, 9))
    ratios = tuple(int(r) for r in rng.choice([0, 4, tokens], size=int(rng.integers(1, 6))))
    csa = 4 in ratios
    layout = LatentLayout(f"python-v4-{rng.integers(1 << 30)}", len(ratios), 64 * int(rng.integers(1, 4)) + 64, 64,
                          tokens, "fp8", indexer_dim=32 * int(rng.integers(1, 5)) if csa else 0,
                          indexer_encoding=INDEXER_MXFP4 if csa else 0, compress_ratios=ratios,
                          sliding_window=int(rng.integers(1, 200)))
    boundary = tokens * int(rng.integers(1, 60))
    size = layout.v4_block_bytes() if kind == V4_BLOCK else layout.v4_restore_point_bytes(boundary)
    payload = bytearray(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())
    if kind == V4_RESTORE_POINT:
        payload[:8] = boundary.to_bytes(8, "little")
    fields = {"model_id": layout.model_id, "num_layers": layout.num_layers, "kv_lora_rank": layout.kv_lora_rank,
              "rope_dim": layout.rope_dim, "tokens_per_block": layout.tokens_per_block, "codec": layout.codec,
              "block_format_version": layout.block_format_version, "indexer_dim": layout.indexer_dim,
              "indexer_encoding": layout.indexer_encoding, "compress_ratios": list(ratios),
              "sliding_window": layout.sliding_window}
    return {"layout": fields, "layout_id": f"{layout.layout_id:016x}", "kind": kind,
            "payload": base64.b64encode(bytes(payload)).decode(),
            "record": base64.b64encode(encode_v4_record(layout, kind, payload)).decode()}


def test_python_vectors_hold_in_cxx(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    cases = [random_case(rng, codec, indexed) for codec in CODECS for indexed in (False, True) for _ in range(2)]
    v4_cases = [random_v4_case(rng, kind) for kind in (V4_BLOCK, V4_RESTORE_POINT) for _ in range(4)]
    path = tmp_path / "python.json"
    path.write_text(json.dumps({"cases": cases, "v4_cases": v4_cases}))
    checked = subprocess.run([binary("KVTIER_WIRE_VECTORS"), "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == f"{len(cases) + len(v4_cases)} cases agree"


def test_v4_records_are_checked_like_the_servers_do():
    """Format 3 in Python: sizes, kinds and boundaries refused as the C++
    parser refuses them, a flipped byte is DATA_LOSS, another layout's
    record FAILED_PRECONDITION."""
    rng = np.random.default_rng(fresh_seed())
    case = random_v4_case(rng, V4_RESTORE_POINT)
    layout = LatentLayout(**case["layout"])
    payload, record = base64.b64decode(case["payload"]), bytearray(base64.b64decode(case["record"]))
    assert parse_record(bytes(record), layout).boundary == int.from_bytes(payload[:8], "little")
    for kind, bad, message in [(V4_BLOCK, payload, "the layout's blocks take"),
                               (V4_RESTORE_POINT, payload + b"x", "points there take"),
                               (V4_RESTORE_POINT, (layout.tokens_per_block + 1).to_bytes(8, "little") + payload[8:],
                                "not a block boundary"),
                               (V4_RESTORE_POINT, payload[:7], "has no boundary"),
                               (2, payload, "record kind 2")]:
        with pytest.raises(KvtierError) as e:
            encode_v4_record(layout, kind, bad)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details, message
    record[32 + len(payload) // 2] ^= 2
    with pytest.raises(KvtierError) as e:
        parse_record(bytes(record), layout)
    assert e.value.code == grpc.StatusCode.DATA_LOSS
    with pytest.raises(KvtierError) as e:
        parse_record(base64.b64decode(case["record"]), v4_flash())
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


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
    v4 = random_v4_case(np.random.default_rng(7), V4_BLOCK)
    record = bytearray(base64.b64decode(v4["record"]))
    record[-5] ^= 1  # the payload's last byte
    v4["record"] = base64.b64encode(bytes(record)).decode()
    path.write_text(json.dumps({"cases": [], "v4_cases": [v4]}))
    checked = subprocess.run([binary("KVTIER_WIRE_VECTORS"), "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 1 and "the V4 record differs" in checked.stderr, checked.stderr


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
