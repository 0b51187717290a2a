// dense: MPI_Allreduce of float32. With codec `none` the input goes to MPI as it is; any other
// codec first decodes this rank's own payload (what it would have sent), so the sum is the same
// as every other algorithm's, in float32 on the wire: fp16/bf16 contributions are summed in
// float32 and cannot overflow the 16-bit range. When auto finds that no compressing algorithm
// beats a plain allreduce, it runs this one with the codec skipped (x + e goes as it is).
//
// Schedule (MPICH's choice inside MPI_Allreduce): for large messages a reduce-scatter by
// recursive halving then an allgather by recursive doubling, 2 log2(P) rounds with partner
// rank ^ 2^k, 2 (P-1)/P * 4n bytes sent per rank; for short ones recursive doubling, log2(P)
// rounds of 4n bytes.
#include <algorithm>

#include "algorithm_table.hpp"
#include "codec_impl.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

// What this rank sends: x, x + e, or its decoded payload.
static const float* contribution(Job& job) {
  const std::size_t n = job.buf.in.size();
  std::vector<float>& own = job.ws.own;
  if (job.skip_codec || job.call.codec->kind() == CodecKind::none) {
    // Uncompressed: x, or with error feedback v = x + e, whose residual then is zero.
    if (job.buf.ef) std::fill(job.buf.ef_next.begin(), job.buf.ef_next.end(), 0.0f);
    if (std::holds_alternative<prepared::Staged>(job.input)) {
      return job.buf.out.data();  // device staging, copied and checked: reduced in place
    }
    if (const auto* sum = std::get_if<prepared::Summed>(&job.input)) {
      return sum->values.data();  // x + e, formed and checked before the agreement
    }
    if (!job.buf.ef) return job.buf.in.data();
    const auto timed = job.meter.encoding();
    own.resize(n);
    const auto e = job.buf.ef->residual();
    for (std::size_t i = 0; i < n; ++i) own[i] = job.buf.in[i] + e[i];
    return own.data();
  }
  const std::span<const std::byte> payload = encode_whole(job);
  const auto timed = job.meter.decoding();
  own.assign(n, 0.0f);
  decode_add_own(payload, own, 1.0f);
  return own.data();
}

void run_dense(Job& job) {
  const std::size_t n = job.buf.in.size();
  const float* send = contribution(job);
  {
    const auto timed = job.meter.communicating();
    if (job.call.size == 1) {
      if (send != job.buf.out.data()) std::copy(send, send + n, job.buf.out.data());
    } else {
      job.call.net->allreduce(send, job.buf.out.data(), n, Reduction::sum_float);
      // The volume a bandwidth-optimal allreduce moves per rank.
      const std::uint64_t volume = 2 * (static_cast<std::uint64_t>(job.call.size) - 1) * 4 * n /
                                   static_cast<std::uint64_t>(job.call.size);
      job.meter.traffic.sent += volume;
      job.meter.traffic.received += volume;
    }
  }
  finish_average(job);
}

namespace {

// Decode own contribution (unless none), then MPI's allreduce of float32.
double predict_dense(const ModelInput& in) {
  const LocalTerms l = local_terms(in);
  return (in.codec_none ? 0.0 : l.encode + l.decode_one) + t_allreduce(in, 4 * in.n, in.n) +
         l.average;
}

bool always(const ModelInput&) { return true; }

// A bandwidth-optimal allreduce of float32.
double bytes_dense(const ModelInput& in) { return 2 * (in.ranks - 1.0) / in.ranks * 4 * in.n; }

}  // namespace

extern const AlgorithmRow kDenseRow = {
    .id = Algorithm::dense,
    .name = "dense",
    .description =
        "MPI_Allreduce of float32: each rank's decoded contribution (or x + e, "
        "uncompressed), summed by MPI",
    .sparse_only = false,
    .candidate = always,
    .predict = predict_dense,
    .bytes = bytes_dense,
    .run = run_dense,
    .run_device = run_dense_device,
};

}  // namespace gcomp::detail
