"""load/eviction_sim.py on a trace small enough to work out by hand: room
for three blocks, then a request that needs the blocks each policy kept."""
import pathlib
import subprocess
import sys

import pytest

LOAD = pathlib.Path(__file__).resolve().parents[2] / "load"
sys.path.insert(0, str(LOAD))
import eviction_sim  # noqa: E402

# Prompt tokens 1024 + 1536 + 512 + 1536 = 4608.
TRACE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
    {"timestamp": 1, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},  # hits 1, 2
    {"timestamp": 2, "input_length": 512, "output_length": 1, "hash_ids": [4]},  # one block must go
    {"timestamp": 3, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]},
]


@pytest.mark.parametrize("policy, hit_tokens", [
    ("lru", 1024),  # 1 (oldest, the prefix's head) goes: the last request misses from its start
    ("leaf-first", 1536),  # 2 goes: the last request hits 1
    ("radix", 2048),  # 3, the oldest leaf, goes: the last request hits 1 and 2
])
def test_each_policy_keeps_what_it_should(policy, hit_tokens):
    assert eviction_sim.hit_rate(TRACE, eviction_sim.POLICIES[policy](3)) == pytest.approx(hit_tokens / 4608)


@pytest.mark.parametrize("policy", sorted(eviction_sim.POLICIES))
def test_with_room_for_everything_every_policy_reaches_the_ceiling(policy):
    assert eviction_sim.working_set(TRACE) == 4
    assert eviction_sim.hit_rate(TRACE, eviction_sim.POLICIES[policy](4)) == pytest.approx(2560 / 4608)


