"""The wire contract in Python equals the C++ code's, both ways, on fresh
random inputs: layout ids, hash chains, records of every codec (latents with
outlier channels), and the fixed vectors docs/protocol.md lists."""
import base64
import json
import random
import subprocess

import numpy as np

from conftest import binary
from kvtier import LatentLayout, block_hashes, encode_record, parse_record
from kvtier.layout import CODECS


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


def test_cxx_vectors_hold_in_python(tmp_path):
    out = tmp_path / "cxx.json"
    subprocess.run([binary("KVTIER_WIRE_VECTORS"), "make", str(fresh_seed()), str(out)], check=True)
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 12  # 3 shapes x 4 codecs
    for case in cases:
        layout = LatentLayout(**case["layout"])
        assert f"{layout.layout_id:016x}" == case["layout_id"], case["layout"]
        assert [h.hex() for h in block_hashes(case["namespace"], layout, case["token_ids"])] == case["block_hashes"]
        latents = np.frombuffer(base64.b64decode(case["latents"]), dtype="<f4").reshape(
            layout.num_layers, layout.tokens_per_block, layout.dim)
        record = base64.b64decode(case["record"])
        assert encode_record(layout, 0, latents) == record, case["layout"]
        parsed = parse_record(record, layout)
        assert parsed.layer_count == layout.num_layers


def random_case(rng, codec):
    latent = int(rng.integers(1, 700))
    rope = int(rng.integers(0, 80))
    layout = LatentLayout(f"python-{rng.integers(1 << 30)}", int(rng.integers(1, 4)), latent, rope,
                          int(rng.integers(1, 40)), codec)
    x = rng.standard_normal((layout.num_layers, layout.tokens_per_block, layout.dim)).astype(np.float32)
    for layer in x:  # outlier channels and a spiking token
        layer[:, rng.integers(0, layout.dim, size=3)] *= 40
        layer[rng.integers(0, layout.tokens_per_block)] *= 8
    tokens = [int(t) for t in rng.integers(0, 102400, size=3 * layout.tokens_per_block + 2)]
    ns = f"ns-{rng.integers(1000)}"
    return {"layout": {"model_id": layout.model_id, "num_layers": layout.num_layers,
                       "kv_lora_rank": layout.kv_lora_rank, "rope_dim": layout.rope_dim,
                       "tokens_per_block": layout.tokens_per_block, "codec": layout.codec,
                       "block_format_version": layout.block_format_version},
            "layout_id": f"{layout.layout_id:016x}", "namespace": ns, "token_ids": tokens,
            "block_hashes": [h.hex() for h in block_hashes(ns, layout, tokens)],
            "latents": base64.b64encode(x.astype("<f4").tobytes()).decode(),
            "record": base64.b64encode(encode_record(layout, 0, x)).decode()}


def test_python_vectors_hold_in_cxx(tmp_path):
    rng = np.random.default_rng(fresh_seed())
    cases = [random_case(rng, codec) for codec in CODECS for _ in range(4)]
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
