// The two levels of a transport's ranks, for the two-level algorithms (issue 43): the ranks of
// each host (as the transport tells hosts apart: hosts()) reduce inside the host uncompressed,
// the ranks that own the same part of the tensor on each host run a one-level algorithm across
// hosts, and the host's ranks gather the parts back.
//
// The tensor is cut into W chunks (W: the most ranks any host has; chunk_bound's even cut). On a
// host of L ranks, its i-th rank owns chunks i, i + L, i + 2L, ... < W: with the same number of
// ranks on every host each rank owns one chunk, and the ranks owning chunk c, one per host, are
// the ranks of local index c; on a host with fewer ranks some own several. Every rank derives
// the same layout from hosts(), so the ranks agree on it without a message.
//
//   host_reduce_scatter: each rank's elements of chunk c go to c's owner on its host (one
//     all-to-all over the host's ranks), which sums them in host-rank order: the host's sum of
//     its chunks, the same bits whichever rank computes them;
//   (across hosts: chunk c's owners reduce it, each compressing its host's sum; what it leaves
//    out is split among the host's ranks, an L-th each)
//   host_allgather: the owners' reduced chunks (and the residual shares) to every rank of the
//     host (one allgatherv each).
//
// Bytes inside a host per rank: (L - 1) / L of the tensor each way in each step (as a ring's
// reduce-scatter and allgather); across hosts, each chunk's owners move what the one-level
// algorithm moves for n / W elements among H ranks, so a host's link carries the algorithm's
// bytes for the whole tensor once, not once per rank.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "levels.hpp"
#include "transport.hpp"
#include "workspace.hpp"

namespace gcomp::detail {

// Chunk c of n elements: [chunk_bound(n, c, W), chunk_bound(n, c + 1, W)).

// x is this rank's n elements; host is a transport over levels.host_ranks (a group transport,
// or the whole transport when every rank is on one host). sums gets, per owned chunk, the
// host's sum of that chunk (the host's ranks' elements added in host-rank order).
void host_reduce_scatter(Net& host, const Levels& levels, std::span<const float> x,
                         std::vector<std::vector<float>>& sums, Traffic& t);

// The inverse: every rank of the host sends its owned chunks (chunks[k]: chunk owned[k], of its
// size) and out (n elements) gets every chunk from its owner on this host. With allow_missing,
// a rank whose chunks[k] is empty where the chunk is not (its step across hosts failed) sends
// nothing, and every rank of the host returns false, the chunks of such ranks left as they
// were in out; else true.
bool host_allgather(Net& host, const Levels& levels, const std::vector<std::vector<float>>& chunks,
                    std::span<float> out, Traffic& t, bool allow_missing = false);

}  // namespace gcomp::detail
