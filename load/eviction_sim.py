#!/usr/bin/python3
"""Which eviction policy would pay on a trace, before building it into
kvtier-cache: replays a Mooncake-format trace (load/trace_gen.py writes
one) against an in-memory model of a cache that holds whole 512-token trace
blocks, for several policies and capacities. It is a model for choosing what
to build, not a measurement: load/trace_replay measures kvtier-cache itself
(pages, codecs, tiers); this counts blocks, which is fast enough to sweep.

Per request: the longest cached prefix of its full blocks is a hit (tokens
weighted), the policy sees that prefix used, then the rest are inserted in
chain order (last to first for the policies that order a Put stream's
blocks so, as kvtier-cache's leaf-first and adaptive do). Policies: lru (a
hit refreshes the prefix first block first, as kvtier-cache's --eviction
lru), leaf-first (last block first, as --eviction leaf-first), radix (the least recently used block with no cached
child goes first), s3fifo (new blocks in a small FIFO, 10% of the room,
moved on to the main one when used again, else to a ghost list), 2q (an
LRU whose new blocks wait in a probation FIFO, 10% of the room, until used
again), adaptive (kvtier-cache's default: leaf-first, but blocks not used
since they were stored go first while they hold more than a share of the
room that ghost hits move, as ARC's target; where room is scarce, blocks
used far more often outlast more recent ones, as far as ghost hits say),
arc (Megiddo and Modha's adaptive replacement cache), and two offline
references: dead-first (adaptive, but a block no later request uses goes
first: reuse known, not its time) and belady (the block used again
farthest ahead goes first), the one the others are measured against.

    python3 load/trace_gen.py --conversations 500 --seed 1 > /tmp/t500.jsonl
    python3 load/eviction_sim.py /tmp/t500.jsonl --fractions 0.01,0.02,0.05,0.1,0.2,0.4
"""
import argparse
import collections
import heapq
import json
import math
import subprocess

from trace_gen import BLOCK as TRACE_BLOCK


def remember(ghosts, block, bound):
    """Adds an evicted block to a bounded FIFO of keys (ghosts), the oldest
    forgotten first."""
    ghosts[block] = True
    if len(ghosts) > bound:
        ghosts.popitem(last=False)


def use_again(blocks, fresh, used):
    """Moves `blocks` out of `fresh` (where they are) to the most recently
    used end of `used`, in order."""
    for b in blocks:
        fresh.pop(b, None)
        used[b] = True
        used.move_to_end(b)


class Lru:
    def __init__(self, capacity, leaf_first=False):
        self.capacity, self.leaf_first, self.blocks = capacity, leaf_first, collections.OrderedDict()

    def __contains__(self, block):
        return block in self.blocks

    def used(self, prefix):
        for b in reversed(prefix) if self.leaf_first else prefix:
            self.blocks.move_to_end(b)

    def insert(self, block, parent):
        self.blocks[block] = parent
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class LeafFirst(Lru):
    stores_leaf_first = True  # a Put stream's blocks ordered behind the one before

    def __init__(self, capacity):
        super().__init__(capacity, leaf_first=True)


class Radix:
    """Evicts the least recently used leaf, as a prefix tree would."""

    def __init__(self, capacity):
        self.capacity, self.time, self.clock = capacity, {}, 0
        self.parent, self.children, self.heap = {}, collections.defaultdict(set), []

    def __contains__(self, block):
        return block in self.time

    def _touch(self, block):
        self.clock += 1
        self.time[block] = self.clock
        heapq.heappush(self.heap, (self.clock, block))

    def used(self, prefix):
        for b in prefix:
            self._touch(b)

    def insert(self, block, parent):
        self.parent[block] = parent
        if parent is not None:
            self.children[parent].add(block)
        self._touch(block)
        while len(self.time) > self.capacity:
            while True:  # entries whose time changed, or that have children, are stale
                t, victim = heapq.heappop(self.heap)
                if self.time.get(victim) == t and not self.children[victim]:
                    break
            del self.time[victim]
            up = self.parent.pop(victim)
            if up is not None:
                self.children[up].discard(victim)
                if up in self.time and not self.children[up]:
                    heapq.heappush(self.heap, (self.time[up], up))


