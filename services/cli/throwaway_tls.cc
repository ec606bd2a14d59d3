#include "services/cli/throwaway_tls.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace kvtier::cli {
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

}  // namespace

absl::Status MakeThrowawayTls(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot make ", dir, ": ", error.message()));
  const std::string ca_key = dir + "/ca.key", csr = dir + "/tls.csr";
  const std::vector<std::string> p256 = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"};
  std::vector<std::string> ca = {"req",  "-x509", "-days",        "1", "-subj", "/CN=kvtier up throwaway CA", "-keyout",
                                 ca_key, "-out",  dir + "/ca.crt"};
  ca.insert(ca.begin() + 2, p256.begin(), p256.end());
  std::vector<std::string> request = {
      "req",     "-subj",          "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
      "-keyout", dir + "/tls.key", "-out",          csr};
  request.insert(request.begin() + 1, p256.begin(), p256.end());
  absl::Status made = Openssl(ca);
  if (made.ok()) made = Openssl(request);
  if (made.ok()) {
    made = Openssl({"x509", "-req", "-in", csr, "-CA", dir + "/ca.crt", "-CAkey", ca_key, "-CAcreateserial", "-days",
                    "1", "-copy_extensions", "copy", "-out", dir + "/tls.crt"});
  }
  for (const std::string& gone : {ca_key, csr, dir + "/ca.srl"}) std::filesystem::remove(gone, error);
  return made;
}

}  // namespace kvtier::cli
