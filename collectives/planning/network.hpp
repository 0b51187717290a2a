// The network measurement (network.cpp) on a transport, and its pairing, exposed for its test.
#pragma once

#include <span>
#include <vector>

#include "gcomp/collective_types.hpp"

namespace gcomp::detail {

class Net;
// Collective: this rank's measurement of the network (the Communicator agrees them by MAX).
// Without fit_allreduce, beta_allreduce stays 0 (the transport's own allreduce not timed: a
// group transport's gathers every rank's values, too much memory to time at 8M floats).
NetworkModel measure_network(Net& net, bool fit_allreduce = true);

// The ranks dealt round-robin over their hosts (host_of[r]: a host's name, a rank number below
// host_of.size(); hosts in order of their first rank, each host's ranks in order). Paired as
// dealt, (dealt[0], dealt[1]), (dealt[2], dealt[3]), ..., each pair spans two hosts wherever
// there are several; on one host the pairs are (0, 1), (2, 3), ...
std::vector<int> deal_over_hosts(std::span<const int> host_of);

}  // namespace gcomp::detail
