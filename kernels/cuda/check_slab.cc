// GPU slab check and benchmark, for the device machine (no gtest there):
// random bytes copied into the device tier's slab and back at random
// offsets come back identical (the destination poisoned first; also when
// the copy in did not wait and its pageable source was overwritten); a block
// copied device-to-device into an IPC buffer reads back identical in
// another process that opens the buffer's handle (the fast path to GPU
// clients); and the spill (slab -> host) and promotion
// (host -> slab) rates of 1 MB blocks, as one copy each and as the cache's
// page arena moves them (16 runs of 64 KB, one wait), from pinned memory,
// from a pinned buffer allocated per block, from pageable memory, and from
// memfd pages pinned in 4 MB segments (PinHost: the host tier's pages),
// in batches of 8 blocks, and with their CRCs computed on the GPU first
// (as the store demotes); and a Put's 27 slices a block from pageable
// memory, each waited for or staged without the wait; against plain
// pinned cudaMemcpy of 256 MB. The
// pinned memfd pages must round-trip too, and records' CRC32C computed on
// the GPU must equal a bit-by-bit CPU CRC32C.
// Exit codes: 0 pass, 1 mismatch or CUDA error, 77 no device (ctest: skip).
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_ipc.h"
#include "kvtier/kernels/cuda_slab.h"

