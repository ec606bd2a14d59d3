"""The prefill and decode clients against the real servers: Info says what
they serve, and a prefix computed and stored from Python (numpy codec,
Python records and keys, from the latents `kvtier run --latents-out` wrote)
is byte for byte what the C++ prefill node stores, and the decode worker
uses it: Generate reports it cached, with the ids of the in-process run and
exactly the logprobs of a turn that hit the C++ node's blocks."""
import json
import pathlib
import subprocess

import grpc
import numpy as np
import pytest

from conftest import binary, cache_argv, write_tenants
from kvtier import CacheClient, DecodeClient, KvtierError, LatentLayout, PrefillClient, block_hashes, encode_record
from kvtier.layout import CODECS, INT8, model_id_of
from kvtier.prefill import Finished, Token

TOKENS_PER_BLOCK = 16


def model_servers(start_server, model_dir, *extra):
    cache = start_server(cache_argv())
    common = ["--listen", "127.0.0.1:0", "--metrics-listen", "", "--model", model_dir, "--cache", cache.target,
              "--threads", "1", *extra]
    decode = start_server([binary("KVTIER_DECODE_BINARY"), *common])
    prefill = start_server([binary("KVTIER_PREFILL_BINARY"), *common, "--decode", decode.target, "--kv-codec", "int8",
                            "--tokens-per-block", TOKENS_PER_BLOCK])
    return cache, decode, prefill


def test_info_says_what_each_server_serves(start_server, model_dir):
    _, decode, prefill = model_servers(start_server, model_dir)
    info = PrefillClient(prefill.target).info()
    assert info.server_version.startswith("kvtier-prefill ")
    assert info.model_id == model_id_of(model_dir) and info.default_namespace == "default"
    assert len(info.layouts) == 1
    layout = LatentLayout.from_proto(info.layouts[0])
    assert (layout.model_id, layout.codec, layout.tokens_per_block) == (info.model_id, INT8, TOKENS_PER_BLOCK)
    assert info.layouts[0].layout_id == layout.layout_id  # the server's id is the one Python computes
    assert info.vocab_size > 0 and info.max_context_tokens > 0 and list(info.block_format_versions) == [1]
    worker = DecodeClient(decode.target).info()
    assert worker.model_id == info.model_id and worker.server_version.startswith("kvtier-decode ")
    assert sorted(p.codec for p in worker.layouts) == sorted(CODECS.values())
    assert {(p.tokens_per_block, p.layout_id) for p in worker.layouts} == {(0, 0)}


def test_a_v3_model_is_served_and_named_as_python_computes(start_server, v3_model_dir):
    _, _, prefill = model_servers(start_server, v3_model_dir)
    client = PrefillClient(prefill.target)
    info = client.info()
    assert info.model_id == model_id_of(v3_model_dir) and info.model_id.startswith("deepseek_v3-")
    layout = LatentLayout.from_proto(info.layouts[0])
    assert layout.num_layers == 4 and layout.layout_id == info.layouts[0].layout_id
    prompt = [int(t) for t in np.random.default_rng().integers(0, info.vocab_size, size=TOKENS_PER_BLOCK + 3)]
    events = list(client.generate(prompt, max_new_tokens=6))
    run = subprocess.run([binary("KVTIER_BINARY"), "run", "--model", v3_model_dir, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-new-tokens", "6", "--kv-codec", "int8",
                          "--tokens-per-block", str(TOKENS_PER_BLOCK), "--json"],
                         check=True, capture_output=True, text=True)
    assert [t.token_id for t in events[:-1]] == json.loads(run.stdout.strip().splitlines()[-1])["ids"]


def test_text_in_and_out_on_the_trained_model(start_server, model_dir):
    trained = str(pathlib.Path(__file__).resolve().parents[3] / "models" / "jargon-mla")
    _, _, prefill = model_servers(start_server, trained)
    client = PrefillClient(prefill.target)
    assert client.info().tokenizer == "ByT5Tokenizer"
    prompt = ":hack: n.\n\n1. "
    got = client.generate_text(prompt, max_new_tokens=24, stop_at_end_of_text=False)
    run = subprocess.run([binary("KVTIER_BINARY"), "run", "--model", trained, "--prompt", prompt, "--max-new-tokens",
                          "24", "--kv-codec", "int8", "--tokens-per-block", str(TOKENS_PER_BLOCK), "--json"],
                         check=True, capture_output=True, text=True)
    assert got == json.loads(run.stdout)["text"] and len(got) > 0
    _, _, random_model = model_servers(start_server, model_dir)
    with pytest.raises(ValueError, match="no tokenizer"):
        PrefillClient(random_model.target).generate_text(prompt)


