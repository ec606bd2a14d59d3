"""A client of kvtier-cache (kvtier.v1.KvCache): match, put, get, stats.

Every call takes a deadline (seconds; the client's default otherwise), and
every failure is a KvtierError carrying the gRPC status code.
"""

from kvtier.channel import ServiceClient
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

    def put(self, ns, layout, blocks, *, timeout=None):
        """Stores blocks: `blocks` is an iterable of (hash, record) or (hash,
        [records]) where records are whole blocks or layer slices
        (records.encode_record). Returns the PutResponse."""
        def messages():
            yield cache_pb2.PutRequest(header=cache_pb2.PutHeader(kv_namespace=ns, layout=layout.to_proto()))
            for block_hash, records in blocks:
                for record in [records] if isinstance(records, (bytes, bytearray)) else records:
                    yield cache_pb2.PutRequest(slice=cache_pb2.LayerSlice(block_hash=bytes(block_hash),
                                                                          data=bytes(record)))
        check_namespace(ns)
        return self._unary(self._stub.Put, messages(), timeout)

    def get(self, ns, layout, hashes, *, layers=None, lease_id=0, verify=True, timeout=None):
        """The records of `hashes`, in order: a list of bytes, None where a
        block is missing. layers: (begin, count) for only those layers.
        verify: parse each record (CRC32C and layout) and raise on a bad one."""
        begin, count = layers or (0, 0)
        request = cache_pb2.GetRequest(kv_namespace=check_namespace(ns), layout=layout.to_proto(),
                                       block_hashes=list(hashes), layer_begin=begin, layer_count=count,
                                       lease_id=lease_id)
        out = [None] * len(request.block_hashes)
        for answer in self._stream(self._stub.Get, request, timeout):
            if answer.WhichOneof("result") == "data":
                if verify:
                    parse_record(answer.data, layout)
                out[answer.index] = answer.data
        return out

    def release_lease(self, lease_id, *, timeout=None):
        self._unary(self._stub.ReleaseLease, cache_pb2.ReleaseLeaseRequest(lease_id=lease_id), timeout)

    def stats(self, *, timeout=None):
        """The StatsResponse: per tier capacity, use and counters."""
        return self._unary(self._stub.Stats, cache_pb2.StatsRequest(), timeout)
