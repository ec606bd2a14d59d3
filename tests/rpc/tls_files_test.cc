// TlsFiles over certificates made with the openssl command line: what it
// hands gRPC changes only to a whole, matching set; anything else is
// refused, counted and logged without a byte of a key.
#include "services/rpc/tls_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/test_certificates.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing::Contents;

void Write(const fs::path& path, const std::string& contents) {
  const fs::path tmp = path.string() + ".new";
  std::ofstream(tmp) << contents;
  fs::rename(tmp, path);
}

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// The names of the files in `dir`, sorted.
std::vector<std::string> FileNames(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// What `openssl x509 -hash` prints for the certificate at `path`: the name
// OpenSSL looks its CA's files up by.
std::string SubjectHash(const fs::path& path) {
  FILE* out = popen(("openssl x509 -hash -noout -in " + path.string()).c_str(), "r");
  char line[64] = {};
  const bool read = out != nullptr && std::fgets(line, sizeof(line), out) != nullptr;
  if (out != nullptr) pclose(out);
  EXPECT_TRUE(read);
  std::string hash(line);
  while (!hash.empty() && hash.back() == '\n') hash.pop_back();
  return hash;
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
    ca_ = new testing::TestCa(dir_->path() / "ca", "kvtier test CA");
    ca_->Issue(dir_->path() / "one", "one", "DNS:localhost");
    ca_->Issue(dir_->path() / "two", "two", "DNS:localhost");
    ca_->TrustOnly(dir_->path() / "trust");
    other_ca_ = new testing::TestCa(dir_->path() / "other-ca", "some other CA");
    other_ca_->TrustOnly(dir_->path() / "other-trust");
  }
  static void TearDownTestSuite() {
    delete other_ca_;
    delete ca_;
    delete dir_;
  }

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
  static inline testing::TestCa* ca_ = nullptr;
  static inline testing::TestCa* other_ca_ = nullptr;
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
  EXPECT_NE(log.find("the last good certificate, key and revocation lists stay in force"), std::string::npos) << log;
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

// ca.crl's lists go where gRPC's OpenSSL looks them up: a file named by
// the CA's subject hash, each newer list of it under the next number, the
// earlier ones kept (OpenSSL reads each file once and applies the newest).
TEST_F(TlsFilesTest, RevocationListsAreLaidOutAsOpenSslLooksThemUp) {
  const fs::path live = Live("crl", "one");
  const int64_t now = Now();
  ca_->Revoke(Path("two") / "tls.crt");
  ca_->WriteCrl(live / "ca.crl", now - 120, now + 3600);
  auto opened = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
  ASSERT_TRUE(opened.ok()) << opened.status();
  TlsFiles& files = **opened;
  const std::string hash = SubjectHash(live / "ca.crt");
  ASSERT_EQ(hash.size(), 8u);
  EXPECT_EQ(FileNames(files.crl_dir()), std::vector<std::string>{hash + ".r0"});
  EXPECT_EQ(Contents(fs::path(files.crl_dir()) / (hash + ".r0")), Contents(live / "ca.crl"));
  EXPECT_EQ(files.health().crl_next_update, now + 3600);
  // What the lists in force say of a client, for what outlives its handshake.
  const std::string two = Contents(Path("two") / "tls.crt");
  EXPECT_NE(files.trust()->VerifyClient(two).status().message().find("certificate revoked"), std::string::npos);

  ca_->ReinstateAll();
  const std::string first = Contents(live / "ca.crl");
  ca_->WriteCrl(Path("crl-newer.pem"), now - 60, now + 7200);
  Write(live / "ca.crl", Contents(Path("crl-newer.pem")));
  files.ReloadIfChanged();
  EXPECT_TRUE(files.health().in_force);
  EXPECT_EQ(files.health().crl_next_update, now + 7200);
  EXPECT_EQ(FileNames(files.crl_dir()), (std::vector<std::string>{hash + ".r0", hash + ".r1"}));
  EXPECT_EQ(Contents(fs::path(files.crl_dir()) / (hash + ".r0")), first);
  EXPECT_EQ(Contents(fs::path(files.crl_dir()) / (hash + ".r1")), Contents(live / "ca.crl"));
  EXPECT_TRUE(files.trust()->VerifyClient(two).ok()) << "the newer list lifts the revocation";
  // The directory goes with its TlsFiles.
  const std::string crl_dir = files.crl_dir();
  opened->reset();
  EXPECT_FALSE(fs::exists(crl_dir));
}

// What every call asks: whether its client's chain still passes the files
// in force. The answer is kept until the files change (a revocation counts
// at once) or the chain's trust falls due (an expiry counts with no change
// of files); a refusal is logged once, naming the certificate.
TEST_F(TlsFilesTest, AClientIsCheckedAgainstTheFilesInForceAndTheAnswerKeptUntilDue) {
  const fs::path live = Live("check-client", "one");
  const int64_t now = Now();
  ca_->Issue(Path("checked"), "checked", "DNS:checked.clients.kvtier");
  ca_->Issue(Path("brief"), "brief", "DNS:brief.clients.kvtier", testing::TestCa::Asn1Time(now - 60),
             testing::TestCa::Asn1Time(now + 3));
  auto opened = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
  ASSERT_TRUE(opened.ok()) << opened.status();
  TlsFiles& files = **opened;
  const std::string checked = Contents(Path("checked") / "tls.crt"), brief = Contents(Path("brief") / "tls.crt");
  EXPECT_TRUE(files.CheckClient("").ok()) << "a client without a certificate is the handshake's to refuse";
  EXPECT_TRUE(files.CheckClient(checked).ok());
  EXPECT_TRUE(files.CheckClient(brief).ok());
  const absl::Status garbage = files.CheckClient("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  EXPECT_EQ(garbage.code(), absl::StatusCode::kUnauthenticated) << garbage;
  const absl::Status other = files.CheckClient(Contents(Path("other-trust") / "ca.crt"));
  EXPECT_EQ(other.code(), absl::StatusCode::kUnauthenticated) << "a certificate of another CA passed";

  ca_->Revoke(Path("checked") / "tls.crt");
  ca_->WriteCrl(Path("check-client.crl"), now - 60, now + 3600);
  ca_->ReinstateAll();
  ::testing::internal::CaptureStderr();
  Write(live / "ca.crl", Contents(Path("check-client.crl")));
  files.ReloadIfChanged();
  for (int call = 0; call < 3; ++call) {
    const absl::Status refused = files.CheckClient(checked);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << "a revoked client passed after the reload";
    EXPECT_NE(refused.message().find("the certificate of CN=checked: certificate revoked"), std::string::npos)
        << refused;
  }
  EXPECT_TRUE(files.CheckClient(brief).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string said = "a client's calls are refused: the client certificate no longer passes the TLS files";
  EXPECT_NE(log.find(said), std::string::npos) << log;
  EXPECT_EQ(log.find(said), log.rfind(said)) << "one refusal, three calls: logged once\n" << log;

  // The brief certificate expires with no change of files.
  std::this_thread::sleep_until(std::chrono::system_clock::from_time_t(now + 4));
  const absl::Status expired = files.CheckClient(brief);
  EXPECT_EQ(expired.code(), absl::StatusCode::kUnauthenticated) << "a kept answer outlived the certificate";
  EXPECT_NE(expired.message().find("certificate has expired"), std::string::npos) << expired;
}

TEST_F(TlsFilesTest, RevocationListsThatCannotBeTakenAreRefusedAtStartSayingWhy) {
  const int64_t now = Now();
  ca_->WriteCrl(Path("crl-a.pem"), now - 120, now + 3600);
  ca_->WriteCrl(Path("crl-b.pem"), now - 60, now + 3600);
  ca_->WriteCrl(Path("crl-expired.pem"), now - 7200, now - 3600);
  ca_->WriteCrl(Path("crl-early.pem"), now + 3600, now + 7200);
  other_ca_->WriteCrl(Path("crl-other.pem"), now - 60, now + 3600);
  // A CA of the same name and another key.
  testing::TestCa impostor(Path("impostor-ca"), "kvtier test CA");
  impostor.WriteCrl(Path("crl-impostor.pem"), now - 60, now + 3600);
  struct Case {
    std::string what, contents, message;
  };
  const Case cases[] = {
      {"another CA's list", Contents(Path("crl-other.pem")),
       "the list of CN=some other CA is not signed by a CA of ca.crt"},
      {"a list signed by another key", Contents(Path("crl-impostor.pem")),
       "the list of CN=kvtier test CA is not signed by a CA of ca.crt"},
      {"an expired list", Contents(Path("crl-expired.pem")), "the list of CN=kvtier test CA expired at"},
      {"a list not valid yet", Contents(Path("crl-early.pem")), "the list of CN=kvtier test CA is not valid until"},
      {"garbage", "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n", "ca.crl: no revocation list in it"},
      {"an empty file", "", "ca.crl: no revocation list in it"},
      {"two lists of a CA", Contents(Path("crl-a.pem")) + Contents(Path("crl-b.pem")),
       "two lists of CN=kvtier test CA (give only the newest)"},
  };
  for (const Case& c : cases) {
    const fs::path live = Live("crl-start", "one");
    Write(live / "ca.crl", c.contents);
    auto files = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
    ASSERT_FALSE(files.ok()) << c.what;
    EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(files.status().message().find(c.message), std::string::npos) << c.what << ": " << files.status();
  }
}

// OpenSSL never forgets a list it has read: a version of ca.crl that would
// withdraw one or go back to an older one is refused, and the one in force
// stays, said so; a CA dropped from ca.crt takes its list with it.
TEST_F(TlsFilesTest, AReloadNeverWithdrawsOrRollsBackAList) {
  const fs::path live = Live("crl-reload", "one");
  const int64_t now = Now();
  ca_->WriteCrl(Path("crl-older.pem"), now - 120, now + 3600);
  ca_->WriteCrl(Path("crl-in-force.pem"), now - 60, now + 7200);
  Write(live / "ca.crl", Contents(Path("crl-in-force.pem")));
  auto opened = TlsFiles::Open(live.string(), /*need_identity=*/true, absl::InfiniteDuration());
  ASSERT_TRUE(opened.ok()) << opened.status();
  TlsFiles& files = **opened;
  const std::vector<std::string> laid_out = FileNames(files.crl_dir());
  ASSERT_EQ(laid_out.size(), 1u);

  const std::shared_ptr<const PeerTrust> trust = files.trust();
  ::testing::internal::CaptureStderr();
  Write(live / "ca.crl", Contents(Path("crl-older.pem")));
  files.ReloadIfChanged();
  EXPECT_EQ(files.health().rejected, 1u);
  EXPECT_FALSE(files.health().in_force);
  fs::remove(live / "ca.crl");
  files.ReloadIfChanged();
  EXPECT_EQ(files.health().rejected, 2u);
  EXPECT_EQ(FileNames(files.crl_dir()), laid_out);
  EXPECT_EQ(files.health().crl_next_update, now + 7200);
  EXPECT_EQ(files.trust(), trust) << "a refused version changed the trust in force";
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("is no newer than the one in force"), std::string::npos) << log;
  EXPECT_NE(log.find("ca.crl no longer has the list of CN=kvtier test CA, which stays in force"), std::string::npos)
      << log;

  Write(live / "ca.crl", Contents(Path("crl-in-force.pem")));  // the same list again: nothing new to write
  files.ReloadIfChanged();
  EXPECT_TRUE(files.health().in_force);
  EXPECT_EQ(FileNames(files.crl_dir()), laid_out);

  Write(live / "ca.crt", Contents(Path("other-trust") / "ca.crt"));
  fs::remove(live / "ca.crl");
  files.ReloadIfChanged();
  EXPECT_TRUE(files.health().in_force);
  EXPECT_EQ(files.health().rejected, 2u);
  EXPECT_EQ(files.health().crl_next_update, 0);
}

}  // namespace
}  // namespace kvtier
