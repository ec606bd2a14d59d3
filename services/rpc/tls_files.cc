#include "services/rpc/tls_files.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/base/watched_file.h"
#include "services/rpc/openssl_pem.h"

namespace kvtier {
namespace {

// CheckClient's answers kept at most, one a distinct client chain.
constexpr size_t kMostVerdicts = 4096;

absl::StatusOr<std::string> Read(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls-dir: ", bytes.status().message()));
  return bytes;
}

// The certificates of the file at `path`, at least one.
absl::StatusOr<std::vector<Certificate>> CertificatesIn(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(const std::string pem, Read(path));
  std::vector<Certificate> certificates = PemBlocks(pem, PEM_read_bio_X509);
  if (certificates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no certificate in it (empty or not PEM)"));
  }
  return certificates;
}

// What gRPC is given, re-encoded from what was checked.
struct Checked {
  ~Checked() { OPENSSL_cleanse(identity.data(), identity.size()); }
  std::string ca;
  RevocationLists::Version crls;
  std::string identity;  // the key, then the chain; empty without identity
  int64_t not_after = 0;
};

absl::StatusOr<Checked> Check(const std::string& dir, bool identity) {
  Checked checked;
  KVTIER_ASSIGN_OR_RETURN(const std::vector<Certificate> roots, CertificatesIn(absl::StrCat(dir, "/ca.crt")));
  Bio out(BIO_new(BIO_s_mem()));
  std::vector<const X509*> cas;
  for (const Certificate& c : roots) {
    PEM_write_bio_X509(out.get(), c.get());
    cas.push_back(c.get());
  }
  checked.ca = Contents(out.get());
  KVTIER_ASSIGN_OR_RETURN(checked.crls, RevocationLists::Check(absl::StrCat(dir, "/ca.crl"), cas));
  if (!identity) return checked;

  const std::string crt_path = absl::StrCat(dir, "/tls.crt"), key_path = absl::StrCat(dir, "/tls.key");
  KVTIER_ASSIGN_OR_RETURN(const std::vector<Certificate> chain, CertificatesIn(crt_path));
  KVTIER_ASSIGN_OR_RETURN(std::string key_pem, Read(key_path));
  Bio key_in = Reading(key_pem);
  PrivateKey key(PEM_read_bio_PrivateKey(key_in.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(key_path, ": no private key in it (empty, encrypted or not PEM)"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(crt_path, " is not the certificate of ", key_path, " (a rotation half done?)"));
  }
  // Secure memory: cleansed when freed, as the key's copy in it must be.
  Bio identity_out(BIO_new(BIO_s_secmem()));
  PEM_write_bio_PrivateKey(identity_out.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  for (const Certificate& c : chain) PEM_write_bio_X509(identity_out.get(), c.get());
  checked.identity = Contents(identity_out.get());
  checked.not_after = UnixSeconds(X509_get0_notAfter(chain.front().get()));
  return checked;
}

// A new memfd holding `bytes`, readable by this user only, modified at
// `version` seconds (gRPC reads a version's modification time before and
// after reading it); -1 when one cannot be made.
int Memfd(const std::string& bytes, uint64_t version) {
  const int fd = memfd_create("kvtier-tls", MFD_CLOEXEC);
  if (fd < 0) return -1;
  const timespec times[2] = {{static_cast<time_t>(version), 0}, {static_cast<time_t>(version), 0}};
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done != bytes.size() || fchmod(fd, 0400) != 0 || futimens(fd, times) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Puts `bytes` behind `fd` (a new one when `fd` is -1) at once: whoever
// opens /proc/self/fd/`fd` gets the old version or the new, never a mix.
absl::Status Replace(int& fd, const std::string& bytes, uint64_t version) {
  const int fresh = Memfd(bytes, version);
  if (fresh < 0) return absl::InternalError(absl::StrCat("cannot make an in-memory copy: ", std::strerror(errno)));
  if (fd < 0) {
    fd = fresh;
    return absl::OkStatus();
  }
  const bool swapped = dup2(fresh, fd) == fd;
  close(fresh);
  if (!swapped) return absl::InternalError(absl::StrCat("cannot swap the in-memory copy: ", std::strerror(errno)));
  return absl::OkStatus();
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

absl::Mutex shared_mu;
std::map<std::string, std::unique_ptr<TlsFiles>>& SharedFiles() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared_mu) {
  static auto* files = new std::map<std::string, std::unique_ptr<TlsFiles>>;  // for the process's life
  return *files;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Open(const std::string& dir, bool need_identity,
                                                         absl::Duration reload) {
  const bool identity = need_identity || (access(absl::StrCat(dir, "/tls.crt").c_str(), R_OK) == 0 &&
                                          access(absl::StrCat(dir, "/tls.key").c_str(), R_OK) == 0);
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<RevocationLists> crls, RevocationLists::Make());
  std::unique_ptr<TlsFiles> files(new TlsFiles(dir, identity, std::move(crls)));
  KVTIER_RETURN_IF_ERROR(files->Load(files->Signature(), /*at_start=*/true));
  if (reload != absl::InfiniteDuration()) {
    files->watcher_ = std::make_unique<PeriodicTask>(reload, [f = files.get()] { f->ReloadIfChanged(); });
  }
  return files;
}

absl::StatusOr<TlsFiles*> TlsFiles::Shared(const std::string& dir, bool need_identity, absl::Duration reload) {
  absl::MutexLock lock(&shared_mu);
  std::unique_ptr<TlsFiles>& files = SharedFiles()[dir];
  if (files == nullptr) {
    absl::StatusOr<std::unique_ptr<TlsFiles>> opened = Open(dir, need_identity, reload);
    if (!opened.ok()) {
      SharedFiles().erase(dir);
      return opened.status();
    }
    files = *std::move(opened);
  }
  if (need_identity && !files->has_identity()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-dir: ", dir, " had no tls.crt and tls.key when first read"));
  }
  return files.get();
}

std::vector<TlsFiles::Health> TlsFiles::SharedHealth() {
  absl::MutexLock lock(&shared_mu);
  std::vector<Health> all;
  for (auto& [dir, files] : SharedFiles()) all.push_back(files->health());
  return all;
}

TlsFiles::TlsFiles(std::string dir, bool identity, std::unique_ptr<RevocationLists> crls)
    : dir_(std::move(dir)), identity_(identity), crl_dir_(crls->dir()), crls_(std::move(crls)) {
  health_.dir = dir_;
}

TlsFiles::~TlsFiles() {
  watcher_.reset();  // before the copies it swaps go
  if (identity_fd_ >= 0) close(identity_fd_);
  if (ca_fd_ >= 0) close(ca_fd_);
}

std::string TlsFiles::identity_path() const { return FdPath(identity_fd_); }
std::string TlsFiles::ca_path() const { return FdPath(ca_fd_); }

std::shared_ptr<const PeerTrust> TlsFiles::trust() {
  absl::MutexLock lock(&mu_);
  return trust_;
}

absl::Status TlsFiles::CheckClient(const std::string& chain_pem) {
  if (chain_pem.empty()) return absl::OkStatus();
  const uint64_t version = trust_version();
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&verdicts_mu_);
    if (verdicts_version_ < version) {
      verdicts_.clear();
      verdicts_version_ = version;
    }
    // A caller that read an older version than the kept answers' asks anew.
    const auto it = verdicts_version_ == version ? verdicts_.find(chain_pem) : verdicts_.end();
    if (it != verdicts_.end() && now < it->second.until) return it->second.status;
  }
  // Read after the version, so at least as new: at worst asked again.
  const std::shared_ptr<const PeerTrust> trust = this->trust();
  const absl::StatusOr<absl::Time> trusted_until = trust->VerifyClient(chain_pem);
  Verdict verdict{trusted_until.status(), trusted_until.ok() ? *trusted_until : absl::InfiniteFuture()};
  if (!verdict.status.ok()) {
    Log(LogLevel::kWarning, "tls", absl::StrCat("a client's calls are refused: ", verdict.status.message()));
  }
  absl::MutexLock lock(&verdicts_mu_);
  if (verdicts_version_ == version) {
    if (verdicts_.size() >= kMostVerdicts) verdicts_.clear();  // many clients: they are verified again
    verdicts_.insert_or_assign(chain_pem, verdict);
  }
  return verdict.status;
}

TlsFiles::Health TlsFiles::health() {
  absl::MutexLock lock(&mu_);
  return health_;
}

std::string TlsFiles::Signature() const {
  std::string signature =
      absl::StrCat(FileSignature(absl::StrCat(dir_, "/ca.crt")), "|", FileSignature(absl::StrCat(dir_, "/ca.crl")));
  if (identity_) {
    absl::StrAppend(&signature, "|", FileSignature(absl::StrCat(dir_, "/tls.crt")), "|",
                    FileSignature(absl::StrCat(dir_, "/tls.key")));
  }
  return signature;
}

absl::Status TlsFiles::Load(const std::string& signature, bool at_start) {
  absl::StatusOr<Checked> checked = Check(dir_, identity_);
  absl::MutexLock lock(&mu_);
  signature_ = signature;  // a refused version is said once, not every check
  const absl::Status published =
      checked.ok() ? Publish(checked->crls, checked->identity, checked->ca) : checked.status();
  if (!published.ok()) {
    if (at_start) return published;
    ++health_.rejected;
    health_.in_force = false;
    Log(LogLevel::kError, "tls",
        absl::StrCat("--tls-dir ", dir_,
                     " changed but is refused (the last good certificate, key and revocation lists stay in force): ",
                     published.message()));
    return published;
  }
  if (!at_start) Log(LogLevel::kInfo, "tls", absl::StrCat("--tls-dir ", dir_, ": the new files are in force"));
  health_.in_force = true;
  health_.not_after = checked->not_after;
  health_.crl_next_update = crls_->next_update();
  return absl::OkStatus();
}

absl::Status TlsFiles::Publish(const RevocationLists::Version& crls, const std::string& identity,
                               const std::string& ca) {
  KVTIER_ASSIGN_OR_RETURN(std::shared_ptr<const PeerTrust> trust, PeerTrust::Make(ca, crls.lists));
  KVTIER_RETURN_IF_ERROR(crls_->Publish(crls));  // so crls.lists are the lists in force
  ++version_;
  if (identity_) KVTIER_RETURN_IF_ERROR(Replace(identity_fd_, identity, version_));
  KVTIER_RETURN_IF_ERROR(Replace(ca_fd_, ca, version_));
  trust_ = std::move(trust);
  trust_version_.fetch_add(1, std::memory_order_release);
  return absl::OkStatus();
}

void TlsFiles::ReloadIfChanged() {
  const std::string signature = Signature();
  {
    absl::MutexLock lock(&mu_);
    if (signature == signature_) return;
  }
  Load(signature, /*at_start=*/false).IgnoreError();
}

}  // namespace kvtier
