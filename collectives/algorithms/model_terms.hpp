// The cost model's building blocks (defined in cost_model.cpp), shared by the algorithms'
// predictions in their own files. Times in seconds; P ranks, n elements, alpha + m beta per
// message. docs/algorithms.md explains each.
#pragma once

#include "gcomp/cost_model.hpp"

namespace gcomp::detail {

double log2_ceil(int p);
// Expected size of the union of m independent random k-subsets of n (or k when shared).
double union_size(double n, double k, double m, bool shared);
// MPICH's allreduce of `bytes` (`elements` float32 summed): recursive doubling for short
// messages, Rabenseifner for long ones (bandwidth term as measured, where it was).
double t_allreduce(const ModelInput& in, double bytes, double elements);
// The allreduce on two levels (two_level.cpp): the host's reduce-scatter, each part's
// allreduce across hosts (a group's: gathered, then summed), the host's allgather.
double t_two_level_allreduce(const ModelInput& in, double bytes, double elements);
// An allgatherv of `bytes` per rank, after an allgather of the sizes.
double t_allgatherv(const ModelInput& in, double bytes);
// Seconds per byte when `flows` of the P ranks send at once: from beta_one (one flow) to beta
// (all P), in proportion.
double beta_for(const ModelInput& in, double flows);
// An all-to-all where each rank sends `bytes` in all, spread evenly, after one of the sizes.
double t_alltoallv(const ModelInput& in, double bytes);

// The compute every algorithm pays in some measure.
struct LocalTerms {
  double write_out;   // zeroing or copying the output: n reduce
  double average;     // dividing by P, when averaging
  double encode;      // the whole-tensor encode
  double decode_one;  // decoding one rank's payload (per entry for sparse codecs)
};
LocalTerms local_terms(const ModelInput& in);

// Every rank's whole payload to every rank, all decoded (allgather, sparse_allgather).
double predict_payload_allgather(const ModelInput& in);
double bytes_payload_allgather(const ModelInput& in);

// Bytes of one (index, value) stream entry: a value (float32, or binary16 for a codec with
// values=fp16) and a packed index, whose size follows the density of the stream's entries in
// the index range it covers (expected_packed_index_bytes); without a density, the codec's
// sent / n.
double stream_entry_bytes(double entries, double range, double value_bytes);
double stream_entry_bytes(const ModelInput& in);

// The start both region algorithms share (sparse_split, sparse_reduce_scatter): each rank's
// entries to the owners of their regions (an all-to-all, a stream head per region), decoded
// there and merged, P pieces per owner. Seconds, and bytes sent per rank.
double predict_region_exchange(const ModelInput& in);
double bytes_region_exchange(const ModelInput& in);

}  // namespace gcomp::detail
