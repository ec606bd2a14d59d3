"""Channels to kvtier servers: plaintext, TLS, mutual TLS, with a bearer token.

TLS material is read from a directory laid out as a Kubernetes TLS Secret
(what the servers' --tls-dir takes): ca.crt (the CA to trust), and for
mutual TLS tls.crt and tls.key (this client's certificate and key).
"""
import logging
import pathlib
import threading
import time

import grpc

from kvtier.errors import KvtierError, invalid

_log = logging.getLogger("kvtier")

# Records of a few MiB travel in one message.
# round_robin: calls spread over every address the target resolves to (a
# headless Service's pods, dns:///kvtier-prefill.kvtier:7071) instead of all
# riding one connection.
_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20),
            ("grpc.lb_policy_name", "round_robin")]


class _TokenFile:
    """A bearer token read from a file (its first line, as the servers'
    --token-file) and read again at most once every `reload` seconds, so a
    client follows a rotated Kubernetes Secret without a restart. A file
    that becomes unreadable or empty keeps the last good token in force
    and is logged (its path, never a token)."""

    def __init__(self, path, reload):
        self._path = pathlib.Path(path)
        self._reload = reload
        self._lock = threading.Lock()
        token, why = self._read()
        if token is None:
            raise invalid(f"token_file {self._path}: {why}")
        self._token = token
        self._next_read = time.monotonic() + reload
        self._complaint = None  # what the last reading found wrong, said once

    def _read(self):
        try:
            first = self._path.read_text().split("\n", 1)[0]
        except (OSError, UnicodeDecodeError) as e:
            return None, f"cannot be read ({e.__class__.__name__})"
        token = first.strip()
        return (token, None) if token else (None, "its first line is empty")

    def token(self):
        with self._lock:
            if time.monotonic() < self._next_read:
                return self._token
            self._next_read = time.monotonic() + self._reload
            token, why = self._read()
            if token is None:
                if why != self._complaint:
                    _log.warning("token_file %s: %s; the last good token stays in force", self._path, why)
                self._complaint = why
                return self._token
            if token != self._token:
                _log.info("token_file %s: a new token is in force", self._path)
            self._token, self._complaint = token, None
            return token


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor,
             grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call (plaintext or TLS);
    `token` is a function giving the token in force."""

    def __init__(self, token):
        self._token = token

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [("authorization", "Bearer " + self._token())]
        return details._replace(metadata=metadata)  # grpc passes a namedtuple

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


def make_channel(target, *, tls_dir=None, token=None, token_file=None, token_reload=10.0, server_name=None):
    """A channel to HOST:PORT. tls_dir: TLS (mutual when it holds tls.crt and
    tls.key); token: a bearer token sent with every call; token_file
    (instead): a file holding it, read again at most every token_reload
    seconds as it changes; server_name: the name to check the server's
    certificate against, when not the host's."""
    if token and token_file:
        raise invalid("give token or token_file, not both")
    if token_file is not None and not token_reload > 0:
        raise invalid(f"token_reload {token_reload}: must be positive (seconds)")
    bearer = _TokenFile(token_file, token_reload).token if token_file is not None else (lambda: token)
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
    if token or token_file is not None:
        channel = grpc.intercept_channel(channel, _Token(bearer))
    return channel


class ServiceClient:
    """What the clients share: a channel, a default deadline (seconds) for
    every call, and failures raised as KvtierError."""

    def __init__(self, stub_class, target, *, tls_dir=None, token=None, token_file=None, token_reload=10.0,
                 server_name=None, timeout=10.0, channel=None):
        self._channel = channel or make_channel(target, tls_dir=tls_dir, token=token, token_file=token_file,
                                                token_reload=token_reload, server_name=server_name)
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
