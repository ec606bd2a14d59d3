"""A client of kvtier-decode (kvtier.v1.Decode). Decode workers serve kvtier
services (prefill nodes): with a tenants file, only a SERVICE tenant's
token or certificate is accepted. End clients call the prefill node."""
from kvtier.channel import ServiceClient
from kvtier.prefill import events
from kvtier.v1 import decode_pb2_grpc, info_pb2


class DecodeClient(ServiceClient):
    """DecodeClient("127.0.0.1:7072", tls_dir=..., token=..., timeout=60)."""

    def __init__(self, target, *, timeout=60.0, **options):
        super().__init__(decode_pb2_grpc.DecodeStub, target, timeout=timeout, **options)

    def info(self, *, timeout=None):
        """The ServerInfo: model_id and one layout a codec (tokens_per_block
        0: any), vocab_size, max_context_tokens, server_version."""
        return self._unary(self._stub.Info, info_pb2.InfoRequest(), timeout)

    def decode(self, request, *, timeout=None):
        """Continues a sequence (a kvtier.v1.DecodeRequest); yields Token
        objects from index 1, then one Finished."""
        for event in self._stream(self._stub.Decode, request, timeout):
            yield from events(event)
