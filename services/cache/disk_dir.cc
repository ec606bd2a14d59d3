#include "services/cache/disk_dir.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/kvblock/block_format.h"

namespace kvtier::cache {
namespace fs = std::filesystem;
namespace {

constexpr char kNamespacePrefix[] = "ns-";
constexpr char kSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".tmp";

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::string bytes(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<DiskDir> DiskDir::Open(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error || !fs::is_directory(dir)) {
    return absl::InvalidArgumentError(absl::StrCat("--disk-dir ", dir, ": ", error.message()));
  }
  for (const auto& file : fs::recursive_directory_iterator(dir, error)) {
    if (file.path().extension() == kTempSuffix) fs::remove(file.path(), error);
  }
  const fs::path probe = fs::path(dir) / ".kvtier-write-probe";
  if (!std::ofstream(probe)) {
    return absl::InvalidArgumentError(absl::StrCat("--disk-dir ", dir, " is not writable"));
  }
  fs::remove(probe, error);
  return DiskDir(dir);
}

std::string DiskDir::PathOf(const std::string& ns, const kvblock::BlockHash& hash) const {
  return (fs::path(dir_) / (kNamespacePrefix + ns) / (kvblock::HashToHex(hash) + kSuffix)).string();
}

std::vector<DiskRecord> DiskDir::Scan(uint64_t& corrupt) const {
  std::vector<DiskRecord> records;
  std::error_code error;
  for (const auto& ns_dir : fs::directory_iterator(dir_, error)) {
    const std::string name = ns_dir.path().filename().string();
    if (!ns_dir.is_directory() || name.rfind(kNamespacePrefix, 0) != 0) continue;
    for (const auto& file : fs::directory_iterator(ns_dir.path(), error)) {
      if (file.path().extension() != kSuffix) continue;
      const std::string hex = file.path().stem().string();
      absl::StatusOr<std::string> bytes = ReadFile(file.path());
      absl::StatusOr<kvblock::BlockView> view =
          bytes.ok() ? kvblock::ParseBlock(*bytes) : absl::StatusOr<kvblock::BlockView>(bytes.status());
      const bool hex_ok = hex.size() == 64 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
      if (!hex_ok || !view.ok()) {
        ++corrupt;
        fs::remove(file.path(), error);
        continue;
      }
      DiskRecord r;
      r.ns = name.substr(sizeof(kNamespacePrefix) - 1);
      const std::string raw_hash = absl::HexStringToBytes(hex);
      std::memcpy(r.hash.data(), raw_hash.data(), r.hash.size());
      r.layout_id = view->header.layout_id;
      r.size = bytes->size();
      r.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       fs::last_write_time(file.path(), error).time_since_epoch())
                       .count();
      records.push_back(std::move(r));
    }
  }
  return records;
}

absl::Status DiskDir::Write(const std::string& ns, const kvblock::BlockHash& hash,
                            const std::vector<std::span<const uint8_t>>& pieces) const {
  const fs::path path = PathOf(ns, hash);
  std::error_code error;
  fs::create_directories(path.parent_path(), error);
  const fs::path temp = path.string() + kTempSuffix;
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    for (const auto& piece : pieces) {
      out.write(reinterpret_cast<const char*>(piece.data()), static_cast<std::streamsize>(piece.size()));
    }
    if (!out.flush()) {
      fs::remove(temp, error);
      return absl::UnavailableError(absl::StrCat("cannot write ", temp.string(), ": ",
                                                 std::strerror(errno)));
    }
  }
  fs::rename(temp, path, error);
  if (error) {
    fs::remove(temp, error);
    return absl::UnavailableError(absl::StrCat("cannot rename into ", path.string()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DiskDir::Read(const std::string& ns, const kvblock::BlockHash& hash,
                                          size_t size) const {
  absl::StatusOr<std::string> bytes = ReadFile(PathOf(ns, hash));
  if (bytes.ok() && bytes->size() != size) {
    return absl::DataLossError(absl::StrCat(PathOf(ns, hash), " is ", bytes->size(),
                                            " bytes, expected ", size));
  }
  return bytes;
}

void DiskDir::Remove(const std::string& ns, const kvblock::BlockHash& hash) const {
  std::error_code error;
  fs::remove(PathOf(ns, hash), error);
}

}  // namespace kvtier::cache
