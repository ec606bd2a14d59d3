#include "services/rpc/token_file.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/watched_file.h"

namespace kvtier {
namespace {

// The authorization header for the token in `path`'s first line.
absl::StatusOr<std::string> ReadHeader(const std::string& path) {
  absl::StatusOr<std::string> file = ReadWholeFile(path);
  if (!file.ok()) return absl::InvalidArgumentError(absl::StrCat("--token-file: ", file.status().message()));
  const absl::string_view token = absl::StripAsciiWhitespace(absl::string_view(*file).substr(0, file->find('\n')));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("--token-file: ", path, " is empty"));
  return absl::StrCat("Bearer ", token);
}

}  // namespace

absl::StatusOr<std::shared_ptr<TokenFile>> TokenFile::Open(const std::string& path, absl::Duration reload) {
  absl::StatusOr<std::string> header = ReadHeader(path);
  if (!header.ok()) return header.status();
  return std::shared_ptr<TokenFile>(
      new TokenFile(path, reload, std::make_shared<const std::string>(*std::move(header))));
}

std::shared_ptr<const std::string> TokenFile::Header() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now < next_read_) return header_;
    next_read_ = now + reload_;  // this call reads; the others go on with the token in force
  }
  absl::StatusOr<std::string> header = ReadHeader(path_);
  absl::MutexLock lock(&mu_);
  if (!header.ok()) {
    if (complaint_ != header.status().message()) {
      complaint_ = std::string(header.status().message());
      Log(LogLevel::kError, "auth", absl::StrCat(complaint_, ": the last good token stays in force"));
    }
    return header_;
  }
  complaint_.clear();
  if (*header != *header_) {
    header_ = std::make_shared<const std::string>(*std::move(header));
    Log(LogLevel::kInfo, "auth", absl::StrCat("--token-file ", path_, ": a new token is in force"));
  }
  return header_;
}

}  // namespace kvtier
