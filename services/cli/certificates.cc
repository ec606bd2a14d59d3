#include "services/cli/certificates.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/base/status.h"

extern char** environ;

namespace kvtier::cli {
namespace fs = std::filesystem;
namespace {

// Runs openssl with `args` (no shell), its output discarded.
absl::Status Openssl(std::vector<std::string> args) {
  args.insert(args.begin(), "openssl");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "openssl", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return absl::UnavailableError("cannot run openssl (apt-get install openssl)");
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat("openssl ", absl::StrJoin(args.begin() + 1, args.end(), " "), " failed"));
  }
  return absl::OkStatus();
}

bool IsIpAddress(const std::string& name) {
  unsigned char address[16];
  return inet_pton(AF_INET, name.c_str(), address) == 1 || inet_pton(AF_INET6, name.c_str(), address) == 1;
}

// "DNS:a,IP:b,...", or INVALID_ARGUMENT naming the first bad name.
absl::StatusOr<std::string> SubjectAltNames(const std::vector<std::string>& names) {
  static const std::regex kDnsName(
      R"((\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)");
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (IsIpAddress(name)) {
      out.push_back("IP:" + name);
    } else if (name.size() <= 253 && std::regex_match(name, kDnsName)) {
      out.push_back("DNS:" + name);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' is neither a DNS name nor an IP address"));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("the services' certificate needs at least one name");
  return absl::StrJoin(out, ",");
}

// A key and a certificate signed by the CA in `ca_dir`, in `dir` with a
// copy of ca.crt: the layout --tls-dir reads.
absl::Status MakeLeaf(const fs::path& ca_dir, const fs::path& dir, const std::string& common_name,
                      const std::string& alt_names, int days) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot make ", dir.string(), ": ", error.message()));
  const std::string key = dir / "tls.key", csr = dir / "tls.csr";
  std::vector<std::string> request = {
      "req",     "-newkey", "ec",   "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=" + common_name,
      "-keyout", key,       "-out", csr};
  if (!alt_names.empty()) request.insert(request.end(), {"-addext", "subjectAltName=" + alt_names});
  absl::Status made = Openssl(request);
  if (made.ok()) {
    made =
        Openssl({"x509", "-req", "-in", csr, "-CA", ca_dir / "ca.crt", "-CAkey", ca_dir / "ca.key", "-CAcreateserial",
                 "-days", std::to_string(days), "-copy_extensions", "copy", "-out", dir / "tls.crt"});
  }
  fs::remove(csr, error);
  if (made.ok()) {
    fs::permissions(key, fs::perms::owner_read | fs::perms::owner_write, error);
    fs::copy_file(ca_dir / "ca.crt", dir / "ca.crt", fs::copy_options::overwrite_existing, error);
    if (error) made = absl::UnavailableError(absl::StrCat("cannot copy ca.crt into ", dir.string()));
  }
  return made;
}

}  // namespace

std::vector<std::string> KubernetesServiceNames(const std::string& ns) {
  std::vector<std::string> names = {"localhost", "127.0.0.1"};
  for (const char* service : {"kvtier-cache", "kvtier-decode", "kvtier-prefill"}) {
    for (const std::string& suffix : {std::string(), "." + ns, "." + ns + ".svc", "." + ns + ".svc.cluster.local"}) {
      names.push_back(service + suffix);
      names.push_back(absl::StrCat("*.", service, suffix));  // a pod under the headless Service
    }
  }
  return names;
}

absl::Status MakeCertificates(const CertificateOptions& options) {
  static const std::regex kClientName("[A-Za-z0-9._-]{1,64}");
  for (const std::string& client : options.clients) {
    if (!std::regex_match(client, kClientName)) {
      return absl::InvalidArgumentError(
          absl::StrCat("client name '", client, "': 1-64 characters of [A-Za-z0-9._-] (it names a directory)"));
    }
  }
  if (options.days < 1) return absl::InvalidArgumentError("a certificate must be valid at least a day");
  KVTIER_ASSIGN_OR_RETURN(const std::string alt_names, SubjectAltNames(options.server_names));
  const fs::path dir = options.dir;
  if (fs::exists(dir / "ca.crt")) {
    return absl::AlreadyExistsError(
        absl::StrCat(options.dir, " already holds a CA (ca.crt); choose another directory"));
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot make ", options.dir, ": ", error.message()));
  const std::string ca_key = dir / "ca.key";
  absl::Status made =
      Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days",
               std::to_string(options.days), "-subj", "/CN=kvtier CA", "-keyout", ca_key, "-out", dir / "ca.crt"});
  if (made.ok()) fs::permissions(ca_key, fs::perms::owner_read | fs::perms::owner_write, error);
  if (made.ok()) made = MakeLeaf(dir, dir / "server", "kvtier", alt_names, options.days);
  for (const std::string& client : options.clients) {
    if (made.ok()) made = MakeLeaf(dir, dir / "clients" / client, client, "", options.days);
  }
  fs::remove(dir / "ca.srl", error);
  if (!options.keep_ca_key || !made.ok()) fs::remove(ca_key, error);
  return made;
}

}  // namespace kvtier::cli