namespace kvtier::kernels {
namespace {

constexpr uint64_t kSlabBytes = uint64_t{1} << 30;

struct Reader {
  pid_t pid;
  int to;  // its input
};
constexpr size_t kBlock = 1026468;  // a V2-Lite int8 block record

bool RoundTrips(cuda::DeviceSlab& slab, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint64_t> offset(0, kSlabBytes - kBlock);
  std::vector<uint8_t> in(kBlock), out(kBlock);
  for (int i = 0; i < 64; ++i) {
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    std::memset(out.data(), 0xA5, out.size());
    const uint64_t at = offset(rng);
    const Status a = slab.CopyIn(at, in.data(), in.size()), b = slab.CopyOut(at, out.data(), out.size());
    if (!a.ok() || !b.ok() || in != out) {
      std::fprintf(stderr, "round trip at %llu: %s %s %s\n", static_cast<unsigned long long>(at), a.message().c_str(),
                   b.message().c_str(), in == out ? "" : "bytes differ");
      return false;
    }
  }
  // Without the wait, from pageable and pinned memory overwritten at once,
  // 24 blocks in a row through the 16 MB of staging (its chunks reused
  // while copies are queued), then read back: each as it was when its copy
  // in returned.
  std::shared_ptr<uint8_t> pinned = cuda::DeviceSlab::AllocatePinned(kBlock);
  std::vector<std::vector<uint8_t>> sent;
  for (uint64_t i = 0; i < 24; ++i) {
    uint8_t* source = i % 2 == 0 ? in.data() : pinned.get();
    for (size_t k = 0; k < kBlock; ++k) source[k] = static_cast<uint8_t>(rng());
    sent.emplace_back(source, source + kBlock);
    const cuda::SlabRun run{i * kBlock, kBlock, source};
    if (const Status s = slab.CopyInRunsNoWait({&run, 1}); !s.ok()) {
      std::fprintf(stderr, "unwaited copy in: %s\n", s.message().c_str());
      return false;
    }
    std::memset(source, 0xEE, kBlock);
  }
  for (uint64_t i = 0; i < sent.size(); ++i) {
    if (!slab.CopyOut(i * kBlock, out.data(), kBlock).ok() || out != sent[i]) {
      std::fprintf(stderr, "unwaited copy in of block %llu: bytes differ\n", static_cast<unsigned long long>(i));
      return false;
    }
  }
  // Outside the slab: refused, not written.
  return !slab.CopyIn(kSlabBytes - 10, in.data(), 100).ok();
}

// `bytes` of a memfd mapped shared, as the cache's host tier maps its
// segments, pinned with PinHost `segment` bytes at a time (what the page
// arena does for a GPU's slab); unpinned and unmapped when destroyed.
class PinnedMemfd {
 public:
  PinnedMemfd(size_t bytes, size_t segment) : bytes_(bytes), segment_(segment) {
    const int fd = memfd_create("kvtier-check-slab", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    data_ = static_cast<uint8_t*>(p);
    for (size_t at = 0; at < bytes; at += segment) {
      if (const Status s = cuda::DeviceSlab::PinHost(data_ + at, std::min(segment, bytes - at)); !s.ok()) {
        std::fprintf(stderr, "PinHost: %s\n", s.message().c_str());
        return;
      }
      pinned_ = at + segment;
    }
  }
  ~PinnedMemfd() {
    for (size_t at = 0; at < pinned_ && at < bytes_; at += segment_) cuda::DeviceSlab::UnpinHost(data_ + at);
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  // Null unless mapped and pinned whole.
  uint8_t* data() const { return pinned_ >= bytes_ ? data_ : nullptr; }

 private:
  size_t bytes_, segment_;
  uint8_t* data_ = nullptr;
  size_t pinned_ = 0;
};

// Random blocks copied out of the slab into pinned memfd pages and back in
// at other offsets come back identical.
bool PinnedMemfdRoundTrips(cuda::DeviceSlab& slab, std::mt19937_64& rng) {
  PinnedMemfd host(8u << 20, 4u << 20);
  if (host.data() == nullptr) return false;
  std::vector<uint8_t> in(kBlock), out(kBlock);
  for (int i = 0; i < 8; ++i) {
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    std::memset(out.data(), 0xA5, out.size());
    const size_t at = (i * 3 * kBlock / 2) % ((8u << 20) - kBlock);  // across the segments' border too
    std::memset(host.data() + at, 0x5A, kBlock);
    if (!slab.CopyIn(0, in.data(), kBlock).ok() || !slab.CopyOut(0, host.data() + at, kBlock).ok() ||
        !slab.CopyIn(2 * kBlock, host.data() + at, kBlock).ok() || !slab.CopyOut(2 * kBlock, out.data(), kBlock).ok() ||
        in != out || std::memcmp(host.data() + at, in.data(), kBlock) != 0) {
      return false;
    }
  }
  return true;
}

// CRC32C bit by bit: the reference for the GPU's.
uint32_t BitwiseCrc32c(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

// Records over scattered 64 KB pages of the slab, of sizes around the
// GPU's part boundaries and a block's: their CRC32C computed on the GPU
// equals the CPU's, and the runs queued with them come out intact.
bool RecordCrcsMatch(cuda::DeviceSlab& slab, std::mt19937_64& rng) {
  constexpr uint32_t kPage = 65536;
  const std::vector<size_t> sizes = {0, 1, 3, 4097, kPage, kPage + 5, 1026464, 1026468, 3 * kPage - 1};
  std::vector<uint64_t> free_pages(kSlabBytes / kPage);
  for (size_t i = 0; i < free_pages.size(); ++i) free_pages[i] = i * kPage;
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  std::vector<std::vector<uint64_t>> offsets;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<cuda::DeviceSlab::Record> records;
  std::vector<cuda::SlabRun> runs;
  for (const size_t size : sizes) {
    std::vector<uint8_t> record(size);
    for (auto& b : record) b = static_cast<uint8_t>(rng());
    std::vector<uint64_t> pages;
    for (size_t at = 0; at < std::max<size_t>(size, 1); at += kPage) {
      pages.push_back(free_pages.back());
      free_pages.pop_back();
      const size_t n = std::min<size_t>(kPage, size - std::min(size, at));
      if (n > 0 && !slab.CopyIn(pages.back(), record.data() + at, n).ok()) return false;
    }
    offsets.push_back(std::move(pages));
    bytes.push_back(std::move(record));
  }
  std::vector<uint8_t> out(kPage, 0xA5);
  for (size_t k = 0; k < sizes.size(); ++k) records.push_back({offsets[k], sizes[k]});
  runs.push_back({offsets[6][1], kPage, out.data()});  // the second page of the block-sized record
  std::vector<uint32_t> crcs(records.size(), 0);
  if (const Status s = slab.CopyOutRunsWithCrc(runs, records, kPage, crcs.data()); !s.ok()) {
    std::fprintf(stderr, "CopyOutRunsWithCrc: %s\n", s.message().c_str());
    return false;
  }
  bool ok = std::memcmp(out.data(), bytes[6].data() + kPage, kPage) == 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const uint32_t want = BitwiseCrc32c(bytes[k].data(), sizes[k]);
    if (crcs[k] != want) {
      std::fprintf(stderr, "record of %zu bytes: GPU CRC %08x, CPU %08x\n", sizes[k], crcs[k], want);
      ok = false;
    }
  }
  return ok;
}

// GB/s of `op`, which moves `bytes` each call.
template <typename Op>
double GBs(size_t bytes, Op op) {
  return bytes / check::Milliseconds(op, 5) / 1e6;
}

void Benchmark(cuda::DeviceSlab& slab) {
  constexpr size_t kBig = 256u << 20, kBlocks = kBig / kBlock;
  std::shared_ptr<uint8_t> pinned = cuda::DeviceSlab::AllocatePinned(kBig);
  std::vector<uint8_t> pageable(kBig, 1);
  void* device = nullptr;
  cudaMalloc(&device, kBig);
  const double h2d = GBs(kBig, [&] { cudaMemcpy(device, pinned.get(), kBig, cudaMemcpyHostToDevice); });
  const double d2h = GBs(kBig, [&] { cudaMemcpy(pinned.get(), device, kBig, cudaMemcpyDeviceToHost); });
  cudaFree(device);
  // The first copy that failed in a row's timing: the row says so instead
  // of a rate (a refused copy costs nothing and would look fast).
  std::string failed;
  auto note = [&](const Status& s) {
    if (!s.ok() && failed.empty()) failed = s.message();
  };
  auto blocks = [&](uint8_t* host, bool in) {
    for (size_t b = 0; b < kBlocks; ++b) {
      note(in ? slab.CopyIn(b * kBlock, host + b * kBlock, kBlock)
              : slab.CopyOut(b * kBlock, host + b * kBlock, kBlock));
    }
  };
  // As the cache's page arena moves a block: its 64 KB pages' runs queued
  // together, one wait a block.
  constexpr size_t kPage = 65536;
  auto paged = [&](uint8_t* host, bool in) {
    std::vector<cuda::SlabRun> runs;
    for (size_t b = 0; b < kBlocks; ++b) {
      runs.clear();
      for (size_t at = 0; at < kBlock; at += kPage) {
        runs.push_back({b * kBlock + at, std::min(kPage, kBlock - at), host + b * kBlock + at});
      }
      note(in ? slab.CopyInRuns(runs) : slab.CopyOutRuns(runs));
    }
  };
  // And with a pinned buffer allocated for each block, as a tier move or a
  // Get from the device tier takes one.
  auto fresh_pinned = [&] {
    for (size_t b = 0; b < kBlocks; ++b) {
      std::shared_ptr<uint8_t> buffer = cuda::DeviceSlab::AllocatePinned(kBlock);
      note(slab.CopyOut(b * kBlock, buffer.get(), kBlock));
    }
  };
  // As a Put writes a block: 27 layer slices, from pageable memory (a gRPC
  // message), each waited for or not (the slab's staging).
  constexpr size_t kSlices = 27, kSlice = kBlock / kSlices;
  auto slices = [&](bool wait) {
    for (size_t b = 0; b < kBlocks; ++b) {
      for (size_t k = 0; k < kSlices; ++k) {
        const cuda::SlabRun run{b * kBlock + k * kSlice, kSlice, pageable.data() + b * kBlock + k * kSlice};
        note(wait ? slab.CopyInRuns({&run, 1}) : slab.CopyInRunsNoWait({&run, 1}));
      }
    }
    uint8_t last;
    note(slab.CopyOut(0, &last, 1));  // waits for what was queued
  };
  // The store's demotions out of a GPU tier: 8 blocks a batch, with their
  // CRCs computed on the GPU first or not (1 MB records over 64 KB pages,
  // each from a page boundary of the slab, as the store lays them).
  constexpr size_t kBatch = 8, kSlot = (kBlock + kPage - 1) / kPage * kPage;
  auto spill_batches = [&](uint8_t* host, bool crc) {
    std::vector<cuda::SlabRun> runs;
    std::vector<std::vector<uint64_t>> pages(kBatch);
    std::vector<cuda::DeviceSlab::Record> records;
    uint32_t crcs[kBatch];
    for (size_t b = 0; b + kBatch <= kBlocks; b += kBatch) {
      runs.clear();
      records.clear();
      for (size_t k = 0; k < kBatch; ++k) {
        runs.push_back({(b + k) * kSlot, kBlock, host + (b + k) * kBlock});
        if (!crc) continue;  // the plain row times the copies alone
        pages[k].clear();
        for (size_t at = 0; at < kBlock; at += kPage) pages[k].push_back((b + k) * kSlot + at);
        records.push_back({pages[k], kBlock - 4});
      }
      note(crc ? slab.CopyOutRunsWithCrc(runs, records, kPage, crcs) : slab.CopyOutRuns(runs));
    }
  };
  const size_t moved = kBlocks * kBlock, batched = kBlocks / kBatch * kBatch * kBlock,
               sliced = kBlocks * kSlices * kSlice;
  std::printf("\nplain pinned cudaMemcpy, 256 MB: host->device %.1f GB/s, device->host %.1f GB/s\n", h2d, d2h);
  std::printf("%-32s %10s %10s\n", "1 MB blocks through the slab", "GB/s", "% memcpy");
  // Times `op`, which moves `bytes` into the slab (`in`) or out of it,
  // and prints its row against the plain copy that way.
  auto row = [&](const char* what, size_t bytes, bool in, auto op) {
    failed.clear();
    const double rate = GBs(bytes, op), limit = in ? h2d : d2h;
    if (!failed.empty()) {
      std::printf("%-32s FAILED: %s\n", what, failed.c_str());
      return;
    }
    std::printf("%-32s %10.1f %9.0f%%\n", what, rate, 100 * rate / limit);
  };
  row("promotion, from pinned", moved, true, [&] { blocks(pinned.get(), true); });
  row("spill, to pinned", moved, false, [&] { blocks(pinned.get(), false); });
  row("promotion, 16 page runs, pinned", moved, true, [&] { paged(pinned.get(), true); });
  row("spill, 16 page runs, pinned", moved, false, [&] { paged(pinned.get(), false); });
  row("spill, new pinned buffer each", moved, false, fresh_pinned);
  row("promotion, from pageable", moved, true, [&] { blocks(pageable.data(), true); });
  row("spill, to pageable", moved, false, [&] { blocks(pageable.data(), false); });
  row("put, 27 slices, each waited", sliced, true, [&] { slices(true); });
  row("put, 27 slices, staged unwaited", sliced, true, [&] { slices(false); });
  const auto pin_start = std::chrono::steady_clock::now();
  PinnedMemfd memfd(kBig, 4u << 20);
  const double pin_ms_a_segment =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pin_start).count() / (kBig >> 22);
  if (memfd.data() == nullptr) {
    std::printf("pinned memfd pages: could not be had (see above)\n");
    return;
  }
  row("promotion, pinned memfd pages", moved, true, [&] { blocks(memfd.data(), true); });
  row("spill, to pinned memfd pages", moved, false, [&] { blocks(memfd.data(), false); });
  row("spill, same, 8 blocks a batch", batched, false, [&] { spill_batches(memfd.data(), false); });
  row("spill, same, CRCs on the GPU", batched, false, [&] { spill_batches(memfd.data(), true); });
  std::printf("pinning a 4 MB memfd segment (PinHost, first touch included): %.2f ms\n", pin_ms_a_segment);
}

// The other process: reads a handle, a size and a seed from `in`, opens the
// buffer and checks its bytes against the seed's. Exit code 0 when equal.
int IpcReader(int in) {
  cuda::IpcHandleBytes handle;
  uint64_t seed = 0;
  if (read(in, handle.data(), handle.size()) != 64 || read(in, &seed, 8) != 8) return 2;
  std::unique_ptr<cuda::IpcMapping> mapping;
  if (const Status s = cuda::IpcMapping::Open(handle, kBlock, mapping); !s.ok()) {
    std::fprintf(stderr, "reader: %s\n", s.message().c_str());
    return 1;
  }
  std::vector<uint8_t> got(kBlock), want(kBlock);
  std::mt19937_64 rng(seed);
  for (auto& b : want) b = static_cast<uint8_t>(rng());
  if (!mapping->CopyToHost(0, got.data(), got.size()).ok() || got != want) {
    std::fprintf(stderr, "reader: the bytes differ\n");
    return 1;
  }
  return 0;
}

// A block in the slab, copied device-to-device into an IPC buffer, read by
// the reader process (forked before this process touched CUDA).
bool IpcRoundTrip(cuda::DeviceSlab& slab, std::mt19937_64& rng, const Reader& reader) {
  const uint64_t seed = rng();
  std::mt19937_64 bytes(seed);
  std::vector<uint8_t> block(kBlock);
  for (auto& b : block) b = static_cast<uint8_t>(bytes());
  // Its halves lie apart in the slab, as a record's pages may: two runs.
  const size_t half = kBlock / 2;
  std::unique_ptr<cuda::DeviceBuffer> buffer;
  if (!slab.CopyIn(4096, block.data(), half).ok() || !slab.CopyIn(4096 + 3 * kBlock, block.data() + half, half).ok() ||
      !cuda::DeviceBuffer::Create(kBlock, buffer).ok()) {
    return false;
  }
  const cuda::SlabRun runs[] = {{4096, half, buffer->data()}, {4096 + 3 * kBlock, half, buffer->data() + half}};
  if (!slab.CopyToDeviceRuns(runs).ok()) return false;
  if (write(reader.to, buffer->handle().data(), 64) != 64 || write(reader.to, &seed, 8) != 8) return false;
  int status = 0;
  waitpid(reader.pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int Main(bool benchmark) {
  // The IPC reader must start before this process initialises CUDA.
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[1]);
    _exit(IpcReader(pipe_fds[0]));
  }
  close(pipe_fds[0]);
  const Reader reader{pid, pipe_fds[1]};
  if (!check::DeviceOrSkip("the device tier's slab and IPC were")) {
    close(reader.to);  // the reader sees end of input and exits
    waitpid(reader.pid, nullptr, 0);
    return 77;
  }
  std::unique_ptr<cuda::DeviceSlab> slab;
  if (const Status s = cuda::DeviceSlab::Create(kSlabBytes, slab); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::mt19937_64 rng(std::random_device{}());
  const bool ok = RoundTrips(*slab, rng);
  const bool ipc = IpcRoundTrip(*slab, rng, reader);
  const bool memfd = PinnedMemfdRoundTrips(*slab, rng);
  const bool crc = RecordCrcsMatch(*slab, rng);
  std::printf(
      "%s: copies in and out %s; through an IPC buffer to another process %s; to and from pinned memfd "
      "pages %s; records' CRC32C on the GPU %s\n",
      slab->name().c_str(), ok ? "round-trip" : "MISMATCH", ipc ? "round-trip" : "FAILED",
      memfd ? "round-trip" : "FAILED", crc ? "equal to the CPU's" : "MISMATCH");
  if (benchmark) Benchmark(*slab);
  return ok && ipc && memfd && crc ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) { return kvtier::kernels::Main(kvtier::kernels::check::WantBenchmark(argc, argv)); }
