#include "services/rpc/library_logs.h"

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>
#include <openssl/x509_vfy.h>

#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "re2/re2.h"

namespace kvtier {
namespace {

// Each kind of line (its source file and line, and the hint it gives) said
// at most once this often, then with how many were held back.
constexpr absl::Duration kEvery = absl::Seconds(10);

struct Hint {
  absl::string_view says;  // in the library's message
  absl::string_view means;
};
// gRPC's line does not say which side it is on (a prefill node is both),
// so neither does the hint.
constexpr Hint kHandshakeHints[] = {
    {"wrong version number",
     "one side spoke plaintext to the other's TLS (a client without --tls-dir at a TLS port, or a client with "
     "--tls-dir calling a plaintext server)"},
    {"http request", "a client spoke plaintext (HTTP) to a TLS port (give it --tls-dir with the server's ca.crt)"},
    {"peer did not return a certificate",
     "a client brought no certificate to a server that requires one (--tls-require-client-cert): give the "
     "client's --tls-dir a tls.crt and tls.key signed by the server's ca.crt"},
    {"certificate verify failed",
     "the peer's certificate is not signed by a CA in this side's ca.crt, has expired, or is revoked by its ca.crl"},
    {"tlsv1 alert unknown ca",
     "the peer does not trust this side's certificate (its ca.crt lacks the CA that signed it)"},
};

absl::Mutex limits_mu(absl::kConstInit);
RateLimitedLog& LimitFor(const std::string& source, LogLevel level, const char* component)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(limits_mu) {
  static auto* limits = new std::map<std::string, std::unique_ptr<RateLimitedLog>>;
  std::unique_ptr<RateLimitedLog>& limit = (*limits)[absl::StrCat(component, ":", source)];
  if (limit == nullptr) limit = std::make_unique<RateLimitedLog>(level, component, kEvery);
  return *limit;
}

void SayLimited(const std::string& source, LogLevel level, const char* component, const std::string& text) {
  RateLimitedLog* limit;
  {
    absl::MutexLock lock(&limits_mu);
    limit = &LimitFor(source, level, component);
  }
  (*limit)(text);
}

LogLevel FromGrpc(gpr_log_severity severity) {
  switch (severity) {
    case GPR_LOG_SEVERITY_ERROR:
      return LogLevel::kError;
    case GPR_LOG_SEVERITY_INFO:
    case GPR_LOG_SEVERITY_DEBUG:
      break;
  }
  return LogLevel::kInfo;
}

void GrpcLine(gpr_log_func_args* args) {
  std::optional<LibraryLine> line = ExplainGrpcLine(FromGrpc(args->severity), args->message);
  if (!line) return;
  SayLimited(absl::StrCat(args->file, ":", args->line, ":", line->kind), line->level, "grpc", line->text);
}

void ProtobufLine(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  const LogLevel ours = level >= google::protobuf::LOGLEVEL_ERROR     ? LogLevel::kError
                        : level == google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                                      : LogLevel::kInfo;
  if (level >= google::protobuf::LOGLEVEL_FATAL) {
    Log(ours, "protobuf", message);  // the process ends next: never held back
    return;
  }
  SayLimited(absl::StrCat(file, ":", line), ours, "protobuf", message);
}

}  // namespace

std::optional<LibraryLine> ExplainGrpcLine(LogLevel level, absl::string_view message) {
  // A server that cannot bind says which address and why in one line of
  // its own (ServerRunner); gRPC's nested dump of the same adds nothing.
  if (absl::StrContains(message, "No address added out of total")) return std::nullopt;
  if (absl::StrContains(message, "Handshake failed")) {
    const std::string lower = absl::AsciiStrToLower(message);
    for (const Hint& hint : kHandshakeHints) {
      if (absl::StrContains(lower, hint.says)) {
        return LibraryLine{LogLevel::kWarning, absl::StrCat("TLS handshake failed: ", hint.means),
                           std::string(hint.says)};
      }
    }
  }
  // gRPC's OpenSSL callback gives a verification's error as a number.
  static const LazyRE2 kVerifyCode = {R"(Certificate verify failed with code (\d+))"};
  if (int code = 0; RE2::PartialMatch(re2::StringPiece(message.data(), message.size()), *kVerifyCode, &code)) {
    std::string text =
        absl::StrCat("TLS: a peer's certificate failed verification: ", X509_verify_cert_error_string(code));
    if (code == X509_V_ERR_CERT_REVOKED) absl::StrAppend(&text, " (ca.crl revokes it)");
    if (code == X509_V_ERR_CRL_HAS_EXPIRED) {
      absl::StrAppend(&text, " (ca.crl's list of its CA is past its next update: write a newer one into --tls-dir)");
    }
    return LibraryLine{LogLevel::kWarning, std::move(text), absl::StrCat("verify code ", code)};
  }
  // gRPC's error strings carry where and when each cause was made.
  std::string text(message);
  static const LazyRE2 kBookkeeping = {R"((, )?(file|file_line|created_time):("[^"]*"|\d+)(, )?)"};
  RE2::GlobalReplace(&text, *kBookkeeping, "");
  static const LazyRE2 kEmptyBraces = {R"( ?\{\})"};
  RE2::GlobalReplace(&text, *kEmptyBraces, "");
  return LibraryLine{level, std::move(text), ""};
}

void RouteLibraryLogs() {
  gpr_set_log_function(GrpcLine);
  google::protobuf::SetLogHandler(ProtobufLine);
}

}  // namespace kvtier
