"""A client of kvtier-decode (kvtier.v1.Decode). Decode workers serve kvtier
services (prefill nodes): with a tenants file, only a SERVICE tenant's
token or certificate is accepted. End clients call the prefill node."""
import grpc

from kvtier.channel import make_channel
from kvtier.errors import KvtierError
from kvtier.prefill import _events
from kvtier.v1 import decode_pb2_grpc, info_pb2


class DecodeClient:
    """DecodeClient("127.0.0.1:7072", tls_dir=..., token=..., timeout=60)."""

    def __init__(self, target, *, tls_dir=None, token=None, server_name=None, timeout=60.0, channel=None):
        self._channel = channel or make_channel(target, tls_dir=tls_dir, token=token, server_name=server_name)
        self._stub = decode_pb2_grpc.DecodeStub(self._channel)
        self.timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self, *, timeout=None):
        """The ServerInfo: model_id and one layout a codec (tokens_per_block
        0: any), vocab_size, max_context_tokens, server_version."""
        try:
            return self._stub.Info(info_pb2.InfoRequest(), timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None

    def decode(self, request, *, timeout=None):
        """Continues a sequence (a kvtier.v1.DecodeRequest); yields Token
        objects from index 1, then one Finished."""
        try:
            for event in self._stub.Decode(request, timeout=self.timeout if timeout is None else timeout):
                yield from _events(event)
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None
