// TlsFiles over certificates made with the openssl command line: what it
// hands gRPC changes only to a whole, matching set; anything else is
// refused, counted and logged without a byte of a key.
#include "services/rpc/tls_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "tests/integration/test_certificates.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

std::string Contents(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Write(const fs::path& path, const std::string& contents) {
  const fs::path tmp = path.string() + ".new";
  std::ofstream(tmp) << contents;
  fs::rename(tmp, path);
}

// The PEM body of a file's first block: what re-encoding keeps of it.
std::string FirstBlockBody(const std::string& pem) {
  const size_t start = pem.find('\n') + 1;
  return pem.substr(start, pem.find("-----END") - start);
}

class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("kvtier-tls-files-");
    testing::TestCa ca(dir_->path() / "ca", "kvtier test CA");
    ca.Issue(dir_->path() / "one", "one", "DNS:localhost");
    ca.Issue(dir_->path() / "two", "two", "DNS:localhost");
    ca.TrustOnly(dir_->path() / "trust");
  }
  static void TearDownTestSuite() { delete dir_; }

  // A directory holding `from`'s three files, to change under a TlsFiles.
  static fs::path Live(const std::string& name, const std::string& from) {
    const fs::path live = dir_->path() / name;
    fs::create_directories(live);
    for (const char* f : {"ca.crt", "tls.crt", "tls.key"}) {
      fs::copy_file(dir_->path() / from / f, live / f, fs::copy_options::overwrite_existing);
    }
    return live;
  }
  static fs::path Path(const std::string& name) { return dir_->path() / name; }

  static inline testing::TempDir* dir_ = nullptr;
};

TEST_F(TlsFilesTest, ItHandsGrpcTheKeyThenTheChainAndTheCa) {
  auto files = TlsFiles::Open(Path("one").string(), /*need_identity=*/true, absl::InfiniteDuration());
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string identity = Contents((*files)->identity_path());
  const size_t key = identity.find("-----BEGIN PRIVATE KEY-----");
  const size_t certificate = identity.find(FirstBlockBody(Contents(Path("one") / "tls.crt")));
  EXPECT_NE(key, std::string::npos);
  EXPECT_NE(certificate, std::string::npos);
  EXPECT_LT(key, certificate);
  EXPECT_NE(Contents((*files)->ca_path()).find(FirstBlockBody(Contents(Path("one") / "ca.crt"))), std::string::npos);
  // Only this user may read the copies.
  struct stat st;
  ASSERT_EQ(stat((*files)->identity_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u);
  const TlsFiles::Health health = (*files)->health();
  EXPECT_TRUE(health.in_force);
  EXPECT_EQ(health.rejected, 0u);
  EXPECT_GT(health.not_after, 0);
}

TEST_F(TlsFilesTest, FilesThatAreNotWholeAreRefusedAtStartSayingWhy) {
  const std::string key_two = Contents(Path("two") / "tls.key");
  struct Case {
    std::string what, file, contents, message;
  };
  const Case cases[] = {
      {"empty key", "tls.key", "", "tls.key: no private key in it"},
      {"empty certificate", "tls.crt", "", "tls.crt: no certificate in it"},
      {"garbage certificate", "tls.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
       "tls.crt: no certificate in it"},
      {"another's key", "tls.key", key_two, "is not the certificate of"},
      {"empty CA", "ca.crt", "", "ca.crt: no certificate in it"},
  };
  for (const Case& c : cases) {
    const fs::path live = Live("start-" + c.file, "one");
    Write(live / c.file, c.contents);
    auto files = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
    ASSERT_FALSE(files.ok()) << c.what;
    EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(files.status().message().find(c.message), std::string::npos) << c.what << ": " << files.status();
  }
  // An encrypted key is refused, never prompted for.
  const fs::path live = Live("start-encrypted", "one");
  ASSERT_TRUE(testing::Shell("openssl pkey -aes256 -passout pass:secret -in " + (Path("one") / "tls.key").string() +
                             " -out " + (live / "tls.key").string()));
  auto files = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("encrypted"), std::string::npos) << files.status();
}

TEST_F(TlsFilesTest, AReloadTakesOnlyAWholeSetAndKeepsTheLastGoodOne) {
  const fs::path live = Live("reload", "one");
  auto opened = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
  ASSERT_TRUE(opened.ok()) << opened.status();
  TlsFiles& files = **opened;
  const std::string first = Contents(files.identity_path());
  struct stat before;
  ASSERT_EQ(stat(files.identity_path().c_str(), &before), 0);

  ::testing::internal::CaptureStderr();
  std::ofstream(live / "tls.key", std::ios::trunc);  // truncated in place
  files.ReloadIfChanged();
  files.ReloadIfChanged();  // unchanged since: not counted again
  EXPECT_EQ(files.health().rejected, 1u);
  EXPECT_FALSE(files.health().in_force);
  Write(live / "tls.key", Contents(Path("one") / "tls.key"));
  Write(live / "tls.crt", Contents(Path("two") / "tls.crt"));  // a rotation half done
  files.ReloadIfChanged();
  EXPECT_EQ(files.health().rejected, 2u);
  EXPECT_EQ(Contents(files.identity_path()), first) << "gRPC was handed a set that is not whole";
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("tls.key: no private key in it"), std::string::npos) << log;
  EXPECT_NE(log.find("is not the certificate of"), std::string::npos) << log;
  EXPECT_NE(log.find("the last good certificate and key stay in force"), std::string::npos) << log;
  EXPECT_EQ(log.find("PRIVATE KEY"), std::string::npos) << "a key reached the log";

  Write(live / "tls.key", Contents(Path("two") / "tls.key"));  // now whole
  files.ReloadIfChanged();
  EXPECT_TRUE(files.health().in_force);
  EXPECT_EQ(files.health().rejected, 2u);
  const std::string second = Contents(files.identity_path());
  EXPECT_NE(second.find(FirstBlockBody(Contents(Path("two") / "tls.crt"))), std::string::npos);
  // A new modification time: gRPC's check that a read did not straddle two
  // versions relies on it.
  struct stat after;
  ASSERT_EQ(stat(files.identity_path().c_str(), &after), 0);
  EXPECT_NE(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
}

TEST_F(TlsFilesTest, AClientWithOnlyTheCaHasNoIdentity) {
  auto files = TlsFiles::Open(Path("trust").string(), /*need_identity=*/false, absl::InfiniteDuration());
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_FALSE((*files)->has_identity());
  EXPECT_FALSE(TlsFiles::Open(Path("trust").string(), /*need_identity=*/true, absl::InfiniteDuration()).ok());
}

TEST_F(TlsFilesTest, TheWatcherThreadTakesANewPairByItself) {
  const fs::path live = Live("watched", "one");
  auto opened = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::Milliseconds(20));
  ASSERT_TRUE(opened.ok()) << opened.status();
  const std::string first = Contents((*opened)->identity_path());
  Write(live / "tls.key", Contents(Path("two") / "tls.key"));
  Write(live / "tls.crt", Contents(Path("two") / "tls.crt"));
  for (int i = 0; i < 500 && Contents((*opened)->identity_path()) == first; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(Contents((*opened)->identity_path()), first);
  EXPECT_TRUE((*opened)->health().in_force);
}

}  // namespace
}  // namespace kvtier
