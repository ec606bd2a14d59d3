"""CacheClient.get against a server whose answers do not fit the request
(a gRPC server in this process scripted to answer so: the real cache never
does), and put with a block source that fails, against the real cache."""
from concurrent import futures

import grpc
import numpy as np
import pytest

from kvtier import CacheClient, KvtierError, LatentLayout, block_hashes, encode_record
from kvtier.v1 import cache_pb2, cache_pb2_grpc

LAYOUT = LatentLayout("hostile-answers", num_layers=3, kv_lora_rank=64, rope_dim=16, tokens_per_block=8, codec="int8")


class ScriptedCache(cache_pb2_grpc.KvCacheServicer):
    """Answers every Get with `self.answers`."""

    def __init__(self):
        self.answers = []

    def Get(self, request, context):
        yield from self.answers


@pytest.fixture
def scripted():
    cache = ScriptedCache()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cache_pb2_grpc.add_KvCacheServicer_to_server(cache, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield cache, CacheClient(f"127.0.0.1:{port}")
    server.stop(None)


def two_blocks():
    rng = np.random.default_rng()
    tokens = [int(t) for t in rng.integers(0, 50000, size=2 * LAYOUT.tokens_per_block)]
    hashes = block_hashes("acme", LAYOUT, tokens)
    x = rng.standard_normal((LAYOUT.num_layers, LAYOUT.tokens_per_block, LAYOUT.dim)).astype(np.float32)
    return hashes, x


def answer(index, block_hash, data):
    return cache_pb2.GetResponse(index=index, block_hash=block_hash, data=data)


def refused(client, hashes, match, **options):
    with pytest.raises(KvtierError) as e:
        client.get("acme", LAYOUT, hashes, **options)
    assert e.value.code == grpc.StatusCode.INTERNAL, e.value
    assert match in e.value.details, e.value.details


def test_answers_that_fit_are_taken(scripted):
    cache, client = scripted
    hashes, x = two_blocks()
    record = encode_record(LAYOUT, 0, x)
    cache.answers = [answer(1, hashes[1], record),
                     cache_pb2.GetResponse(index=0, block_hash=hashes[0], miss=cache_pb2.BlockMiss(code=5))]
    assert client.get("acme", LAYOUT, hashes) == [None, record]
    layer = encode_record(LAYOUT, 1, x[1:2])
    cache.answers = [answer(0, hashes[0], layer), answer(1, hashes[1], layer)]
    assert client.get("acme", LAYOUT, hashes, layers=(1, 1)) == [layer, layer]


def test_answers_that_do_not_fit_are_internal_errors(scripted):
    cache, client = scripted
    hashes, x = two_blocks()
    record = encode_record(LAYOUT, 0, x)
    cache.answers = [answer(0, hashes[0], record), answer(7, hashes[1], record)]
    refused(client, hashes, "block 7 of a 2-block request")
    cache.answers = [answer(0, hashes[0], record), answer(0, hashes[0], record), answer(1, hashes[1], record)]
    refused(client, hashes, "block 0 twice")
    cache.answers = [answer(0, hashes[0], record)]
    refused(client, hashes, "1 of 2 blocks, then ended")
    cache.answers = [answer(0, hashes[1], record), answer(1, hashes[1], record)]
    refused(client, hashes, "block 0 under another block's hash")
    # The whole record where one layer was asked for.
    cache.answers = [answer(0, hashes[0], record), answer(1, hashes[1], record)]
    refused(client, hashes, "block 0 with layers [0, 3), asked for [1, 2)", layers=(1, 1))


def test_a_failing_block_source_cancels_the_put_with_its_own_error(cache):
    client = CacheClient(cache.target)
    hashes, x = two_blocks()

    def source():
        yield hashes[0], encode_record(LAYOUT, 0, x)
        raise RuntimeError("the model crashed")

    with pytest.raises(RuntimeError, match="the model crashed"):
        client.put("acme", LAYOUT, source())
    # The server is fine and takes the next Put.
    client.put("acme", LAYOUT, [(hashes[1], encode_record(LAYOUT, 0, x))])
    assert client.get("acme", LAYOUT, [hashes[1]])[0] is not None
