#include "services/cache/bulk_client.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/cache/bulk_stream.h"

namespace kvtier::cache {

absl::StatusOr<std::unique_ptr<BulkClient>> BulkClient::Connect(const std::string& address,
                                                                absl::Duration io_timeout) {
  absl::StatusOr<int> fd = bulk::OpenTcpSocket(address, /*passive=*/false, [&](int fd, const addrinfo& a) {
    return bulk::ConfigureSocket(fd, io_timeout).ok() && connect(fd, a.ai_addr, a.ai_addrlen) == 0;
  });
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("cannot connect to the bulk stream: ", fd.status().message()));
  }
  return std::unique_ptr<BulkClient>(new BulkClient(*fd));
}

BulkClient::~BulkClient() {
  if (fd_ >= 0) close(fd_);
}

absl::Status BulkClient::Get(const v1::GetRequest& request, const RecordDestination& destination,
                             const std::function<void(const RawBlock&)>& on_block) {
  if (broken()) return absl::UnavailableError("this bulk stream connection broke earlier");
  const std::string body = request.SerializeAsString();
  if (body.size() > bulk::kMaxBulkRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", body.size(), "-byte request; the bulk stream takes ",
                                                   bulk::kMaxBulkRequestBytes, " at most"));
  }
  bulk::RequestHead head{bulk::kBulkRequestMagic, static_cast<uint32_t>(body.size())};
  iovec pieces[2] = {{&head, sizeof head}, {const_cast<char*>(body.data()), body.size()}};
  absl::Status status = bulk::SendAll(fd_, pieces);
  if (status.ok()) status = Receive(request.block_hashes_size(), destination, on_block);
  return status;
}

absl::Status BulkClient::Receive(size_t blocks, const RecordDestination& destination,
                                 const std::function<void(const RawBlock&)>& on_block) {
  // Anything but the cache's own answer leaves the stream at an unknown
  // place: the connection is closed.
  const auto broke = [this](absl::Status why) {
    close(fd_);
    fd_ = -1;
    return why;
  };
  std::string message;
  for (size_t next = 0;; ++next) {
    bulk::Frame frame;
    if (absl::Status s = bulk::ReceiveAll(fd_, {reinterpret_cast<uint8_t*>(&frame), sizeof frame}); !s.ok()) {
      return broke(s);
    }
    if (frame.code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      return broke(absl::InternalError(absl::StrCat("bulk stream answer with status code ", frame.code)));
    }
    const bool end = frame.index == bulk::kBulkEndIndex;
    if (end || frame.code != 0) {
      // A status: its message follows.
      if (frame.length > bulk::kMaxMessageBytes) {
        return broke(absl::InternalError(absl::StrCat("a ", frame.length, "-byte status message")));
      }
      message.assign(frame.length, '\0');
      if (absl::Status s = bulk::ReceiveAll(fd_, {reinterpret_cast<uint8_t*>(message.data()), message.size()});
          !s.ok()) {
        return broke(s);
      }
    }
    const absl::Status status(static_cast<absl::StatusCode>(frame.code), message);
    if (end) {
      if (status.ok() && next != blocks) {
        return broke(absl::InternalError(absl::StrCat("bulk stream ended after ", next, " of ", blocks, " blocks")));
      }
      if (frame.tier == bulk::kClosing) return broke(status);
      return status;
    }
    if (frame.index != next || next >= blocks) {
      return broke(absl::InternalError(absl::StrCat("bulk stream answer for block ", frame.index, " where ",
                                                    next, " of ", blocks, " was due")));
    }
    RawBlock block;
    block.index = frame.index;
    block.tier = static_cast<v1::Tier>(frame.tier);
    block.status = status;
    if (status.ok()) {
      const std::span<uint8_t> out = destination(frame.index, frame.length);
      if (out.size() < frame.length) {
        return broke(absl::InternalError(absl::StrCat("no room for a ", frame.length, "-byte record")));
      }
      if (absl::Status s = bulk::ReceiveAll(fd_, out.first(frame.length)); !s.ok()) return broke(s);
      block.size = frame.length;
    }
    on_block(block);
  }
}

}  // namespace kvtier::cache
