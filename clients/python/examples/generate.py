#!/usr/bin/env python3
"""Ask a prefill node what it serves, then stream a generation.

    kvtier up    # or a kvtier-prefill of your own; note its address
    PYTHONPATH=build/python python3 clients/python/examples/generate.py 127.0.0.1:7071 1,2,3,4,5
"""
import sys

from kvtier import KvtierError, LatentLayout, PrefillClient
from kvtier.layout import CODEC_NAMES
from kvtier.prefill import Token


def main(target, prompt):
    with PrefillClient(target, timeout=60) as prefill:
        info = prefill.info()
        layout = LatentLayout.from_proto(info.layouts[0])
        print(f"{info.server_version}: model {info.model_id}, blocks of {layout.tokens_per_block} tokens in "
              f"{CODEC_NAMES[layout.codec]}, layout id {layout.layout_id:016x}, namespace '{info.default_namespace}'")
        try:
            for event in prefill.generate(prompt, max_new_tokens=16, top_logprobs=2):
                if isinstance(event, Token):
                    print(f"token {event.index}: {event.token_id} (logprob {event.logprob:.3f})")
                else:
                    print(f"finished: {event.usage.generated_tokens} tokens, {event.usage.cached_tokens} of "
                          f"{event.usage.prompt_tokens} prompt tokens from the cache")
        except KvtierError as e:
            sys.exit(f"generate failed: {e.code.name}: {e.details}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7071",
         [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "1,2,3,4,5").split(",")])
