// `cmake --install` of this build into a fresh prefix. The servers'
// component: the binaries, which find their libraries, and `kvtier up` on
// the trained model installed beside them, run from outside the tree. The
// C++ client: clients/cpp/example configured and built outside the tree
// against the prefix (find_package(kvtier)), and run against the installed
// kvtier-cache, plaintext and with mutual TLS.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "services/base/child_process.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

// The kvtier-cache `binary` on a free port; `target` is where it serves.
std::unique_ptr<ChildProcess> StartCache(const std::string& binary, std::vector<std::string> extra,
                                         std::string& target) {
  std::vector<std::string> argv = {binary, "--listen",          "127.0.0.1:0", "--metrics-listen",
                                   "",     "--device-capacity", "16MiB",       "--host-capacity",
                                   "16MiB"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto cache = std::make_unique<ChildProcess>(std::move(argv));
  const int port = cache->WaitForListeningPort();
  target = port > 0 ? "localhost:" + std::to_string(port) : "";
  return cache;
}

// The directories of `binary`'s run path (readelf), but those in this build
// tree.
std::set<std::string> RunPathOutsideTheBuild(const std::string& binary) {
  const CommandResult dynamic = RunCommand("readelf -d " + binary);
  EXPECT_EQ(dynamic.exit_code, 0) << dynamic.output;
  const std::string marker = "runpath: [";
  const size_t at = dynamic.output.find(marker);
  if (at == std::string::npos) return {};
  const size_t begin = at + marker.size(), end = dynamic.output.find(']', begin);
  std::set<std::string> dirs;
  const std::vector<std::string> entries =
      absl::StrSplit(dynamic.output.substr(begin, end - begin), ':', absl::SkipEmpty());
  for (const std::string& dir : entries) {
    if (!absl::StartsWith(dir, KVTIER_BUILD_DIR)) dirs.insert(dir);
  }
  return dirs;
}

const std::string kInstall = std::string(KVTIER_CMAKE) + " --install " + KVTIER_BUILD_DIR + " --prefix ";

TEST(ServersInstall, TheBinariesFindTheirLibrariesAndKvtierUpRunsOnTheInstalledModel) {
  const testing::TempDir dir("kvtier_servers_");
  const std::string prefix = (dir / "prefix").string();
  const CommandResult installed = RunCommand(kInstall + prefix + " --component servers");
  ASSERT_EQ(installed.exit_code, 0) << installed.output;
  EXPECT_FALSE(std::filesystem::exists(prefix + "/lib")) << "the client's libraries came with the servers";
  // Each binary installed, finding the libraries from outside the build
  // (CUDA's runtime) where the build's copy does: a loader whose own paths
  // do not name them (a fresh Debian's) would not.
  for (const char* binary : {"kvtier", "kvtier-cache", "kvtier-decode", "kvtier-prefill"}) {
    ASSERT_TRUE(std::filesystem::exists(prefix + "/bin/" + binary)) << binary;
    EXPECT_EQ(RunPathOutsideTheBuild(prefix + "/bin/" + binary),
              RunPathOutsideTheBuild(std::string(KVTIER_BUILD_DIR) + "/services/" + binary))
        << binary;
  }
  // `kvtier up` from elsewhere: the servers beside it, the model from the
  // prefix, not from the source tree (whose path it also knows).
  const std::string model = prefix + "/share/kvtier/jargon-mla";
  ASSERT_TRUE(std::filesystem::exists(model + "/model.safetensors"));
  const CommandResult up =
      RunCommand("cd " + dir.path().string() + " && " + prefix + "/bin/kvtier up --dir " + (dir / "up").string());
  EXPECT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("the model in " + model + " (text through its byte tokenizer)"), std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("128 from the cache"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find("all three stopped cleanly"), std::string::npos) << up.output;
}

TEST(CppClientInstall, AProgramOutsideTheTreeBuildsAgainstTheInstallAndStoresAndFetches) {
  const testing::TempDir dir("kvtier_cpp_client_");
  const std::string prefix = (dir / "prefix").string(), build = (dir / "build").string();
  const CommandResult installed = RunCommand(kInstall + prefix);
  ASSERT_EQ(installed.exit_code, 0) << installed.output;
  const std::string cache_binary = prefix + "/bin/kvtier-cache";
  // The client's component alone: no binaries.
  const std::string client_only = (dir / "client-only").string();
  const CommandResult client_installed = RunCommand(kInstall + client_only + " --component client");
  ASSERT_EQ(client_installed.exit_code, 0) << client_installed.output;
  EXPECT_TRUE(std::filesystem::exists(client_only + "/lib/cmake/kvtier/kvtierConfig.cmake"));
  EXPECT_FALSE(std::filesystem::exists(client_only + "/bin"));
  const CommandResult configured = RunCommand(
      std::string(KVTIER_CMAKE) + " -S " + KVTIER_SOURCE_DIR + "/clients/cpp/example -B " + build + " -G '" +
      KVTIER_CMAKE_GENERATOR + "' -DCMAKE_CXX_COMPILER=" + KVTIER_CXX_COMPILER + " -DCMAKE_PREFIX_PATH=" + prefix);
  ASSERT_EQ(configured.exit_code, 0) << configured.output;
  const CommandResult built = RunCommand(std::string(KVTIER_CMAKE) + " --build " + build);
  ASSERT_EQ(built.exit_code, 0) << built.output;
  const std::string program = build + "/store_and_fetch ";

  std::string target;
  {
    std::unique_ptr<ChildProcess> cache = StartCache(cache_binary, {}, target);
    ASSERT_FALSE(target.empty());
    const CommandResult ran = RunCommand(program + target);
    EXPECT_EQ(ran.exit_code, 0) << ran.output;
    EXPECT_NE(ran.output.find("128 of 128 prompt tokens cached"), std::string::npos) << ran.output;
    EXPECT_NE(ran.output.find("fetched 2 blocks"), std::string::npos) << ran.output;
  }

  // With mutual TLS: the client's certificate from `kvtier make-certs`,
  // given to the program's SetClientIdentity; without it, refused.
  const std::string certs = (dir / "certs").string();
  const CommandResult made = RunCommand(prefix + "/bin/kvtier make-certs --out " + certs + " --client app");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::unique_ptr<ChildProcess> cache =
      StartCache(cache_binary, {"--tls-dir", certs + "/server", "--tls-require-client-cert"}, target);
  ASSERT_FALSE(target.empty());
  const CommandResult over_tls = RunCommand(program + target + " " + certs + "/clients/app");
  EXPECT_EQ(over_tls.exit_code, 0) << over_tls.output;
  const CommandResult plaintext = RunCommand(program + target);
  EXPECT_NE(plaintext.exit_code, 0) << plaintext.output;
  EXPECT_NE(plaintext.output.find("is not serving"), std::string::npos) << plaintext.output;
}

}  // namespace
}  // namespace kvtier
