#include "services/cache/client/raw_get.h"

#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/async_stream.h>
#include <grpcpp/support/byte_buffer.h>

#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/base/wire_reader.h"

namespace kvtier::cache {
namespace {

constexpr char kGetMethod[] = "/kvtier.v1.KvCache/Get";

// Answers received but not landed yet. The receiving thread waits while
// kAhead are waiting, so a slow caller pauses the stream (and with it the
// server) instead of growing this without bound.
class AnswerQueue {
 public:
  // Waits for room (the caller keeps taking answers to the end, even
  // after it cancelled the call).
  void Push(grpc::ByteBuffer& answer) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &AnswerQueue::HasRoomLocked));
    waiting_.emplace_back();
    waiting_.back().Swap(&answer);  // ByteBuffer has no move: a copy would ref every slice again
  }
  void End(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    status_ = status;
    ended_ = true;
  }
  // The next answer, or false (with the stream's status) once it ended.
  bool Pop(grpc::ByteBuffer& answer, grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &AnswerQueue::ReadyLocked));
    if (waiting_.empty()) {
      status = status_;
      return false;
    }
    answer.Swap(&waiting_.front());
    waiting_.pop_front();
    return true;
  }

 private:
  static constexpr size_t kAhead = 2;
  bool HasRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_.size() < kAhead; }
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !waiting_.empty() || ended_; }

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> waiting_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// Runs the call on the calling thread, which polls the call's own
// completion queue: sends the request, reads the whole stream into
// `answers` and ends it with the call's status. The call is generic (bytes
// both ways): the client half of a server-streaming method is one message
// and a half-close.
void Receive(grpc::CompletionQueue& cq, grpc::GenericClientAsyncReaderWriter& call, const grpc::ByteBuffer& request,
             AnswerQueue& answers) {
  void* tag = nullptr;
  bool ok = false;
  const auto step = [&] { return cq.Next(&tag, &ok) && ok; };
  // A call that did not start, or whose request could not be sent, still
  // finishes, with the reason.
  call.StartCall(&call);
  if (step()) {
    call.WriteLast(request, grpc::WriteOptions(), &call);
    if (step()) {
      while (true) {
        grpc::ByteBuffer answer;
        call.Read(&answer, &call);
        if (!step()) break;  // the stream ended, or failed
        answers.Push(answer);
      }
    }
  }
  grpc::Status status;
  call.Finish(&status, &call);
  if (!step()) status = grpc::Status(grpc::StatusCode::INTERNAL, "Get call lost its status");
  answers.End(status);
}

}  // namespace

// Answers are received on a thread of this call's own, which polls the
// connection through a completion queue of its own, and landed on the
// caller's thread, so copying one record into its destination overlaps
// with receiving the next. gRPC's callback API, which did the receiving
// before, was slower here (load/README.md): its two callback threads hand
// the polling to each other on every event.
grpc::Status RawGet(grpc::Channel* channel, grpc::ClientContext* context, const v1::GetRequest& request,
                    const RecordDestination& destination, const std::function<void(const RawBlock&)>& on_block) {
  const std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer serialized(&slice, 1);
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(channel->shared_from_this());
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(context, kGetMethod, &cq);
  AnswerQueue answers;
  std::thread receiver([&] { Receive(cq, *call, serialized, answers); });
  absl::Status parse_error;
  grpc::ByteBuffer answer;
  grpc::Status status;
  while (answers.Pop(answer, status)) {
    if (!parse_error.ok()) continue;  // cancelled: drain what is left
    RawBlock block;
    parse_error = ParseRawGetResponse(answer, destination, block);
    if (!parse_error.ok()) {
      context->TryCancel();
      continue;
    }
    on_block(block);
  }
  receiver.join();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  if (!parse_error.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(parse_error.message()));
  return status;
}

absl::Status ParseRawGetResponse(grpc::ByteBuffer& buffer, const RecordDestination& destination, RawBlock& block) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InternalError("cannot read a Get answer");
  block = RawBlock();
  std::vector<std::span<const uint8_t>> pieces;
  for (const grpc::Slice& slice : slices) pieces.emplace_back(slice.begin(), slice.size());
  WireReader in(pieces);
  // Fields come in number order (protobuf's own order; proto3 leaves out an
  // index of 0), so the index, if any, comes before the record and says
  // where it lands. An index after the record, or a second index or
  // record, is refused: the bytes would land under one index and be
  // reported under another.
  bool have_index = false, have_data = false;
  while (!in.done()) {
    uint64_t tag, length;
    if (!in.Varint(tag)) return absl::InternalError("truncated Get answer");
    const int field = static_cast<int>(tag >> 3), type = static_cast<int>(tag & 7);
    if (type == 0) {
      uint64_t v;
      if (!in.Varint(v)) return absl::InternalError("truncated Get answer");
      if (field == v1::GetResponse::kIndexFieldNumber) {
        if (have_index || have_data) return absl::InternalError("Get answer with its index twice or after its record");
        block.index = static_cast<uint32_t>(v);
        have_index = true;
      }
      if (field == v1::GetResponse::kTierFieldNumber) block.tier = static_cast<v1::Tier>(v);
      continue;
    }
    if (type != 2 || !in.Varint(length)) return absl::InternalError("malformed Get answer");
    if (length > in.remaining()) return absl::InternalError("truncated Get answer");
    if (field == v1::GetResponse::kDataFieldNumber) {
      if (have_data) return absl::InternalError("Get answer with two records");
      std::span<uint8_t> out = destination(block.index, length);
      if (out.size() < length) {
        return absl::InternalError(absl::StrCat("no room for a ", length, "-byte record"));
      }
      if (!in.Read(length, out.data())) return absl::InternalError("truncated record");
      block.size = length;
      have_data = true;
    } else if (field == v1::GetResponse::kMissFieldNumber) {
      std::string bytes(length, '\0');
      v1::BlockMiss miss;
      if (!in.Read(length, reinterpret_cast<uint8_t*>(bytes.data())) || !miss.ParseFromString(bytes)) {
        return absl::InternalError("malformed miss");
      }
      block.status = absl::Status(static_cast<absl::StatusCode>(miss.code()), miss.message());
    } else if (!in.Read(length, nullptr)) {
      return absl::InternalError("truncated Get answer");
    }
  }
  if (!have_data && block.status.ok()) return absl::InternalError("Get answer without data or miss");
  return absl::OkStatus();
}

}  // namespace kvtier::cache
