#!/usr/bin/env python3
"""An outside client: Debian's python3-grpcio, with TLS and a bearer token,
does Put, Match and Get against a real kvtier-cache run with --tls-dir and
--tenants; a second tenant's token cannot read the first's blocks, and no
token is UNAUTHENTICATED. Stubs are generated from proto/ with protoc and
grpc_python_plugin at test time; records are built from
services/kvblock/block_format.md alone (bf16 payloads, CRC32C).
Usage: tls_client_test.py KVTIER_CACHE_BINARY PROTO_DIR"""
import hashlib
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

import crc32c
import grpc


def sh(*args, cwd):
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


def make_certificates(d):
    p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *p256, "-days", "1", "-subj", "/CN=test CA", "-keyout", "ca.key", "-out",
       "ca.crt", cwd=d)
    sh("openssl", "req", *p256, "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
       "-keyout", "tls.key", "-out", "tls.csr", cwd=d)
    sh("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
       "-days", "1", "-copy_extensions", "copy", "-out", "tls.crt", cwd=d)


def layout_id(model_id, layers, latent, rope, tokens, codec, version=1):
    canonical = b"kvtier.layout.v1" + struct.pack("<I", len(model_id)) + model_id.encode()
    canonical += struct.pack("<IIIIII", layers, latent, rope, tokens, codec, version)
    return struct.unpack("<Q", hashlib.sha256(canonical).digest()[:8])[0]


def record(lid, first_layer, layers, latent, rope, tokens, payload):
    """A bf16 record of `layers` layers from `first_layer` (block_format.md)."""
    per_layer = tokens * (latent + rope) * 2
    assert len(payload) == layers * per_layer
    header = b"KVTB" + struct.pack("<HBBQIHHHHI", 1, 1, 0, lid, tokens, first_layer, layers, latent, rope,
                                   per_layer)
    body = header + payload
    return body + struct.pack("<I", crc32c.crc32c(body))


def main(cache_binary, proto_dir):
    proto_dir = str(pathlib.Path(proto_dir).resolve())
    work = pathlib.Path(tempfile.mkdtemp(prefix="kvtier-python-"))
    stubs = work / "stubs"
    stubs.mkdir()
    protos = [str(p.relative_to(proto_dir)) for p in pathlib.Path(proto_dir).glob("kvtier/v1/*.proto")]
    sh("protoc", f"-I{proto_dir}", f"--python_out={stubs}", f"--grpc_out={stubs}",
       "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin", *protos, cwd=proto_dir)
    sys.path.insert(0, str(stubs))
    from kvtier.v1 import cache_pb2, cache_pb2_grpc, layout_pb2  # noqa: E402

    tls = work / "tls"
    tls.mkdir()
    make_certificates(tls)
    tokens = {"acme": "acme-python-token-31", "globex": "globex-python-token-77"}
    tenants = ",".join(
        '{"name": "%s", "role": "WRITER", "namespaces": ["%s"], "tokenSha256": ["%s"]}'
        % (name, name, hashlib.sha256(token.encode()).hexdigest()) for name, token in tokens.items())
    (work / "tenants.json").write_text('{"tenants": [%s]}' % tenants)
    cache = subprocess.Popen(
        [cache_binary, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity", "16MiB",
         "--host-capacity", "16MiB", "--no-fast-path", "--tls-dir", str(tls), "--tenants", str(work / "tenants.json")],
        stdout=subprocess.PIPE, text=True)
    try:
        target = None
        for line in cache.stdout:
            if line.startswith("listening on "):
                target = line.split()[-1]
                break
        assert target, "kvtier-cache did not start"
        credentials = grpc.ssl_channel_credentials(root_certificates=(tls / "ca.crt").read_bytes())
        stub = cache_pb2_grpc.KvCacheStub(grpc.secure_channel(target, credentials))

        def bearer(name):
            return [("authorization", "Bearer " + tokens[name])]

        latent, rope, tokens_per_block, layers = 32, 8, 16, 2
        lid = layout_id("python-client", layers, latent, rope, tokens_per_block, 1)
        layout = layout_pb2.LatentLayout(model_id="python-client", num_layers=layers, kv_lora_rank=latent,
                                         rope_dim=rope, tokens_per_block=tokens_per_block,
                                         codec=layout_pb2.KV_CODEC_BF16, block_format_version=1, layout_id=lid)
        per_layer = tokens_per_block * (latent + rope) * 2
        blocks = []  # (hash, whole record)
        requests = [cache_pb2.PutRequest(header=cache_pb2.PutHeader(kv_namespace="acme", layout=layout))]
        for b in range(3):
            payload = os.urandom(layers * per_layer)
            block_hash = hashlib.sha256(b"python block %d" % b).digest()
            blocks.append((block_hash, record(lid, 0, layers, latent, rope, tokens_per_block, payload)))
            for layer in range(layers):  # a slice per layer, as a prefill node sends them
                part = payload[layer * per_layer:(layer + 1) * per_layer]
                requests.append(cache_pb2.PutRequest(slice=cache_pb2.LayerSlice(
                    block_hash=block_hash, data=record(lid, layer, 1, latent, rope, tokens_per_block, part))))
        put = stub.Put(iter(requests), metadata=bearer("acme"), timeout=10)
        assert put.blocks_stored == 3, put

        hashes = [h for h, _ in blocks]
        match = stub.Match(cache_pb2.MatchRequest(kv_namespace="acme", layout=layout, block_hashes=hashes),
                           metadata=bearer("acme"), timeout=10)
        assert match.matched_blocks == 3, match
        got = list(stub.Get(cache_pb2.GetRequest(kv_namespace="acme", layout=layout, block_hashes=hashes),
                            metadata=bearer("acme"), timeout=10))
        assert [r.data for r in sorted(got, key=lambda r: r.index)] == [rec for _, rec in blocks], \
            "Get did not answer the records Put stored"

        for name, meta, want in (("globex's token", bearer("globex"), grpc.StatusCode.PERMISSION_DENIED),
                                 ("no token", [], grpc.StatusCode.UNAUTHENTICATED)):
            try:
                stub.Match(cache_pb2.MatchRequest(kv_namespace="acme", layout=layout, block_hashes=hashes),
                           metadata=meta, timeout=10)
                raise AssertionError(f"{name}: Match of acme's blocks answered")
            except grpc.RpcError as e:
                assert e.code() == want, f"{name}: {e.code()} {e.details()}"
        print("python client over TLS: Put 3 blocks, Match 3, Get 3 byte for byte; "
              "another tenant PERMISSION_DENIED, no token UNAUTHENTICATED")
        return 0
    finally:
        cache.terminate()
        cache.wait(timeout=30)
        subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
