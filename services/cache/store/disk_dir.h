// The disk tier's files: one file per block record, at
// DIR/ns-<namespace>/<hash hex>.kvb, written to a temporary name and renamed
// so a file is either whole or absent. Each file starts with the block's
// key and the tenant that stored it, checked with the record's CRC
// (block_format.md, "Disk files"), so a file moved or copied to another
// block's name is refused, never served as that block, and a restart
// charges each block to its tenant again. Everything under DIR is reached relative to the directory
// with O_NOFOLLOW: a symlink planted there is skipped, never followed, and
// nothing outside DIR is read or deleted. A restart finds the records again
// by scanning, and keeps only those that verify. Thread-safe for different
// blocks (BlockStore never touches one block's file from two threads at
// once).
#ifndef KVTIER_SERVICES_CACHE_STORE_DISK_DIR_H_
#define KVTIER_SERVICES_CACHE_STORE_DISK_DIR_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/kvblock/block_key.h"

namespace kvtier::cache {

inline constexpr char kDiskFileMagic[4] = {'K', 'V', 'T', 'D'};
// 1: the bare record, no key; 2: the key, no owner (still read, as nobody's).
inline constexpr uint16_t kDiskFileVersion = 3;
inline constexpr uint16_t kUnownedDiskFileVersion = 2;

struct DiskRecord {
  std::string ns;
  kvblock::BlockHash hash;
  std::string owner;  // the tenant whose Put stored it ("": nobody's)
  uint64_t layout_id = 0;
  size_t size = 0;        // the record's bytes (the file's less its key header)
  int64_t mtime_ns = 0;   // for restoring LRU order
  bool v4_block = false;  // a DeepSeek-V4 block, whose restore point goes with it
};

class DiskDir {
 public:
  // Creates `dir` if needed and locks it for this DiskDir's life:
  // FAILED_PRECONDITION while another process (or DiskDir) holds it.
  static absl::StatusOr<std::unique_ptr<DiskDir>> Open(const std::string& dir);
  ~DiskDir();
  DiskDir(const DiskDir&) = delete;
  DiskDir& operator=(const DiskDir&) = delete;

  // Every verified record under the directory. Files that do not parse or
  // verify (their key, their record) are deleted and counted in `corrupt`;
  // entries that are not plain files and directories are left alone.
  std::vector<DiskRecord> Scan(uint64_t& corrupt) const;

  // Writes `owner`'s record of a block, given as pieces. RESOURCE_EXHAUSTED
  // when the file system is full (ENOSPC, EDQUOT); UNAVAILABLE on other
  // failures. Nothing is left behind on failure.
  absl::Status Write(const std::string& ns, const kvblock::BlockHash& hash, const std::string& owner,
                     const std::vector<std::span<const uint8_t>>& pieces) const;
  // The record of `ns`/`hash`, `size` bytes. NOT_FOUND without a file;
  // DATA_LOSS when the file is not that block's (its key or length).
  absl::StatusOr<std::string> Read(const std::string& ns, const kvblock::BlockHash& hash, size_t size) const;
  void Remove(const std::string& ns, const kvblock::BlockHash& hash) const;
  // Sets a record's file's modification time (Scan's DiskRecord::mtime_ns),
  // where it can: a file it cannot date is found in another order, no worse.
  void SetModified(const std::string& ns, const kvblock::BlockHash& hash, absl::Time when) const;

 private:
  DiskDir(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  // The namespace's directory, opened without following links (-1 and
  // errno when it cannot be; `create` makes it first).
  int OpenNamespace(const std::string& ns, bool create) const;

  const std::string dir_;
  const int fd_;      // DIR, opened once
  int lock_fd_ = -1;  // DIR/.kvtier-lock, locked while open
};

// The key header a disk file of `version` starts with, for a record whose
// CRC32C (its last four bytes) is `record_crc`; version 2 names no owner.
// Exposed for tests.
std::string DiskFileHeader(uint16_t version, const std::string& ns, const kvblock::BlockHash& hash,
                           const std::string& owner, uint32_t record_crc);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_DISK_DIR_H_
