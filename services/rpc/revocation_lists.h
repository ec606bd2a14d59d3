// The certificate revocation lists of a --tls-dir (ca.crl, PEM, at most
// one list per CA), checked before gRPC sees them, in the directory gRPC
// has OpenSSL look them up in.
//
// OpenSSL reads such a directory lazily, by name (<issuer hash>.r<n>), and
// never reads a file it has read again; of the lists of a CA it has read,
// it applies the newest (by thisUpdate). So each new list of a CA goes in
// as the next n, and a list in force can be replaced by a newer one but
// never withdrawn. A version of ca.crl that would withdraw a list, or give
// an older one than the one in force, is refused, as is one that is not
// signed by a CA of ca.crt or is outside its validity (OpenSSL refuses
// every certificate of a CA whose list has expired). A CA without a list
// is not checked.
#ifndef KVTIER_SERVICES_RPC_REVOCATION_LISTS_H_
#define KVTIER_SERVICES_RPC_REVOCATION_LISTS_H_

#include <openssl/x509.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier {

class RevocationLists {
 public:
  // One list of a checked version of ca.crl.
  struct List {
    std::string issuer;       // its CA's name, DER: a CA has one list in force
    std::string issuer_text;  // the same, for messages
    unsigned long hash = 0;   // OpenSSL's hash of the name: the file name
    std::string pem;
    int64_t this_update = 0;  // Unix seconds
    int64_t next_update = 0;  // 0: none given
  };
  struct Version {
    std::vector<List> lists;
    std::set<std::string> cas;  // the names (DER) of ca.crt's CAs
  };

  // The lists in the file at `path` (none when there is no such file),
  // each signed by one of `cas` and valid now: INVALID_ARGUMENT naming the
  // file and what is wrong with it otherwise.
  static absl::StatusOr<Version> Check(const std::string& path, const std::vector<const X509*>& cas);

  // A directory of its own under $TMPDIR (else /tmp), removed when this
  // goes or the process exits, or by a later process once this one is
  // gone (killed); UNAVAILABLE when one cannot be made.
  static absl::StatusOr<std::unique_ptr<RevocationLists>> Make();
  ~RevocationLists();
  RevocationLists(const RevocationLists&) = delete;
  RevocationLists& operator=(const RevocationLists&) = delete;

  // For gRPC's set_crl_directory.
  const std::string& dir() const { return dir_; }

  // Puts a checked version in force: INVALID_ARGUMENT, with nothing
  // written, when it would withdraw a list in force of a CA still in
  // ca.crt or replace one with a list no newer. Not thread-safe: its owner
  // serializes the calls.
  absl::Status Publish(const Version& version);

  // The earliest next update of the lists in force (Unix seconds; 0 when
  // none gives one): after it, every certificate of that CA is refused.
  int64_t next_update() const;

 private:
  RevocationLists(std::string dir, int lock) : dir_(std::move(dir)), lock_(lock) {}
  absl::Status Write(const List& list);

  const std::string dir_;
  const int lock_;                          // an open descriptor of dir_, locked: a sign of life
  std::map<std::string, List> in_force_;    // by issuer
  std::map<unsigned long, int> next_file_;  // by hash: the n of the next file
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_REVOCATION_LISTS_H_
