// Block keys: the hash chain that addresses blocks by content.
//
//   hash_i = SHA-256( u32le(len(salt)) ‖ salt
//                   ‖ hash_{i-1}            (32 zero bytes for block 0)
//                   ‖ u64le(layout_id)
//                   ‖ u32le(token count) ‖ u32le(token id) ... )
//
// The salt is the namespace (tenant), so equal prompts of different tenants
// never share keys; the parent hash makes a key name the whole prefix, not
// just its own tokens. Length prefixes keep the encoding unambiguous.
#ifndef KVTIER_SERVICES_KVBLOCK_BLOCK_KEY_H_
#define KVTIER_SERVICES_KVBLOCK_BLOCK_KEY_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/kvblock/sha256.h"

namespace kvtier::kvblock {

using BlockHash = Sha256Digest;

inline constexpr BlockHash kNoParent{};

// A namespace (tenant) is the salt of its keys. INVALID_ARGUMENT unless
// 1-128 bytes of [A-Za-z0-9._-].
absl::Status ValidateNamespace(const std::string& ns);

BlockHash ChainHash(std::string_view namespace_salt, const BlockHash& parent, uint64_t layout_id,
                    std::span<const uint32_t> token_ids);

// Keys of the full blocks of `token_ids` (a partial tail gets none).
std::vector<BlockHash> ComputeBlockChain(std::string_view namespace_salt, uint64_t layout_id, uint32_t tokens_per_block,
                                         std::span<const uint32_t> token_ids);

// DeepSeek-V4 (block format 3): the key of the restore point after the
// block whose key is `block`, SHA-256("kvtier.v4.restore" ‖ block): a
// client finds it from the chain it already has.
BlockHash RestorePointKey(const BlockHash& block);

// Where a writer of a V4 sequence whose first `cached_blocks` came from
// the cache stores new restore points (as block counts, ascending): after
// each multiple of `every` blocks (0: none) up to `restore_blocks`, and
// after `restore_blocks` itself, where a continuation starts.
std::vector<size_t> NewRestorePoints(size_t cached_blocks, size_t restore_blocks, uint32_t every);

std::string HashToHex(const BlockHash& hash);
std::string_view HashAsBytes(const BlockHash& hash);
// INVALID_ARGUMENT unless `bytes` is exactly 32 bytes.
absl::StatusOr<BlockHash> HashFromBytes(std::string_view bytes);

}  // namespace kvtier::kvblock

#endif  // KVTIER_SERVICES_KVBLOCK_BLOCK_KEY_H_
