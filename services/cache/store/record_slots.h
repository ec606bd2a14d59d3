// Slots for small records, so that a record of a few hundred bytes does not
// take a whole page. A record of at most half a page takes a slot: a page
// of the arena split into equal slots of one size class (powers of two from
// min_slot up to half a page), owned, as every page, by one owner (a
// segment owner: a shared segment still holds only its owner's bytes). A
// record takes the smallest class it fits; a page goes back to the arena
// when its last slot is freed.
//
// A slotted record's room is two numbers: its page, and kTag | its byte
// offset in that page (page_arena.h's page indices never reach kTag). Not
// thread-safe: the store calls it under its lock, as it does the arena.
#ifndef KVTIER_SERVICES_CACHE_STORE_RECORD_SLOTS_H_
#define KVTIER_SERVICES_CACHE_STORE_RECORD_SLOTS_H_

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "services/cache/store/page_arena.h"

namespace kvtier::cache {

class RecordSlots {
 public:
  static constexpr uint32_t kTag = 1u << 31;
  static constexpr uint32_t kMostSlotsPerPage = 64;  // a page's free slots are one 64-bit mask

  explicit RecordSlots(PageArena* arena);

  // The slot a record of `bytes` takes; 0 when it takes whole pages.
  uint32_t SlotBytes(size_t bytes) const;
  // Whether `owner` has a free slot of `slot_bytes`, or the arena a page for it.
  bool HasRoom(uint32_t slot_bytes, const std::string& owner) const;
  // Takes a slot of `slot_bytes` for `owner` into `room`; false (nothing
  // taken) when none is free and the arena has no page for it. The page is
  // new when `room` is: the taker prepares it, as any page (Prepare).
  bool Take(uint32_t slot_bytes, const std::string& owner, std::vector<uint32_t>& room);
  void Give(const std::vector<uint32_t>& room);

  static bool IsSlot(const std::vector<uint32_t>& room) { return room.size() == 2 && (room[1] & kTag) != 0; }
  // The arena pages a room lies in (a view of it), and where in the first
  // it starts.
  static std::span<const uint32_t> Pages(const std::vector<uint32_t>& room) {
    return std::span(room).first(IsSlot(room) ? 1 : room.size());
  }
  static uint32_t Offset(const std::vector<uint32_t>& room) { return IsSlot(room) ? room[1] & ~kTag : 0; }

  uint64_t MetadataBytes() const;
  // Bytes of free slots in `owner`'s slotted pages: held for it, usable by
  // no one else.
  uint64_t FreeBytesOf(const std::string& owner) const;

 private:
  struct SlottedPage {
    std::string owner;
    uint32_t slot_bytes = 0;
    uint64_t free = 0;  // bit k: slot k is free
  };
  using Class = std::pair<std::string, uint32_t>;  // owner, slot size

  uint32_t SlotsPerPage(uint32_t slot_bytes) const { return arena_->page_size() / slot_bytes; }
  // Adds `bytes` (or takes them away) from `owner`'s free slot bytes.
  void CountFree(const std::string& owner, int64_t bytes);
  // `page` has no free slot left (or leaves): off its class's list.
  void DropFromFree(std::map<Class, std::set<uint32_t>>::iterator free_pages, uint32_t page);

  PageArena* const arena_;
  const uint32_t min_slot_;
  std::unordered_map<uint32_t, SlottedPage> pages_;
  std::map<Class, std::set<uint32_t>> with_free_;         // pages of a class with a free slot
  std::unordered_map<std::string, uint64_t> free_bytes_;  // FreeBytesOf, owners with some
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_RECORD_SLOTS_H_
