// sparse_reduce_scatter's memory between calls (sparse_reduce_scatter.cpp): per tensor, the
// region boundaries balanced by where the ranks' selections fell last time, and the global
// threshold estimate (with the level it came from). Every rank derives it from the same gathered
// data, so every rank holds the same; the agreement compares its hash (Agreement::regions) and
// every rank forgets it when they differ.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace gcomp::detail {

struct SparseRegions {
  std::vector<std::uint64_t> bound;  // P + 1 boundaries; empty: P equal regions
  double threshold = 0;              // keep |sum| >= threshold; 0: unknown (found this call)
  double level = 0;                  // the previous call's 1.1 k-th largest |sum|; 0: unknown
  std::uint64_t signature() const;   // a hash of the three (0 when all are unset)
  void forget() {
    bound.clear();
    threshold = 0;
    level = 0;
  }
};

// The regions of each tensor a Communicator has reduced this way, by a key of (spec, n, tensor,
// layout): the same tensor from step to step, whatever its seed.
class RegionMemory {
 public:
  SparseRegions& of(std::uint64_t key);

 private:
  std::unordered_map<std::uint64_t, SparseRegions> map_;
};

}  // namespace gcomp::detail
