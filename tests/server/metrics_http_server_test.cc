// MetricsHttpServer on a real loopback socket: what it answers, and that
// silent connections, however many, never keep a scrape out.
#include "services/server/metrics_http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace kvtier {
namespace {

int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// Whether the server closed `fd` within `ms` (it sent nothing else).
bool ClosedWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return false;
  char byte;
  return recv(fd, &byte, 1, 0) <= 0;
}

// Sends `request` and reads until the server closes; "" if it does not
// within 5 s.
std::string Exchange(int port, const std::string& request) {
  const int fd = ConnectTo(port);
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string answer;
  char buffer[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) {
      answer.clear();
      break;
    }
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

class MetricsHttpServerTest : public testing::Test {
 protected:
  void SetUp() override {
    auto& family = prometheus::BuildCounter().Name("test_requests_total").Help("h").Register(*registry_);
    family.Add({}).Increment(3);
    MetricsHttpOptions options;
    options.max_connections = 8;
    options.max_connections_per_peer = 4;
    options.idle_timeout = absl::Milliseconds(300);
    server_ = *MetricsHttpServer::Start("127.0.0.1:0", {registry_}, options);
  }
  std::string Scrape() { return Exchange(server_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); }

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, AnswersMetricsAndRefusesEverythingElse) {
  const std::string page = Scrape();
  ASSERT_TRUE(page.starts_with("HTTP/1.1 200 OK\r\n")) << page;
  const size_t body = page.find("\r\n\r\n") + 4;
  EXPECT_NE(page.find("Content-Length: " + std::to_string(page.size() - body) + "\r\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\ntest_requests_total 3\n"), std::string::npos) << page;
  // A query string is no other page.
  EXPECT_NE(Exchange(server_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n").find("test_requests_total 3"),
            std::string::npos);

  const std::string head = Exchange(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(head.starts_with("HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << "HEAD answered with a body: " << head;

  EXPECT_TRUE(Exchange(server_->port(), "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 ")) << "another path";
  EXPECT_TRUE(Exchange(server_->port(), "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
  // A head that has not ended within 8 KiB (all of it read by the server,
  // so that its close does not reset the connection before the answer).
  const std::string endless = "GET /metrics HTTP/1.1\r\nX: " + std::string(8200, 'a');
  EXPECT_TRUE(Exchange(server_->port(), endless).starts_with("HTTP/1.1 431 ")) << "a request head past 8 KiB";
}

TEST_F(MetricsHttpServerTest, SilentConnectionsAreClosedOldestFirstAndNeverKeepAScrapeOut) {
  std::vector<int> silent;
  for (int i = 0; i < 64; ++i) silent.push_back(ConnectTo(server_->port()));
  // Every scrape is answered at once, however many wait.
  for (int i = 0; i < 5; ++i) EXPECT_NE(Scrape().find("test_requests_total 3"), std::string::npos);
  // One peer keeps at most 4 open: the first 60 were closed to make room,
  // well before the idle timeout.
  int closed = 0;
  for (size_t i = 0; i < 60; ++i) closed += ClosedWithin(silent[i], 100);
  EXPECT_EQ(closed, 60);
  // The rest go once idle.
  for (size_t i = 60; i < silent.size(); ++i) EXPECT_TRUE(ClosedWithin(silent[i], 5000)) << i;
  for (int fd : silent) close(fd);
}

TEST_F(MetricsHttpServerTest, AConnectionThatSendsHalfARequestIsClosedOnceIdle) {
  const int fd = ConnectTo(server_->port());
  const std::string part = "GET /metr";
  ASSERT_EQ(send(fd, part.data(), part.size(), MSG_NOSIGNAL), static_cast<ssize_t>(part.size()));
  EXPECT_TRUE(ClosedWithin(fd, 5000));
  close(fd);
}

TEST(MetricsHttpServerStartTest, ABusyAddressSaysWhy) {
  auto first = MetricsHttpServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsHttpServer::Start("127.0.0.1:" + std::to_string((*first)->port()), {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status();
}

// A port past 65535 is refused, not bound to its low 16 bits.
TEST(MetricsHttpServerStartTest, APortOutOfRangeIsRefused) {
  auto started = MetricsHttpServer::Start("127.0.0.1:99999", {});
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(started.status().message(), "address '127.0.0.1:99999' is not HOST:PORT (port 0-65535, 0 = any free)");
}

}  // namespace
}  // namespace kvtier
