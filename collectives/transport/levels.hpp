// The two levels of a transport's ranks (as hosts() tells hosts apart): each host's ranks, and
// the chunks of a tensor each rank owns across hosts. The layout the two-level algorithms run
// on (algorithms/two_level.hpp explains it) and the Communicator's count of hosts; every rank
// derives the same layout from hosts(), without a message.
#pragma once

#include <vector>

#include "transport.hpp"

namespace gcomp::detail {

struct Levels {
  int hosts = 1;                // H
  int width = 1;                // W: the most ranks on a host, and the number of chunks
  std::vector<int> host_ranks;  // this host's ranks, ascending
  int local = 0;                // this rank's place among them
  std::vector<int> owned;       // the chunks this rank owns, ascending
  // Per owned chunk (owned[k]): its owners, one per host, ascending (the chunk's group across
  // hosts, which holds this rank).
  std::vector<std::vector<int>> chunk_groups;
  // owner[c][h]: chunk c's owner on the h-th host (hosts in the order of their lowest rank).
  std::vector<std::vector<int>> owners;
};

// The layout of the transport's ranks (hosts() and rank()).
Levels levels_of(const Net& net);

}  // namespace gcomp::detail
