#include "services/rpc/revocation_lists.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/base/status.h"
#include "services/base/watched_file.h"
#include "services/rpc/openssl_pem.h"

namespace kvtier {
namespace {

std::string Time(int64_t unix_seconds) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(unix_seconds), absl::UTCTimeZone());
}

// The list checked against `cas` and the time now.
absl::StatusOr<RevocationLists::List> CheckList(X509_CRL* crl, const std::vector<const X509*>& cas) {
  RevocationLists::List list;
  const X509_NAME* issuer = X509_CRL_get_issuer(crl);
  list.issuer = NameDer(issuer);
  list.issuer_text = NameText(issuer);
  const auto ca = std::find_if(cas.begin(), cas.end(), [&](const X509* c) {
    return X509_NAME_cmp(X509_get_subject_name(c), issuer) == 0 && X509_CRL_verify(crl, X509_get0_pubkey(c)) == 1;
  });
  ERR_clear_error();
  if (ca == cas.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the list of ", list.issuer_text, " is not signed by a CA of ca.crt"));
  }
  int ok = 0;
  list.hash = X509_NAME_hash_ex(issuer, nullptr, nullptr, &ok);
  if (ok != 1) return absl::InvalidArgumentError(absl::StrCat("cannot hash the name ", list.issuer_text));
  list.this_update = UnixSeconds(X509_CRL_get0_lastUpdate(crl));
  list.next_update = UnixSeconds(X509_CRL_get0_nextUpdate(crl));
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  if (list.this_update > now) {
    return absl::InvalidArgumentError(
        absl::StrCat("the list of ", list.issuer_text, " is not valid until ", Time(list.this_update)));
  }
  if (list.next_update != 0 && list.next_update <= now) {
    return absl::InvalidArgumentError(absl::StrCat("the list of ", list.issuer_text, " expired at ",
                                                   Time(list.next_update),
                                                   " (every certificate of that CA would be refused)"));
  }
  Bio out(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509_CRL(out.get(), crl);
  list.pem = Contents(out.get());
  return list;
}

// The directories of the RevocationLists alive, removed at exit: a
// process's TlsFiles live as long as it does.
absl::Mutex dirs_mu;
std::set<std::string>& LiveDirs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(dirs_mu) {
  static auto* dirs = new std::set<std::string>;  // for the process's life
  return *dirs;
}

void RemoveLiveDirs() {
  absl::MutexLock lock(&dirs_mu);
  std::error_code error;
  for (const std::string& dir : LiveDirs()) std::filesystem::remove_all(dir, error);
}

constexpr char kDirPrefix[] = "kvtier-crl-";

// Removes the directories in `tmp` of processes that ended without
// removing theirs (killed): a live one holds a lock on its directory, from
// just after making it (hence a minute's grace).
void RemoveAbandonedDirs(const std::string& tmp) {
  std::error_code error;
  for (const std::filesystem::directory_entry& entry : std::filesystem::directory_iterator(tmp, error)) {
    const std::string path = entry.path().string();
    struct stat st;
    if (!entry.path().filename().string().starts_with(kDirPrefix) || lstat(path.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || std::time(nullptr) - st.st_mtime < 60) {
      continue;
    }
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(path, error);
    close(fd);
  }
}

}  // namespace

absl::StatusOr<RevocationLists::Version> RevocationLists::Check(const std::string& path,
                                                                const std::vector<const X509*>& cas) {
  Version version;
  for (const X509* ca : cas) version.cas.insert(NameDer(X509_get_subject_name(ca)));
  struct stat st;
  if (stat(path.c_str(), &st) != 0 && errno == ENOENT) return version;
  absl::StatusOr<std::string> pem = ReadWholeFile(path);
  if (!pem.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-dir: ", pem.status().message()));
  std::vector<RevocationList> lists = PemBlocks(*pem, PEM_read_bio_X509_CRL);
  if (lists.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no revocation list in it (empty or not PEM)"));
  }
  for (const RevocationList& crl : lists) {
    absl::StatusOr<List> list = CheckList(crl.get(), cas);
    if (!list.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", list.status().message()));
    for (const List& earlier : version.lists) {
      if (earlier.issuer == list->issuer) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": two lists of ", list->issuer_text, " (give only the newest)"));
      }
    }
    version.lists.push_back(*std::move(list));
  }
  return version;
}

