// `kvtier make-certs --out DIR [--namespace NS] [--name NAME,...]
// [--client NAME,...] [--days N]`: a CA and the certificates of the three
// services and of end clients, as certificates.h lays them out.
#include <iostream>

#include "absl/strings/str_split.h"
#include "services/base/flags.h"
#include "services/cli/certificates.h"
#include "services/cli/commands.h"

namespace kvtier::cli {

int RunMakeCerts(const std::vector<std::string>& args) {
  std::string out, ns = "kvtier", names, clients;
  uint64_t days = 365;
  FlagParser flags("kvtier make-certs --out DIR [flags]",
                   "Makes a certificate authority (DIR/ca.crt, DIR/ca.key) and, signed by it:\n"
                   "DIR/server, one certificate for kvtier-cache, kvtier-decode and kvtier-prefill,\n"
                   "as server and as client, named by every address the manifests call them by\n"
                   "(--namespace) and localhost; DIR/clients/NAME for each --client, whose common\n"
                   "name a tenant's certificateIdentities lists. Each directory holds ca.crt,\n"
                   "tls.crt and tls.key: give it to --tls-dir, or make it the kvtier-tls Secret.\n"
                   "Keep ca.key private: openssl signs more certificates with it (openssl x509\n"
                   "-req -CA ca.crt -CAkey ca.key ...); kvtier's servers never read it.");
  flags.AddString("out", &out, "directory to write; refused if it already holds a CA");
  flags.AddString("namespace", &ns, "the Kubernetes namespace the services' names are in");
  flags.AddString("name", &names,
                  "more names of the services' certificate, comma-separated: DNS names (*.x allowed) or IP addresses");
  flags.AddString("client", &clients, "end clients to make certificates for, comma-separated names");
  flags.AddUint("days", &days, "how long the certificates are valid (1 to 3650)");
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier make-certs")) return *exit;
  if (out.empty() || days < 1 || days > 3650) {
    std::cerr << "kvtier make-certs: --out is required and --days must be 1 to 3650\n";
    return 2;
  }
  CertificateOptions options{.dir = out,
                             .server_names = KubernetesServiceNames(ns),
                             .clients = {},
                             .days = static_cast<int>(days),
                             .keep_ca_key = true};
  for (absl::string_view n : absl::StrSplit(names, ',', absl::SkipEmpty())) options.server_names.emplace_back(n);
  for (absl::string_view c : absl::StrSplit(clients, ',', absl::SkipEmpty())) options.clients.emplace_back(c);
  if (absl::Status s = MakeCertificates(options); !s.ok()) {
    std::cerr << "kvtier make-certs: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kAlreadyExists ? 2 : 1;
  }
  std::cout << "wrote a CA to " << out << "/ca.crt (its key: " << out << "/ca.key, keep it private)\n"
            << "the services' certificate: --tls-dir " << out << "/server\n";
  for (const std::string& c : options.clients) {
    std::cout << "client " << c << ": --tls-dir " << out << "/clients/" << c
              << " (tenants.json: \"certificateIdentities\": [\"" << c << "\"])\n";
  }
  std::cout << "on Kubernetes: kubectl -n " << ns << " create secret generic kvtier-tls --from-file=" << out
            << "/server\n";
  return 0;
}

}  // namespace kvtier::cli
