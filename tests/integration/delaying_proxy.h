// A TCP proxy on 127.0.0.1 that holds each new connection for a while
// before it reaches the server behind it, then passes bytes both ways: a
// server whose connections (and TLS handshakes) are that slow to set up;
// and, given `answer_delay`, holds each read of the server's bytes that
// long too: a server slow to answer.
#ifndef KVTIER_TESTS_INTEGRATION_DELAYING_PROXY_H_
#define KVTIER_TESTS_INTEGRATION_DELAYING_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvtier::testing {

class DelayingProxy {
 public:
  DelayingProxy(int upstream_port, absl::Duration delay, absl::Duration answer_delay = absl::ZeroDuration())
      : upstream_port_(upstream_port), delay_(delay), answer_delay_(answer_delay) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof addr;
    if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener_, 16) != 0 || getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }

  // Stops accepting and closes every connection it passes.
  ~DelayingProxy() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    if (listener_ >= 0) shutdown(listener_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : connections_) t.join();
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
    if (listener_ >= 0) close(listener_);
  }

  // 0 when it could not listen.
  int port() const { return port_; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }

  // Keeps `fd` to be shut down and closed; false (and `fd` closed) once stopping.
  bool Keep(int fd) {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return false;
    }
    fds_.push_back(fd);
    return true;
  }

  void Accept() {
    for (int client; (client = accept(listener_, nullptr, nullptr)) >= 0;) {
      if (!Keep(client)) return;
      connections_.emplace_back([this, client] {
        absl::SleepFor(delay_);
        const int server = socket(AF_INET, SOCK_STREAM, 0);
        if (server < 0 || !Keep(server)) return;
        const sockaddr_in addr = Loopback(upstream_port_);
        if (connect(server, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) Pass(client, server);
        shutdown(client, SHUT_RDWR);
        shutdown(server, SHUT_RDWR);
      });
    }
  }

  // Copies bytes each way until either side closes; `b` is the server.
  void Pass(int a, int b) {
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    char buffer[16384];
    while (poll(fds, 2, -1) > 0) {
      for (int i = 0; i < 2; ++i) {
        if (fds[i].revents == 0) continue;
        ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
        if (n <= 0) return;
        if (i == 1) absl::SleepFor(answer_delay_);
        for (ssize_t at = 0; at < n;) {
          const ssize_t written = write(fds[1 - i].fd, buffer + at, static_cast<size_t>(n - at));
          if (written <= 0) return;
          at += written;
        }
      }
    }
  }

  const int upstream_port_;
  const absl::Duration delay_;
  const absl::Duration answer_delay_;
  int listener_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // only the acceptor adds, before the destructor joins it
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_DELAYING_PROXY_H_
