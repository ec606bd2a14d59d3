// PageArena's shared segments changing owner: what the new owner and any
// old reader can see, and that a segment no reader has is reused in place;
// and over a slab, the runs a block's pages are copied in.
#include "services/cache/store/page_arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "services/cache/store/tier_storage.h"
#include "tests/cache/store/gated_pin_slab.h"
#include "tests/cache/store/memory_checks.h"
#include "tests/cache/store/recording_slab.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

constexpr uint32_t kPage = 4096;
constexpr uint32_t kSegmentPages = 2;

// A shared arena of `segments` segments, its host pages pinned for
// `pin_for` (if any).
std::unique_ptr<PageArena> SharedArena(uint32_t segments, std::shared_ptr<SlabMemory> pin_for = nullptr) {
  absl::StatusOr<std::unique_ptr<PageArena>> arena = PageArena::Create({.capacity = segments * kSegmentPages * kPage,
                                                                        .page_size = kPage,
                                                                        .segment_pages = kSegmentPages,
                                                                        .shared = true,
                                                                        .slab = nullptr,
                                                                        .pin_for = std::move(pin_for)});
  EXPECT_TRUE(arena.ok()) << arena.status();
  return *std::move(arena);
}

// Allocate and then Prepare, as the store takes pages.
bool Take(PageArena& arena, uint32_t n, const std::string& owner, std::vector<uint32_t>& pages) {
  if (!arena.Allocate(n, owner, pages)) return false;
  arena.Prepare(pages);
  return true;
}

// n random bytes, none of them zero.
std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> byte(1, 255);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(byte(rng));
  return bytes;
}

// n bytes read back from `pages` at `offset`.
std::string ReadBack(PageArena& arena, const std::vector<uint32_t>& pages, size_t offset, size_t n) {
  std::string back(n, '\0');
  EXPECT_TRUE(arena.Read(pages, offset, std::span(reinterpret_cast<uint8_t*>(back.data()), n)).ok());
  return back;
}

// Both pages of the segment for `owner`, filled with fresh random bytes,
// none of them zero.
std::string FillFor(PageArena& arena, const std::string& owner, std::vector<uint32_t>& pages) {
  static testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  EXPECT_TRUE(Take(arena, kSegmentPages, owner, pages));
  const std::string bytes = RandomBytes(kSegmentPages * kPage, rng.engine());
  EXPECT_TRUE(arena.Write(pages, 0, bytes).ok());
  return bytes;
}

// The record laid over `pages`, as `segment` (the segment's bytes) holds it.
std::string Record(std::string_view segment, const std::vector<uint32_t>& pages) {
  std::string out;
  for (uint32_t p : pages) out.append(segment.substr(size_t{p} * kPage, kPage));
  return out;
}

std::string_view SegmentBytes(const PageArena& arena) {
  return {reinterpret_cast<const char*>(arena.page(0)), kSegmentPages * kPage};
}

TEST(PageArenaTest, ASegmentNoReaderHasIsClearedInPlaceForItsNextOwner) {
  std::unique_ptr<PageArena> arena = SharedArena(1);
  std::vector<uint32_t> pages;
  FillFor(*arena, "tenant-a", pages);
  const int fd = arena->SegmentFd(0);
  const uint64_t generation = arena->Generation(0);
  ASSERT_GE(fd, 0);
  arena->Free(pages);

  ASSERT_TRUE(Take(*arena, 1, "tenant-b", pages));
  EXPECT_EQ(arena->Owner(0), "tenant-b");
  EXPECT_GT(arena->Generation(0), generation);
  // The same memfd (its pages already there), with nothing of tenant-a's.
  EXPECT_EQ(arena->SegmentFd(0), fd);
  EXPECT_TRUE(AllZero(SegmentBytes(*arena)));
}

