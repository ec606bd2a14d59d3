"""The byte tokenizer: the same ids and the same repaired text as the C++
one (tests/runtime/tokenizer_test.cc has the same cases)."""
import random

import pytest

from kvtier import ByteTokenizer, tokenizer_for
from kvtier.v1 import info_pb2

REPLACEMENT = "\ufffd"


def test_each_byte_is_an_id_and_comes_back():
    t = ByteTokenizer()
    assert t.encode("Hi\n") == [ord("H") + 3, ord("i") + 3, ord("\n") + 3]
    assert t.encode("\u00e9") == [0xC3 + 3, 0xA9 + 3]
    text = "".join(chr(random.randrange(128)) for _ in range(200)) + "caf\u00e9 \u2014 \U0001F642"
    assert t.decode(t.encode(text)) == text


def test_special_ids_are_left_out_and_broken_characters_replaced():
    t = ByteTokenizer()
    a = ord("a") + 3
    assert t.decode([0, a, 1, a, 2, 299]) == "aa"
    cases = {b"x\xc3": "x" + REPLACEMENT, b"\xa9y": REPLACEMENT + "y", b"\xc0\xaf": REPLACEMENT * 2,
             b"\xed\xa0\x80": REPLACEMENT * 3, b"\xe2\x80a\xf0\x9f\x99": REPLACEMENT + "a" + REPLACEMENT}
    for raw, want in cases.items():
        assert t.decode([b + 3 for b in raw]) == want, raw


def test_only_a_byte_tokenizer_over_enough_ids_is_taken():
    assert isinstance(tokenizer_for(info_pb2.ServerInfo(tokenizer="ByT5Tokenizer", vocab_size=259)), ByteTokenizer)
    for info, words in [(info_pb2.ServerInfo(vocab_size=259), "no tokenizer"),
                        (info_pb2.ServerInfo(tokenizer="LlamaTokenizerFast", vocab_size=32000), "LlamaTokenizerFast"),
                        (info_pb2.ServerInfo(tokenizer="ByT5Tokenizer", vocab_size=258), "needs 259")]:
        with pytest.raises(ValueError, match=words):
            tokenizer_for(info)
