// PeerTrust on certificates and lists made by the openssl command line:
// what a handshake would refuse (security_test shows gRPC's handshake
// refusing the same), and until when what it takes stays trusted.
#include "services/rpc/peer_trust.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/integration/test_certificates.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using testing::Contents;

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

class PeerTrustTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("kvtier-peer-trust-");
    root_ = new testing::TestCa(Path("root"), "kvtier root CA");
    other_ = new testing::TestCa(Path("other"), "some other CA");
    intermediate_ = new testing::TestCa(Path("intermediate"), "kvtier issuing CA", *root_);
  }
  static void TearDownTestSuite() {
    delete intermediate_;
    delete other_;
    delete root_;
    delete dir_;
  }
  static fs::path Path(const std::string& name) { return dir_->path() / name; }

  // A client certificate of `ca` named `cn`, due at `until` (0: a day on);
  // the chain it presents, its certificate first.
  static std::string Client(const testing::TestCa& ca, const std::string& cn, int64_t until = 0, int64_t from = 0) {
    const fs::path out = Path(cn);
    if (until == 0) {
      ca.Issue(out, cn, "DNS:" + cn + ".clients.kvtier");
    } else {
      ca.Issue(out, cn, "DNS:" + cn + ".clients.kvtier", testing::TestCa::Asn1Time(from == 0 ? Now() - 60 : from),
               testing::TestCa::Asn1Time(until));
    }
    return Contents(out / "tls.crt");
  }

  // `ca`'s list of what it has revoked, due at `next_update`, as checked
  // against `cas` (PEM of the CA certificates that may sign it).
  static RevocationLists::List List(const testing::TestCa& ca, const fs::path& ca_crt, int64_t next_update) {
    const fs::path crl = Path(ca_crt.parent_path().filename().string() + "-" + std::to_string(next_update) + ".crl");
    ca.WriteCrl(crl, Now() - 60, next_update);
    const std::vector<Certificate> cas = PemBlocks(Contents(ca_crt), PEM_read_bio_X509);
    absl::StatusOr<RevocationLists::Version> version = RevocationLists::Check(crl.string(), {cas.front().get()});
    EXPECT_TRUE(version.ok()) << version.status();
    return version.ok() ? version->lists.front() : RevocationLists::List();
  }

  static std::shared_ptr<const PeerTrust> Trust(const std::string& ca_pem,
                                                const std::vector<RevocationLists::List>& lists = {}) {
    absl::StatusOr<std::shared_ptr<const PeerTrust>> trust = PeerTrust::Make(ca_pem, lists);
    EXPECT_TRUE(trust.ok()) << trust.status();
    return trust.ok() ? *trust : nullptr;
  }

  static void ExpectRefused(const absl::StatusOr<absl::Time>& verdict, const std::string& who, const std::string& why) {
    ASSERT_FALSE(verdict.ok()) << who << " was let in";
    EXPECT_EQ(verdict.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_NE(verdict.status().message().find("CN=" + who), std::string::npos) << verdict.status();
    EXPECT_NE(verdict.status().message().find(why), std::string::npos) << verdict.status();
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline testing::TestCa* root_ = nullptr;
  static inline testing::TestCa* other_ = nullptr;
  static inline testing::TestCa* intermediate_ = nullptr;
};

// A client is trusted until the first of its certificate's expiry and its
// CA's list's next update; its CA's own certificate lasts longer.
TEST_F(PeerTrustTest, AClientIsTrustedUntilItsCertificateOrItsListFallsDue) {
  const int64_t now = Now();
  const std::string acme = Client(*root_, "acme", now + 7200);
  const std::string root_ca = Contents(Path("root") / "ca.crt");
  EXPECT_EQ(Trust(root_ca)->VerifyClient(acme).value(), absl::FromUnixSeconds(now + 7200));
  const RevocationLists::List due_sooner = List(*root_, Path("root") / "ca.crt", now + 3600);
  EXPECT_EQ(Trust(root_ca, {due_sooner})->VerifyClient(acme).value(), absl::FromUnixSeconds(now + 3600));
  // Another CA's list, due sooner still, does not check acme.
  const RevocationLists::List others = List(*other_, Path("other") / "ca.crt", now + 1800);
  const std::string both = root_ca + Contents(Path("other") / "ca.crt");
  EXPECT_EQ(Trust(both, {due_sooner, others})->VerifyClient(acme).value(), absl::FromUnixSeconds(now + 3600));
}

// What a handshake refuses, each said in OpenSSL's words with the
// certificate's name: revoked by its CA's list, expired, not yet valid, of
// a CA not trusted; a CA without a list checks no revocation.
TEST_F(PeerTrustTest, RevokedExpiredAndUnknownClientsAreRefusedSayingWhy) {
  const int64_t now = Now();
  const std::string wayne = Client(*root_, "wayne"), kept = Client(*root_, "kept");
  root_->Revoke(Path("wayne") / "tls.crt");
  const RevocationLists::List revoking = List(*root_, Path("root") / "ca.crt", now + 3600);
  root_->ReinstateAll();
  const std::string root_ca = Contents(Path("root") / "ca.crt"), other_ca = Contents(Path("other") / "ca.crt");
  const std::shared_ptr<const PeerTrust> trust = Trust(root_ca + other_ca, {revoking});

  ExpectRefused(trust->VerifyClient(wayne), "wayne", "certificate revoked");
  EXPECT_TRUE(trust->VerifyClient(kept).ok());
  EXPECT_TRUE(Trust(root_ca)->VerifyClient(wayne).ok()) << "refused without the list";
  ExpectRefused(trust->VerifyClient(Client(*root_, "lapsed", now - 3600, now - 7200)), "lapsed",
                "certificate has expired");
  ExpectRefused(trust->VerifyClient(Client(*root_, "early", now + 7200, now + 3600)), "early",
                "certificate is not yet valid");
  const std::string initech = Client(*other_, "initech");
  EXPECT_TRUE(trust->VerifyClient(initech).ok()) << "a CA without a list";
  ExpectRefused(Trust(root_ca, {revoking})->VerifyClient(initech), "initech", "unable to get local issuer certificate");
  const absl::StatusOr<absl::Time> garbage = trust->VerifyClient("-----BEGIN CERTIFICATE-----\nnot one\n");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(PeerTrust::Make("no PEM here", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Through an intermediate CA, as cert-manager issues: the chain the client
// sends with its certificate is used, and both CAs' lists count (the root's
// can revoke the intermediate itself).
TEST_F(PeerTrustTest, AClientOfAnIntermediateCaIsCheckedAgainstBothCasLists) {
  const int64_t now = Now();
  const std::string intermediate_ca = Contents(Path("intermediate") / "ca.crt");
  const std::string globex = Client(*intermediate_, "globex", now + 7200), chain = globex + intermediate_ca;
  const std::string root_ca = Contents(Path("root") / "ca.crt");
  EXPECT_EQ(Trust(root_ca)->VerifyClient(chain).value(), absl::FromUnixSeconds(now + 7200));
  ExpectRefused(Trust(root_ca)->VerifyClient(globex), "globex", "unable to get local issuer certificate");

  const RevocationLists::List nothing_revoked = List(*intermediate_, Path("intermediate") / "ca.crt", now + 600);
  EXPECT_EQ(Trust(root_ca, {nothing_revoked})->VerifyClient(chain).value(), absl::FromUnixSeconds(now + 600));
  intermediate_->Revoke(Path("globex") / "tls.crt");
  const RevocationLists::List leaf_revoked = List(*intermediate_, Path("intermediate") / "ca.crt", now + 3600);
  intermediate_->ReinstateAll();
  ExpectRefused(Trust(root_ca, {leaf_revoked})->VerifyClient(chain), "globex", "certificate revoked");

  root_->Revoke(Path("intermediate") / "ca.crt");
  const RevocationLists::List intermediate_revoked = List(*root_, Path("root") / "ca.crt", now + 3600);
  root_->ReinstateAll();
  ExpectRefused(Trust(root_ca, {intermediate_revoked})->VerifyClient(chain), "kvtier issuing CA",
                "certificate revoked");
}

}  // namespace
}  // namespace kvtier
