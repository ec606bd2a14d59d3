#include "services/cache/store/disk_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/crc32c.h"

namespace kvtier::cache {
namespace {

constexpr char kNamespacePrefix[] = "ns-";
constexpr char kSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".kvb.tmp";
constexpr size_t kFixedHeaderBytes = 8 + 32;  // magic, version, namespace length; hash

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string FileName(const kvblock::BlockHash& hash) { return kvblock::HashToHex(hash) + kSuffix; }

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Reads exactly `size` bytes at `offset`.
bool ReadAll(int fd, void* out, size_t size, off_t offset) {
  auto* at = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = pread(fd, at, size, offset);
    if (n <= 0) return false;
    at += n;
    offset += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Writes all of `bytes`; false (errno set) when it cannot.
bool WriteAll(int fd, std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return true;
}

// An entry of a directory, as lstat sees it.
struct Entry {
  std::string name;
  struct stat st;
};

// The entries of directory `fd` (not closed) that are plain directories
// (`dirs`) or plain files; anything else (a link, a device) is said and
// skipped, never followed.
std::vector<Entry> Entries(int fd, bool dirs, const std::string& where) {
  static RateLimitedLog skipped(LogLevel::kWarning, "disk");
  std::vector<Entry> entries;
  const int copy = dup(fd);
  DIR* dir = copy >= 0 ? fdopendir(copy) : nullptr;
  if (dir == nullptr) {
    if (copy >= 0) close(copy);
    return entries;
  }
  while (const dirent* d = readdir(dir)) {
    Entry e{d->d_name, {}};
    if (e.name == "." || e.name == ".." || fstatat(fd, e.name.c_str(), &e.st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (dirs ? S_ISDIR(e.st.st_mode) : S_ISREG(e.st.st_mode)) {
      entries.push_back(std::move(e));
    } else if (!S_ISDIR(e.st.st_mode) && !S_ISREG(e.st.st_mode)) {
      skipped(
          absl::StrCat("skipping ", where, "/", e.name, ": not a plain file or directory (links are never followed)"));
    }
  }
  closedir(dir);
  return entries;
}

std::string Unreadable(const std::string& path) {
  return absl::StrCat("cannot read ", path, ": ", std::strerror(errno));
}

absl::Status NotThisBlock(const std::string& path, const std::string& ns, const kvblock::BlockHash& hash) {
  return absl::DataLossError(absl::StrCat(path, " does not hold block ", kvblock::HashToHex(hash), " of '", ns,
                                          "' (an old format, or a file moved from another block's name)"));
}

// The start of an open disk file that claims to be a block of `ns`: its
// key header, not yet checked (CheckKey), and the record's header after
// it, read at once (a first read of kFirstRead bytes holds both unless the
// owner's name is long). DATA_LOSS when it cannot be a record's file.
constexpr size_t kFirstRead = 512;
struct FileHead {
  uint16_t version = 0;
  size_t header_bytes = 0;  // the key header's
  size_t record_bytes = 0;
  std::string owner;
  std::string bytes;  // the key header, then at least the record's header (or all of the record)
};
absl::StatusOr<FileHead> ReadHead(int fd, const std::string& ns, const kvblock::BlockHash& hash,
                                  const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return absl::DataLossError(absl::StrCat(path, " is no file"));
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  // Version 3 gives the owner's length after the namespace (in version 2
  // those bytes are the header's CRC).
  const size_t owner_at = kFixedHeaderBytes + ns.size();
  if (file_bytes < owner_at + 2) return NotThisBlock(path, ns, hash);
  FileHead head;
  head.bytes.resize(std::min(file_bytes, kFirstRead));
  if (!ReadAll(fd, head.bytes.data(), head.bytes.size(), 0)) return absl::DataLossError(Unreadable(path));
  uint16_t owner_bytes = 0;
  std::memcpy(&head.version, head.bytes.data() + 4, 2);
  if (head.version == kDiskFileVersion) {
    std::memcpy(&owner_bytes, head.bytes.data() + owner_at, 2);
  } else if (head.version != kUnownedDiskFileVersion) {
    return NotThisBlock(path, ns, hash);
  }
  head.header_bytes = owner_at + (head.version == kDiskFileVersion ? 2 + owner_bytes : 0) + 4;
  if (file_bytes < head.header_bytes + kvblock::kBlockHeaderBytes + kvblock::kBlockTrailerBytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", file_bytes, " bytes, too few for a record"));
  }
  head.record_bytes = file_bytes - head.header_bytes;
  if (const size_t want = std::min(file_bytes, head.header_bytes + kvblock::kIndexedBlockHeaderBytes),
      have = head.bytes.size();
      have < want) {  // a long owner's name
    head.bytes.resize(want);
    if (!ReadAll(fd, head.bytes.data() + have, want - have, static_cast<off_t>(have))) {
      return absl::DataLossError(Unreadable(path));
    }
  }
  if (head.version == kDiskFileVersion) head.owner = head.bytes.substr(owner_at + 2, owner_bytes);
  return head;
}

// Whether `head`'s key header is the one `ns`/`hash`, its owner and the
// record's CRC (its last four bytes) give: DATA_LOSS when it is not.
absl::Status CheckKey(const FileHead& head, const std::string& ns, const kvblock::BlockHash& hash, uint32_t record_crc,
                      const std::string& path) {
  if (head.bytes.compare(0, head.header_bytes, DiskFileHeader(head.version, ns, hash, head.owner, record_crc)) != 0) {
    return NotThisBlock(path, ns, hash);
  }
  return absl::OkStatus();
}

// What a start learns of an open disk file, its key checked against the
// record's CRC and the record's header against its length; the record's
// bytes are checked at each read, not here. Its mtime_ns is left unset.
absl::StatusOr<DiskRecord> FoundRecord(int fd, const std::string& ns, const kvblock::BlockHash& hash,
                                       const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(FileHead head, ReadHead(fd, ns, hash, path));
  uint32_t record_crc;
  if (!ReadAll(fd, &record_crc, sizeof record_crc, static_cast<off_t>(head.header_bytes + head.record_bytes - 4))) {
    return absl::DataLossError(Unreadable(path));
  }
  KVTIER_RETURN_IF_ERROR(CheckKey(head, ns, hash, record_crc, path));
  KVTIER_ASSIGN_OR_RETURN(
      const kvblock::BlockHeader header,
      kvblock::ParseBlockHeader(std::string_view(head.bytes).substr(head.header_bytes), head.record_bytes));
  return DiskRecord{.ns = ns,
                    .hash = hash,
                    .owner = std::move(head.owner),
                    .layout_id = header.layout_id,
                    .size = head.record_bytes,
                    .v4_block = header.format_version == kvblock::kV4BlockFormatVersion &&
                                header.kind == kvblock::RecordKind::kBlock};
}

}  // namespace

std::string DiskFileHeader(uint16_t version, const std::string& ns, const kvblock::BlockHash& hash,
                           const std::string& owner, uint32_t record_crc) {
  std::string header(kDiskFileMagic, sizeof kDiskFileMagic);
  Append(header, version);
  Append(header, static_cast<uint16_t>(ns.size()));
  header.append(reinterpret_cast<const char*>(hash.data()), hash.size());
  header += ns;
  if (version != kUnownedDiskFileVersion) {
    Append(header, static_cast<uint16_t>(owner.size()));
    header += owner;
  }
  // The key's and owner's bytes, then the record's own CRC: checks them,
  // and binds them to the record they head.
  const uint32_t crc = kvblock::Crc32cExtend(kvblock::Crc32c(header.data(), header.size()), &record_crc, 4);
  Append(header, crc);
  return header;
}

absl::StatusOr<std::unique_ptr<DiskDir>> DiskDir::Open(const std::string& dir) {
  // DIR itself is the operator's: a path through links is theirs to give.
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(absl::StrCat("--disk-dir ", dir, ": ", std::strerror(errno)));
  }
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("--disk-dir ", dir, ": ", std::strerror(errno)));
  std::unique_ptr<DiskDir> disk(new DiskDir(dir, fd));
  const auto not_writable = [&] {
    return absl::InvalidArgumentError(absl::StrCat("--disk-dir ", dir, " is not writable: ", std::strerror(errno)));
  };
  // One process a directory: another's start would delete this one's
  // temporary files as a crash's, and each would remove files the other
  // has indexed. flock's lock goes with the process, so it is never stale.
  disk->lock_fd_ = openat(fd, ".kvtier-lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (disk->lock_fd_ < 0) return not_writable();
  const int lock_error = flock(disk->lock_fd_, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
  if (lock_error == EWOULDBLOCK) {
    char holder[24];
    const ssize_t n = pread(disk->lock_fd_, holder, sizeof holder, 0);
    const absl::string_view pid = absl::StripAsciiWhitespace(absl::string_view(holder, n > 0 ? n : 0));
    return absl::FailedPreconditionError(
        absl::StrCat("--disk-dir ", dir, " is in use by another kvtier-cache", pid.empty() ? "" : " (pid ", pid,
                     pid.empty() ? "" : ")", ": each would delete the other's files; give each its own directory"));
  }
  if (lock_error != 0) {  // a file system without locks (some network ones): served as before
    Log(LogLevel::kWarning, "disk",
        absl::StrCat("cannot lock --disk-dir ", dir, " (", std::strerror(lock_error),
                     "): a second cache started on it would not be refused"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  // Only for another's refusal to name: the lock holds without it.
  if (ftruncate(disk->lock_fd_, 0) == 0) (void)!pwrite(disk->lock_fd_, pid.data(), pid.size(), 0);
  constexpr char kProbe[] = ".kvtier-write-probe";
  const int probe = openat(fd, kProbe, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (probe < 0) return not_writable();
  close(probe);
  unlinkat(fd, kProbe, 0);
  return disk;
}

DiskDir::~DiskDir() {
  if (lock_fd_ >= 0) close(lock_fd_);  // and with it the lock
  close(fd_);
}

int DiskDir::OpenNamespace(const std::string& ns, bool create) const {
  const std::string name = kNamespacePrefix + ns;
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  const int fd = openat(fd_, name.c_str(), kFlags);
  if (fd >= 0 || !create || errno != ENOENT) return fd;
  if (mkdirat(fd_, name.c_str(), 0700) != 0 && errno != EEXIST) return -1;
  return openat(fd_, name.c_str(), kFlags);
}

std::vector<DiskRecord> DiskDir::Scan(uint64_t& corrupt) const {
  std::vector<DiskRecord> records;
  for (const Entry& ns_dir : Entries(fd_, /*dirs=*/true, dir_)) {
    if (ns_dir.name.rfind(kNamespacePrefix, 0) != 0) continue;
    const std::string ns = ns_dir.name.substr(sizeof(kNamespacePrefix) - 1);
    if (!kvblock::ValidateNamespace(ns).ok()) continue;
    const int ns_fd = OpenNamespace(ns, /*create=*/false);
    if (ns_fd < 0) continue;
    const std::string where = dir_ + "/" + ns_dir.name;
    for (const Entry& entry : Entries(ns_fd, /*dirs=*/false, where)) {
      const std::string& name = entry.name;
      if (EndsWith(name, kTempSuffix)) {  // a write a crash cut short
        unlinkat(ns_fd, name.c_str(), 0);
        continue;
      }
      if (!EndsWith(name, kSuffix)) continue;
      const std::string hex = name.substr(0, name.size() - (sizeof(kSuffix) - 1));
      const bool hex_ok = hex.size() == 64 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
      absl::StatusOr<kvblock::BlockHash> hash =
          hex_ok ? kvblock::HashFromBytes(absl::HexStringToBytes(hex)) : absl::DataLossError("not a block's name");
      const int fd = hash.ok() ? openat(ns_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
      const std::string path = where + "/" + name;
      // The key and the record's header and length: its bytes are checked
      // where every tier's are, at each read and move, so a start costs a
      // few small reads a file, not a read of the whole tier.
      absl::StatusOr<DiskRecord> found = fd >= 0 ? FoundRecord(fd, ns, *hash, path) : absl::DataLossError("unreadable");
      if (fd >= 0) close(fd);
      if (!found.ok()) {
        ++corrupt;
        unlinkat(ns_fd, name.c_str(), 0);  // the entry itself: a plain file in our directory
        continue;
      }
      found->mtime_ns = int64_t{entry.st.st_mtim.tv_sec} * 1000000000 + entry.st.st_mtim.tv_nsec;
      records.push_back(*std::move(found));
    }
    close(ns_fd);
  }
  return records;
}

absl::Status DiskDir::Write(const std::string& ns, const kvblock::BlockHash& hash, const std::string& owner,
                            const std::vector<std::span<const uint8_t>>& pieces) const {
  size_t size = 0;
  for (const auto& piece : pieces) size += piece.size();
  if (size < kvblock::kBlockTrailerBytes) return absl::InvalidArgumentError("not a record");
  if (owner.size() > UINT16_MAX) return absl::InvalidArgumentError("an owner's name longer than a disk file holds");
  const std::string header = DiskFileHeader(kDiskFileVersion, ns, hash, owner, kvblock::TrailerCrc(pieces, size));
  const auto failed = [&](const char* what) {
    const int error = errno;
    const std::string message =
        absl::StrCat(what, " ", dir_, "/", kNamespacePrefix, ns, "/", FileName(hash), ": ", std::strerror(error));
    return error == ENOSPC || error == EDQUOT ? absl::ResourceExhaustedError(message) : absl::UnavailableError(message);
  };
  const int ns_fd = OpenNamespace(ns, /*create=*/true);
  if (ns_fd < 0) return failed("cannot open the directory of");
  const std::string final_name = FileName(hash);
  const std::string temp_name = kvblock::HashToHex(hash) + kTempSuffix;
  const int fd = openat(ns_fd, temp_name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  absl::Status status;
  if (fd < 0) {
    status = failed("cannot create");
  } else {
    bool written = WriteAll(fd, std::span(reinterpret_cast<const uint8_t*>(header.data()), header.size()));
    for (size_t i = 0; written && i < pieces.size(); ++i) written = WriteAll(fd, pieces[i]);
    if (!written) status = failed("cannot write");
    if (close(fd) != 0 && status.ok()) status = failed("cannot write");
    if (status.ok() && renameat(ns_fd, temp_name.c_str(), ns_fd, final_name.c_str()) != 0) {
      status = failed("cannot rename into");
    }
    if (!status.ok()) unlinkat(ns_fd, temp_name.c_str(), 0);
  }
  close(ns_fd);
  return status;
}

absl::StatusOr<std::string> DiskDir::Read(const std::string& ns, const kvblock::BlockHash& hash, size_t size) const {
  const std::string path = absl::StrCat(dir_, "/", kNamespacePrefix, ns, "/", FileName(hash));
  const int ns_fd = OpenNamespace(ns, /*create=*/false);
  const int fd = ns_fd < 0 ? -1 : openat(ns_fd, FileName(hash).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (ns_fd >= 0) close(ns_fd);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  absl::StatusOr<FileHead> head = ReadHead(fd, ns, hash, path);
  absl::Status status = head.status();
  std::string record;
  if (head.ok() && head->record_bytes != size) {
    status = absl::DataLossError(absl::StrCat(path, " holds a record of ", head->record_bytes, " bytes, not ", size));
  } else if (head.ok()) {
    record.resize(size);
    if (!ReadAll(fd, record.data(), size, static_cast<off_t>(head->header_bytes))) {
      status = absl::DataLossError(Unreadable(path));
    } else {
      uint32_t record_crc;
      std::memcpy(&record_crc, record.data() + size - 4, 4);
      status = CheckKey(*head, ns, hash, record_crc, path);
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return record;
}

void DiskDir::Remove(const std::string& ns, const kvblock::BlockHash& hash) const {
  const int ns_fd = OpenNamespace(ns, /*create=*/false);
  if (ns_fd < 0) return;
  unlinkat(ns_fd, FileName(hash).c_str(), 0);
  close(ns_fd);
}

void DiskDir::SetModified(const std::string& ns, const kvblock::BlockHash& hash, absl::Time when) const {
  const int ns_fd = OpenNamespace(ns, /*create=*/false);
  if (ns_fd < 0) return;
  const timespec times[2] = {{.tv_sec = 0, .tv_nsec = UTIME_OMIT}, absl::ToTimespec(when)};
  utimensat(ns_fd, FileName(hash).c_str(), times, AT_SYMLINK_NOFOLLOW);
  close(ns_fd);
}

}  // namespace kvtier::cache
