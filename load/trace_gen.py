#!/usr/bin/env python3
"""Makes a request trace in the format of Mooncake's production traces
(FAST'25): JSON lines, one request a line, sorted by time,

    {"timestamp": ms, "input_length": tokens, "output_length": tokens,
     "hash_ids": [ids]}

one id per 512-token block of the prompt (the last may be partial), chained
so that requests whose prompts begin alike share their first ids, and a
block that differs gets a new id, as do all after it.

The shape it draws, so that tests and benchmarks need no outside data:
- system prompts (--system-prompts of them, --system-tokens long on
  average) that conversations share, chosen with Zipf popularity
  (--zipf): a few are most of the traffic;
- conversations arriving as a Poisson process (--rate a second), each of
  --turns turns on average (geometric); a turn's prompt is the whole
  conversation so far (its system prompt, every earlier message and
  answer) and a new user message, so a conversation extends its own
  prefix; after an answer the user thinks (--think-seconds, exponential)
  before the next turn;
- message and answer lengths log-normal around --user-tokens and
  --output-tokens;
- and, the shape that hurts LRU, one-off long prompts (a document pasted
  once, a batch job) arriving as their own Poisson process (--one-off-rate
  a second, 0 by default), log-normal around --one-off-tokens, whose
  blocks no later request reuses: each pushes the hot working set out of
  an LRU cache once, for nothing; with --one-off-system each begins with
  a system prompt (so a cache finds its first blocks), as a document
  pasted into a new chat would.

Usage: trace_gen.py --conversations 200 --seed 1 > trace.jsonl
"""
import argparse
import heapq
import json
import math
import random
import sys

BLOCK = 512  # tokens per hash id


def lognormal(rng, mean, sigma=0.8):
    """A positive integer, log-normal with the given mean."""
    return max(1, int(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))


class Ids:
    """Hands out fresh block ids."""

    def __init__(self):
        self.next = 0

    def fresh(self, n):
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


def zipf_weights(n, s):
    return [1.0 / (rank + 1) ** s for rank in range(n)]


def generate(args):
    rng = random.Random(args.seed)
    ids = Ids()
    # Each system prompt: its length and the ids of its whole blocks, shared
    # by every conversation that starts with it.
    systems = []
    for _ in range(args.system_prompts):
        length = lognormal(rng, args.system_tokens, 0.5)
        systems.append((length, ids.fresh(length // BLOCK)))
    weights = zipf_weights(len(systems), args.zipf)

    requests = []
    # (time of its next turn in ms, conversation number, state)
    pending = []
    start = 0.0
    for c in range(args.conversations):
        start += rng.expovariate(args.rate) * 1000
        length, whole = systems[rng.choices(range(len(systems)), weights)[0]]
        turns = 1  # geometric, mean args.turns
        while rng.random() > 1 / args.turns:
            turns += 1
        heapq.heappush(pending, (start, c, {"context": length, "whole_ids": list(whole), "turns_left": turns}))
    while pending:
        now, c, conversation = heapq.heappop(pending)
        prompt = conversation["context"] + lognormal(rng, args.user_tokens)
        output = lognormal(rng, args.output_tokens)
        blocks = -(-prompt // BLOCK)
        known = conversation["whole_ids"][:blocks]
        hash_ids = known + ids.fresh(blocks - len(known))
        requests.append({"timestamp": int(now), "input_length": prompt, "output_length": output,
                         "hash_ids": hash_ids})
        conversation["turns_left"] -= 1
        if conversation["turns_left"] == 0:
            continue
        # The prompt's whole blocks stay as they are; the partial last one
        # grows by the answer and the next message: new content, new id.
        conversation["whole_ids"] = hash_ids[:prompt // BLOCK]
        conversation["context"] = prompt + output
        answer_ms = output * args.ms_per_output_token
        think_ms = rng.expovariate(1 / args.think_seconds) * 1000
        heapq.heappush(pending, (now + answer_ms + think_ms, c, conversation))
    requests += one_offs(rng, ids, args, end_ms=requests[-1]["timestamp"] if requests else 0,
                         systems=systems if args.one_off_system else [], weights=weights)
    requests.sort(key=lambda r: r["timestamp"])  # stable: conversations keep their order
    return requests


def one_offs(rng, ids, args, end_ms, systems, weights):
    """One-off long prompts until `end_ms`: fresh ids, never seen again,
    after one of `systems` (chosen by `weights`) when any are given."""
    out = []
    now = 0.0
    while args.one_off_rate > 0:
        now += rng.expovariate(args.one_off_rate) * 1000
        if now > end_ms:
            break
        prompt = lognormal(rng, args.one_off_tokens, 0.5)
        head = []
        if systems:
            length, head = systems[rng.choices(range(len(systems)), weights)[0]]
            prompt += length - length % BLOCK  # the system prompt's whole blocks, then the document
        out.append({"timestamp": int(now), "input_length": prompt, "output_length": lognormal(rng, args.output_tokens),
                    "hash_ids": list(head) + ids.fresh(-(-prompt // BLOCK) - len(head))})
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--system-prompts", type=int, default=20)
    parser.add_argument("--system-tokens", type=int, default=2000, help="mean system prompt length")
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent of the system prompts' popularity")
    parser.add_argument("--turns", type=float, default=4, help="mean turns a conversation")
    parser.add_argument("--user-tokens", type=int, default=300, help="mean user message length")
    parser.add_argument("--output-tokens", type=int, default=250, help="mean answer length")
    parser.add_argument("--rate", type=float, default=2.0, help="conversations starting a second")
    parser.add_argument("--think-seconds", type=float, default=30.0, help="mean pause between an answer and the next turn")
    parser.add_argument("--ms-per-output-token", type=float, default=20.0)
    parser.add_argument("--one-off-rate", type=float, default=0.0,
                        help="one-off long prompts a second, beside the conversations (0: none)")
    parser.add_argument("--one-off-tokens", type=int, default=8000, help="mean one-off prompt length")
    parser.add_argument("--one-off-system", action="store_true",
                        help="one-off prompts begin with a system prompt (Zipf-chosen, as conversations do), so a "
                             "cache finds their first blocks")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if (args.conversations < 0 or args.system_prompts < 1 or args.rate <= 0 or args.turns < 1
            or args.one_off_rate < 0 or args.one_off_tokens < 1):
        parser.error("--conversations >= 0, --system-prompts >= 1, --rate > 0, --turns >= 1, --one-off-rate >= 0 "
                     "and --one-off-tokens >= 1")
    for request in generate(args):
        sys.stdout.write(json.dumps(request) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
