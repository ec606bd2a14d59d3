// A fast path client that dies holding leases: fast_path_test starts it,
// waits for "holding N", and SIGKILLs it.
//   fast_path_holder TARGET NAMESPACE FIRST_SEED COUNT
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "services/cache/fast_path/fast_path_client.h"
#include "services/rpc/client_identity.h"
#include "tests/integration/cache_test_blocks.h"

int main(int argc, char** argv) {
  using namespace kvtier::cache;
  if (argc != 5) {
    std::fprintf(stderr, "usage: fast_path_holder TARGET NAMESPACE FIRST_SEED COUNT\n");
    return 2;
  }
  const std::string ns = argv[2];
  const uint64_t first = std::strtoull(argv[3], nullptr, 10), count = std::strtoull(argv[4], nullptr, 10);
  const kvtier::kvblock::LatentLayout layout = TestLayout();
  std::vector<kvtier::kvblock::BlockHash> hashes;
  for (uint64_t i = 0; i < count; ++i) hashes.push_back(MakeBlock(layout, ns, first + i).slices.hash);
  auto client = FastPathClient::Connect(kvtier::MakeChannel(argv[1]), absl::Seconds(10));
  if (!client.ok()) {
    std::fprintf(stderr, "fast_path_holder: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  std::string sink;
  // The lease is held while blocks are being delivered: stop in the middle.
  auto fetched = (*client)->Fetch(
      ns, layout, hashes,
      [&](uint32_t, size_t size) {
        sink.resize(size);
        return std::span(reinterpret_cast<uint8_t*>(sink.data()), size);
      },
      [&](const RawBlock&) {
        std::printf("holding %zu\n", hashes.size());
        std::fflush(stdout);
        for (;;) pause();
      });
  std::fprintf(stderr, "fast_path_holder: fetch ended: %s\n", std::string(fetched.status().message()).c_str());
  return 1;
}
