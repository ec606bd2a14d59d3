// A client's certificate checked again after its handshake, against the
// CAs of a ca.crt and the revocation lists in force beside it, as gRPC's
// OpenSSL checks it at a handshake: chained to one of the CAs, each
// certificate of the chain valid now, none revoked by its CA's list (a CA
// without a list is not checked for revocation). Each call asks (through
// TlsFiles::CheckClient), and what outlives its call's start (a stream, a
// same-host fast path session) asks again whenever the files change
// (tls_files.h makes one per version).
#ifndef KVTIER_SERVICES_RPC_PEER_TRUST_H_
#define KVTIER_SERVICES_RPC_PEER_TRUST_H_

#include <openssl/x509_vfy.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/rpc/openssl_pem.h"
#include "services/rpc/revocation_lists.h"

namespace kvtier {

class PeerTrust {
 public:
  // `ca_pem`: the CA bundle; `lists`: the revocation lists in force, each
  // checked already (RevocationLists::Check). INVALID_ARGUMENT when the
  // bundle holds no certificate or a list cannot be read.
  static absl::StatusOr<std::shared_ptr<const PeerTrust>> Make(const std::string& ca_pem,
                                                               const std::vector<RevocationLists::List>& lists);

  // Whether a client presenting `chain_pem` (its certificate, then any
  // intermediates: gRPC's x509_pem_cert_chain) would pass a handshake now.
  // If so, until when it stays trusted while these files stay in force:
  // the first expiry of its verified chain, or next update of a list that
  // checks it. UNAUTHENTICATED otherwise, naming the certificate and
  // saying why in OpenSSL's words ("the client certificate no longer
  // passes the TLS files in force: the certificate of CN=acme: certificate
  // revoked"). Thread-safe.
  absl::StatusOr<absl::Time> VerifyClient(const std::string& chain_pem) const;

 private:
  PeerTrust() = default;

  std::unique_ptr<X509_STORE, OpenSslFree> store_;
  std::map<std::string, int64_t> next_update_;  // of each list that gives one, by issuer (DER)
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_PEER_TRUST_H_