TEST(PageArenaTest, ASegmentAReaderHadGetsANewMemfdAndTheReaderOnlyItsOwnBytes) {
  std::unique_ptr<PageArena> arena = SharedArena(1);
  std::vector<uint32_t> pages;
  const std::string a_bytes = FillFor(*arena, "tenant-a", pages);
  // A reader of tenant-a maps the segment, as a fast path session does.
  const int old_fd = arena->SegmentFd(0);
  const uint64_t generation = arena->Generation(0);
  arena->MarkExported(0);
  void* reader = mmap(nullptr, kSegmentPages * kPage, PROT_READ, MAP_SHARED, old_fd, 0);
  ASSERT_NE(reader, MAP_FAILED);
  const std::string_view seen(static_cast<const char*>(reader), kSegmentPages * kPage);
  EXPECT_EQ(Record(seen, pages), a_bytes);
  const std::vector<uint32_t> old_pages = pages;
  arena->Free(pages);

  const std::string b_bytes = FillFor(*arena, "tenant-b", pages);
  EXPECT_GT(arena->Generation(0), generation);
  EXPECT_EQ(Record(SegmentBytes(*arena), pages), b_bytes);
  // The old reader still sees tenant-a's bytes (its own), never tenant-b's.
  EXPECT_EQ(Record(seen, old_pages), a_bytes);
  EXPECT_EQ(seen.find(b_bytes.substr(0, 64)), std::string_view::npos);
  munmap(reader, kSegmentPages * kPage);

  // The new memfd has gone to no reader yet: the next change is in place.
  const int b_fd = arena->SegmentFd(0);
  arena->Free(pages);
  ASSERT_TRUE(Take(*arena, 1, "tenant-c", pages));
  EXPECT_EQ(arena->SegmentFd(0), b_fd);
  EXPECT_TRUE(AllZero(SegmentBytes(*arena)));
}

// In an arena of enough segments, a segment a reader had gets a memfd made
// ahead: its pages already there when the new owner writes. The old reader
// never sees the new owner's bytes: it keeps the old owner's (the write
// seal keeps them from being punched out) and the old memfd is closed.
TEST(PageArenaTest, ASegmentAReaderHadGetsAMemfdMadeAhead) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  constexpr uint32_t kSegments = 32;
  absl::StatusOr<std::unique_ptr<PageArena>> made = PageArena::Create({.capacity = kSegments * kSegmentPages * kPage,
                                                                       .page_size = kPage,
                                                                       .segment_pages = kSegmentPages,
                                                                       .shared = true,
                                                                       .slab = nullptr,
                                                                       .pin_for = nullptr});
  ASSERT_TRUE(made.ok()) << made.status();
  PageArena& arena = **made;
  const size_t bytes = kSegmentPages * kPage;
  std::vector<uint32_t> pages;
  const std::vector<std::string> owners = {"tenant-a", "tenant-b", "tenant-c"};
  for (size_t k = 0; k + 1 < owners.size(); ++k) {
    // owners[k] fills segment 0, a reader maps it, owners[k] lets it go.
    ASSERT_TRUE(Take(arena, kSegmentPages, owners[k], pages));
    ASSERT_EQ(arena.SegmentOf(pages[0]), 0u);
    const std::string old_bytes = RandomBytes(bytes, rng.engine());
    ASSERT_TRUE(arena.Write(pages, 0, old_bytes).ok());
    arena.MarkExported(0);
    void* reader = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, arena.SegmentFd(0), 0);
    ASSERT_NE(reader, MAP_FAILED);
    const std::string_view seen(static_cast<const char*>(reader), bytes);
    arena.Free(pages);
    arena.WaitForSegmentsAhead();

    ASSERT_TRUE(Take(arena, kSegmentPages, owners[k + 1], pages));
    ASSERT_EQ(arena.SegmentOf(pages[0]), 0u);
    // The first change starts the thread; from the second on, one is ready.
    if (k > 0) {
      EXPECT_TRUE(AllPagesPresent(arena.page(0), bytes)) << "the new memfd's pages were not made ahead";
    }
    EXPECT_TRUE(AllZero(SegmentBytes(arena)));
    const std::string new_bytes = RandomBytes(bytes, rng.engine());
    ASSERT_TRUE(arena.Write(pages, 0, new_bytes).ok());
    EXPECT_EQ(Record(SegmentBytes(arena), pages), new_bytes);
    EXPECT_EQ(seen.find(new_bytes.substr(0, 64)), std::string_view::npos) << "an old reader saw the new owner's bytes";
    arena.WaitForSegmentsAhead();
    EXPECT_EQ(seen, old_bytes) << "the old reader's bytes changed";
    EXPECT_EQ(arena.SegmentsAheadBytes(), 2 * bytes) << "one made ahead a 16 segments, counted";
    munmap(reader, bytes);
    arena.Free(pages);
  }
}

