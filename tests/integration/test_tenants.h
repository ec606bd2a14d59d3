// Tenants files for tests of servers run with --tenants: each tenant's
// token is written to a file of its own (what --token-file reads) and only
// its SHA-256 goes into the JSON, as operators are told to do.
#ifndef KVTIER_TESTS_INTEGRATION_TEST_TENANTS_H_
#define KVTIER_TESTS_INTEGRATION_TEST_TENANTS_H_

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/kvblock/sha256.h"

namespace kvtier::testing {

struct TestTenant {
  std::string name, role;
  std::string ns;  // its namespaces, comma-separated
  std::string token;
  std::string cert_identity = "";             // empty: none
  std::string quota = "";                     // a TenantQuota as JSON; empty: none
  std::vector<std::string> more_tokens = {};  // also its own (a rotation's new one)
};

// The lowercase hex SHA-256 of `token` (what `sha256sum` prints).
inline std::string TokenSha256Hex(const std::string& token) {
  const kvblock::Sha256Digest d = kvblock::Sha256({token});
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

inline std::string TenantsJson(const std::vector<TestTenant>& tenants) {
  std::string json = "{\"tenants\": [";
  for (size_t i = 0; i < tenants.size(); ++i) {
    const TestTenant& t = tenants[i];
    absl::StrAppend(&json, i ? "," : "", "{\"name\": \"", t.name, "\", \"role\": \"", t.role, "\"");
    if (!t.ns.empty()) {
      absl::StrAppend(&json, ", \"namespaces\": [\"", absl::StrReplaceAll(t.ns, {{",", "\", \""}}), "\"]");
    }
    absl::StrAppend(&json, ", \"tokenSha256\": [\"", TokenSha256Hex(t.token));
    for (const std::string& more : t.more_tokens) absl::StrAppend(&json, "\", \"", TokenSha256Hex(more));
    json += "\"]";
    if (!t.cert_identity.empty()) absl::StrAppend(&json, ", \"certificateIdentities\": [\"", t.cert_identity, "\"]");
    if (!t.quota.empty()) absl::StrAppend(&json, ", \"quota\": ", t.quota);
    json += "}";
  }
  return json + "]}";
}

// Writes `token` as a --token-file under `dir`; returns its path.
inline std::string WriteTokenFile(const std::filesystem::path& dir, const std::string& token) {
  const std::filesystem::path path = dir / ("token-" + TokenSha256Hex(token).substr(0, 12));
  std::ofstream(path) << token << "\n";
  return path.string();
}

// Writes `contents` to `path` by a rename, as Kubernetes swaps a Secret's
// files: a server reloading it sees the old file or the new, never a mix.
inline void WriteAtomically(const std::filesystem::path& path, const std::string& contents) {
  const std::filesystem::path tmp = path.string() + ".new";
  std::ofstream(tmp) << contents;
  std::filesystem::rename(tmp, path);
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_TEST_TENANTS_H_