def test_the_command_prints_a_row_per_room(tmp_path):
    trace = tmp_path / "t.jsonl"
    subprocess.run([sys.executable, str(LOAD / "trace_gen.py"), "--conversations", "40", "--seed", "3"],
                   stdout=trace.open("w"), check=True)
    out = subprocess.run([sys.executable, str(LOAD / "eviction_sim.py"), str(trace), "--fractions", "0.1,1"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    ceiling = float(out[0].rsplit(" ", 1)[1])
    assert out[1].split()[:2] == ["room", "blocks"] and len(out) == 4
    # With room for the whole working set, every policy is at the ceiling.
    references = 2  # dead-first and belady
    assert [float(v) for v in out[3].split()[2:]] == pytest.approx(
        [ceiling] * (len(eviction_sim.POLICIES) + references), abs=1e-3)


def test_dead_first_lets_go_what_no_later_request_uses():
    # a, b, c, then a again, room for two: a is the oldest and, for
    # adaptive, a cold start's block like the others, so c pushes it out;
    # knowing b and c are never used again, dead-first lets b go.
    trace = [{"timestamp": t, "input_length": 512, "output_length": 1, "hash_ids": [b]} for t, b in enumerate("abca")]
    assert eviction_sim.hit_rate(trace, eviction_sim.Adaptive(2)) == 0
    dead_first = eviction_sim.DeadFirst(2, eviction_sim.last_uses(trace))
    assert eviction_sim.hit_rate(trace, dead_first) == pytest.approx(512 / 2048)
    assert "a" in dead_first and "b" not in dead_first


def test_two_queue_lets_blocks_used_once_go_first():
    q = eviction_sim.TwoQueue(4, probation=0.25)
    q.insert("a", None)
    q.used(["a"])  # used again: in the LRU
    for b in "bcd":
        q.insert(b, None)  # first use: on probation
    q.insert("e", None)  # full: the oldest on probation goes, not "a", older but used twice
    assert "a" in q and "b" not in q
    q.insert("b", None)  # back from its ghost: straight into the LRU
    for b in "fg":
        q.insert(b, None)
    assert "a" in q and "b" in q
    assert not any(b in q for b in "cde")


def feed(policy, blocks):
    for b in blocks:
        if b in policy:
            policy.used([b])
        else:
            policy.insert(b, None)


def test_adaptive_keeps_a_hot_block_that_one_offs_push_out_of_an_lru():
    # Room for five; each round the hot block, then six blocks never seen
    # again: recency alone loses the hot block every round.
    def rounds(policy):
        found, fresh = [], iter(range(10**6))
        for _ in range(8):
            found.append("hot" in policy)
            feed(policy, ["hot"] + [next(fresh) for _ in range(6)])
        return found
    assert not any(rounds(eviction_sim.LeafFirst(5))[1:])
    adaptive = eviction_sim.Adaptive(5)
    assert all(rounds(adaptive)[4:])
    assert adaptive.share < 1


def test_adaptive_keeps_blocks_used_most_when_they_outnumber_the_room():
    # Room for five; each round three hot blocks, then three new blocks
    # each used once right after it is stored (off probation at once):
    # recency loses a hot block every round, and the next before its turn.
    def rounds(policy):
        found, fresh = [], iter(range(10**6))
        for _ in range(16):
            found.append(0)
            for b in ["h1", "h2", "h3"] + [next(fresh) for _ in range(3)]:
                found[-1] += b in policy  # as each is wanted
                feed(policy, [b])
                policy.used([b])
        return found
    assert not any(rounds(eviction_sim.LeafFirst(5))[1:])
    assert not any(rounds(eviction_sim.Lru(5))[1:])
    adaptive = eviction_sim.Adaptive(5)
    assert rounds(adaptive)[-4:] == [3] * 4
    assert adaptive.weight > 0 and adaptive.share <= 0.5


def test_adaptive_gives_up_what_leaf_first_does_when_everything_is_reused():
    # Each block used right after it is stored, and some again later,
    # more than fit: found or missed as under leaf-first, block by block,
    # even after a share moved by one-offs.
    adaptive, leaf_first = eviction_sim.Adaptive(10), eviction_sim.LeafFirst(10)
    fresh = iter(range(-1, -10**6, -1))
    for _ in range(8):
        feed(adaptive, ["hot"] + [next(fresh) for _ in range(12)])
    assert adaptive.share < 1
    for i in range(2000):
        for b in ([i, i - 5, i - 12] if i >= 12 else [i]):
            assert (b in adaptive) == (b in leaf_first)
            for policy in (adaptive, leaf_first):
                feed(policy, [b])
                policy.used([b])


def test_adaptive_lets_a_cold_start_go_before_a_continued_prefix():
    a = eviction_sim.Adaptive(4)
    a.share = 0.5  # probation may hold two blocks

    def request(prefix, new, blocks):
        a.starts(len(prefix), blocks)
        a.used(prefix)
        for b in new:
            a.insert(b, None)
    request([], ["p"], 1)
    request(["p"], ["w1"], 2)  # continues a cached prefix
    request([], ["c1", "c2"], 2)  # a cold start: none of its prefix cached
    request(["p"], ["w2"], 2)  # full, and probation over its share: a cold block goes, though w1 is older
    assert "w1" in a and "w2" in a and "c1" not in a and "c2" in a
    request(["p"], ["w3", "c3", "c4", "c5"], 5)  # one block of five found: a cold start too
    assert "w1" in a and "c2" not in a and "w3" not in a


def test_a_cold_start_is_under_a_quarter_of_the_blocks_found():
    assert eviction_sim.is_cold_start(0, 1) and eviction_sim.is_cold_start(1, 5)
    assert not eviction_sim.is_cold_start(1, 4) and not eviction_sim.is_cold_start(2, 2)


def test_belady_lets_the_block_never_used_again_go():
    # Room for three: block 4 is never used again, so it goes at once and
    # the last request hits all of 1, 2 and 3: the ceiling with less room.
    future = eviction_sim.next_uses(TRACE)
    assert eviction_sim.hit_rate(TRACE, eviction_sim.Belady(3, future)) == pytest.approx(2560 / 4608)
    assert eviction_sim.hit_rate(TRACE, eviction_sim.Belady(2, future)) < 2560 / 4608
