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
    assert [float(v) for v in out[3].split()[2:]] == pytest.approx([ceiling] * 5, abs=1e-3)
