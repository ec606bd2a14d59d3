"""A client of kvtier-cache (kvtier.v1.KvCache): match, put, get, stats.

Every call takes a deadline (seconds; the client's default otherwise), and
every failure is a KvtierError carrying the gRPC status code; an answer
that does not fit its request (an index out of range or twice, a block
left out, layers not asked for) is INTERNAL.
"""
import grpc

from kvtier.channel import ServiceClient
from kvtier.errors import KvtierError
from kvtier.keys import check_namespace
from kvtier.records import parse_record
from kvtier.v1 import cache_pb2, cache_pb2_grpc


class CacheClient(ServiceClient):
    """CacheClient("127.0.0.1:7070", tls_dir=..., token=..., timeout=10)."""

    def __init__(self, target, **options):
        super().__init__(cache_pb2_grpc.KvCacheStub, target, **options)

    def match(self, ns, layout, hashes, *, lease_ms=None, timeout=None):
        """How many of `hashes` (a chain, first block first) are stored, as a
        MatchResponse (matched_blocks, tiers, and lease_id with lease_ms)."""
        request = cache_pb2.MatchRequest(kv_namespace=check_namespace(ns), layout=layout.to_proto(),
                                         block_hashes=list(hashes), acquire_lease=lease_ms is not None,
                                         lease_ttl_ms=lease_ms or 0)
        return self._unary(self._stub.Match, request, timeout)

    def put(self, ns, layout, blocks, *, cold_start=False, timeout=None):
        """Stores blocks: `blocks` is an iterable of (hash, record) or (hash,
        [records]) where records are whole blocks or layer slices
        (records.encode_record). `cold_start`: a Match found little of the
        sequence cached, as kvtier's own clients say under a quarter of its
        blocks (the cache's adaptive eviction lets such blocks go first
        while nobody uses them again). Returns the
        PutResponse. If `blocks` raises, the Put is cancelled (its
        incomplete blocks dropped) and that exception is raised here."""
        raised = []

        def messages():
            yield cache_pb2.PutRequest(header=cache_pb2.PutHeader(kv_namespace=ns, layout=layout.to_proto(),
                                                                  cold_start=cold_start))
            try:
                for block_hash, records in blocks:
                    for record in [records] if isinstance(records, (bytes, bytearray)) else records:
                        yield cache_pb2.PutRequest(slice=cache_pb2.LayerSlice(block_hash=bytes(block_hash),
                                                                              data=bytes(record)))
            except Exception as e:  # gRPC would only say UNKNOWN: keep the caller's own error
                raised.append(e)
                raise
        check_namespace(ns)
        try:
            return self._unary(self._stub.Put, messages(), timeout)
        except KvtierError:
            if raised:
                raise raised[0] from None
            raise

    def get(self, ns, layout, hashes, *, layers=None, lease_id=0, verify=True, timeout=None):
        """The records of `hashes`, in order: a list of bytes, None where a
        block is missing. layers: (begin, count) for only those layers.
        verify: parse each record (CRC32C and layout) and raise on a bad one."""
        begin, count = layers or (0, 0)
        request = cache_pb2.GetRequest(kv_namespace=check_namespace(ns), layout=layout.to_proto(),
                                       block_hashes=list(hashes), layer_begin=begin, layer_count=count,
                                       lease_id=lease_id)
        asked = (begin, begin + count if count else layout.num_layers)
        out = [None] * len(request.block_hashes)
        answered = [False] * len(out)
        for answer in self._stream(self._stub.Get, request, timeout):
            i = answer.index
            if i >= len(out):
                raise _bad_answer(f"block {i} of a {len(out)}-block request")
            if answered[i]:
                raise _bad_answer(f"block {i} twice")
            if answer.block_hash != request.block_hashes[i]:
                raise _bad_answer(f"block {i} under another block's hash")
            answered[i] = True
            if answer.WhichOneof("result") == "data":
                data = answer.data  # each read of the field is a copy
                if verify:
                    record = parse_record(data, layout)
                    got = (record.first_layer, record.first_layer + record.layer_count)
                    if got != asked:
                        raise _bad_answer(f"block {i} with layers [{got[0]}, {got[1]}), "
                                          f"asked for [{asked[0]}, {asked[1]})")
                out[i] = data
        if not all(answered):
            raise _bad_answer(f"{answered.count(True)} of {len(out)} blocks, then ended")
        return out

    def release_lease(self, lease_id, *, timeout=None):
        self._unary(self._stub.ReleaseLease, cache_pb2.ReleaseLeaseRequest(lease_id=lease_id), timeout)

    def stats(self, *, timeout=None):
        """The StatsResponse: per tier capacity, use and counters."""
        return self._unary(self._stub.Stats, cache_pb2.StatsRequest(), timeout)


def _bad_answer(what):
    return KvtierError(grpc.StatusCode.INTERNAL, f"the cache's Get answered {what}")
