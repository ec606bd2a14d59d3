#include "services/cache/raw_get.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::cache {
namespace {

constexpr char kGetMethod[] = "/kvtier.v1.KvCache/Get";

// Reads bytes across a message's slices in order.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& slice : slices) left_ += slice.size();
  }

  // Bytes not read yet.
  size_t remaining() const { return left_; }

  bool done() {
    Skip();
    return slice_ == slices_.size();
  }
  bool ReadByte(uint8_t& b) {
    Skip();
    if (slice_ == slices_.size()) return false;
    b = slices_[slice_].begin()[offset_++];
    --left_;
    return true;
  }
  bool ReadVarint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(b)) return false;
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Copies `n` bytes to `out` (or skips them when out is null).
  bool Read(size_t n, uint8_t* out) {
    while (n > 0) {
      Skip();
      if (slice_ == slices_.size()) return false;
      const size_t take = std::min(n, slices_[slice_].size() - offset_);
      if (out != nullptr) {
        std::memcpy(out, slices_[slice_].begin() + offset_, take);
        out += take;
      }
      offset_ += take;
      left_ -= take;
      n -= take;
    }
    return true;
  }

 private:
  void Skip() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) ++slice_, offset_ = 0;
  }
  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
  size_t left_ = 0;
};

// Receives the stream on gRPC's threads and lands each answer on the
// caller's thread (in Wait), so copying one record into its destination
// overlaps with receiving the next. At most kAhead answers wait to be
// landed; past that, reading pauses until the caller catches up. Wait
// restarts reads from outside any reaction, so the reactor holds the call
// (AddHold) until a read has found the stream's end: gRPC calls OnDone only
// after that, never under a read Wait is about to start.
class RawGetReactor final : public grpc::ClientReadReactor<grpc::ByteBuffer> {
 public:
  RawGetReactor(grpc::ClientContext* context, const RecordDestination& destination,
                const std::function<void(const RawBlock&)>& on_block)
      : context_(context), destination_(destination), on_block_(on_block) {}

  void Start(grpc::Channel* channel, const v1::GetRequest& request) {
    bool own = false;
    (void)grpc::SerializationTraits<v1::GetRequest>::Serialize(request, &request_, &own);
    const grpc::internal::RpcMethod method(kGetMethod, grpc::internal::RpcMethod::SERVER_STREAMING);
    grpc::internal::ClientCallbackReaderFactory<grpc::ByteBuffer>::Create(channel, method, context_,
                                                                          &request_, this);
    AddHold();
    StartRead(&reading_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    bool again = false;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        ended_ = true;  // Wait lets go of the call
      } else {
        received_.emplace_back();
        received_.back().Swap(&reading_);
        again = received_.size() < kAhead;
        reading_paused_ = !again;
      }
    }
    if (again) StartRead(&reading_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  // Lands answers as they arrive until the stream ends; its status.
  grpc::Status Wait() {
    absl::Status parse_error;
    while (true) {
      grpc::ByteBuffer answer;
      bool resume = false, release = false;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &RawGetReactor::ReadyLocked));
        if (received_.empty()) {
          if (done_) break;  // everything landed, and the call is over
          release = held_;   // the stream ended: OnDone may come now
          held_ = false;
        } else {
          answer.Swap(&received_.front());
          received_.pop_front();
          resume = reading_paused_;  // after an error too: reads then end at once
          reading_paused_ = false;
        }
      }
      if (release) {
        RemoveHold();
        continue;
      }
      if (resume) StartRead(&reading_);
      if (!parse_error.ok()) continue;  // cancelled: drain what is left
      RawBlock block;
      parse_error = ParseRawGetResponse(answer, destination_, block);
      if (!parse_error.ok()) {
        context_->TryCancel();
        continue;
      }
      on_block_(block);
    }
    if (!parse_error.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(parse_error.message()));
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  static constexpr size_t kAhead = 2;

  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !received_.empty() || done_ || (ended_ && held_);
  }

  grpc::ClientContext* context_;
  const RecordDestination& destination_;
  const std::function<void(const RawBlock&)>& on_block_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reading_;  // the read in flight
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> received_ ABSL_GUARDED_BY(mu_);  // not landed yet
  bool reading_paused_ ABSL_GUARDED_BY(mu_) = false;            // Wait restarts reading
  bool ended_ ABSL_GUARDED_BY(mu_) = false;                     // a read found the end
  bool held_ ABSL_GUARDED_BY(mu_) = true;                       // the hold Start took
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::Status RawGet(grpc::Channel* channel, grpc::ClientContext* context,
                    const v1::GetRequest& request, const RecordDestination& destination,
                    const std::function<void(const RawBlock&)>& on_block) {
  RawGetReactor reactor(context, destination, on_block);
  reactor.Start(channel, request);
  return reactor.Wait();
}

absl::Status ParseRawGetResponse(grpc::ByteBuffer& buffer, const RecordDestination& destination,
                                 RawBlock& block) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::InternalError("cannot read a Get answer");
  block = RawBlock();
  SliceCursor in(slices);
  // Fields come in number order (protobuf's own order; proto3 leaves out an
  // index of 0), so the index, if any, comes before the record and says
  // where it lands. An index after the record, or a second index or
  // record, is refused: the bytes would land under one index and be
  // reported under another.
  bool have_index = false, have_data = false;
  while (!in.done()) {
    uint64_t tag, length;
    if (!in.ReadVarint(tag)) return absl::InternalError("truncated Get answer");
    const int field = static_cast<int>(tag >> 3), type = static_cast<int>(tag & 7);
    if (type == 0) {
      uint64_t v;
      if (!in.ReadVarint(v)) return absl::InternalError("truncated Get answer");
      if (field == v1::GetResponse::kIndexFieldNumber) {
        if (have_index || have_data) return absl::InternalError("Get answer with its index twice or after its record");
        block.index = static_cast<uint32_t>(v);
        have_index = true;
      }
      if (field == v1::GetResponse::kTierFieldNumber) block.tier = static_cast<v1::Tier>(v);
      continue;
    }
    if (type != 2 || !in.ReadVarint(length)) return absl::InternalError("malformed Get answer");
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
