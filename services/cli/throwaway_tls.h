// A throwaway certificate authority and one certificate for this host
// (localhost, 127.0.0.1), made with the openssl command line for `kvtier up
// --tls`: the layout --tls-dir reads. The CA's key is deleted once the
// certificate is signed, so nothing else can ever be signed by it.
#ifndef KVTIER_SERVICES_CLI_THROWAWAY_TLS_H_
#define KVTIER_SERVICES_CLI_THROWAWAY_TLS_H_

#include <string>

#include "absl/status/status.h"

namespace kvtier::cli {

// Writes ca.crt, tls.crt and tls.key into `dir` (made if missing).
// UNAVAILABLE when openssl cannot be run or fails.
absl::Status MakeThrowawayTls(const std::string& dir);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_THROWAWAY_TLS_H_
