"""Text to token ids and back for models whose server names a byte tokenizer
(ServerInfo.tokenizer "ByT5Tokenizer": byte b is id b + 3; 0, 1, 2 are pad,
end of text and unknown). Ids are the wire format; this is the client's
side of `kvtier generate --prompt`."""

BYTE_TOKENIZER = "ByT5Tokenizer"
PAD, EOS, UNK, BYTE_OFFSET = 0, 1, 2, 3


class ByteTokenizer:
    """Stateless: encode(str) -> ids, decode(ids) -> str."""

    @staticmethod
    def encode(text):
        return [b + BYTE_OFFSET for b in text.encode("utf-8")]

    @staticmethod
    def decode(ids):
        """The bytes of byte ids, special ids left out; a broken UTF-8
        sequence (a character cut off) becomes U+FFFD."""
        data = bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < BYTE_OFFSET + 256)
        return data.decode("utf-8", errors="replace")


def tokenizer_for(info):
    """The tokenizer of a server's ServerInfo; ValueError naming it when
    the model has none or one this client does not know."""
    if not info.tokenizer:
        raise ValueError("the server's model has no tokenizer; give token ids")
    if info.tokenizer != BYTE_TOKENIZER:
        raise ValueError(f"tokenizer {info.tokenizer!r} is not one kvtier knows (only {BYTE_TOKENIZER}); "
                         "give token ids")
    if info.vocab_size < BYTE_OFFSET + 256:
        raise ValueError(f"{BYTE_TOKENIZER} needs {BYTE_OFFSET + 256} ids; the model has {info.vocab_size}")
    return ByteTokenizer()
