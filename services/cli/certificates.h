// A certificate authority and the certificates kvtier's servers and
// clients present, made with the openssl command line (gRPC and OpenSSL
// check them; nothing here is crypto of our own), each in the layout
// --tls-dir reads: ca.crt, tls.crt, tls.key.
//
//   DIR/ca.crt, DIR/ca.key        the CA (its key 0600; gone unless kept)
//   DIR/server/                   one certificate for all three services, as
//                                 server and as client, naming every address
//                                 they call each other by
//   DIR/clients/NAME/             an end client's, CN=NAME: a tenant's
//                                 certificateIdentities entry
#ifndef KVTIER_SERVICES_CLI_CERTIFICATES_H_
#define KVTIER_SERVICES_CLI_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::cli {

struct CertificateOptions {
  std::string dir;
  // DNS names (a leading "*." allowed) and IP addresses the services'
  // certificate names.
  std::vector<std::string> server_names;
  std::vector<std::string> clients;  // common names, one certificate each
  int days = 365;
  // Keep DIR/ca.key to sign more later; else deleted once all are signed,
  // so nothing else can ever be signed by this CA.
  bool keep_ca_key = true;
};

// The names of the three services in Kubernetes namespace `ns`, as the
// manifests call them (decode workers and cache shards by pod, under their
// headless Services), and localhost.
std::vector<std::string> KubernetesServiceNames(const std::string& ns);

// Writes what CertificateOptions says (directories made if missing).
// INVALID_ARGUMENT for a name that is neither a DNS name nor an IP address
// or a client name that is not a plain word; ALREADY_EXISTS when the
// directory holds a CA already (never written over); UNAVAILABLE when
// openssl cannot be run or fails.
absl::Status MakeCertificates(const CertificateOptions& options);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_CERTIFICATES_H_
