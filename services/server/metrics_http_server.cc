#include "services/server/metrics_http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <prometheus/text_serializer.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "services/base/bind_check.h"

namespace kvtier {
namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// A request head larger than this is refused: a scrape's is a few hundred
// bytes.
constexpr size_t kMaxRequestHead = 8 << 10;

absl::StatusOr<int> Listen(const std::string& address) {
  absl::StatusOr<AddressList> found = ListenAddresses(address);
  if (!found.ok()) return found.status();
  int listener = -1;
  for (const addrinfo* a = found->get(); a != nullptr && listener < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      listener = fd;
    } else {
      close(fd);
    }
  }
  if (listener < 0) return absl::UnavailableError(WhyCannotBind(address));
  return listener;
}

int LocalPort(int socket) {
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  getsockname(socket, reinterpret_cast<sockaddr*>(&local), &length);
  return local.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
}

std::string PeerAddress(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "";
  if (peer.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr, text, sizeof text);
  } else if (peer.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr, text, sizeof text);
  }
  return text;
}

std::string Response(std::string_view status, std::string_view body, bool with_body) {
  std::string head =
      "HTTP/1.1 " + std::string(status) +
      "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n";
  if (with_body) head += body;
  return head;
}

// The whole answer to a request head: the metrics for GET (or HEAD)
// /metrics, 404 or 405 for anything else.
std::string Answer(std::string_view head, const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  const std::string_view line = head.substr(0, head.find('\n'));
  const size_t first_space = line.find(' ');
  const std::string_view method = line.substr(0, first_space);
  std::string_view path;
  if (first_space != std::string_view::npos) {
    path = line.substr(first_space + 1);
    path = path.substr(0, std::min(path.find(' '), path.find('?')));
  }
  if (method != "GET" && method != "HEAD") return Response("405 Method Not Allowed", "GET /metrics\n", true);
  if (path != "/metrics") return Response("404 Not Found", "metrics are at /metrics\n", method == "GET");
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : collectables) {
    std::vector<prometheus::MetricFamily> collected = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  }
  return Response("200 OK", prometheus::TextSerializer().Serialize(families), method == "GET");
}

}  // namespace

struct MetricsHttpServer::Connection {
  std::string peer;
  SteadyTime accepted;
  SteadyTime last_progress;
  std::string in;   // the request head so far
  std::string out;  // the answer, once there is one (never empty then)
  size_t sent = 0;  // of `out`
  bool answered() const { return !out.empty(); }
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
    const MetricsHttpOptions& options) {
  absl::StatusOr<int> listener = Listen(address);
  if (!listener.ok()) return listener.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(*listener);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(*listener, LocalPort(*listener), wake, std::move(collectables), options));
}

MetricsHttpServer::MetricsHttpServer(int listener, int port, int wake,
                                     std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
                                     const MetricsHttpOptions& options)
    : listener_(listener), port_(port), wake_(wake), collectables_(std::move(collectables)), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof one);
  thread_.join();
  close(wake_);
  close(listener_);
}