class S3Fifo:
    def __init__(self, capacity, small_share=0.1):
        self.capacity, self.small_room = capacity, max(1, int(capacity * small_share))
        self.small, self.main, self.ghost, self.freq = (collections.OrderedDict(), collections.OrderedDict(),
                                                        collections.OrderedDict(), {})

    def __contains__(self, block):
        return block in self.small or block in self.main

    def used(self, prefix):
        for b in prefix:
            self.freq[b] = min(3, self.freq.get(b, 0) + 1)

    def insert(self, block, parent):
        if block in self.ghost:
            del self.ghost[block]
            self.main[block] = True
        else:
            self.small[block] = True
        self.freq[block] = 0
        while len(self.small) + len(self.main) > self.capacity:
            if len(self.small) >= self.small_room or not self.main:
                b, _ = self.small.popitem(last=False)
                if self.freq.get(b, 0) > 0:
                    self.main[b] = True
                else:
                    remember(self.ghost, b, self.capacity)
            else:
                while True:
                    b, _ = self.main.popitem(last=False)
                    if self.freq.get(b, 0) == 0:
                        break
                    self.freq[b] -= 1
                    self.main[b] = True


class TwoQueue:
    """An LRU whose new blocks wait in a probation FIFO (`probation` of the
    room) and join the LRU only when used again; those the FIFO lets go
    unused are remembered (ghosts) and join the LRU at once if they come
    back."""

    def __init__(self, capacity, probation=0.1):
        self.capacity, self.probation = capacity, probation
        self.fifo, self.lru, self.ghost = (collections.OrderedDict() for _ in range(3))

    def __contains__(self, block):
        return block in self.fifo or block in self.lru

    def used(self, prefix):
        use_again(prefix, self.fifo, self.lru)

    def insert(self, block, parent):
        if block in self.ghost:
            del self.ghost[block]
            self.lru[block] = True
        else:
            self.fifo[block] = True
        while len(self.fifo) + len(self.lru) > self.capacity:
            if self.lru and len(self.fifo) <= self.capacity * self.probation:
                self.lru.popitem(last=False)
            else:
                b, _ = self.fifo.popitem(last=False)
                remember(self.ghost, b, self.capacity)