// An arena of 4 pages in `slab`, all taken by one owner.
std::unique_ptr<PageArena> AllTakenArena(std::shared_ptr<SlabMemory> slab) {
  absl::StatusOr<std::unique_ptr<PageArena>> arena = PageArena::Create({.capacity = 4 * kPage,
                                                                        .page_size = kPage,
                                                                        .segment_pages = 4,
                                                                        .shared = false,
                                                                        .slab = std::move(slab),
                                                                        .pin_for = nullptr});
  EXPECT_TRUE(arena.ok()) << arena.status();
  std::vector<uint32_t> all;
  EXPECT_TRUE(Take(**arena, 4, "ns", all));
  return *std::move(arena);
}

// A block over pages 0, 1 and 3 of a slab goes as one batch of two runs
// each way (pages 0 and 1 adjacent in both memories: one run), and its
// bytes come back.
TEST(PageArenaTest, ABlocksAdjacentPagesAreOneRunInOneBatch) {
  auto slab = std::make_shared<RecordingSlab>(4 * kPage);
  std::unique_ptr<PageArena> arena = AllTakenArena(slab);
  const std::vector<uint32_t> pages = {0, 1, 3};
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (const size_t offset : {size_t{0}, size_t{kPage / 2}}) {
    const std::string bytes = RandomBytes(2 * kPage + (offset == 0 ? kPage : 0), rng.engine());
    slab->Clear();
    ASSERT_TRUE(arena->Write(pages, offset, bytes).ok());
    EXPECT_EQ(ReadBack(*arena, pages, offset, bytes.size()), bytes);
    ASSERT_EQ(slab->in_batches.size(), 1u);
    ASSERT_EQ(slab->out_batches.size(), 1u);
    for (const std::vector<SlabRun>& runs : {slab->in_batches[0], slab->out_batches[0]}) {
      ASSERT_EQ(runs.size(), 2u);
      EXPECT_EQ(runs[0].offset, offset);
      EXPECT_EQ(runs[0].n, 2 * kPage - offset);
      EXPECT_EQ(runs[1].offset, 3 * kPage);
      EXPECT_EQ(runs[1].n, bytes.size() - runs[0].n);
    }
  }
}

// A record in pieces of host memory (a tier move's pages in another
// arena) goes in one batch each way too; the pieces' bytes land in order.
TEST(PageArenaTest, PiecesOfARecordAreOneBatch) {
  auto slab = std::make_shared<RecordingSlab>(4 * kPage);
  std::unique_ptr<PageArena> arena = AllTakenArena(slab);
  const std::vector<uint32_t> pages = {3, 0, 2};
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  // Three pieces apart in host memory, of other sizes than a page.
  const std::vector<std::string> parts = {RandomBytes(kPage / 3, rng.engine()), RandomBytes(kPage + 17, rng.engine()),
                                          RandomBytes(kPage / 2, rng.engine())};
  const std::string whole = parts[0] + parts[1] + parts[2];
  std::vector<std::span<const uint8_t>> in;
  for (const std::string& part : parts) in.emplace_back(reinterpret_cast<const uint8_t*>(part.data()), part.size());
  slab->Clear();
  ASSERT_TRUE(arena->WritePieces(pages, 100, in).ok());
  EXPECT_EQ(ReadBack(*arena, pages, 100, whole.size()), whole);
  // And read back into pieces: the other way round.
  std::vector<std::string> out = {std::string(5, '\0'), std::string(whole.size() - 5, '\0')};
  std::vector<std::span<uint8_t>> out_pieces;
  for (std::string& part : out) out_pieces.emplace_back(reinterpret_cast<uint8_t*>(part.data()), part.size());
  ASSERT_TRUE(arena->ReadPieces(pages, 100, out_pieces).ok());
  EXPECT_EQ(out[0] + out[1], whole);
  ASSERT_EQ(slab->in_batches.size(), 1u);
  ASSERT_EQ(slab->out_batches.size(), 2u);
  for (const auto& batch : {slab->in_batches[0], slab->out_batches[0], slab->out_batches[1]}) {
    EXPECT_EQ(RecordingSlab::Bytes(batch), whole.size());
    EXPECT_EQ(batch.front().offset, 3 * kPage + 100);
  }
}