void MetricsHttpServer::Loop() {
  const int poller = epoll_create1(EPOLL_CLOEXEC);
  absl::flat_hash_map<int, Connection> connections;
  absl::flat_hash_map<std::string, size_t> per_peer;
  auto watch = [&](int fd, uint32_t events, int op) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    epoll_ctl(poller, op, fd, &e);
  };
  auto drop = [&](int fd) {
    auto it = connections.find(fd);
    if (--per_peer[it->second.peer] == 0) per_peer.erase(it->second.peer);
    connections.erase(it);
    close(fd);  // leaves the epoll set too
  };
  // The connection still waiting for its request that came first, of
  // `peer` (or of anyone, for an empty one); -1 when none waits.
  auto oldest_waiting = [&](const std::string& peer) {
    int oldest = -1;
    SteadyTime since = SteadyTime::max();
    for (const auto& [fd, c] : connections) {
      if (c.answered() || (!peer.empty() && c.peer != peer) || c.accepted >= since) continue;
      oldest = fd;
      since = c.accepted;
    }
    return oldest;
  };
  // Sends what it can; false when the connection is done (all sent, or the
  // peer is gone).
  auto send_some = [&](int fd, Connection& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n = send(fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      c.sent += static_cast<size_t>(n);
      c.last_progress = std::chrono::steady_clock::now();
    }
    return false;
  };
  // Reads what has arrived; false when the connection is done.
  auto receive = [&](int fd, Connection& c) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      c.in.append(buffer, static_cast<size_t>(n));
      c.last_progress = std::chrono::steady_clock::now();
      if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) break;
      if (c.in.size() > kMaxRequestHead) {
        c.out = Response("431 Request Header Fields Too Large", "", false);
        break;
      }
    }
    if (!c.answered()) c.out = Answer(c.in, collectables_);
    if (send_some(fd, c)) {
      watch(fd, EPOLLOUT, EPOLL_CTL_MOD);
      return true;
    }
    return false;
  };
  auto accept_all = [&] {
    // A bounded batch a turn: the connections already here are read first.
    for (int i = 0; i < 64; ++i) {
      sockaddr_storage peer{};
      socklen_t length = sizeof peer;
      const int fd = accept4(listener_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      const std::string address = PeerAddress(peer);
      if (per_peer[address] >= options_.max_connections_per_peer) {
        const int oldest = oldest_waiting(address);
        if (oldest >= 0) drop(oldest);
      }
      if (connections.size() >= options_.max_connections) {
        const int oldest = oldest_waiting("");
        if (oldest >= 0) drop(oldest);
      }
      if (per_peer[address] >= options_.max_connections_per_peer || connections.size() >= options_.max_connections) {
        if (per_peer[address] == 0) per_peer.erase(address);
        close(fd);  // every connection there is being answered
        continue;
      }
      const SteadyTime now = std::chrono::steady_clock::now();
      Connection& c = connections[fd];
      c.peer = address;
      c.accepted = c.last_progress = now;
      ++per_peer[address];
      watch(fd, EPOLLIN, EPOLL_CTL_ADD);
      // A scraper's request is usually here already: answered now, it is
      // out of reach of the next connection's room-making.
      if (!receive(fd, c)) drop(fd);
    }
  };

  watch(wake_, EPOLLIN, EPOLL_CTL_ADD);
  watch(listener_, EPOLLIN, EPOLL_CTL_ADD);
  const auto idle_timeout = absl::ToChronoMilliseconds(options_.idle_timeout);
  constexpr auto kSweepEvery = std::chrono::milliseconds(100);
  SteadyTime next_sweep = std::chrono::steady_clock::now() + kSweepEvery;
  std::vector<epoll_event> events(64);
  for (;;) {
    const int n = epoll_wait(poller, events.data(), static_cast<int>(events.size()), kSweepEvery.count());
    bool stop = false, incoming = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_) {
        stop = true;
      } else if (fd == listener_) {
        incoming = true;
      } else if (auto it = connections.find(fd); it != connections.end()) {
        Connection& c = it->second;
        const bool open = c.answered() ? send_some(fd, c) : receive(fd, c);
        if (!open) drop(fd);
      }
    }
    if (stop) break;
    if (incoming) accept_all();
    // Idle connections, looked for at most every kSweepEvery, not at every
    // event.
    const SteadyTime now = std::chrono::steady_clock::now();
    if (now < next_sweep) continue;
    next_sweep = now + kSweepEvery;
    std::vector<int> idle;
    for (const auto& [fd, c] : connections) {
      if (now - c.last_progress >= idle_timeout) idle.push_back(fd);
    }
    for (int fd : idle) drop(fd);
  }
  for (const auto& [fd, c] : connections) close(fd);
  close(poller);
}

}  // namespace kvtier
