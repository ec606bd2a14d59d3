// The median the benchmarks print of their rounds (the upper one of an even
// count).
#ifndef KVTIER_LOAD_MEDIAN_H_
#define KVTIER_LOAD_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace kvtier::load {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_MEDIAN_H_
