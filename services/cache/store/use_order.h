// A tier's blocks by use score (RecencyOrFrequency), the least used
// first, kept lazily. A block's key only rises (a use adds to its score,
// and takes a later tie-break), so a use changes the key without moving the
// block; a search moves a block whose place is below its key when it
// reaches it. No block's place is above its key, so the first block a
// search allows whose place is its key is the least used it allows: a
// Match then costs a tier nothing per block it refreshes. Not thread-safe:
// the store calls it under its lock.
#ifndef KVTIER_SERVICES_CACHE_STORE_USE_ORDER_H_
#define KVTIER_SERVICES_CACHE_STORE_USE_ORDER_H_

#include <cstdint>
#include <map>
#include <utility>

namespace kvtier::cache {

// A block's use score, then a tie-break (RecencyOrFrequency hands both
// out): so that of a prompt's blocks with the same score the last goes
// first, as under leaf-first.
using UseKey = std::pair<double, int64_t>;

// T has `UseKey use` (its key, raised in place) and
// `std::map<UseKey, T*>::iterator by_use` (its place, for the order).
template <typename T>
class UseOrder {
 public:
  void Place(T* item) { item->by_use = map_.emplace(item->use, item).first; }
  void Remove(T* item) { map_.erase(item->by_use); }

  // The order from the least used, past items already passed over (the
  // store takes its victims one after another).
  class Search {
   public:
    explicit Search(UseOrder& order) : map_(order.map_), at_(map_.begin()) {}

    // The least used item `allowed` allows, or null.
    template <typename Allowed>
    T* Least(const Allowed& allowed) {
      while (true) {
        while (at_ != map_.end() && !allowed(at_->second)) ++at_;
        if (at_ == map_.end()) return nullptr;
        T* item = at_->second;
        if (at_->first == item->use) return item;
        auto node = map_.extract(at_++);  // its key rose: moved, not freed and made again
        node.key() = item->use;
        item->by_use = map_.insert(std::move(node)).position;
        if (at_ == map_.end() || item->use < at_->first) at_ = item->by_use;
      }
    }

   private:
    std::map<UseKey, T*>& map_;
    typename std::map<UseKey, T*>::iterator at_;
  };

 private:
  std::map<UseKey, T*> map_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_USE_ORDER_H_
