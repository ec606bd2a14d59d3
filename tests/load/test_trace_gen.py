"""load/trace_gen.py makes traces of the Mooncake format whose ids are
chained (an id always follows the same ids), whose conversations extend
their own prefixes and share popular system prompts; trace_replay replays
one against a real kvtier-cache. KVTIER_TRACE_REPLAY and
KVTIER_CACHE_BINARY: the built programs."""
import collections
import json
import os
import pathlib
import subprocess
import sys

import pytest

LOAD = pathlib.Path(__file__).resolve().parents[2] / "load"
sys.path.insert(0, str(LOAD))
import trace_gen  # noqa: E402


def generate(*flags):
    out = subprocess.run([sys.executable, str(LOAD / "trace_gen.py"), *flags], capture_output=True, text=True,
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_requests_are_well_formed_sorted_and_reproducible():
    trace = generate("--conversations", "60", "--seed", "7")
    assert trace == generate("--conversations", "60", "--seed", "7")
    assert trace != generate("--conversations", "60", "--seed", "8")
    assert [r["timestamp"] for r in trace] == sorted(r["timestamp"] for r in trace)
    for r in trace:
        assert set(r) == {"timestamp", "input_length", "output_length", "hash_ids"}
        assert len(r["hash_ids"]) == -(-r["input_length"] // 512)
        assert r["output_length"] > 0


def test_ids_are_chained_and_turns_extend_their_conversation():
    trace = generate("--conversations", "80", "--seed", "3", "--turns", "5")
    before = {}
    for r in trace:
        for k, block in enumerate(r["hash_ids"]):
            # A chain: the same id always comes after the same ids.
            assert before.setdefault(block, tuple(r["hash_ids"][:k])) == tuple(r["hash_ids"][:k])
    # Later turns reuse all the whole blocks of an earlier prompt.
    extended = sum(1 for a in trace for b in trace if a is not b and a["input_length"] >= 512
                   and b["hash_ids"][:a["input_length"] // 512] == a["hash_ids"][:a["input_length"] // 512]
                   and b["timestamp"] > a["timestamp"])
    assert extended > len(trace) // 4


def test_popular_system_prompts_are_shared_zipf_wise():
    trace = generate("--conversations", "400", "--seed", "5", "--turns", "1", "--system-prompts", "10",
                     "--system-tokens", "1500")
    first = collections.Counter(r["hash_ids"][0] for r in trace if r["input_length"] >= 512)
    counts = sorted(first.values(), reverse=True)
    assert counts[0] > 3 * counts[-1], counts
    assert len(counts) <= 10 + 5  # system prompts (shorter ones start with a message's id)


def test_weights_follow_zipf():
    w = trace_gen.zipf_weights(4, 1.0)
    assert w == [1.0, 0.5, 1 / 3, 0.25]


@pytest.mark.skipif("KVTIER_TRACE_REPLAY" not in os.environ, reason="needs the built trace_replay")
def test_replay_of_a_generated_trace_reaches_the_ceiling_only_with_room(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in generate("--conversations", "40", "--seed", "2")))
    out = subprocess.run([os.environ["KVTIER_TRACE_REPLAY"], "--cache-binary", os.environ["KVTIER_CACHE_BINARY"],
                          "--trace", str(trace), "--layers", "1", "--layouts", "int8,bf16",
                          "--budgets", "8MiB,512MiB", "--json"], capture_output=True, text=True, check=True).stdout
    runs = {(r["layout"], r["budget_bytes"]): r for r in json.loads(out)}
    ceiling = runs[("int8", 512 << 20)]["ceiling_rate"]
    assert ceiling > 0.3
    for layout in ("int8", "bf16"):
        assert runs[(layout, 512 << 20)]["hit_rate"] == ceiling  # room for every block
        assert runs[(layout, 8 << 20)]["hit_rate"] < ceiling
        assert runs[(layout, 8 << 20)]["evictions"] > 0
    # Smaller blocks, more of them kept in the same memory.
    assert runs[("int8", 8 << 20)]["hit_rate"] > runs[("bf16", 8 << 20)]["hit_rate"]


@pytest.mark.skipif("KVTIER_TRACE_REPLAY" not in os.environ, reason="needs the built trace_replay")
def test_replay_stores_v3_layouts_expanded_ones_in_parts(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in generate("--conversations", "10", "--seed", "3")))
    out = subprocess.run([os.environ["KVTIER_TRACE_REPLAY"], "--cache-binary", os.environ["KVTIER_CACHE_BINARY"],
                          "--trace", str(trace), "--model", "v3", "--layers", "1", "--layouts", "int8,expanded",
                          "--budgets", "512MiB", "--json"], capture_output=True, text=True, check=True).stdout
    runs = {r["layout"]: r for r in json.loads(out)}
    assert all(r["model"] == "v3" for r in runs.values())
    # V3's expanded layer is 128 heads x (128 + 64 + 128) bf16 values a token
    # (stored as 4 parts of 10,240); its latent one 512 + 64 in int8.
    assert runs["expanded"]["block_bytes"] > 64 * 128 * 320 * 2
    assert runs["expanded"]["block_bytes"] < 1.01 * 64 * 128 * 320 * 2
    assert runs["int8"]["block_bytes"] < runs["expanded"]["block_bytes"] / 100
    # 512 MiB holds every int8 block, and a hundred expanded ones.
    assert runs["int8"]["hit_rate"] == runs["int8"]["ceiling_rate"] > 0.3
    assert 0 < runs["expanded"]["hit_rate"] < runs["int8"]["hit_rate"]
    bad = subprocess.run([os.environ["KVTIER_TRACE_REPLAY"], "--trace", str(trace), "--model", "v4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--model v4 is not v2-lite, v3, v3.2, kimi-k2 or v4-flash" in bad.stderr
    # V4-Flash stores its entries in its own FP8 only, in blocks of whole
    # 128-token groups.
    for flags, says in ((["--layouts", "int8"], "v4-flash stores its entries in its own FP8"),
                        (["--layouts", "fp8", "--tokens-per-block", "64"], "does not divide tokens_per_block 64"),
                        (["--layouts", "fp8", "--write-back"], "--write-back is not modelled for v4-flash")):
        bad = subprocess.run([os.environ["KVTIER_TRACE_REPLAY"], "--trace", str(trace), "--model", "v4-flash"] + flags,
                             capture_output=True, text=True)
        assert bad.returncode == 2 and says in bad.stderr, (flags, bad.stderr)


@pytest.mark.skipif("KVTIER_TRACE_REPLAY" not in os.environ, reason="needs the built trace_replay")
def test_replay_of_v32_layouts_carries_the_indexer_keys(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in generate("--conversations", "10", "--seed", "4")))
    runs = {}
    for model in ("v3", "v3.2"):
        out = subprocess.run([os.environ["KVTIER_TRACE_REPLAY"], "--cache-binary", os.environ["KVTIER_CACHE_BINARY"],
                              "--trace", str(trace), "--model", model, "--layers", "2", "--layouts", "int4",
                              "--budgets", "512MiB", "--json"], capture_output=True, text=True, check=True).stdout
        runs.update({(model, r["layout"]): r for r in json.loads(out)})
    # V3.2's blocks: V3's latents, plus 64 tokens' keys (128 FP8 codes and a
    # scale) in each of the 2 layers, and format 2's 8 more header bytes.
    assert runs[("v3.2", "int4")]["block_bytes"] == runs[("v3", "int4")]["block_bytes"] + 2 * 64 * 132 + 8
    assert runs[("v3.2", "int4")]["hit_rate"] == runs[("v3.2", "int4")]["ceiling_rate"] > 0.3


def test_one_off_prompts_are_long_and_never_reused():
    plain = generate("--conversations", "60", "--seed", "11")
    mixed = generate("--conversations", "60", "--seed", "11", "--one-off-rate", "0.5", "--one-off-tokens", "6000")
    assert [r["timestamp"] for r in mixed] == sorted(r["timestamp"] for r in mixed)
    conversations = {i for r in plain for i in r["hash_ids"]}
    one_offs = [r for r in mixed if not set(r["hash_ids"]) & conversations]
    assert [r for r in mixed if r not in one_offs] == plain, "the conversations changed"
    seen = collections.Counter(i for r in mixed for i in r["hash_ids"])
    assert all(seen[i] == 1 for r in one_offs for i in r["hash_ids"]), "a one-off block was used again"
    # About 0.5 a second over the trace, around 6000 tokens each.
    expected = 0.5 * plain[-1]["timestamp"] / 1000
    assert 0.6 * expected < len(one_offs) < 1.4 * expected, (len(one_offs), expected)
    assert 4000 < sum(r["input_length"] for r in one_offs) / len(one_offs) < 8000


def test_one_off_prompts_may_begin_with_a_system_prompt():
    # Enough conversations that each of the 20 system prompts begins one.
    plain = generate("--conversations", "400", "--seed", "11")
    mixed = generate("--conversations", "400", "--seed", "11", "--one-off-rate", "0.5", "--one-off-system")
    one_offs = [r for r in mixed if r not in plain]
    assert [r for r in mixed if r in plain] == plain, "the conversations changed"
    assert len(one_offs) > 5
    firsts = {r["hash_ids"][0] for r in plain}  # where conversations (their system prompts) begin
    seen = collections.Counter(i for r in mixed for i in r["hash_ids"])
    for r in one_offs:
        assert r["hash_ids"][0] in firsts, "a one-off that does not begin with a system prompt"
        shared = [i for i in r["hash_ids"] if seen[i] > 1]
        assert shared == r["hash_ids"][:len(shared)], "what it shares is its head"
        assert len(r["hash_ids"]) - len(shared) >= 4, "then a document of its own"
