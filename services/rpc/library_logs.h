// gRPC core's and protobuf's own log lines, through kvtier's log: in its
// format, rate-limited (a flood of bad requests must not become a flood of
// lines), and, for the lines an operator meets first, saying what they
// mean: a TLS handshake a client failed says whether it spoke plaintext or
// brought no certificate.
#ifndef KVTIER_SERVICES_RPC_LIBRARY_LOGS_H_
#define KVTIER_SERVICES_RPC_LIBRARY_LOGS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "services/base/log.h"

namespace kvtier {

// Installs the handlers; once, first thing in main (after SetLogProgram).
void RouteLibraryLogs();

// What a gRPC core line says, in kvtier's words: its level, and the text
// (a hint for the lines an operator needs explained, else the message
// without gRPC's bookkeeping: source files, timestamps). Nullopt for a line
// kvtier says better itself (a port in use).
struct LibraryLine {
  LogLevel level;
  std::string text;
  std::string kind;  // which hint it is; empty for other lines
};
std::optional<LibraryLine> ExplainGrpcLine(LogLevel level, absl::string_view message);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_LIBRARY_LOGS_H_
