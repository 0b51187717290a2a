// sparse_recursive_doubling: SparCML's SSAR_Recursive_double (Renggli et al., SC 2019). Each rank
// starts from its own sparse stream (the codec's selected entries); in round k it exchanges its
// whole stream with partner rank ^ 2^k and merges, so after log2(P) rounds every rank holds the
// sum. A stream switches to the dense representation once its bytes would reach the dense
// size, so a round never sends more than 4n bytes.
//
// Non-power-of-two P: with p2 the largest power of two <= P and r = P - p2, the ranks 0..2r-1
// fold first (even rank 2i sends its stream to 2i+1 and waits), the p2 remaining ranks run the
// rounds, and 2i+1 finally sends the result back to 2i (unfold): doubling.hpp's schedule.
//
// Schedule: log2(p2) rounds (+2 when folding); in round k a rank sends its stream, about
// min(2^k k_0 (1 - overlap), n) entries of (index + value) bytes, and receives its partner's.
// Merging is commutative bit for bit, so all ranks end with identical streams.
#include <algorithm>

#include "algorithm_table.hpp"
#include "doubling.hpp"
#include "model_terms.hpp"
#include "sparse_vector.hpp"

namespace gcomp::detail {

namespace {
struct RecursiveDoublingBuffers {
  SparseVector sum, other;           // this rank's partial sum, a partner's
  std::vector<std::byte> wire, got;  // the partial sums as sent and received
};
}  // namespace

static void run_sparse_recursive_doubling(Job& job) {
  encode_whole(job);
  // Named references, not a structured binding: lambdas below capture them (clang 14 cannot
  // capture structured bindings).
  RecursiveDoublingBuffers& bufs = job.ws.get<RecursiveDoublingBuffers>();
  SparseVector& s = bufs.sum;
  SparseVector& other = bufs.other;
  std::vector<std::byte>& wire = bufs.wire;
  std::vector<std::byte>& got = bufs.got;
  payload_vector(job, s);
  const std::uint64_t n = job.buf.out.size();
  // With binary16 values a partner reads this rank's stream rounded: this rank sums the same.
  const bool half = half_values(job);
  const auto send_form = [&] {
    if (half) round_to_half(s);
    serialize(s, wire, half);
  };
  const auto merge_from = [&](const std::vector<std::byte>& bytes) {
    const auto timed = job.meter.decoding();
    deserialize(bytes, n, other);
    merge_into(s, other);
  };

  const DoublingSchedule d(job.call.rank, job.call.size);
  if (d.folds_into >= 0) {
    send_form();
    job.call.net->send_bytes(d.folds_into, wire, job.meter.traffic);
  }
  if (d.folded_from >= 0) {
    job.call.net->recv_bytes(d.folded_from, got, job.meter.traffic);
    merge_from(got);
  }
  for (const int peer : d.partners) {
    send_form();
    job.call.net->sendrecv_bytes(peer, wire, got, job.meter.traffic);
    merge_from(got);
  }
  if (d.folded_from >= 0) {
    serialize(s, wire);  // the result as it is, as its round partner holds it
    job.call.net->send_bytes(d.folded_from, wire, job.meter.traffic);
  }
  if (d.folds_into >= 0) {
    job.call.net->recv_bytes(d.folds_into, got, job.meter.traffic);
    const auto timed = job.meter.decoding();
    deserialize(got, n, s);
  }
  const auto timed = job.meter.decoding();
  write_out(s, job.buf.out, average_scale(job));  // averaged in the same pass
}

namespace {

// Whether a stream of `entries` of n is sent dense (goes_full, the merge's rule), and its bytes
// (values of value_bytes each).
bool dense_stream(double entries, double n) {
  return goes_full(static_cast<std::uint64_t>(entries), static_cast<std::uint64_t>(n));
}
double stream_bytes(double entries, double n, double value_bytes) {
  return 8 + (dense_stream(entries, n) ? value_bytes * n
                                       : entries * stream_entry_bytes(entries, n, value_bytes));
}

// Rounds of whole-stream exchanges, streams growing by union.
double predict_sparse_recursive_doubling(const ModelInput& in) {
  const LocalTerms l = local_terms(in);
  const double n = in.n, p = in.ranks;
  const auto& c = in.compute;
  int p2 = 1;
  while (p2 * 2 <= in.ranks) p2 *= 2;
  const bool fold = p2 != in.ranks;
  const auto merge_cost = [&](double a, double b) {
    return dense_stream(a + b, n) ? n * c.reduce : (a + b) * c.merge;
  };
  // Folding and unfolding move P - p2 messages at once, the rounds p2.
  const double fold_beta = beta_for(in, in.ranks - p2);
  const double round_beta = beta_for(in, p2);
  // The average is taken in write_out's pass (no term of its own).
  double total = l.encode + in.sent * c.decode + l.write_out;
  double s = in.sent;
  if (fold) {
    total += in.network.alpha + stream_bytes(s, n, in.value_bytes) * fold_beta + merge_cost(s, s);
    s = union_size(n, in.sent, 2, in.shared_support);
  }
  // m: the most contributions one rank's stream holds (2 on a folded rank), never above P.
  double m = fold ? 2 : 1;
  for (int step = 1; step < p2; step *= 2) {
    total += in.network.alpha + stream_bytes(s, n, in.value_bytes) * round_beta + merge_cost(s, s);
    m = std::min(2 * m, p);
    s = union_size(n, in.sent, m, in.shared_support);
  }
  if (fold) total += in.network.alpha + stream_bytes(s, n, in.value_bytes) * fold_beta;
  return total;
}

// The most a rank sends: a folded odd rank's rounds and the unfold.
double bytes_sparse_recursive_doubling(const ModelInput& in) {
  const double n = in.n, p = in.ranks;
  int p2 = 1;
  while (p2 * 2 <= in.ranks) p2 *= 2;
  const bool fold = p2 != in.ranks;
  double total = 0;
  double s = fold ? union_size(n, in.sent, 2, in.shared_support) : in.sent;
  double m = fold ? 2 : 1;
  for (int step = 1; step < p2; step *= 2) {
    total += stream_bytes(s, n, in.value_bytes);
    m = std::min(2 * m, p);
    s = union_size(n, in.sent, m, in.shared_support);
  }
  if (fold) total += stream_bytes(s, n, in.value_bytes);
  return total;
}

}  // namespace

extern const AlgorithmRow kSparseRecursiveDoublingRow = {
    .id = Algorithm::sparse_recursive_doubling,
    .name = "sparse_recursive_doubling",
    .description =
        "SparCML's SSAR_Recursive_double: log2 P rounds exchanging and merging sparse "
        "streams, dense once they fill",
    .sparse_only = true,
    .candidate = for_sparse_codecs,
    .predict = predict_sparse_recursive_doubling,
    .bytes = bytes_sparse_recursive_doubling,
    .run = run_sparse_recursive_doubling,
    .run_device = nullptr,
};

}  // namespace gcomp::detail