def arc_move(share, raising, lowering, block, unit, floor=0.0):
    """ARC's target (Megiddo and Modha) as a block is stored: up if it was
    remembered in `raising`, down if in `lowering`, each step `unit` times
    the other's remembered count over this one's, between `floor` and 1;
    the block is forgotten. The share, and whether it was remembered."""
    for mine, other, sign in ((raising, lowering, 1), (lowering, raising, -1)):
        if block in mine:
            step = max(1, len(other) // len(mine)) * unit
            del mine[block]
            return min(1.0, max(floor, share + sign * step)), True
    return share, False


def add_use(score, now):
    """A use score (log2 of the sum of 2**stamp over a block's uses) with
    one more use stamped `now`: kept as a log so that it never overflows."""
    high, low = max(score, now), min(score, now)
    return high + math.log2(1 + 2 ** (low - high))


class Adaptive:
    """kvtier-cache's --eviction adaptive: one leaf-first recency order
    over every block, and a FIFO of the blocks stored and not used since
    (probation). While probation holds more than its share of the room its
    oldest goes first. The share starts at the whole room (leaf-first
    alone) and moves as ARC's target does: a block stored again after
    probation let it go grows it, one stored again after recency let it go
    shrinks it (each step the other kind's remembered count over this
    one's), down to `floor`. Of the blocks on probation, those of a cold
    start (a request that found under a quarter of its blocks cached: a
    one-off, perhaps after a shared system prompt, or a prefix long gone)
    go before those that continue a cached prefix, oldest first in each.

    Else the victim is recency's (the least recently used of all) or
    frequency's (the lowest use score: each store or hit of a block counts
    one, halved for every `half_life` fills of the room since, remembered
    for evicted blocks; among equal scores a prompt's later block first).
    Frequency may choose only where room is scarce (the share on probation
    at most a half) and recency's victim was used at least twice as much;
    then a weight picks, as many of frequency's victims as its share: it
    starts at none (leaf-first) and moves as the hits say, one of recency's
    victims stored again towards frequency, one of frequency's towards
    recency, in ARC's steps."""
    stores_leaf_first = True

    def __init__(self, capacity, floor=0.1, half_life=8):
        self.c, self.floor, self.share = capacity, floor, 1.0
        self.order, self.probation = collections.OrderedDict(), collections.OrderedDict()
        self.cold, self.cold_start = collections.OrderedDict(), False
        self.gone_on_probation, self.gone_used = collections.OrderedDict(), collections.OrderedDict()
        # Frequency: the clock counts blocks stored; each block's key
        # (score, tie), and a heap of keys, stale entries skipped.
        self.half_life, self.clock, self.now = half_life * max(1, capacity), 0, 0.0
        self.key, self.heap, self.tie = {}, [], 0
        self.remembered = collections.OrderedDict()  # evicted blocks' scores
        self.weight, self.due = 0.0, 0.0  # frequency's share of the victims, and what it is owed
        self.gone_by_recency, self.gone_by_frequency = collections.OrderedDict(), collections.OrderedDict()

    def __contains__(self, block):
        return block in self.order

    def starts(self, matched, blocks):
        """A request of `blocks` full blocks whose first `matched` were
        cached: the blocks it then inserts are a cold start's or not, as a
        kvtier client marks its Put (cold_start)."""
        self.cold_start = is_cold_start(matched, blocks)

    def _use(self, block, score):
        self.tie += 1
        self.key[block] = (score, self.tie)
        heapq.heappush(self.heap, (score, self.tie, block))

    def used(self, prefix):
        self.now = self.clock / self.half_life  # every request's, before it stores: its stores' stamp too
        use_again(reversed(prefix), self.probation, self.order)
        for b in reversed(prefix):  # the last first: among equal scores it goes first
            self.cold.pop(b, None)
            self._use(b, add_use(self.key[b][0], self.now))

    def insert(self, block, parent):
        while block not in self.order and len(self.order) >= self.c:  # room first, as the store makes it
            self.evict()
        unit = 1 / max(1, self.c)
        self.share, returning = arc_move(self.share, self.gone_on_probation, self.gone_used, block, unit, self.floor)
        if not returning:
            self.probation[block] = True
            if self.cold_start:
                self.cold[block] = True
        self.weight, _ = arc_move(self.weight, self.gone_by_recency, self.gone_by_frequency, block, unit)
        before = self.remembered.pop(block, None)
        self._use(block, self.now if before is None else add_use(before, self.now))
        self.clock += 1
        self.order[block] = True

    def least_frequent(self):
        while True:
            score, tie, block = self.heap[0]
            if self.key.get(block) == (score, tie):
                return block
            heapq.heappop(self.heap)

    def evict(self):
        gone_by = None
        if len(self.probation) > self.share * self.c:
            victim = next(iter(self.cold or self.probation))
        else:
            victim, by_frequency = next(iter(self.order)), self.least_frequent()
            if by_frequency != victim and self.frequency_may_choose(victim, by_frequency):
                self.due += self.weight
                gone_by = self.gone_by_recency
                if self.due >= 1:
                    self.due -= 1
                    victim, gone_by = by_frequency, self.gone_by_frequency
        self.drop(victim)
        if gone_by is not None:
            remember(gone_by, victim, self.c)

    def frequency_may_choose(self, by_recency, by_frequency):
        """Only where room is scarce (probation within half the room: used
        blocks were lost to recency) and recency's victim was used at least
        twice as much as frequency's."""
        return self.share <= 0.5 and self.key[by_recency][0] - self.key[by_frequency][0] >= 1

    def drop(self, victim):
        del self.order[victim]
        on_probation = self.probation.pop(victim, None) is not None
        self.cold.pop(victim, None)
        remember(self.gone_on_probation if on_probation else self.gone_used, victim, self.c)
        self.remembered[victim] = self.key.pop(victim)[0]
        if len(self.remembered) > 4 * self.c:
            self.remembered.popitem(last=False)


class Arc:
    def __init__(self, capacity):
        self.c, self.p = capacity, 0
        self.t1, self.t2, self.b1, self.b2 = (collections.OrderedDict() for _ in range(4))

    def __contains__(self, block):
        return block in self.t1 or block in self.t2

    def used(self, prefix):
        use_again(prefix, self.t1, self.t2)

    def _replace(self, block):
        if self.t1 and (len(self.t1) > self.p or (block in self.b2 and len(self.t1) == self.p)):
            b, _ = self.t1.popitem(last=False)
            self.b1[b] = True
        elif self.t2:
            b, _ = self.t2.popitem(last=False)
            self.b2[b] = True
        else:
            b, _ = self.t1.popitem(last=False)
            self.b1[b] = True

    def insert(self, block, parent):
        if block in self.b1:
            self.p = min(self.c, self.p + max(len(self.b2) // max(1, len(self.b1)), 1))
            self._replace(block)
            del self.b1[block]
            self.t2[block] = True
            return
        if block in self.b2:
            self.p = max(0, self.p - max(len(self.b1) // max(1, len(self.b2)), 1))
            self._replace(block)
            del self.b2[block]
            self.t2[block] = True
            return
        in_l1 = len(self.t1) + len(self.b1)
        everything = in_l1 + len(self.t2) + len(self.b2)
        if in_l1 == self.c:
            if len(self.t1) < self.c:
                self.b1.popitem(last=False)
                self._replace(block)
            else:
                self.t1.popitem(last=False)
        elif everything >= self.c:
            if everything == 2 * self.c:
                self.b2.popitem(last=False)
            self._replace(block)
        self.t1[block] = True


def next_uses(requests):
    """For each block access, in the order hit_rate makes them, when that
    block is accessed next (inf: never); what Belady needs, once a trace."""
    accesses = [b for r in requests for b in full_blocks(r)]
    out, last = [0] * len(accesses), {}
    for i in range(len(accesses) - 1, -1, -1):
        out[i] = last.get(accesses[i], math.inf)
        last[accesses[i]] = i
    return out


class Belady:
    """Offline, knowing the whole trace (next_uses): the block whose next
    use is farthest goes first (one never used again, before any). Per
    block the best any policy can do; with hits counted by prefix, a
    reference rather than a proven bound."""

    def __init__(self, capacity, next_use):
        self.capacity, self.next_use = capacity, next_use
        self.at, self.resident, self.heap = 0, {}, []

    def __contains__(self, block):
        return block in self.resident

    def _access(self, block):
        n = self.next_use[self.at]
        self.at += 1
        self.resident[block] = n
        heapq.heappush(self.heap, (-n, self.at, block))

    def used(self, prefix):
        for b in prefix:
            self._access(b)

    def insert(self, block, parent):
        self._access(block)
        while len(self.resident) > self.capacity:
            n, _, b = heapq.heappop(self.heap)
            if self.resident.get(b) == -n:
                del self.resident[b]


def last_uses(requests):
    """For each block, the number of the last request that uses it; what
    DeadFirst needs, once a trace."""
    return {b: i for i, r in enumerate(requests) for b in full_blocks(r)}


class DeadFirst(Adaptive):
    """Offline, knowing which blocks are used again but not when
    (last_uses): adaptive, except that a block no later request uses goes
    before any other, oldest first. What predicting reuse perfectly would
    add to adaptive; Belady also knows when."""

    def __init__(self, capacity, last_use):
        super().__init__(capacity)
        self.last_use, self.request, self.dead = last_use, -1, collections.OrderedDict()

    def starts(self, matched, blocks):
        super().starts(matched, blocks)
        self.request += 1

    def _note(self, block):
        if self.last_use[block] == self.request:
            self.dead[block] = True

    def used(self, prefix):
        super().used(prefix)
        for b in prefix:
            self._note(b)

    def insert(self, block, parent):
        super().insert(block, parent)
        self._note(block)

    def evict(self):
        if not self.dead:
            super().evict()
            return
        victim, _ = self.dead.popitem(last=False)
        self.drop(victim)


POLICIES = {"lru": Lru, "leaf-first": LeafFirst, "radix": Radix, "s3fifo": S3Fifo, "2q": TwoQueue, "adaptive": Adaptive,
            "arc": Arc}


def read_trace(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def full_blocks(request):
    """The ids of a request's full blocks: only those are kept."""
    return request["hash_ids"][:request["input_length"] // TRACE_BLOCK]


def is_cold_start(matched, blocks):
    """A request that found under a quarter of its blocks cached, as
    kvtier's clients decide (cache::IsColdStart)."""
    return 4 * matched < blocks


def hit_rate(requests, policy):
    """Token-weighted share of prompt tokens found cached."""
    hits = total = 0
    for r in requests:
        blocks = full_blocks(r)
        matched = 0
        while matched < len(blocks) and blocks[matched] in policy:
            matched += 1
        hits += matched * TRACE_BLOCK
        total += r["input_length"]
        if hasattr(policy, "starts"):
            policy.starts(matched, len(blocks))
        policy.used(blocks[:matched])
        rest = range(matched, len(blocks))
        for i in reversed(rest) if getattr(policy, "stores_leaf_first", False) else rest:
            policy.insert(blocks[i], blocks[i - 1] if i > 0 else None)
    return hits / total if total else 0.0


def working_set(requests):
    return len({b for r in requests for b in full_blocks(r)})


# The policies kvtier-cache has (--eviction), which --against-cache runs.
CACHE_POLICIES = ("lru", "leaf-first", "adaptive")

# What --against-cache stores: one layer of V2-Lite's int8 latents for each
# 512-token trace block, in 4 KiB pages, so that one kvtier block is one
# trace block and a budget of n blocks' pages holds n of them.
REPLAY_FLAGS = ["--layers", "1", "--layouts", "int8", "--page-size", "4096", "--tokens-per-block", str(TRACE_BLOCK)]
PAGE = 4096


def replay(binary, trace, policies, budgets, limit=0):
    """Hit rates of a real kvtier-cache (load/trace_replay) per (policy, budget in bytes)."""
    out = subprocess.run([binary, "--trace", trace, *REPLAY_FLAGS, "--evictions", ",".join(policies), "--budgets",
                          ",".join(str(b) for b in budgets), "--limit", str(limit), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return {(r["eviction"], r["budget_bytes"]): r for r in json.loads(out)}


def against_cache(binary, trace, requests, size, fractions, policies):
    """The model's hit rates beside the real cache's on the same trace and
    rooms (in blocks), and the largest difference."""
    block = replay(binary, trace, policies[:1], [1 << 20], limit=1)
    pages = -(-next(iter(block.values()))["block_bytes"] // PAGE)
    rooms = [max(1, int(size * f)) for f in fractions]
    cache = replay(binary, trace, policies, [room * pages * PAGE for room in rooms])
    print(f"{'room':>6} {'blocks':>7} " + " ".join(f"{n + ' model/cache':>24}" for n in policies))
    worst = 0.0
    for fraction, room in zip(fractions, rooms):
        cells = []
        for n in policies:
            model = hit_rate(requests, POLICIES[n](room))
            real = cache[(n, room * pages * PAGE)]["hit_rate"]
            worst = max(worst, abs(model - real))
            cells.append(f"{model:>11.3f} /{real:>11.3f}")
        print(f"{fraction:>6.0%} {room:>7} " + " ".join(cells), flush=True)
    print(f"largest difference, model against cache: {worst * 100:.2f} points")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="JSON lines: timestamp, input_length, output_length, hash_ids")
    p.add_argument("--fractions", default="0.02,0.05,0.1,0.2,0.4", help="capacities, as shares of the working set")
    p.add_argument("--policies", help="of " + ", ".join(POLICIES) + ", and two offline references: dead-first "
                                      "(adaptive, but blocks never used again go first) and belady (the next use "
                                      "farthest goes first); default all (with --against-cache, the cache's)")
    p.add_argument("--against-cache", metavar="TRACE_REPLAY",
                   help="also replay the trace through a real kvtier-cache with load/trace_replay (this binary) "
                        "at the same rooms, for " + ", ".join(CACHE_POLICIES) + " (the policies it has)")
    args = p.parse_args()
    requests = read_trace(args.trace)
    size = working_set(requests)
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.against_cache:
        print(f"{len(requests)} requests, working set {size} blocks of {TRACE_BLOCK} tokens")
        policies = args.policies.split(",") if args.policies else list(CACHE_POLICIES)
        if not set(policies) <= set(CACHE_POLICIES):
            p.error("--against-cache runs only " + ", ".join(CACHE_POLICIES))
        against_cache(args.against_cache, args.trace, requests, size, fractions, policies)
        return
    names = args.policies.split(",") if args.policies else [*POLICIES, "dead-first", "belady"]
    unknown = set(names) - set(POLICIES) - {"dead-first", "belady"}
    if unknown:
        p.error("no policy " + ", ".join(sorted(unknown)))
    offline = {}  # the references that read the whole trace first
    if "belady" in names:
        future = next_uses(requests)
        offline["belady"] = lambda room: Belady(room, future)
    if "dead-first" in names:
        last = last_uses(requests)
        offline["dead-first"] = lambda room: DeadFirst(room, last)
    print(f"{len(requests)} requests, working set {size} blocks of {TRACE_BLOCK} tokens, "
          f"ceiling {hit_rate(requests, Lru(size)):.3f}")
    print(f"{'room':>6} {'blocks':>7} " + " ".join(f"{n:>10}" for n in names))
    for fraction in fractions:
        room = max(1, int(size * fraction))
        rates = [hit_rate(requests, (offline.get(n) or POLICIES[n])(room)) for n in names]
        print(f"{fraction:>6.0%} {room:>7} " + " ".join(f"{r:>10.3f}" for r in rates))


if __name__ == "__main__":
    main()
