"""A client of kvtier-prefill (kvtier.v1.Prefill): generate and info."""
import dataclasses

import grpc

from kvtier.channel import make_channel
from kvtier.errors import KvtierError
from kvtier.v1 import generation_pb2, info_pb2, prefill_pb2, prefill_pb2_grpc


@dataclasses.dataclass
class Token:
    """One generated token: its index, id, logprob and top logprobs [(id, logprob)]."""
    index: int
    token_id: int
    logprob: float
    top_logprobs: list


@dataclasses.dataclass
class Finished:
    """The end of a generation: why (FINISH_REASON_LENGTH or _STOP) and usage
    (prompt_tokens, cached_tokens, generated_tokens, time_to_first_token_us)."""
    reason: int
    usage: object


class PrefillClient:
    """PrefillClient("127.0.0.1:7071", tls_dir=..., token=..., timeout=60)."""

    def __init__(self, target, *, tls_dir=None, token=None, server_name=None, timeout=60.0, channel=None):
        self._channel = channel or make_channel(target, tls_dir=tls_dir, token=token, server_name=server_name)
        self._stub = prefill_pb2_grpc.PrefillStub(self._channel)
        self.timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self, *, timeout=None):
        """The ServerInfo: model_id, the layout this node writes, vocab_size,
        max_context_tokens, default_namespace, server_version."""
        try:
            return self._stub.Info(info_pb2.InfoRequest(), timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None

    def generate(self, prompt_ids, *, max_new_tokens=16, namespace="", temperature=0.0, top_p=0.0, seed=0,
                 stop_token_ids=(), top_logprobs=0, request_id="", timeout=None):
        """Yields Token objects as they stream, then one Finished. The
        deadline covers the whole generation."""
        request = prefill_pb2.GenerateRequest(
            request_id=request_id, kv_namespace=namespace, prompt_token_ids=list(prompt_ids),
            sampling=generation_pb2.SamplingParams(temperature=temperature, top_p=top_p, seed=seed),
            limits=generation_pb2.GenerationLimits(max_new_tokens=max_new_tokens, stop_token_ids=list(stop_token_ids),
                                                   top_logprobs=top_logprobs))
        try:
            for event in self._stub.Generate(request, timeout=self.timeout if timeout is None else timeout):
                yield from _events(event)
        except grpc.RpcError as e:
            raise KvtierError.from_rpc(e) from None


def _events(event):
    """A GenerateResponse or DecodeResponse as Token / Finished."""
    if event.WhichOneof("event") == "token":
        t = event.token
        yield Token(t.index, t.token_id, t.logprob, [(p.token_id, p.logprob) for p in t.top_logprobs])
    elif event.WhichOneof("event") == "finished":
        yield Finished(event.finished.reason, event.finished.usage)
