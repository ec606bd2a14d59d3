"""Channels to kvtier servers: plaintext, TLS, mutual TLS, with a bearer token.

TLS material is read from a directory laid out as a Kubernetes TLS Secret
(what the servers' --tls-dir takes): ca.crt (the CA to trust), and for
mutual TLS tls.crt and tls.key (this client's certificate and key).
"""
import pathlib

import grpc

from kvtier.errors import KvtierError

# Records of a few MiB travel in one message.
# round_robin: calls spread over every address the target resolves to (a
# headless Service's pods, dns:///kvtier-prefill.kvtier:7071) instead of all
# riding one connection.
_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20),
            ("grpc.lb_policy_name", "round_robin")]


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor,
             grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call (plaintext or TLS)."""

    def __init__(self, token):
        self._header = ("authorization", "Bearer " + token)

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._header]
        return details._replace(metadata=metadata)  # grpc passes a namedtuple

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


def make_channel(target, *, tls_dir=None, token=None, server_name=None):
    """A channel to HOST:PORT. tls_dir: TLS (mutual when it holds tls.crt and
    tls.key); token: a bearer token sent with every call; server_name: the
    name to check the server's certificate against, when not the host's."""
    options = list(_OPTIONS)
    if tls_dir is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        d = pathlib.Path(tls_dir)
        cert, key = d / "tls.crt", d / "tls.key"
        mutual = cert.exists() and key.exists()
        credentials = grpc.ssl_channel_credentials(root_certificates=(d / "ca.crt").read_bytes(),
                                                   private_key=key.read_bytes() if mutual else None,
                                                   certificate_chain=cert.read_bytes() if mutual else None)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        channel = grpc.secure_channel(target, credentials, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _Token(token))
    return channel


class ServiceClient:
    """What the clients share: a channel, a default deadline (seconds) for
    every call, and failures raised as KvtierError."""

    def __init__(self, stub_class, target, *, tls_dir=None, token=None, server_name=None, timeout=10.0,
                 channel=None):
        self._channel = channel or make_channel(target, tls_dir=tls_dir, token=token, server_name=server_name)
        self._stub = stub_class(self._channel)
        self.timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _deadline(self, timeout):
        return self.timeout if timeout is None else timeout

    def _unary(self, method, request, timeout):
        try:
            return method(request, timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None

    def _stream(self, method, request, timeout):
        """The answers of a server-streaming call, as they arrive."""
        try:
            yield from method(request, timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None
