#include "services/cache/store/use_order.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

struct Item {
  UseKey use;
  std::map<UseKey, Item*>::iterator by_use = {};
};

const auto kAny = [](const Item*) { return true; };

// A key raised in place (a use) is honoured when a search reaches it:
// the item is passed over for the next least used, and found in its new
// place later.
TEST(UseOrder, ARaisedKeyIsHonouredWithoutMovingTheItemAtOnce) {
  Item a{{1.0, 1}}, b{{2.0, 2}}, c{{3.0, 3}};
  UseOrder<Item> order;
  for (Item* i : {&a, &b, &c}) order.Place(i);
  a.use = {2.5, 4};  // used again: now between b and c
  UseOrder<Item>::Search search(order);
  EXPECT_EQ(search.Least(kAny), &b);
  EXPECT_EQ(search.Least([&](const Item* i) { return i != &b; }), &a) << "a in its new place, before c";
  EXPECT_EQ(search.Least([&](const Item* i) { return i == &c; }), &c);
  EXPECT_EQ(search.Least([](const Item*) { return false; }), nullptr);
  order.Remove(&a);
  EXPECT_EQ(UseOrder<Item>::Search(order).Least([&](const Item* i) { return i != &b; }), &c);
}

// Against a plain minimum over fresh random keys raised at random: each
// search finds the least used item it allows.
TEST(UseOrder, FindsTheLeastUsedOfThoseAllowed) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_real_distribution<double> rise(0.0, 3.0);
  std::vector<Item> items(200);
  UseOrder<Item> order;
  int64_t tie = 0;
  for (Item& i : items) {
    i.use = {rise(rng.engine()), ++tie};
    order.Place(&i);
  }
  for (int round = 0; round < 300; ++round) {
    for (int k = 0; k < 20; ++k) {  // uses raise keys in place
      Item& i = items[rng.engine()() % items.size()];
      i.use = {i.use.first + rise(rng.engine()), ++tie};
    }
    const uint64_t odd = rng.engine()() % 2;
    const auto allowed = [&](const Item* i) { return (i - items.data()) % 2 == static_cast<int64_t>(odd); };
    const Item* least = nullptr;
    for (const Item& i : items) {
      if (allowed(&i) && (least == nullptr || i.use < least->use)) least = &i;
    }
    ASSERT_EQ(UseOrder<Item>::Search(order).Least(allowed), least) << "round " << round;
  }
}

}  // namespace
}  // namespace kvtier::cache
