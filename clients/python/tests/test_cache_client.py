"""CacheClient against a real kvtier-cache on port 0: byte-exact Put and
Get of records built in Python, Match, Stats, the documented statuses for
bad input, a dead server, and TLS with tokens."""
import logging
import socket
import time

import crc32c
import grpc
import numpy as np
import pytest

from conftest import cache_argv, pip_install_copy, write_tenants
from kvtier import (CacheClient, KvtierError, LatentLayout, block_hashes, encode_record, encode_v4_record, parse_record,
                    restore_point_key)
from kvtier.layout import INDEXER_MXFP4
from kvtier.records import V4_BLOCK, V4_RESTORE_POINT
from kvtier.records import encode_payloads
from kvtier.v1 import cache_pb2

LAYOUT = LatentLayout("python-client", num_layers=3, kv_lora_rank=64, rope_dim=16, tokens_per_block=8, codec="int8")


def blocks(rng, layout, ns, count):
    """(hash, whole record, per-layer records) for `count` blocks of a random prompt."""
    tokens = [int(t) for t in rng.integers(0, 50000, size=count * layout.tokens_per_block)]
    out = []
    for h in block_hashes(ns, layout, tokens):
        x = rng.standard_normal((layout.num_layers, layout.tokens_per_block, layout.dim)).astype(np.float32)
        record = encode_record(layout, 0, x)
        layers = [encode_record(layout, layer, x[layer]) for layer in range(layout.num_layers)]
        out.append((h, record, layers))
    return out


def test_put_match_get_are_byte_exact(cache):
    rng = np.random.default_rng()
    with CacheClient(cache.target) as client:
        stored = blocks(rng, LAYOUT, "acme", 5)
        put = client.put("acme", LAYOUT, [(h, layers) for h, _, layers in stored])  # a slice per layer
        assert put.blocks_stored == 5
        hashes = [h for h, _, _ in stored]
        assert client.match("acme", LAYOUT, hashes + [bytes(32)]).matched_blocks == 5
        assert client.get("acme", LAYOUT, hashes) == [record for _, record, _ in stored]
        # A layer subset comes back as a record of its own.
        one = client.get("acme", LAYOUT, hashes[:1], layers=(1, 2))[0]
        parsed = parse_record(one, LAYOUT)
        assert (parsed.first_layer, parsed.layer_count) == (1, 2)
        assert parsed.payloads == parse_record(stored[0][1]).payloads[1:]
        # Whole records dedupe; a missing block is None.
        assert client.put("acme", LAYOUT, [(h, record) for h, record, _ in stored]).blocks_deduplicated == 5
        assert client.get("acme", LAYOUT, [bytes(32)]) == [None]
        assert client.match("other", LAYOUT, hashes).matched_blocks == 0  # namespaces never share
        # A cold start's blocks (none of their prefix was cached) are stored alike.
        cold = blocks(rng, LAYOUT, "acme", 2)
        assert client.put("acme", LAYOUT, [(h, record) for h, record, _ in cold], cold_start=True).blocks_stored == 2
        assert client.get("acme", LAYOUT, [h for h, _, _ in cold]) == [record for _, record, _ in cold]
        stats = client.stats()
        assert stats.blocks_stored == 7 and stats.server_version.startswith("kvtier-cache ")


# DeepSeek-V4 (block format 3): a window-only layer, one of ratio 4 with
# an indexer, one of ratio 16.
V4_LAYOUT = LatentLayout("python-client-v4", num_layers=3, kv_lora_rank=128, rope_dim=64, tokens_per_block=16,
                         codec="fp8", indexer_dim=32, indexer_encoding=INDEXER_MXFP4, compress_ratios=(0, 4, 16),
                         sliding_window=16)


def v4_record(rng, kind, boundary=16):
    """A V4 block's record, or a restore point's, of random bytes."""
    layout = V4_LAYOUT
    size = layout.v4_block_bytes() if kind == V4_BLOCK else layout.v4_restore_point_bytes(boundary)
    payload = bytearray(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())
    if kind == V4_RESTORE_POINT:
        payload[:8] = boundary.to_bytes(8, "little")
    return encode_v4_record(layout, kind, payload)


