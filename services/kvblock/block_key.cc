#include "services/kvblock/block_key.h"

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier::kvblock {

absl::Status ValidateNamespace(const std::string& ns) {
  if (ns.empty() || ns.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("kv_namespace must be 1-128 bytes, got ", ns.size()));
  }
  for (char c : ns) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError("kv_namespace may hold only [A-Za-z0-9._-]");
    }
  }
  return absl::OkStatus();
}

BlockHash ChainHash(std::string_view namespace_salt, const BlockHash& parent, uint64_t layout_id,
                    std::span<const uint32_t> token_ids) {
  const uint32_t salt_len = static_cast<uint32_t>(namespace_salt.size());
  const uint32_t count = static_cast<uint32_t>(token_ids.size());
  char salt_len_le[4], layout_le[8], count_le[4];
  std::memcpy(salt_len_le, &salt_len, 4);  // little-endian host
  std::memcpy(layout_le, &layout_id, 8);
  std::memcpy(count_le, &count, 4);
  return Sha256({std::string_view(salt_len_le, 4), namespace_salt, HashAsBytes(parent), std::string_view(layout_le, 8),
                 std::string_view(count_le, 4),
                 std::string_view(reinterpret_cast<const char*>(token_ids.data()), token_ids.size_bytes())});
}

std::vector<BlockHash> ComputeBlockChain(std::string_view namespace_salt, uint64_t layout_id, uint32_t tokens_per_block,
                                         std::span<const uint32_t> token_ids) {
  std::vector<BlockHash> chain;
  if (tokens_per_block == 0) return chain;
  const size_t blocks = token_ids.size() / tokens_per_block;
  chain.reserve(blocks);
  BlockHash parent = kNoParent;
  for (size_t i = 0; i < blocks; ++i) {
    parent = ChainHash(namespace_salt, parent, layout_id, token_ids.subspan(i * tokens_per_block, tokens_per_block));
    chain.push_back(parent);
  }
  return chain;
}

std::string_view HashAsBytes(const BlockHash& hash) {
  return std::string_view(reinterpret_cast<const char*>(hash.data()), hash.size());
}

BlockHash RestorePointKey(const BlockHash& block) { return Sha256({"kvtier.v4.restore", HashAsBytes(block)}); }

std::vector<size_t> NewRestorePoints(size_t cached_blocks, size_t restore_blocks, uint32_t every) {
  std::vector<size_t> points;
  for (size_t m = every > 0 ? (cached_blocks / every + 1) * every : restore_blocks; m < restore_blocks; m += every) {
    points.push_back(m);
  }
  if (restore_blocks > cached_blocks) points.push_back(restore_blocks);
  return points;
}

std::string HashToHex(const BlockHash& hash) {
  const std::string_view bytes = HashAsBytes(hash);
  return absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size()));
}

absl::StatusOr<BlockHash> HashFromBytes(std::string_view bytes) {
  BlockHash hash;
  if (bytes.size() != hash.size()) {
    return absl::InvalidArgumentError(absl::StrCat("block hash must be 32 bytes, got ", bytes.size()));
  }
  std::memcpy(hash.data(), bytes.data(), hash.size());
  return hash;
}

}  // namespace kvtier::kvblock
