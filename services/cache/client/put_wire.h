// Put messages in wire form, the client's side of a lean Put: a batch of
// layer slices is built as gRPC slices, each large record a slice over
// the caller's own string (kept alive by the message), the framing between
// them copied into small slices; no protobuf message holds or serializes
// the records. The cache reads them in place (put_message.h).
#ifndef KVTIER_SERVICES_CACHE_CLIENT_PUT_WIRE_H_
#define KVTIER_SERVICES_CACHE_CLIENT_PUT_WIRE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "kvtier/v1/cache.pb.h"
#include "services/kvblock/block_key.h"

namespace kvtier::cache {

class PutBatchWire {
 public:
  // Records below this many bytes are copied with the framing: a slice of
  // their own would cost more than the copy.
  static constexpr size_t kCopyBelowBytes = 4096;

  void AddInline(const kvblock::BlockHash& hash, std::shared_ptr<const std::string> record);
  void AddStaged(const kvblock::BlockHash& hash, const v1::StagedRange& range);
  size_t slices() const { return entries_.size(); }
  size_t inline_bytes() const { return inline_bytes_; }
  // A PutRequest whose batch holds the slices added, in order; empties this.
  grpc::ByteBuffer Take();

 private:
  struct Entry {
    std::string hash;
    std::shared_ptr<const std::string> record;  // null: staged
    std::string staged;                         // a StagedRange in wire form
  };
  std::vector<Entry> entries_;
  size_t inline_bytes_ = 0;
};

// `record` handed to AddInline without a copy or a share of its ownership:
// the caller keeps it alive until the stream it goes on has finished.
inline std::shared_ptr<const std::string> Borrowed(const std::string& record) {
  return std::shared_ptr<const std::string>(std::shared_ptr<const std::string>(), &record);
}

// The PutRequest carrying `header`, in wire form.
grpc::ByteBuffer PutHeaderMessage(const v1::PutHeader& header);

// PutHeader.cold_start for the blocks of a sequence of `blocks` full blocks
// of which the first `found` were cached: under a quarter found (a one-off,
// perhaps after a shared system prompt, or a prefix long gone).
inline bool IsColdStart(size_t found, size_t blocks) { return 4 * found < blocks; }

// A Put stream on `channel` whose messages are given in wire form
// (PutHeaderMessage, then PutBatchWire's); the cache's answer lands in
// `response`.
std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> OpenRawPut(grpc::Channel* channel, grpc::ClientContext* context,
                                                                 v1::PutResponse* response);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_PUT_WIRE_H_
