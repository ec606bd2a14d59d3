// The C++ client as a package: `cmake --install` of this build into a fresh
// prefix, clients/cpp/example configured and built outside the tree against
// it (find_package(kvtier)), and the program run against a real
// kvtier-cache, plaintext and with mutual TLS.
#include <gtest/gtest.h>

#include <string>

#include "services/base/child_process.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

// A kvtier-cache on a free port; `target` is where it serves.
std::unique_ptr<ChildProcess> StartCache(std::vector<std::string> extra, std::string& target) {
  std::vector<std::string> argv = {
      KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity", "16MiB",
      "--host-capacity",   "16MiB"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto cache = std::make_unique<ChildProcess>(std::move(argv));
  const int port = cache->WaitForListeningPort();
  target = port > 0 ? "localhost:" + std::to_string(port) : "";
  return cache;
}

TEST(CppClientInstall, AProgramOutsideTheTreeBuildsAgainstTheInstallAndStoresAndFetches) {
  const testing::TempDir dir("kvtier_cpp_client_");
  const std::string prefix = (dir / "prefix").string(), build = (dir / "build").string();
  const CommandResult installed =
      RunCommand(std::string(KVTIER_CMAKE) + " --install " + KVTIER_BUILD_DIR + " --prefix " + prefix);
  ASSERT_EQ(installed.exit_code, 0) << installed.output;
  const CommandResult configured = RunCommand(
      std::string(KVTIER_CMAKE) + " -S " + KVTIER_SOURCE_DIR + "/clients/cpp/example -B " + build + " -G '" +
      KVTIER_CMAKE_GENERATOR + "' -DCMAKE_CXX_COMPILER=" + KVTIER_CXX_COMPILER + " -DCMAKE_PREFIX_PATH=" + prefix);
  ASSERT_EQ(configured.exit_code, 0) << configured.output;
  const CommandResult built = RunCommand(std::string(KVTIER_CMAKE) + " --build " + build);
  ASSERT_EQ(built.exit_code, 0) << built.output;
  const std::string program = build + "/store_and_fetch ";

  std::string target;
  {
    std::unique_ptr<ChildProcess> cache = StartCache({}, target);
    ASSERT_FALSE(target.empty());
    const CommandResult ran = RunCommand(program + target);
    EXPECT_EQ(ran.exit_code, 0) << ran.output;
    EXPECT_NE(ran.output.find("128 of 128 prompt tokens cached"), std::string::npos) << ran.output;
    EXPECT_NE(ran.output.find("fetched 2 blocks"), std::string::npos) << ran.output;
  }

  // With mutual TLS: the client's certificate from `kvtier make-certs`,
  // given to the program's SetClientIdentity; without it, refused.
  const std::string certs = (dir / "certs").string();
  const CommandResult made = RunCommand(std::string(KVTIER_BINARY) + " make-certs --out " + certs + " --client app");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::unique_ptr<ChildProcess> cache =
      StartCache({"--tls-dir", certs + "/server", "--tls-require-client-cert"}, target);
  ASSERT_FALSE(target.empty());
  const CommandResult over_tls = RunCommand(program + target + " " + certs + "/clients/app");
  EXPECT_EQ(over_tls.exit_code, 0) << over_tls.output;
  const CommandResult plaintext = RunCommand(program + target);
  EXPECT_NE(plaintext.exit_code, 0) << plaintext.output;
  EXPECT_NE(plaintext.output.find("is not serving"), std::string::npos) << plaintext.output;
}

}  // namespace
}  // namespace kvtier
