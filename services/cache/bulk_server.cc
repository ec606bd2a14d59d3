#include "services/cache/bulk_server.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/cache/bulk_stream.h"
#include "services/common/server_runner.h"

namespace kvtier::cache {
namespace {

absl::StatusOr<int> ListenTcp(const std::string& address, int& port) {
  if (absl::Status s = ValidateListenAddress(address); !s.ok()) return s;
  absl::StatusOr<int> fd = bulk::OpenTcpSocket(address, /*passive=*/true, [](int fd, const addrinfo& a) {
    const int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    return bind(fd, a.ai_addr, a.ai_addrlen) == 0 && listen(fd, 128) == 0;
  });
  if (!fd.ok()) return absl::Status(fd.status().code(), absl::StrCat("cannot listen: ", fd.status().message()));
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  if (getsockname(*fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    close(*fd);
    return absl::InternalError(absl::StrCat("getsockname: ", std::strerror(errno)));
  }
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return *fd;
}

// An end frame: the request's status, and whether the connection closes
// after it.
absl::Status SendEnd(int fd, const absl::Status& status, bool closing = false) {
  const std::string message = bulk::FrameMessage(status);
  bulk::Frame frame{bulk::kBulkEndIndex, static_cast<uint32_t>(status.code()), closing ? bulk::kClosing : 0,
                    static_cast<uint32_t>(message.size())};
  iovec pieces[2] = {{&frame, sizeof frame}, {const_cast<char*>(message.data()), message.size()}};
  return bulk::SendAll(fd, pieces);
}

// Answers a request that cannot be read, then ends the connection so that
// the answer arrives: closing with the peer's bytes still unread would
// reset the connection, and the reset can overtake the answer. So the rest
// of what the peer sent is read and dropped first (up to 1 MiB and the
// socket's receive timeout).
void RefuseAndClose(int fd, const absl::Status& why) {
  if (!SendEnd(fd, why, /*closing=*/true).ok()) return;
  shutdown(fd, SHUT_WR);
  char sink[16384];
  for (size_t dropped = 0; dropped < (1 << 20);) {
    const ssize_t n = recv(fd, sink, sizeof sink, 0);
    if (n <= 0) return;
    dropped += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(const BulkServerOptions& options,
                                                              CacheService* service, RpcMetrics* metrics) {
  if (options.max_connections == 0) return absl::InvalidArgumentError("the bulk stream needs room for a connection");
  int port = 0;
  absl::StatusOr<int> listener = ListenTcp(options.listen, port);
  if (!listener.ok()) return listener.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(*listener);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<BulkServer> server(new BulkServer(options, service, metrics, *listener, wake, port));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

BulkServer::BulkServer(const BulkServerOptions& options, CacheService* service, RpcMetrics* metrics,
                       int listener, int wake, int port)
    : options_(options), service_(service), metrics_(metrics), listener_(listener), wake_(wake), port_(port) {}

BulkServer::~BulkServer() {
  Shutdown();
  close(listener_);
  close(wake_);
}

void BulkServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof one);
  acceptor_.join();
  // No new threads now: join the rest (each finishes its request first).
  std::list<Connection> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(connections_);
  }
  for (Connection& c : left) c.thread.join();
}

size_t BulkServer::connections() const {
  absl::MutexLock lock(&mu_);
  return std::count_if(connections_.begin(), connections_.end(), [](const Connection& c) { return !c.done; });
}

void BulkServer::JoinFinished() {
  std::list<Connection> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& c : finished) c.thread.join();
}

void BulkServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {wake_, POLLIN, 0}};
    // Wakes now and then to join the threads of closed connections.
    const int ready = poll(fds, 2, /*timeout_ms=*/1000);
    JoinFinished();
    if (fds[1].revents != 0) return;
    if (ready <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the listener stays readable, so wait a little
      // (or for Shutdown) rather than spin. Otherwise the peer gave up.
      if (errno == EMFILE || errno == ENFILE) {
        pollfd wake{wake_, POLLIN, 0};
        (void)poll(&wake, 1, /*timeout_ms=*/100);
      }
      continue;
    }
    if (!bulk::ConfigureSocket(fd, options_.io_timeout).ok()) {
      close(fd);
      continue;
    }
    if (connections() >= options_.max_connections) {
      // Not drained as RefuseAndClose does: that could hold the acceptor.
      (void)SendEnd(fd,
                    absl::ResourceExhaustedError(absl::StrCat("the bulk stream serves ", options_.max_connections,
                                                              " connections at most")),
                    /*closing=*/true);
      close(fd);
      continue;
    }
    absl::MutexLock lock(&mu_);
    connections_.emplace_back();
    Connection* c = &connections_.back();
    c->thread = std::thread([this, fd, c] {
      Serve(fd);
      close(fd);
      absl::MutexLock done_lock(&mu_);
      c->done = true;
    });
  }
}

