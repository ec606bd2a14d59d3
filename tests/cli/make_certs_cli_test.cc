// `kvtier make-certs`, the real binary: a CA and certificates that openssl
// verifies, with the names the manifests use, and that a real kvtier-cache
// with mutual TLS accepts from a client made with them.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "services/base/child_process.h"

namespace kvtier::cli {
namespace {

namespace fs = std::filesystem;

TEST(MakeCertsCli, MakesACaAndCertificatesAMutualTlsCacheAccepts) {
  const fs::path dir = fs::temp_directory_path() / ("kvtier_make_certs_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string make = std::string(KVTIER_BINARY) + " make-certs --out " + dir.string();
  const CommandResult made =
      RunCommand(make + " --namespace inference --name cache.example.com,10.1.2.3 --client acme");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  struct stat key {};
  ASSERT_EQ(stat((dir / "ca.key").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600u) << "the CA's key is readable by others";
  for (const fs::path& leaf : {dir / "server", dir / "clients/acme"}) {
    const CommandResult verify =
        RunCommand("openssl verify -CAfile " + (leaf / "ca.crt").string() + " " + (leaf / "tls.crt").string());
    EXPECT_EQ(verify.exit_code, 0) << leaf << ": " << verify.output;
  }
  const CommandResult names =
      RunCommand("openssl x509 -noout -ext subjectAltName -in " + (dir / "server/tls.crt").string());
  for (const std::string name :
       {"DNS:*.kvtier-cache.inference.svc.cluster.local", "DNS:kvtier-prefill.inference.svc", "DNS:localhost",
        "IP Address:127.0.0.1", "DNS:cache.example.com", "IP Address:10.1.2.3"}) {
    EXPECT_NE(names.output.find(name), std::string::npos) << name << " in " << names.output;
  }
  const CommandResult subject =
      RunCommand("openssl x509 -noout -subject -in " + (dir / "clients/acme/tls.crt").string());
  EXPECT_NE(subject.output.find("CN = acme"), std::string::npos) << subject.output;

  // A cache requiring client certificates takes the client's.
  ChildProcess cache({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity",
                      "16MiB", "--host-capacity", "16MiB", "--tls-dir", (dir / "server").string(),
                      "--tls-require-client-cert"});
  const int port = cache.WaitForListeningPort();
  ASSERT_GT(port, 0);
  const std::string stats = std::string(KVTIER_BINARY) +
                            " stats --timeout-ms 5000 --target localhost:" + std::to_string(port) + " --tls-dir ";
  const CommandResult as_acme = RunCommand(stats + (dir / "clients/acme").string());
  EXPECT_EQ(as_acme.exit_code, 0) << as_acme.output;

  // A second CA over the first is refused, and so is a bad name.
  const CommandResult again = RunCommand(make);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("already holds a CA"), std::string::npos) << again.output;
  const CommandResult bad = RunCommand(make + "-2 --name 'not a name'");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("neither a DNS name nor an IP address"), std::string::npos) << bad.output;
  fs::remove_all(dir);
  fs::remove_all(dir.string() + "-2");
}

}  // namespace
}  // namespace kvtier::cli
