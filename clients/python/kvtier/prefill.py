"""A client of kvtier-prefill (kvtier.v1.Prefill): generate and info."""
import dataclasses

from kvtier.channel import ServiceClient
from kvtier.tokenizer import EOS, tokenizer_for
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

    def __repr__(self):
        u = self.usage
        return (f"Finished(reason={generation_pb2.FinishReason.Name(self.reason)}, prompt_tokens={u.prompt_tokens}, "
                f"cached_tokens={u.cached_tokens}, generated_tokens={u.generated_tokens}, "
                f"time_to_first_token_us={u.time_to_first_token_us})")


class PrefillClient(ServiceClient):
    """PrefillClient("127.0.0.1:7071", tls_dir=..., token=..., timeout=60)."""

    def __init__(self, target, *, timeout=60.0, **options):
        super().__init__(prefill_pb2_grpc.PrefillStub, target, timeout=timeout, **options)

    def info(self, *, timeout=None):
        """The ServerInfo: model_id, the layout this node writes, vocab_size,
        max_context_tokens, default_namespace, server_version, tokenizer."""
        return self._unary(self._stub.Info, info_pb2.InfoRequest(), timeout)

    def generate(self, prompt_ids, *, max_new_tokens=16, namespace="", temperature=0.0, top_p=0.0, seed=0,
                 stop_token_ids=(), top_logprobs=0, request_id="", timeout=None):
        """Yields Token objects as they stream, then one Finished. The
        deadline covers the whole generation."""
        request = prefill_pb2.GenerateRequest(
            request_id=request_id, kv_namespace=namespace, prompt_token_ids=list(prompt_ids),
            sampling=generation_pb2.SamplingParams(temperature=temperature, top_p=top_p, seed=seed),
            limits=generation_pb2.GenerationLimits(max_new_tokens=max_new_tokens, stop_token_ids=list(stop_token_ids),
                                                   top_logprobs=top_logprobs))
        for event in self._stream(self._stub.Generate, request, timeout):
            yield from events(event)

    def generate_text(self, prompt, *, max_new_tokens=16, stop_at_end_of_text=True, **options):
        """The text the model writes after `prompt` (a str), through the
        tokenizer the server names (tokenizer.py; ValueError without one).
        Takes generate's options; stops at end of text unless told not to."""
        tokenizer = tokenizer_for(self.info())
        stop = list(options.pop("stop_token_ids", ())) + ([EOS] if stop_at_end_of_text else [])
        ids = [e.token_id for e in self.generate(tokenizer.encode(prompt), max_new_tokens=max_new_tokens,
                                                 stop_token_ids=stop, **options) if isinstance(e, Token)]
        return tokenizer.decode(ids)


def events(event):
    """A GenerateResponse or DecodeResponse as Token / Finished."""
    if event.WhichOneof("event") == "token":
        t = event.token
        yield Token(t.index, t.token_id, t.logprob, [(p.token_id, p.logprob) for p in t.top_logprobs])
    elif event.WhichOneof("event") == "finished":
        yield Finished(event.finished.reason, event.finished.usage)