def test_v4_prefixes_match_to_their_last_restore_point(cache):
    """DeepSeek-V4's blocks and restore points through a real cache: Match
    ends at the last block with a point, Get gives the records back as
    they were put, and a layer range is refused (a V4 record holds every
    layer)."""
    rng = np.random.default_rng()
    tokens = [int(t) for t in rng.integers(0, 50000, size=3 * V4_LAYOUT.tokens_per_block)]
    hashes = block_hashes("acme", V4_LAYOUT, tokens)
    records = {h: v4_record(rng, V4_BLOCK) for h in hashes}
    points = {restore_point_key(hashes[0]): v4_record(rng, V4_RESTORE_POINT, 16)}
    with CacheClient(cache.target) as client:
        assert client.put("acme", V4_LAYOUT, list(records.items()) + list(points.items())).blocks_stored == 4
        assert client.match("acme", V4_LAYOUT, hashes).matched_blocks == 1
        points[restore_point_key(hashes[2])] = v4_record(rng, V4_RESTORE_POINT, 48)
        client.put("acme", V4_LAYOUT, [(restore_point_key(hashes[2]), points[restore_point_key(hashes[2])])])
        assert client.match("acme", V4_LAYOUT, hashes).matched_blocks == 3
        wanted = hashes + [restore_point_key(hashes[2])]
        assert client.get("acme", V4_LAYOUT, wanted) == [records[h] for h in hashes] + [
            points[restore_point_key(hashes[2])]]
        expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                      lambda: client.get("acme", V4_LAYOUT, hashes[:1], layers=(0, 1)), "every layer")


def expect_status(code, call, match=""):
    with pytest.raises(KvtierError) as e:
        call()
    assert e.value.code == code, e.value
    assert match in e.value.details, e.value.details
    return e.value


def test_bad_input_gets_the_documented_statuses(start_server):
    cache = start_server(cache_argv("--namespaces", "acme,globex"))
    rng = np.random.default_rng()
    client = CacheClient(cache.target)
    h, record, _ = blocks(rng, LAYOUT, "acme", 1)[0]
    other = LatentLayout("another-model", 3, 64, 16, 8, "int8")
    # A record of another layout under this one.
    expect_status(grpc.StatusCode.FAILED_PRECONDITION,
                  lambda: client.put("acme", LAYOUT, [(h, encode_record(other, 0, np.zeros((3, 8, 80))))]),
                  "layout id")
    bad_crc = bytearray(record)
    bad_crc[100] ^= 0xFF
    expect_status(grpc.StatusCode.DATA_LOSS, lambda: client.put("acme", LAYOUT, [(h, bytes(bad_crc))]), "checksum")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.get("acme", LAYOUT, [h], layers=(2, 5)), "layer")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.put("acme", LAYOUT, [(h[:31], record)]), "32 bytes")
    expect_status(grpc.StatusCode.NOT_FOUND, lambda: client.match("initech", LAYOUT, [h]), "unknown namespace")
    for bad in ("no spaces", "", None):
        expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.match(bad, LAYOUT, [h]), "namespace")
    # A request's layout id may be 0 (the server computes it); a record's
    # header must carry the real one.
    request = cache_pb2.MatchRequest(kv_namespace="acme", layout=LAYOUT.to_proto(), block_hashes=[h])
    request.layout.layout_id = 0
    assert client._stub.Match(request, timeout=10).matched_blocks == 0
    zero_id = bytearray(record)
    zero_id[8:16] = bytes(8)
    zero_id[-4:] = crc32c.crc32c(bytes(zero_id[:-4])).to_bytes(4, "little")
    expect_status(grpc.StatusCode.FAILED_PRECONDITION, lambda: client.put("acme", LAYOUT, [(h, bytes(zero_id))]),
                  "layout id 0000000000000000")
    # The records in Python refuse what the server would, with the same codes.
    expect_status(grpc.StatusCode.DATA_LOSS, lambda: parse_record(bad_crc), "checksum")
    expect_status(grpc.StatusCode.FAILED_PRECONDITION, lambda: parse_record(record, other), "layout id")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: parse_record(record[:-1]), "truncated")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: encode_payloads(LAYOUT, 2, [b"x", b"y"]), "not within")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: encode_record(LAYOUT, 0, np.zeros((3, 7, 80))), "8 tokens")
    # Nothing above stored anything.
    assert client.stats().blocks_stored == 0


def test_a_dead_server_is_unavailable_within_the_deadline():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = CacheClient(f"127.0.0.1:{port}", timeout=3)
    start = time.monotonic()
    expect_status(grpc.StatusCode.UNAVAILABLE, lambda: client.match("acme", LAYOUT, [bytes(32)]))
    assert time.monotonic() - start < 3.5


