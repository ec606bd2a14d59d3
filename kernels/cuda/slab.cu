// The device tier's slab of GPU memory (cuda_slab.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_status.h"
#include "kvtier/kernels/crc32c_math.h"
#include "kvtier/kernels/cuda_slab.h"
#include "kvtier/kernels/pinned_ranges.h"
#include "stream_memory.h"

namespace kvtier::kernels::cuda {

Status DeviceSlab::Create(uint64_t bytes, std::unique_ptr<DeviceSlab>& out) {
  std::unique_ptr<DeviceSlab> slab(new DeviceSlab());
  if (const cudaError_t e = cudaGetDevice(&slab->device_); e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, slab->device_);
  slab->name_ = "cuda:" + std::to_string(slab->device_) + " " + prop.name;
  void* base = nullptr;
  if (const cudaError_t e = cudaMalloc(&base, bytes); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return Status(e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                  "cudaMalloc of " + std::to_string(bytes) + " bytes on " + slab->name_ + ": " + cudaGetErrorString(e));
  }
  slab->base_ = static_cast<uint8_t*>(base);
  slab->size_ = bytes;
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError(e, "cudaStreamCreate");
  }
  slab->stream_ = stream;
  out = std::move(slab);
  return OkStatus();
}

DeviceSlab::~DeviceSlab() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // copies out of the staging land first
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  for (size_t i = 0; i < kStagingChunks; ++i) {
    if (staging_[i] != nullptr) cudaFreeHost(staging_[i]);
    if (staging_done_[i] != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(staging_done_[i]));
  }
  if (base_ != nullptr) cudaFree(base_);
}