// Host pages copied to and from a GPU's slab are pinned with it a segment
// at a time, from the segment's first use; a segment that gets a new memfd
// is unpinned while the old pages are still mapped, then pinned again; all
// is unpinned when the arena goes.
TEST(PageArenaTest, SegmentsArePinnedForTheSlabAndUnpinnedBeforeRemapping) {
  auto slab = std::make_shared<RecordingSlab>(kPage);
  {
    std::unique_ptr<PageArena> owned = SharedArena(2, slab);
    PageArena* arena = owned.get();
    EXPECT_TRUE(slab->pinned.empty()) << "nothing pinned before it is used";
    std::vector<uint32_t> pages;
    const std::string bytes = FillFor(*arena, "tenant-a", pages);
    ASSERT_EQ(slab->pinned.size(), 1u);
    for (uint32_t p : pages) EXPECT_TRUE(slab->IsPinned(arena->page(p), kPage)) << p;
    arena->MarkExported(0);  // a reader maps it: the next owner gets a new memfd
    arena->Free(pages);
    ASSERT_TRUE(Take(*arena, kSegmentPages, "tenant-b", pages));
    EXPECT_EQ(slab->first_byte_unpinned, static_cast<uint8_t>(bytes[0])) << "unpinned after the old pages went";
    ASSERT_EQ(slab->pinned.size(), 1u);
    EXPECT_EQ(slab->pin_calls, 2);
    for (uint32_t p : pages) EXPECT_TRUE(slab->IsPinned(arena->page(p), kPage)) << p;
    // The second segment, for a third owner.
    ASSERT_TRUE(Take(*arena, 1, "tenant-c", pages));
    EXPECT_EQ(slab->pinned.size(), 2u);
  }
  EXPECT_TRUE(slab->pinned.empty()) << "the arena left memory pinned";
  EXPECT_EQ(slab->errors, 0);
}

// Allocate only marks the segments it hands out that need work; Prepare
// does it, once a segment however many take its pages, and a reader is
// refused the segment until then (it holds nothing of its new owner yet).
TEST(PageArenaTest, ASegmentIsPreparedOnceAndOpenedOnlyWhenReady) {
  auto slab = std::make_shared<GatedPinSlab>(kPage);
  std::unique_ptr<TierStorage> storage = PagesStorage(SharedArena(2, slab));
  std::vector<uint32_t> first, second;
  ASSERT_TRUE(storage->Take(kPage, "tenant-a", first));
  const auto open = [&] { return storage->OpenShared(0, /*generation=*/1, "tenant-a"); };
  EXPECT_EQ(open().status().code(), absl::StatusCode::kFailedPrecondition) << "opened before it was prepared";
  std::thread preparing([&] { storage->Prepare(first); });
  slab->pinning.WaitForNotification();
  // The segment's other page, taken while the first taker prepares it:
  // the second taker waits for that, and pins nothing itself.
  ASSERT_TRUE(storage->Take(kPage, "tenant-a", second));
  ASSERT_EQ(second[0] / kSegmentPages, first[0] / kSegmentPages);
  std::thread waiting([&] { storage->Prepare(second); });
  EXPECT_EQ(open().status().code(), absl::StatusCode::kFailedPrecondition) << "opened while being prepared";
  slab->open.Notify();
  preparing.join();
  waiting.join();
  EXPECT_EQ(slab->pins_started(), 1);
  absl::StatusOr<int> fd = open();
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
}

// Memory the system refuses to pin is asked for once; the arena works on.
TEST(PageArenaTest, RefusedPinsAreAskedOnce) {
  auto slab = std::make_shared<RecordingSlab>(kPage);
  slab->refuse_pins = true;
  absl::StatusOr<std::unique_ptr<PageArena>> created = PageArena::Create({.capacity = 4 * kPage,
                                                                          .page_size = kPage,
                                                                          .segment_pages = 1,
                                                                          .shared = false,
                                                                          .slab = nullptr,
                                                                          .pin_for = slab});
  ASSERT_TRUE(created.ok()) << created.status();
  PageArena* arena = created->get();
  std::vector<uint32_t> pages;
  ASSERT_TRUE(Take(*arena, 4, "ns", pages));
  const std::string bytes(4 * kPage, 'x');
  ASSERT_TRUE(arena->Write(pages, 0, bytes).ok());
  EXPECT_EQ(ReadBack(*arena, pages, 0, bytes.size()), bytes);
  EXPECT_EQ(slab->pin_calls, 1);
}

}  // namespace
}  // namespace kvtier::cache
