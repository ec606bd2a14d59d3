"""Errors as exceptions that carry a gRPC status code."""
import grpc


class KvtierError(Exception):
    """A call or a check failed; `code` is a grpc.StatusCode, `details` the server's (or our) message."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc(cls, error):
        """From a grpc.RpcError (as raised by a stub)."""
        return cls(error.code(), error.details())


def invalid(details):
    return KvtierError(grpc.StatusCode.INVALID_ARGUMENT, details)