def test_a_prefix_stored_from_python_is_used_by_decode(start_server, model_dir, tmp_path):
    cache, _, prefill = model_servers(start_server, model_dir)
    client = PrefillClient(prefill.target)
    info = client.info()
    layout = LatentLayout.from_proto(info.layouts[0])
    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(0, info.vocab_size, size=3 * TOKENS_PER_BLOCK + 5)]
    latents = tmp_path / "latents.npy"
    run = subprocess.run([binary("KVTIER_BINARY"), "run", "--model", model_dir, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-new-tokens", "8", "--kv-codec", "int8",
                          "--tokens-per-block", str(TOKENS_PER_BLOCK), "--json",
                          "--latents-out", latents, "--threads", "1"], check=True, capture_output=True, text=True)
    want = json.loads(run.stdout.strip().splitlines()[-1])
    x = np.load(latents)  # [layers][sealed tokens][dim]
    assert x.shape[0] == layout.num_layers and x.shape[2] == layout.dim and x.shape[1] >= 3 * TOKENS_PER_BLOCK

    hashes = block_hashes("py", layout, prompt)
    records = [encode_record(layout, 0, x[:, b * TOKENS_PER_BLOCK:(b + 1) * TOKENS_PER_BLOCK])
               for b in range(len(hashes))]
    cache_client = CacheClient(cache.target)
    assert cache_client.put("py", layout, zip(hashes, records)).blocks_stored == 3

    def generate(ns):
        events = list(client.generate(prompt, max_new_tokens=8, namespace=ns, top_logprobs=5))
        assert all(isinstance(t, Token) for t in events[:-1]) and isinstance(events[-1], Finished)
        u = events[-1].usage
        assert repr(events[-1]) == (f"Finished(reason=FINISH_REASON_LENGTH, prompt_tokens={len(prompt)}, "
                                    f"cached_tokens={u.cached_tokens}, generated_tokens=8, "
                                    f"time_to_first_token_us={u.time_to_first_token_us})")
        return events[:-1], u

    # The C++ prefill node computes and stores the same prompt's blocks in
    # another namespace: its records are the bytes Python made.
    cold, usage = generate("cxx")
    assert usage.cached_tokens == 0
    assert cache_client.get("cxx", layout, block_hashes("cxx", layout, prompt)) == records

    from_python, usage = generate("py")
    assert usage.cached_tokens == 3 * TOKENS_PER_BLOCK
    from_cxx, usage = generate("cxx")
    assert usage.cached_tokens == 3 * TOKENS_PER_BLOCK
    # The uncached turn is the in-process run in one prefill; a turn that
    # hits the cache is the in-process run whose prefix was prefilled and
    # sealed first, the rest attending to its int8 codes (the records), and
    # the turns that hit Python's and the C++ node's records are the same.
    assert [t.token_id for t in cold] == want["ids"]
    np.testing.assert_allclose([t.logprob for t in cold], want["logprobs"], atol=1e-4)
    run = subprocess.run([binary("KVTIER_BINARY"), "run", "--model", model_dir, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-new-tokens", "8", "--kv-codec", "int8",
                          "--tokens-per-block", str(TOKENS_PER_BLOCK), "--json", "--threads", "1",
                          "--cached-prefix-tokens", str(3 * TOKENS_PER_BLOCK)], check=True, capture_output=True, text=True)
    warm = json.loads(run.stdout.strip().splitlines()[-1])
    assert warm["cached_tokens"] == 3 * TOKENS_PER_BLOCK
    assert [t.token_id for t in from_python] == warm["ids"]
    np.testing.assert_allclose([t.logprob for t in from_python], warm["logprobs"], atol=1e-4)
    for got, expected in zip(from_python, from_cxx):
        assert (got.token_id, got.logprob) == (expected.token_id, expected.logprob)
        assert got.top_logprobs == expected.top_logprobs


def test_errors_reach_python_as_statuses(start_server, model_dir, tmp_path):
    tenants = write_tenants(tmp_path / "tenants.json",
                            {"acme": ("WRITER", ["acme"], "acme-token-5"), "svc": ("SERVICE", ["acme"], "svc-token-9")})
    _, decode, prefill = model_servers(start_server, model_dir, "--tenants", tenants, "--token-file",
                                       write_token(tmp_path, "svc-token-9"))
    acme = PrefillClient(prefill.target, token="acme-token-5")
    assert acme.info().default_namespace == "acme"
    with pytest.raises(KvtierError) as e:
        list(acme.generate([1, 2, 3], namespace="globex"))
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(KvtierError) as e:
        list(acme.generate([]))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(KvtierError) as e:
        PrefillClient(prefill.target).info()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(KvtierError) as e:  # a decode worker serves kvtier services only
        DecodeClient(decode.target, token="acme-token-5").info()
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert DecodeClient(decode.target, token="svc-token-9").info().model_id
    with pytest.raises(KvtierError) as e:  # the deadline covers the whole generation
        list(acme.generate([1, 2, 3], max_new_tokens=200, timeout=0.005))
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def write_token(tmp_path, token):
    path = tmp_path / "token"
    path.write_text(token)
    return path
