// Recursive doubling on any number of ranks, as MPICH schedules it: with p2 the largest power of
// two <= P and rem = P - p2, the ranks 0..2 rem - 1 fold first (even rank 2i hands its data to
// 2i + 1 and sits the rounds out), the p2 others exchange with one partner per round (log2 p2
// rounds, partner new rank ^ 2^k), and 2i + 1 finally hands the result back to 2i (unfold).
// sparse_recursive_doubling's rounds and the Gloo transport's agreement follow it.
#pragma once

#include <vector>

namespace gcomp::detail {

struct DoublingSchedule {
  int folds_into = -1;  // an even rank below 2 rem: the odd rank it hands its data to, then
                        // takes the result from
  int folded_from = -1;  // an odd rank below 2 rem: the even rank whose data it takes first and
                         // to which it hands the result last
  std::vector<int> partners;  // this rank's partner in each round (none for a rank that folds)

  DoublingSchedule(int rank, int size) {
    int p2 = 1;
    while (p2 * 2 <= size) p2 *= 2;
    const int rem = size - p2;
    int newrank = rank - rem;
    if (rank < 2 * rem) {
      if (rank % 2 == 0) {
        folds_into = rank + 1;
        return;
      }
      folded_from = rank - 1;
      newrank = rank / 2;
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int peer_new = newrank ^ mask;
      partners.push_back(peer_new < rem ? 2 * peer_new + 1 : peer_new + rem);
    }
  }
};

}  // namespace gcomp::detail
