// The radix select's two decisions as functions of a few counts, shared by its one-block scans
// (cuda/sparse.cu) and a host test (tests/cuda/radix_select_test.cpp) that checks them against
// the one-at-a-time walks they replace: which histogram bin holds the need-th largest key, and
// which run of tie counts holds the need-th tie; and how many ties each tile gives the
// selection once the cut is known.
#pragma once

#include "host_device.hpp"

namespace gcomp::cuda::detail {

// A walk down the bins from the top (bins - 1) takes each bin whole while it holds fewer keys
// than are still needed, and stops at the bin that holds the need-th key, or at bin 0. Bin c,
// with `above` keys in the bins above it and `count` of its own, is where the walk stops when
// the walk reaches it (c is the top bin, or the bins above hold fewer than need) and it holds
// the rest (or c is bin 0). Exactly one bin satisfies this for any counts and need.
GCOMP_HOST_DEVICE inline bool walk_stops_at(int c, int bins, unsigned long long above,
                                            unsigned long long count, unsigned long long need) {
  return (c == bins - 1 || above < need) && (c == 0 || need <= above + count);
}

// Runs of tie counts in index order: the run with `before` ties ahead of it and `count` of its
// own holds the need-th tie (need >= 1; one run does when the runs hold at least need).
GCOMP_HOST_DEVICE inline bool holds_nth(unsigned long long before, unsigned long long count,
                                        unsigned long long need) {
  return before < need && need <= before + count;
}

// The ties (keys equal to T) that tile `tile` contributes to the selection, of the `ties` it
// holds: all of them before the tile of the cut (and everywhere when nothing is cut, cut_tile
// ~0), in the cut's tile the cut's rank among its ties (the ties at or below the cut's index),
// none after it.
GCOMP_HOST_DEVICE inline unsigned long long ties_taken(unsigned long long tile,
                                                       unsigned long long ties,
                                                       unsigned long long cut_tile,
                                                       unsigned long long cut_rank) {
  if (cut_tile == ~0ull || tile < cut_tile) return ties;
  return tile == cut_tile ? cut_rank : 0;
}

}  // namespace gcomp::cuda::detail
