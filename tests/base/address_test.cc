// HOST:PORT addresses from the command line, checked before anything
// starts, and the host of a gRPC peer, which per-client limits key on.
#include "services/base/address.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

TEST(Address, ListenAddressesTakePortsFrom0) {
  for (const char* ok : {"0.0.0.0:0", "localhost:50051", "[::]:65535", "[::1]:1", "unix-host:8080"}) {
    EXPECT_TRUE(ValidateListenAddress(ok).ok()) << ok;
  }
  for (const char* bad : {"localhost", ":50051", "localhost:", "localhost:http", "localhost:65536", "localhost:-1",
                          "localhost:50051x", "[::1]"}) {
    const absl::Status s = ValidateListenAddress(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message(), absl::StrCat("address '", bad, "' is not HOST:PORT (port 0-65535, 0 = any free)"));
  }
}

TEST(Address, TargetAddressesNeedAPortToCall) {
  for (const char* ok : {"cache-0.cache:50051", "10.0.0.7:1", "[::1]:65535"}) {
    EXPECT_TRUE(ValidateTargetAddress(ok).ok()) << ok;
  }
  for (const char* bad : {"localhost:0", "localhost", ":50051", "localhost:65536", "localhost:-5"}) {
    const absl::Status s = ValidateTargetAddress(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message(), absl::StrCat("address '", bad, "' is not HOST:PORT (port 1-65535)"));
  }
}

// Two connections from one host are one client, whatever their ports.
TEST(Address, PeerHostDropsThePort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:5123"), "10.0.0.7");
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:61000"), PeerHost("ipv4:10.0.0.7:5123"));
  EXPECT_EQ(PeerHost("ipv6:[::1]:5123"), "::1");
  EXPECT_EQ(PeerHost("ipv6:[fd00::7]:443"), "fd00::7");
  EXPECT_EQ(PeerHost("unix:/run/kvtier.sock"), "unix:/run/kvtier.sock");
  EXPECT_EQ(PeerHost("ipv6:[::1"), "ipv6:[::1") << "no closing bracket: kept whole";
}

}  // namespace
}  // namespace kvtier