absl::StatusOr<std::unique_ptr<RevocationLists>> RevocationLists::Make() {
  std::error_code error;
  const std::string tmp = std::filesystem::temp_directory_path(error).string();  // $TMPDIR, else /tmp
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot make a directory for revocation lists (set TMPDIR to a writable one): ", error.message()));
  }
  RemoveAbandonedDirs(tmp);
  std::string dir = absl::StrCat(tmp, "/", kDirPrefix, "XXXXXX");  // mkdtemp's template: it fills in the X's
  const int lock = mkdtemp(dir.data()) == nullptr ? -1 : open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB) != 0) {
    const std::string why = std::strerror(errno);
    if (lock >= 0) close(lock);
    return absl::UnavailableError(absl::StrCat("cannot make a directory for revocation lists in ", tmp,
                                               " (set TMPDIR to a writable one): ", why));
  }
  absl::MutexLock hold(&dirs_mu);
  static const bool removed_at_exit = std::atexit(RemoveLiveDirs) == 0;
  (void)removed_at_exit;
  LiveDirs().insert(dir);
  return std::unique_ptr<RevocationLists>(new RevocationLists(std::move(dir), lock));
}

RevocationLists::~RevocationLists() {
  absl::MutexLock hold(&dirs_mu);
  LiveDirs().erase(dir_);
  std::error_code error;
  std::filesystem::remove_all(dir_, error);
  close(lock_);
}

absl::Status RevocationLists::Publish(const Version& version) {
  for (const auto& entry : in_force_) {
    const std::string& issuer = entry.first;  // not a structured binding: clang 14's lambdas cannot take one
    const List& served = entry.second;
    if (!version.cas.contains(issuer)) continue;  // a CA no longer trusted: its list no longer matters
    const auto list =
        std::find_if(version.lists.begin(), version.lists.end(), [&](const List& l) { return l.issuer == issuer; });
    if (list == version.lists.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ca.crl no longer has the list of ", served.issuer_text,
                       ", which stays in force (to lift a revocation, give a newer list without it)"));
    }
    if (list->pem != served.pem && list->this_update <= served.this_update) {
      return absl::InvalidArgumentError(
          absl::StrCat("ca.crl: the list of ", served.issuer_text, " (issued ", Time(list->this_update),
                       ") is no newer than the one in force (issued ", Time(served.this_update), ")"));
    }
  }
  for (const List& list : version.lists) {
    const auto served = in_force_.find(list.issuer);
    if (served != in_force_.end() && served->second.pem == list.pem) continue;
    KVTIER_RETURN_IF_ERROR(Write(list));
    in_force_[list.issuer] = list;
  }
  std::erase_if(in_force_, [&](const auto& served) { return !version.cas.contains(served.first); });
  return absl::OkStatus();
}

absl::Status RevocationLists::Write(const List& list) {
  const std::string path = absl::StrFormat("%s/%08lx.r%d", dir_, list.hash, next_file_[list.hash]);
  const std::string fresh = dir_ + "/new";  // not a name OpenSSL looks up
  {
    std::ofstream out(fresh, std::ios::binary | std::ios::trunc);
    out << list.pem;
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", fresh, ": ", std::strerror(errno)));
  }
  if (std::rename(fresh.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  ++next_file_[list.hash];
  return absl::OkStatus();
}

int64_t RevocationLists::next_update() const {
  int64_t earliest = 0;
  for (const auto& [issuer, list] : in_force_) {
    if (list.next_update != 0 && (earliest == 0 || list.next_update < earliest)) earliest = list.next_update;
  }
  return earliest;
}

}  // namespace kvtier
