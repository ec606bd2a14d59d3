#include "services/cache/store/record_slots.h"

#include <algorithm>
#include <bit>

namespace kvtier::cache {
namespace {

uint64_t AllFree(uint32_t slots) { return slots == 64 ? ~uint64_t{0} : (uint64_t{1} << slots) - 1; }

}  // namespace

RecordSlots::RecordSlots(PageArena* arena)
    : arena_(arena), min_slot_(std::max<uint32_t>(256, arena->page_size() / kMostSlotsPerPage)) {}

uint32_t RecordSlots::SlotBytes(size_t bytes) const {
  if (bytes > arena_->page_size() / 2) return 0;
  return std::max(min_slot_, std::bit_ceil(static_cast<uint32_t>(bytes)));
}

bool RecordSlots::HasRoom(uint32_t slot_bytes, const std::string& owner) const {
  return with_free_.contains({owner, slot_bytes}) || arena_->FreePagesFor(owner) >= 1;
}

bool RecordSlots::Take(uint32_t slot_bytes, const std::string& owner, std::vector<uint32_t>& room) {
  auto free_pages = with_free_.find({owner, slot_bytes});
  uint32_t page = 0;
  if (free_pages != with_free_.end()) {
    page = *free_pages->second.begin();
  } else {
    std::vector<uint32_t> taken;
    if (!arena_->Allocate(1, owner, taken)) return false;
    page = taken[0];
    pages_[page] = {owner, slot_bytes, AllFree(SlotsPerPage(slot_bytes))};
    free_pages = with_free_.try_emplace({owner, slot_bytes}).first;
    free_pages->second.insert(page);
    CountFree(owner, int64_t{SlotsPerPage(slot_bytes)} * slot_bytes);
  }
  SlottedPage& p = pages_[page];
  const int slot = std::countr_zero(p.free);
  p.free &= ~(uint64_t{1} << slot);
  CountFree(owner, -int64_t{slot_bytes});
  if (p.free == 0) DropFromFree(free_pages, page);
  room = {page, kTag | static_cast<uint32_t>(slot) * slot_bytes};
  return true;
}

void RecordSlots::Give(const std::vector<uint32_t>& room) {
  const uint32_t page = room[0];
  auto it = pages_.find(page);
  SlottedPage& p = it->second;
  const Class c{p.owner, p.slot_bytes};
  if (p.free == 0) with_free_[c].insert(page);
  p.free |= uint64_t{1} << (Offset(room) / p.slot_bytes);
  CountFree(p.owner, p.slot_bytes);
  if (p.free != AllFree(SlotsPerPage(p.slot_bytes))) return;
  // Its last slot: the page goes back to the arena.
  CountFree(p.owner, -int64_t{SlotsPerPage(p.slot_bytes)} * p.slot_bytes);
  DropFromFree(with_free_.find(c), page);
  pages_.erase(it);
  arena_->Free(std::span(&page, 1));
}

void RecordSlots::DropFromFree(std::map<Class, std::set<uint32_t>>::iterator free_pages, uint32_t page) {
  free_pages->second.erase(page);
  if (free_pages->second.empty()) with_free_.erase(free_pages);
}

void RecordSlots::CountFree(const std::string& owner, int64_t bytes) {
  uint64_t& free = free_bytes_[owner];
  free += bytes;  // modulo 2^64: never below 0 in the end
  if (free == 0) free_bytes_.erase(owner);
}

uint64_t RecordSlots::FreeBytesOf(const std::string& owner) const {
  auto it = free_bytes_.find(owner);
  return it == free_bytes_.end() ? 0 : it->second;
}

uint64_t RecordSlots::MetadataBytes() const {
  // A node of each map a slotted page is in, roughly.
  return pages_.size() * (sizeof(SlottedPage) + 64) + with_free_.size() * 96;
}

}  // namespace kvtier::cache
