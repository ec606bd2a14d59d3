"""Block keys: the hash chain (docs/protocol.md, "Block keys").

hash_i = SHA-256(u32 len(namespace) || namespace || hash_{i-1} || u64 layout_id
|| u32 count || u32 token ids...), all little-endian, with 32 zero bytes as
the parent of block 0. Only full blocks have keys.
"""
import hashlib
import re
import struct

import numpy as np

from kvtier.errors import invalid

NO_PARENT = bytes(32)
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_namespace(ns):
    if not isinstance(ns, str) or not _NAMESPACE.fullmatch(ns):
        raise invalid(f"namespace {ns!r}: 1-128 characters of [A-Za-z0-9._-]")
    return ns


def chain_hash(ns, parent, layout_id, token_ids):
    """The key of one block whose parent's key is `parent`."""
    if len(parent) != 32:
        raise ValueError("a parent hash is 32 bytes")
    salt = ns.encode()
    tokens = np.asarray(token_ids, dtype="<u4").tobytes()
    return hashlib.sha256(struct.pack("<I", len(salt)) + salt + bytes(parent) +
                          struct.pack("<QI", layout_id, len(token_ids)) + tokens).digest()


def restore_point_key(block_hash):
    """DeepSeek-V4: the key of the restore point after the block whose key
    is `block_hash`, SHA-256("kvtier.v4.restore" || block_hash)."""
    if len(block_hash) != 32:
        raise ValueError("a block hash is 32 bytes")
    return hashlib.sha256(b"kvtier.v4.restore" + bytes(block_hash)).digest()


def block_hashes(ns, layout, token_ids):
    """Keys of the full blocks of a prompt, first block first."""
    check_namespace(ns)
    per = layout.tokens_per_block
    hashes, parent = [], NO_PARENT
    for start in range(0, len(token_ids) - per + 1, per):
        parent = chain_hash(ns, parent, layout.layout_id, token_ids[start:start + per])
        hashes.append(parent)
    return hashes
