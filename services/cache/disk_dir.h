// The disk tier's files: one file per block record, at
// DIR/ns-<namespace>/<hash hex>.kvb, written to a temporary name and renamed
// so a file is either whole or absent. A restart finds the records again by
// scanning, and keeps only those whose checksum verifies. Thread-safe for
// different blocks (BlockStore never touches one block's file from two
// threads at once).
#ifndef KVTIER_SERVICES_CACHE_DISK_DIR_H_
#define KVTIER_SERVICES_CACHE_DISK_DIR_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/kvblock/block_key.h"

namespace kvtier::cache {

struct DiskRecord {
  std::string ns;
  kvblock::BlockHash hash;
  uint64_t layout_id = 0;
  size_t size = 0;
  int64_t mtime_ns = 0;  // for restoring LRU order
};

class DiskDir {
 public:
  // Creates `dir` if needed and removes temporary files a crash left.
  static absl::StatusOr<DiskDir> Open(const std::string& dir);

  // Every verified record under the directory. Files that do not parse or
  // verify are deleted and counted in `corrupt`.
  std::vector<DiskRecord> Scan(uint64_t& corrupt) const;

  absl::Status Write(const std::string& ns, const kvblock::BlockHash& hash,
                     const std::vector<std::span<const uint8_t>>& pieces) const;
  absl::StatusOr<std::string> Read(const std::string& ns, const kvblock::BlockHash& hash,
                                   size_t size) const;
  void Remove(const std::string& ns, const kvblock::BlockHash& hash) const;

 private:
  explicit DiskDir(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& ns, const kvblock::BlockHash& hash) const;

  std::string dir_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_DISK_DIR_H_