bool BulkServer::WaitForRequest(int fd) const {
  pollfd fds[2] = {{fd, POLLIN, 0}, {wake_, POLLIN, 0}};
  const int ready = poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(options_.idle_timeout)));
  return ready > 0 && fds[1].revents == 0 && fds[0].revents != 0;
}

void BulkServer::Serve(int fd) {
  while (WaitForRequest(fd)) {
    bulk::RequestHead head;
    const absl::Status got = bulk::ReceiveAll(fd, {reinterpret_cast<uint8_t*>(&head), sizeof head}, /*eof_ok=*/true);
    if (!got.ok()) return;  // closed between requests, or a stalled sender
    if (head.magic != bulk::kBulkRequestMagic) {
      return RefuseAndClose(fd, absl::InvalidArgumentError("not a kvtier bulk stream request (wrong magic)"));
    }
    if (head.length > bulk::kMaxBulkRequestBytes) {
      return RefuseAndClose(fd, absl::InvalidArgumentError(absl::StrCat("a ", head.length, "-byte request; at most ",
                                                                        bulk::kMaxBulkRequestBytes)));
    }
    std::string body(head.length, '\0');
    if (!bulk::ReceiveAll(fd, {reinterpret_cast<uint8_t*>(body.data()), body.size()}).ok()) return;
    if (!Answer(fd, body)) return;
  }
}

bool BulkServer::Answer(int fd, const std::string& body) {
  const absl::Time start = absl::Now();
  absl::Status status;  // the request's
  absl::Status sent;    // the connection's
  v1::GetRequest request;
  absl::StatusOr<GetPlan> plan = request.ParseFromString(body)
                                     ? service_->PlanGet(request)
                                     : absl::InvalidArgumentError("GetRequest does not parse");
  if (!plan.ok()) {
    status = plan.status();
  } else {
    std::vector<iovec> pieces;  // the frame, then the record's pages (or a message)
    for (size_t i = 0; i < plan->hashes.size() && sent.ok(); ++i) {
      const GetAnswer answer = service_->ReadForGet(*plan, i);
      bulk::Frame frame{static_cast<uint32_t>(i), static_cast<uint32_t>(answer.miss.code()),
                        static_cast<uint32_t>(answer.tier), 0};
      pieces.assign(1, {&frame, sizeof frame});
      std::string miss;
      if (answer.record != nullptr) {
        frame.length = static_cast<uint32_t>(answer.record->size());
        for (std::span<const uint8_t> piece : answer.record->pieces()) {
          pieces.push_back({const_cast<uint8_t*>(piece.data()), piece.size()});
        }
      } else {
        if (!answer.miss.ok()) miss = bulk::FrameMessage(answer.miss);
        const std::string& bytes = answer.miss.ok() ? answer.subset : miss;
        frame.length = static_cast<uint32_t>(bytes.size());
        pieces.push_back({const_cast<char*>(bytes.data()), bytes.size()});
      }
      sent = bulk::SendAll(fd, pieces);
    }
    if (plan->lease_id != 0) (void)service_->store()->ReleaseLease(plan->lease_id);
    if (!sent.ok()) status = sent;
  }
  if (sent.ok()) sent = SendEnd(fd, status);
  if (metrics_ != nullptr) {
    metrics_->Observe("BulkGet", static_cast<grpc::StatusCode>(status.code()), absl::Now() - start);
  }
  return sent.ok();
}

}  // namespace kvtier::cache
