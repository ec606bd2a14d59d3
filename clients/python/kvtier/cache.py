"""A client of kvtier-cache (kvtier.v1.KvCache): match, put, get, stats.

Every call takes a deadline (seconds; the client's default otherwise), and
every failure is a KvtierError carrying the gRPC status code.
"""
import grpc

from kvtier.channel import make_channel
from kvtier.errors import KvtierError
from kvtier.keys import check_namespace
from kvtier.records import parse_record
from kvtier.v1 import cache_pb2, cache_pb2_grpc

MAX_SLICES_PER_BATCH = 4096


class CacheClient:
    """CacheClient("127.0.0.1:7070", tls_dir=..., token=..., timeout=10)."""

    def __init__(self, target, *, tls_dir=None, token=None, server_name=None, timeout=10.0, channel=None):
        self._channel = channel or make_channel(target, tls_dir=tls_dir, token=token, server_name=server_name)
        self._stub = cache_pb2_grpc.KvCacheStub(self._channel)
        self.timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _deadline(self, timeout):
        return self.timeout if timeout is None else timeout

    def match(self, ns, layout, hashes, *, lease_ms=None, timeout=None):
        """How many of `hashes` (a chain, first block first) are stored, as a
        MatchResponse (matched_blocks, tiers, and lease_id with lease_ms)."""
        request = cache_pb2.MatchRequest(kv_namespace=check_namespace(ns), layout=layout.to_proto(),
                                         block_hashes=list(hashes), acquire_lease=lease_ms is not None,
                                         lease_ttl_ms=lease_ms or 0)
        try:
            return self._stub.Match(request, timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None

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
        try:
            return self._stub.Put(messages(), timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None

    def get(self, ns, layout, hashes, *, layers=None, lease_id=0, verify=True, timeout=None):
        """The records of `hashes`, in order: a list of bytes, None where a
        block is missing. layers: (begin, count) for only those layers.
        verify: parse each record (CRC32C and layout) and raise on a bad one."""
        begin, count = layers or (0, 0)
        request = cache_pb2.GetRequest(kv_namespace=check_namespace(ns), layout=layout.to_proto(),
                                       block_hashes=list(hashes), layer_begin=begin, layer_count=count,
                                       lease_id=lease_id)
        out = [None] * len(request.block_hashes)
        try:
            for answer in self._stub.Get(request, timeout=self._deadline(timeout)):
                if answer.WhichOneof("result") == "data":
                    if verify:
                        parse_record(answer.data, layout)
                    out[answer.index] = answer.data
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None
        return out

    def release_lease(self, lease_id, *, timeout=None):
        try:
            self._stub.ReleaseLease(cache_pb2.ReleaseLeaseRequest(lease_id=lease_id), timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None

    def stats(self, *, timeout=None):
        """The StatsResponse: per tier capacity, use and counters."""
        try:
            return self._stub.Stats(cache_pb2.StatsRequest(), timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None