namespace {

Status CheckRange(uint64_t offset, size_t n, uint64_t size) {
  if (offset > size || n > size - offset) return Status(StatusCode::kInternal, "slab copy outside the slab");
  return OkStatus();
}

Status CheckRuns(std::span<const SlabRun> runs, uint64_t size) {
  for (const SlabRun& r : runs) {
    if (Status s = CheckRange(r.offset, r.n, size); !s.ok()) return s;
  }
  return OkStatus();
}

// The host memory PinHost registered, process-wide as CUDA's registrations
// are.
PinnedRanges& Pinned() {
  static PinnedRanges* ranges = new PinnedRanges();  // outlives every copy
  return *ranges;
}

// Queues the runs' copies between the slab at `base` and host memory
// (`in`: into the slab) on `stream`, each cut at the borders of pinned
// ranges (runs over adjacent pages of two host tier segments would be
// refused); the first error stops the queuing.
cudaError_t QueueRuns(uint8_t* base, std::span<const SlabRun> runs, bool in, cudaStream_t stream) {
  std::vector<SlabRun> cut;
  Pinned().Split(runs, cut);
  for (const SlabRun& r : cut) {
    const cudaError_t e = in ? cudaMemcpyAsync(base + r.offset, r.host, r.n, cudaMemcpyHostToDevice, stream)
                             : cudaMemcpyAsync(r.host, base + r.offset, r.n, cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Waits for what was queued on `stream`, then tells the first error:
// `queued`'s (a copy that could not be queued), else the wait's. A call's
// error stays as this thread's last error until read: cleared here, or
// the next kernel launch's check would report it as its own.
Status WaitFor(cudaStream_t stream, cudaError_t queued, const char* what) {
  const cudaError_t waited = cudaStreamSynchronize(stream);
  if (queued != cudaSuccess) {
    cudaGetLastError();
    return CudaError(queued, what);
  }
  if (waited != cudaSuccess) return CudaError(waited, what);
  return OkStatus();
}

// Lets go of the slab's lock, then waits for what was queued on `stream`
// before it (an event recorded behind it), so that other threads queue
// their copies (and fill staging) while this one waits; then tells the
// first error as WaitFor does. Without an event, waits holding the lock.
Status UnlockThenWait(std::unique_lock<std::mutex>& lock, cudaStream_t stream, cudaError_t queued, const char* what) {
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(done, stream) != cudaSuccess) {
    if (done != nullptr) cudaEventDestroy(done);
    cudaGetLastError();  // the event's error, not the copies'
    return WaitFor(stream, queued, what);
  }
  lock.unlock();
  const cudaError_t waited = cudaEventSynchronize(done);
  cudaEventDestroy(done);
  if (queued != cudaSuccess) {
    cudaGetLastError();
    return CudaError(queued, what);
  }
  if (waited != cudaSuccess) return CudaError(waited, what);
  return OkStatus();
}

}  // namespace

Status DeviceSlab::CopyIn(uint64_t offset, const void* from, size_t n) {
  const SlabRun run{offset, n, const_cast<void*>(from)};  // read only: a copy in
  return CopyRuns({&run, 1}, true);
}

Status DeviceSlab::CopyOut(uint64_t offset, void* to, size_t n) {
  const SlabRun run{offset, n, to};
  return CopyRuns({&run, 1}, false);
}

namespace {

// Freed pinned buffers, kept for the next of the same size: cudaMallocHost
// of 1 MB costs about a millisecond (page locking), fifty times the copy a
// tier move or a Get from the device tier needs the buffer for.
class PinnedPool {
 public:
  static PinnedPool& Get() {
    static PinnedPool* pool = new PinnedPool();  // outlives every buffer
    return *pool;
  }
  uint8_t* Take(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(n);
      if (it != free_.end()) {
        uint8_t* p = it->second;
        free_.erase(it);
        kept_ -= n;
        return p;
      }
    }
    void* p = nullptr;
    if (cudaMallocHost(&p, n) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return static_cast<uint8_t*>(p);
  }
  void Give(uint8_t* p, size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (kept_ + n <= kKeptBytes) {
        free_.emplace(n, p);
        kept_ += n;
        return;
      }
    }
    cudaFreeHost(p);
  }

 private:
  static constexpr size_t kKeptBytes = size_t{256} << 20;
  std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;
  size_t kept_ = 0;
};

}  // namespace

std::shared_ptr<uint8_t> DeviceSlab::AllocatePinned(size_t n) {
  uint8_t* p = PinnedPool::Get().Take(n);
  if (p == nullptr) {
    return std::shared_ptr<uint8_t>(new uint8_t[n], std::default_delete<uint8_t[]>());  // pageable, still correct
  }
  return std::shared_ptr<uint8_t>(p, [n](uint8_t* q) { PinnedPool::Get().Give(q, n); });
}

Status DeviceSlab::PinHost(void* p, size_t n) {
  if (const cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return CudaError(e, "cudaHostRegister");
  }
  Pinned().Add(p, n);
  return OkStatus();
}

void DeviceSlab::UnpinHost(void* p) {
  Pinned().Remove(p);
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

Status DeviceSlab::CopyRuns(std::span<const SlabRun> runs, bool in) {
  if (Status s = CheckRuns(runs, size_); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  return UnlockThenWait(lock, stream, QueueRuns(base_, runs, in, stream), in ? "slab copy in" : "slab copy out");
}

namespace {

struct RecordDesc {
  uint64_t first_page;  // in the page offsets
  uint64_t bytes;
};

// A record's CRC is taken in chunks of kCrcChunk bytes, one a thread (16
// bytes a load), kCrcThreads chunks a CUDA block, as many CUDA blocks a
// record as the longest needs (1 MB: 16), so a record is read by many
// multiprocessors at once; a second kernel joins each record's parts.
constexpr uint32_t kCrcThreads = 256, kCrcChunk = DeviceSlab::kMinCrcPage;  // a chunk never spans two pages
constexpr uint64_t kCrcPartBytes = uint64_t{kCrcThreads} * kCrcChunk;

// Where byte `at` of `record` lies in the slab (its pages `page_size`, a
// power of two, apart).
__device__ inline const uint8_t* RecordByte(const uint8_t* slab, const uint64_t* page_offsets, const RecordDesc& record,
                                            uint64_t at, uint32_t page_shift) {
  return slab + page_offsets[record.first_page + (at >> page_shift)] + (at & ((uint64_t{1} << page_shift) - 1));
}

// Part blockIdx.x of record blockIdx.y: the raw CRC of its slots' chunks
// (crc32c_math.h's Crc32cChunkInSlot: the whole chunks fill the record's
// last slots), joined pairwise in shared memory, level by level.
__global__ void __launch_bounds__(kCrcThreads)
    RecordCrcPartsKernel(const uint8_t* slab, const uint64_t* page_offsets, const RecordDesc* records,
                         uint32_t page_shift, uint32_t* parts) {
  __shared__ uint32_t table[4][256];
  __shared__ uint32_t raw[kCrcThreads];
  const uint32_t t = threadIdx.x;
  for (uint32_t k = 0; k < 4; ++k) table[k][t] = Crc32cTableEntry(k, t);  // a column a thread
  __syncthreads();
  const RecordDesc record = records[blockIdx.y];
  const uint64_t slots = uint64_t{gridDim.x} * kCrcThreads;
  const int64_t chunk = Crc32cChunkInSlot(uint64_t{blockIdx.x} * kCrcThreads + t, slots, record.bytes / kCrcChunk);
  uint32_t c = 0;
  if (chunk >= 0) {
    const auto* words =
        reinterpret_cast<const uint4*>(RecordByte(slab, page_offsets, record, uint64_t(chunk) * kCrcChunk, page_shift));
    for (uint32_t i = 0; i < kCrcChunk / 16; ++i) {
      const uint4 w = words[i];
      c = Crc32cWordStep(table, c, w.x);
      c = Crc32cWordStep(table, c, w.y);
      c = Crc32cWordStep(table, c, w.z);
      c = Crc32cWordStep(table, c, w.w);
    }
  }
  raw[t] = c;
  uint32_t factor = Crc32cZeroBytesFactor(kCrcChunk);  // joins neighbours at level 0; squared a level up
  for (uint32_t stride = 1; stride < kCrcThreads; stride *= 2) {
    __syncthreads();
    if (t % (2 * stride) == 0) raw[t] = Crc32cMultiply(raw[t], factor) ^ raw[t + stride];
    factor = Crc32cMultiply(factor, factor);
  }
  if (t == 0) parts[uint64_t{blockIdx.y} * gridDim.x + blockIdx.x] = raw[0];
}

// A thread a record: its parts joined in order, then the bytes after its
// whole chunks (fewer than kCrcChunk), into the standard CRC32C.
__global__ void RecordCrcJoinKernel(const uint8_t* slab, const uint64_t* page_offsets, const RecordDesc* records,
                                    uint32_t count, uint32_t page_shift, const uint32_t* parts,
                                    uint32_t parts_per_record, uint32_t* crcs) {
  const uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= count) return;
  const RecordDesc record = records[r];
  const uint32_t part_factor = Crc32cZeroBytesFactor(kCrcPartBytes);
  uint32_t c = 0;
  for (uint32_t p = 0; p < parts_per_record; ++p) {
    c = Crc32cMultiply(c, part_factor) ^ parts[uint64_t{r} * parts_per_record + p];
  }
  const uint64_t tail_at = record.bytes / kCrcChunk * kCrcChunk;
  const uint8_t* tail = RecordByte(slab, page_offsets, record, tail_at, page_shift);
  uint32_t tail_raw = 0;
  for (uint64_t i = 0; i < record.bytes - tail_at; ++i) {
    tail_raw ^= tail[i];
    for (int b = 0; b < 8; ++b) tail_raw = Crc32cBitStep(tail_raw);
  }
  crcs[r] = Crc32cFromRaw(Crc32cJoin(c, tail_raw, record.bytes - tail_at), record.bytes);
}

}  // namespace

Status DeviceSlab::CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const Record> records,
                                      uint32_t page_size, uint32_t* crcs) {
  if (records.empty()) return CopyOutRuns(runs);
  if (!ChecksPagesOf(page_size)) {
    return Status(StatusCode::kInternal, "slab pages must be a power of two of at least " +
                                             std::to_string(kMinCrcPage) + " bytes to be checked on the GPU");
  }
  if (records.size() > 65535) return Status(StatusCode::kInternal, "at most 65535 records a batch");
  if (Status s = CheckRuns(runs, size_); !s.ok()) return s;
  // Descriptors and page offsets go over in one copy, the CRCs come back in
  // one, through one pinned buffer: [descriptors][page offsets][CRCs].
  std::vector<RecordDesc> descs;
  uint64_t pages = 0, longest = 0;
  for (const Record& r : records) {
    if (r.bytes > r.page_offsets.size() * uint64_t{page_size}) {
      return Status(StatusCode::kInternal, "slab record longer than its pages");
    }
    for (const uint64_t offset : r.page_offsets) {
      if (offset % page_size != 0) return Status(StatusCode::kInternal, "slab record page not on a page boundary");
      if (Status s = CheckRange(offset, page_size, size_); !s.ok()) return s;
    }
    descs.push_back({pages, r.bytes});
    pages += r.page_offsets.size();
    longest = std::max(longest, r.bytes);
  }
  const auto parts_per_record =
      static_cast<uint32_t>(std::max<uint64_t>(1, (longest / kCrcChunk + kCrcThreads - 1) / kCrcThreads));
  const size_t desc_bytes = descs.size() * sizeof(RecordDesc), offset_bytes = pages * sizeof(uint64_t),
               in_bytes = desc_bytes + offset_bytes, crc_bytes = records.size() * sizeof(uint32_t),
               part_bytes = records.size() * parts_per_record * sizeof(uint32_t);
  std::shared_ptr<uint8_t> host = AllocatePinned(in_bytes + crc_bytes);
  std::memcpy(host.get(), descs.data(), desc_bytes);
  uint8_t* at = host.get() + desc_bytes;
  for (const Record& r : records) {
    std::memcpy(at, r.page_offsets.data(), r.page_offsets.size_bytes());
    at += r.page_offsets.size_bytes();
  }
  const uint32_t page_shift = static_cast<uint32_t>(__builtin_ctz(page_size));
  const auto count = static_cast<uint32_t>(records.size());
  std::unique_lock<std::mutex> lock(mu_);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  // On the device: [descriptors][page offsets][CRCs][parts].
  void* scratch = nullptr;
  if (const cudaError_t e = MallocAsync(&scratch, in_bytes + crc_bytes + part_bytes, stream); e != cudaSuccess) {
    return CudaError(e, "slab CRC workspace");
  }
  auto* device = static_cast<uint8_t*>(scratch);
  const auto* device_offsets = reinterpret_cast<const uint64_t*>(device + desc_bytes);
  const auto* device_descs = reinterpret_cast<const RecordDesc*>(device);
  auto* device_crcs = reinterpret_cast<uint32_t*>(device + in_bytes);
  auto* device_parts = reinterpret_cast<uint32_t*>(device + in_bytes + crc_bytes);
  cudaError_t first = cudaMemcpyAsync(device, host.get(), in_bytes, cudaMemcpyHostToDevice, stream);
  if (first == cudaSuccess) {
    RecordCrcPartsKernel<<<dim3(parts_per_record, count), kCrcThreads, 0, stream>>>(base_, device_offsets, device_descs,
                                                                                    page_shift, device_parts);
    RecordCrcJoinKernel<<<(count + 127) / 128, 128, 0, stream>>>(base_, device_offsets, device_descs, count, page_shift,
                                                                 device_parts, parts_per_record, device_crcs);
    first = cudaGetLastError();
  }
  if (first == cudaSuccess) {
    first = cudaMemcpyAsync(host.get() + in_bytes, device_crcs, crc_bytes, cudaMemcpyDeviceToHost, stream);
  }
  if (first == cudaSuccess) first = QueueRuns(base_, runs, /*in=*/false, stream);
  cudaFreeAsync(scratch, stream);
  KVTIER_KERNELS_RETURN_IF_ERROR(UnlockThenWait(lock, stream, first, "slab copy out with CRC"));
  std::memcpy(crcs, host.get() + in_bytes, crc_bytes);
  return OkStatus();
}

Status DeviceSlab::CopyInRuns(std::span<const SlabRun> runs) { return CopyRuns(runs, true); }

uint8_t* DeviceSlab::StagingFor(size_t bytes) {
  if (staging_used_ + bytes > kStagingChunkBytes || staging_[staging_chunk_] == nullptr) {
    if (staging_[staging_chunk_] != nullptr) {
      // The chunk is full: mark where its copies end and go on to the next,
      // once what was copied out of that one has landed.
      cudaEventRecord(static_cast<cudaEvent_t>(staging_done_[staging_chunk_]), static_cast<cudaStream_t>(stream_));
      staging_chunk_ = (staging_chunk_ + 1) % kStagingChunks;
    }
    if (staging_[staging_chunk_] == nullptr) {
      void* chunk = nullptr;
      cudaEvent_t done = nullptr;
      if (cudaMallocHost(&chunk, kStagingChunkBytes) != cudaSuccess ||
          cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it
        if (chunk != nullptr) cudaFreeHost(chunk);
        return nullptr;
      }
      staging_[staging_chunk_] = static_cast<uint8_t*>(chunk);
      staging_done_[staging_chunk_] = done;
    } else if (cudaEventSynchronize(static_cast<cudaEvent_t>(staging_done_[staging_chunk_])) != cudaSuccess) {
      return nullptr;
    }
    staging_used_ = 0;
  }
  uint8_t* at = staging_[staging_chunk_] + staging_used_;
  staging_used_ += bytes;
  return at;
}

Status DeviceSlab::CopyInRunsNoWait(std::span<const SlabRun> runs) {
  if (Status s = CheckRuns(runs, size_); !s.ok()) return s;
  size_t bytes = 0;
  for (const SlabRun& r : runs) bytes += r.n;
  if (bytes > kStagingChunkBytes) return CopyRuns(runs, true);
  std::unique_lock<std::mutex> lock(mu_);
  uint8_t* staged = StagingFor(bytes);
  if (staged == nullptr) {
    lock.unlock();
    return CopyRuns(runs, true);
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  for (const SlabRun& r : runs) {
    std::memcpy(staged, r.host, r.n);
    if (const cudaError_t e = cudaMemcpyAsync(base_ + r.offset, staged, r.n, cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return WaitFor(stream, e, "slab copy in");  // what was queued lands before the error is told
    }
    staged += r.n;
  }
  return OkStatus();
}

Status DeviceSlab::CopyOutRuns(std::span<const SlabRun> runs) { return CopyRuns(runs, false); }

Status DeviceSlab::CopyToDeviceRuns(std::span<const SlabRun> runs) {
  if (Status s = CheckRuns(runs, size_); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  cudaError_t queued = cudaSuccess;
  for (const SlabRun& r : runs) {
    queued = cudaMemcpyAsync(r.host, base_ + r.offset, r.n, cudaMemcpyDeviceToDevice, stream);
    if (queued != cudaSuccess) break;
  }
  return UnlockThenWait(lock, stream, queued, "slab copy to device");
}

}  // namespace kvtier::kernels::cuda