def test_tls_and_tokens(start_server, tls_dir, tmp_path):
    tokens = {"acme": "acme-python-token-31", "globex": "globex-python-token-77"}
    tenants = write_tenants(tmp_path / "tenants.json",
                            {name: ("WRITER", [name], token) for name, token in tokens.items()})
    cache = start_server(cache_argv("--no-fast-path", "--tls-dir", tls_dir, "--tenants", tenants))
    acme = CacheClient(cache.target, tls_dir=tls_dir / "client", token=tokens["acme"])
    stored = blocks(np.random.default_rng(), LAYOUT, "acme", 3)
    assert acme.put("acme", LAYOUT, [(h, record) for h, record, _ in stored]).blocks_stored == 3
    hashes = [h for h, _, _ in stored]
    assert acme.get("acme", LAYOUT, hashes) == [record for _, record, _ in stored]
    globex = CacheClient(cache.target, tls_dir=tls_dir / "client", token=tokens["globex"])
    expect_status(grpc.StatusCode.PERMISSION_DENIED, lambda: globex.match("acme", LAYOUT, hashes))
    nobody = CacheClient(cache.target, tls_dir=tls_dir / "client")
    expect_status(grpc.StatusCode.UNAUTHENTICATED, lambda: nobody.match("acme", LAYOUT, hashes))
    plaintext = CacheClient(cache.target, token=tokens["acme"], timeout=3)
    expect_status(grpc.StatusCode.UNAVAILABLE, lambda: plaintext.match("acme", LAYOUT, hashes))


def test_a_token_file_rotated_under_a_running_client_is_followed(start_server, tmp_path, caplog):
    """token_file= is read again as it changes (a Secret's rotation): the
    client rotated in docs/operations.md's order loses no call; a file
    emptied meanwhile keeps the last good token, said once in the log."""
    old, new = "acme-python-token-31", "acme-python-token-new-5e"
    tenants = write_tenants(tmp_path / "tenants.json", {"acme": ("WRITER", ["acme"], [old, new])})
    cache = start_server(cache_argv("--no-fast-path", "--tenants", tenants, "--reload-seconds", "1"))
    token_file = tmp_path / "token"

    def write_token(text):
        (tmp_path / "token.new").write_text(text)
        (tmp_path / "token.new").rename(token_file)

    write_token(old + "\n")
    client = CacheClient(cache.target, token_file=token_file, token_reload=0.2, timeout=3)
    assert client.stats().server_version.startswith("kvtier-cache ")
    write_token(new + "\n")
    time.sleep(0.3)
    assert client.stats()
    write_tenants(tenants, {"acme": ("WRITER", ["acme"], new)})
    holding_old = CacheClient(cache.target, token=old, timeout=3)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            holding_old.stats()
            time.sleep(0.2)
        except KvtierError as e:
            assert e.code == grpc.StatusCode.UNAUTHENTICATED, e
            break
    else:
        pytest.fail("the old token's hash was never taken out")
    assert client.stats(), "the client did not follow its token file"

    with caplog.at_level("WARNING", logger="kvtier"):
        write_token("")
        for _ in range(3):
            time.sleep(0.3)
            assert client.stats(), "an emptied token file took the token away"
    said = [r.getMessage() for r in caplog.records if r.name == "kvtier" and r.levelno >= logging.WARNING]
    assert said == [f"token_file {token_file}: its first line is empty; the last good token stays in force"], said
    assert new not in " ".join(said)

    expect_status(grpc.StatusCode.INVALID_ARGUMENT, lambda: CacheClient(cache.target, token_file=tmp_path / "none"),
                  f"token_file {tmp_path / 'none'}: cannot be read")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                  lambda: CacheClient(cache.target, token=new, token_file=token_file), "not both")
    expect_status(grpc.StatusCode.INVALID_ARGUMENT,
                  lambda: CacheClient(cache.target, token_file=token_file, token_reload=0), "token_reload 0")


def test_pip_installs_the_package_without_network(tmp_path, cache):
    """pip builds and installs it from a copy of the folder, the stubs
    generated and the CRC32C module compiled as it builds; the installed
    package works from anywhere."""
    target, run = pip_install_copy(tmp_path)
    installed, native, version = run("import sys, kvtier, kvtier.codecs; from kvtier.v1 import cache_pb2_grpc; "
                                     f"print(kvtier.__file__, kvtier.codecs.NATIVE, "
                                     f"kvtier.CacheClient('{cache.target}').stats().server_version)").split(" ", 2)
    assert installed.startswith(str(target)) and version.startswith("kvtier-cache ")
    assert native == "True", "pip built the package without kvtier._native"
