// gRPC core's lines in kvtier's words (ExplainGrpcLine), on the lines
// gRPC 1.51 writes.
#include "services/rpc/library_logs.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(LibraryLogsTest, FailedHandshakesSayWhatWentWrong) {
  const std::optional<LibraryLine> plaintext = ExplainGrpcLine(
      LogLevel::kError,
      "Handshake failed with fatal error SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version number.");
  ASSERT_TRUE(plaintext.has_value());
  EXPECT_EQ(plaintext->level, LogLevel::kWarning);
  EXPECT_NE(plaintext->text.find("spoke plaintext to the other's TLS"), std::string::npos) << plaintext->text;
  const std::optional<LibraryLine> no_certificate = ExplainGrpcLine(
      LogLevel::kError,
      "Handshake failed with fatal error SSL_ERROR_SSL: error:0A0000C7:SSL routines::peer did not return a "
      "certificate.");
  ASSERT_TRUE(no_certificate.has_value());
  EXPECT_NE(no_certificate->text.find("--tls-require-client-cert"), std::string::npos) << no_certificate->text;
  EXPECT_NE(plaintext->kind, no_certificate->kind);  // limited apart
}

// gRPC's verify callback gives OpenSSL's error as a number (23: revoked).
TEST(LibraryLogsTest, AFailedVerificationSaysWhyInWords) {
  const std::optional<LibraryLine> revoked =
      ExplainGrpcLine(LogLevel::kError, "Certificate verify failed with code 23");
  ASSERT_TRUE(revoked.has_value());
  EXPECT_EQ(revoked->level, LogLevel::kWarning);
  EXPECT_EQ(revoked->text, "TLS: a peer's certificate failed verification: certificate revoked (ca.crl revokes it)");
  const std::optional<LibraryLine> list_due =
      ExplainGrpcLine(LogLevel::kError, "Certificate verify failed with code 12");
  ASSERT_TRUE(list_due.has_value());
  EXPECT_NE(list_due->text.find("CRL has expired (ca.crl's list of its CA is past its next update"), std::string::npos)
      << list_due->text;
  EXPECT_NE(revoked->kind, list_due->kind);  // limited apart
}

TEST(LibraryLogsTest, APortInUseIsLeftToKvtiersOwnLine) {
  EXPECT_FALSE(ExplainGrpcLine(LogLevel::kError,
                               "UNKNOWN:No address added out of total 1 resolved for '127.0.0.1:7070' "
                               "{file:\"chttp2_server.cc\", file_line:960, children:[]}")
                   .has_value());
}

TEST(LibraryLogsTest, OtherLinesLoseGrpcsBookkeepingOnly) {
  const std::optional<LibraryLine> line = ExplainGrpcLine(
      LogLevel::kError,
      "UNKNOWN:Unable to configure socket {fd:9, created_time:\"2026-12-03T20:21:00.1031601+00:00\", "
      "file_line:219, file:\"./src/core/lib/iomgr/tcp_server_utils_posix_common.cc\", children:[UNKNOWN:Address "
      "already in use {syscall:\"bind\", os_error:\"Address already in use\", errno:98, "
      "created_time:\"2026-12-03T20:21:00.103088824+00:00\", file_line:193, file:\"x.cc\"}]}");
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->level, LogLevel::kError);
  EXPECT_EQ(line->text.find("created_time"), std::string::npos) << line->text;
  EXPECT_EQ(line->text.find("file_line"), std::string::npos) << line->text;
  EXPECT_EQ(line->text.find(".cc"), std::string::npos) << line->text;
  EXPECT_NE(line->text.find("Unable to configure socket {fd:9"), std::string::npos) << line->text;
  EXPECT_NE(line->text.find("os_error:\"Address already in use\", errno:98"), std::string::npos) << line->text;
}

}  // namespace
}  // namespace kvtier
