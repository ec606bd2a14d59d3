// A bearer token read from a file (--token-file: its first line) and read
// again as the file changes, so that a client follows a rotation of its
// Secret without a restart. A file that becomes unreadable or empty keeps
// the last good token in force and is logged (its path, never a token).
#ifndef KVTIER_SERVICES_RPC_TOKEN_FILE_H_
#define KVTIER_SERVICES_RPC_TOKEN_FILE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvtier {

class TokenFile {
 public:
  // INVALID_ARGUMENT when `path` cannot be read or its first line is
  // empty. It is read again at most once every `reload`.
  static absl::StatusOr<std::shared_ptr<TokenFile>> Open(const std::string& path, absl::Duration reload);

  // "Bearer TOKEN", for a call's authorization header: the file's token as
  // of its last reading, read again first when `reload` has passed (by
  // that one call, outside the lock, while others take the token in
  // force). Thread-safe.
  std::shared_ptr<const std::string> Header();

 private:
  TokenFile(std::string path, absl::Duration reload, std::shared_ptr<const std::string> header)
      : path_(std::move(path)), reload_(reload), header_(std::move(header)), next_read_(absl::Now() + reload) {}

  const std::string path_;
  const absl::Duration reload_;
  absl::Mutex mu_;
  std::shared_ptr<const std::string> header_ ABSL_GUARDED_BY(mu_);
  absl::Time next_read_ ABSL_GUARDED_BY(mu_);
  // What the last reading found wrong, so that it is logged once.
  std::string complaint_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_TOKEN_FILE_H_
