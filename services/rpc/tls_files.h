// The files of a --tls-dir, checked before gRPC sees them.
//
// gRPC's file watcher takes whatever the files hold: an empty key aborts
// the process (an assertion inside gRPC), and a garbage certificate, or a
// certificate beside the key of another (a rotation half done), fails every
// new connection. So gRPC reads in-memory copies instead (memfds, through
// their /proc/self/fd paths), and a thread of ours replaces them only with
// a set that is whole: a private key, a certificate chain whose first
// certificate is that key's, and a CA bundle of at least one certificate.
// A set that is not is logged and counted, and the last good one stays in
// force until the files are whole again. A ca.crl beside them, optional,
// is checked and handed on as revocation_lists.h says.
//
// The key and the chain go to gRPC in one file: gRPC reads the key and the
// chain one after the other and checks that neither file's modification
// time moved meanwhile, so with one file, whose every version gets a new
// modification time, it can never pair a key with another version's chain.
#ifndef KVTIER_SERVICES_RPC_TLS_FILES_H_
#define KVTIER_SERVICES_RPC_TLS_FILES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/base/watched_file.h"
#include "services/rpc/peer_trust.h"
#include "services/rpc/revocation_lists.h"

namespace kvtier {

class TlsFiles {
 public:
  // Reads ca.crt, ca.crl when there is one, and tls.crt and tls.key
  // (required with `need_identity`, a server's; else used when both are
  // there, a client's mutual TLS),
  // then checks them for changes every `reload` on a thread of its own
  // (none with an infinite `reload`). INVALID_ARGUMENT naming the file and
  // what is wrong with it.
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Open(const std::string& dir, bool need_identity,
                                                        absl::Duration reload);
  // The process's one TlsFiles for `dir`, made on first use and kept for
  // the process's life (gRPC reads its copies as long as it serves).
  static absl::StatusOr<TlsFiles*> Shared(const std::string& dir, bool need_identity, absl::Duration reload);
  ~TlsFiles();
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  const std::string& dir() const { return dir_; }
  bool has_identity() const { return identity_; }
  // For gRPC's file watcher: the private key followed by the chain (pass
  // it as both the key's and the certificate's path), and the CA bundle.
  std::string identity_path() const;
  std::string ca_path() const;
  // For gRPC's CRL directory: ca.crl's lists as OpenSSL looks them up.
  const std::string& crl_dir() const { return crl_dir_; }
  // ca.crt's CAs and the lists in force, for checking a client's
  // certificate again after its handshake; a new one each version.
  std::shared_ptr<const PeerTrust> trust();
  // Which trust() is in force: changes with it, read without a lock (a
  // stream compares it at each message).
  uint64_t trust_version() const { return trust_version_.load(std::memory_order_acquire); }
  // Whether a client that presented `chain_pem` at its handshake (gRPC's
  // peer chain; empty: no certificate) would pass one now: OK, or
  // UNAUTHENTICATED as PeerTrust::VerifyClient says. The answer is kept
  // per chain until the files change or the chain's trust falls due, so
  // that checking every call costs a lookup; a refusal is logged once a
  // chain and version.
  absl::Status CheckClient(const std::string& chain_pem);

  struct Health {
    std::string dir;
    uint64_t rejected = 0;        // versions of the files refused since start
    bool in_force = true;         // what the files hold now is what is served
    int64_t not_after = 0;        // the served certificate's expiry, Unix seconds (0: no identity)
    int64_t crl_next_update = 0;  // the first next update of the served lists, Unix seconds (0: none)
  };
  Health health();
  // The health of every Shared TlsFiles, for /metrics.
  static std::vector<Health> SharedHealth();

  // Reads the files again now if they changed (the thread's job; for tests).
  void ReloadIfChanged();

 private:
  TlsFiles(std::string dir, bool identity, std::unique_ptr<RevocationLists> crls);
  // Reads and checks the files (whose Signature is `signature`); gives
  // gRPC the copies if they are whole.
  absl::Status Load(const std::string& signature, bool at_start);
  // Puts a checked version's lists in force and swaps in copies of its
  // files.
  absl::Status Publish(const RevocationLists::Version& crls, const std::string& identity, const std::string& ca)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Signature() const;

  const std::string dir_;
  const bool identity_;
  // What gRPC reads, through /proc/self/fd: made by the first Load, and
  // each later version swapped in under the same numbers.
  int identity_fd_ = -1;
  int ca_fd_ = -1;
  const std::string crl_dir_;  // crls_->dir(), readable without mu_
  absl::Mutex mu_;
  const std::unique_ptr<RevocationLists> crls_ ABSL_PT_GUARDED_BY(mu_);
  std::string signature_ ABSL_GUARDED_BY(mu_);  // of the files last read
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;   // of the copies, their mtime
  std::shared_ptr<const PeerTrust> trust_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> trust_version_{0};
  // CheckClient's answers under trust version verdicts_version_.
  struct Verdict {
    absl::Status status;
    absl::Time until;  // asked again from then on
  };
  absl::Mutex verdicts_mu_;
  uint64_t verdicts_version_ ABSL_GUARDED_BY(verdicts_mu_) = 0;
  absl::flat_hash_map<std::string, Verdict> verdicts_ ABSL_GUARDED_BY(verdicts_mu_);
  Health health_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeriodicTask> watcher_;  // calls ReloadIfChanged
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_TLS_FILES_H_
