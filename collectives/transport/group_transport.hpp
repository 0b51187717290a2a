// A Net over some of another transport's ranks (the ranks of one host, or the ranks of
// one local index across hosts), built on the parent's point-to-point messages, so that a
// two-level algorithm can run the one-level algorithms unchanged on each level. Its rank r is
// members[r] of the parent; its collectives are collective over the members only:
//
//   * allgatherv: a ring, members - 1 shifts (each rank sends what it received last);
//   * alltoallv: members - 1 shifts, the k-th to rank + k and from rank - k;
//   * allreduce: every member's values gathered (allgatherv), then reduced in member order, so
//     every member computes the same bits (a float sum is ((x0 + x1) + x2) ... on each);
//   * barrier: an allgatherv of nothing; send, recv and shifts: the parent's, ranks mapped.
//
// It has no agreement of its own: it runs inside a call the parent's ranks have agreed on (the
// agreement names the algorithm, so every member runs the same steps). Traffic counts what its
// messages hand to the parent (sizes included), as the parent counts its own.
#pragma once

#include <memory>
#include <vector>

#include "transport.hpp"

namespace gcomp::detail {

// members: parent ranks, ascending, distinct, holding parent.rank() (Error(internal)
// otherwise). The parent must outlive it. Its hosts() are the members' hosts as the parent
// tells them apart, numbered by the lowest member rank on each.
std::unique_ptr<Net> make_group_transport(Net& parent, std::vector<int> members);

// The ranks of this rank's host (the parent's hosts()), ascending.
std::vector<int> host_members(const Net& parent);
// The ranks whose place among their host's ranks is this rank's (the i-th rank of each host,
// for this rank's i), ascending; a host with fewer ranks has none there.
std::vector<int> index_members(const Net& parent);

}  // namespace gcomp::detail
