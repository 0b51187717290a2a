// sparse_split: SparCML's SSAR_Split_allgather / DSAR_Split_allgather. The index range is cut
// into P parts, part j = [j n / P, (j+1) n / P); each rank sends the entries of its stream that
// fall in part j to rank j (all-to-all); owner j sums the P pieces of its part in rank order
// (sparse merges, switching to dense by the byte rule: that is the DSAR case, where owners
// reduce densely); then every part goes to every rank (allgatherv), sparse or dense by the same
// rule, and each rank writes the parts into its output.
//
// Schedule: 1 all-to-all (P-1 messages of ~k/P entries each per rank: (P-1)/P k (index +
// value) bytes) and 1 allgatherv (each rank sends its reduced part, min(u/P (index + value),
// 4n/P) bytes with u the size of the union of the supports, to P-1 ranks). Cost model
// (Ok-Topk's): (P-1) alpha + 2 k (P-1)/P beta for the reduce part.
#include <algorithm>

#include "algorithm_table.hpp"
#include "model_terms.hpp"
#include "sparse_vector.hpp"

namespace gcomp::detail {

namespace {
struct SparseSplitBuffers {
  SparseVector mine, acc, piece;  // this rank's payload, its part's sum, one gathered part
  std::vector<std::byte> wire;    // the reduced part as sent
  Gathered all;                   // every owner's part
};
}  // namespace

static void run_sparse_split(Job& job) {
  const std::uint64_t n = job.buf.out.size();
  const auto p = static_cast<std::uint64_t>(job.call.size);
  const std::vector<std::uint64_t> bound = even_bounds(n, p);
  auto& [mine, acc, piece, wire, all] = job.ws.get<SparseSplitBuffers>();
  reduce_own_region(job, bound, mine, acc, nullptr);
  {
    const auto timed = job.meter.decoding();
    serialize(acc, wire, half_values(job));
  }
  job.call.net->allgatherv_bytes(wire, all, job.meter.traffic);
  const auto timed = job.meter.decoding();
  for (std::uint64_t j = 0; j < p; ++j) {
    deserialize(all.of(static_cast<int>(j)), bound[j + 1] - bound[j], piece);
    // Averaged in write_out's pass.
    write_out(piece, job.buf.out.subspan(bound[j], bound[j + 1] - bound[j]), average_scale(job));
  }
}


namespace {

// The region exchange, then the reduced parts (the union's share of each region) to every rank.
double part_bytes(const ModelInput& in) {
  const double n = in.n, p = in.ranks;
  const double u = union_size(n, in.sent, p, in.shared_support);
  return 8 + std::min(u / p * stream_entry_bytes(u, n, in.value_bytes), in.value_bytes * n / p);
}

double predict_sparse_split(const ModelInput& in) {
  const LocalTerms l = local_terms(in);
  // The average is taken in write_out's pass (no term of its own).
  return l.encode + predict_region_exchange(in) + t_allgatherv(in, part_bytes(in)) + l.write_out;
}

double bytes_sparse_split(const ModelInput& in) {
  return bytes_region_exchange(in) + (in.ranks - 1) * part_bytes(in);
}

}  // namespace

extern const AlgorithmRow kSparseSplitRow = {
    .id = Algorithm::sparse_split,
    .name = "sparse_split",
    .description = "SparCML's SSAR/DSAR_Split_allgather: each rank sums one region of every "
                   "stream, then the regions are gathered",
    .sparse_only = true,
    .candidate = for_sparse_codecs,
    .predict = predict_sparse_split,
    .bytes = bytes_sparse_split,
    .run = run_sparse_split,
    .run_device = nullptr,
};

}  // namespace gcomp::detail
