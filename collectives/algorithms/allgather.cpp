// allgather: the generic path for any codec. Every rank's whole-tensor payload goes to every
// rank (MPI_Iallgatherv, preceded by an allgather of the payload sizes), and each rank adds all
// of them, in rank order, into its output, so all ranks hold the same bits. With majority_vote
// and the sign codec, the result is (sum of the ranks' scales) * sign(sum of their signs)
// instead (signSGD with majority vote, Bernstein et al. 2018).
//
// Schedule: MPICH's allgatherv (recursive doubling or ring): log2(P) or P-1 rounds; each rank
// sends its payload B_r to the P-1 others, (P-1) * B_r bytes, and receives sum_{s != r} B_s.
#include <algorithm>
#include <cmath>

#include "algorithm_table.hpp"
#include "codec_impl.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

namespace {
struct AllgatherBuffers {
  Gathered all;            // every rank's payload
  std::vector<float> one;  // majority vote: one rank's decoded signs
  std::vector<int> votes;  // and the votes so far
};
}  // namespace

void allgather_payloads(Job& job) {
  const std::span<const std::byte> payload = encode_whole(job);
  auto& [all, one, votes] = job.ws.get<AllgatherBuffers>();
  job.call.net->allgatherv_bytes(payload, all, job.meter.traffic);
  {
    const auto timed = job.meter.decoding();
    const std::span<float> out = job.buf.out;
    const std::size_t n = out.size();
    std::fill(out.begin(), out.end(), 0.0f);
    if (job.call.majority_vote && job.call.codec->kind() == CodecKind::sign) {
      one.resize(n);
      votes.assign(n, 0);
      double scales = 0;
      for (int r = 0; r < job.call.size; ++r) {
        std::fill(one.begin(), one.end(), 0.0f);
        r == job.call.rank ? decode_add_own(all.of(r), one, 1.0f)
                           : decode_add(all.of(r), one, 1.0f);
        float scale = 0;
        for (std::size_t i = 0; i < n; ++i) {
          votes[i] += one[i] > 0 ? 1 : (one[i] < 0 ? -1 : 0);
          scale = std::max(scale, std::fabs(one[i]));
        }
        scales += scale;
      }
      const auto total = static_cast<float>(scales);
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = votes[i] > 0 ? total : (votes[i] < 0 ? -total : 0.0f);
      }
    } else {
      for (int r = 0; r < job.call.size; ++r) {
        // This rank's own payload was checked when it was made.
        r == job.call.rank ? decode_add_own(all.of(r), out, 1.0f)
                           : decode_add(all.of(r), out, 1.0f);
      }
    }
  }
  finish_average(job);
}

static void run_allgather(Job& job) { allgather_payloads(job); }

// Every payload to every rank, all decoded.
double predict_payload_allgather(const ModelInput& in) {
  const LocalTerms l = local_terms(in);
  return l.encode + t_allgatherv(in, in.payload_bytes) + l.write_out + in.ranks * l.decode_one +
         l.average;
}

double bytes_payload_allgather(const ModelInput& in) {
  return (in.ranks - 1.0) * (in.payload_bytes + 8);  // each payload and its size to every rank
}

extern const AlgorithmRow kAllgatherRow = {
    .id = Algorithm::allgather,
    .name = "allgather",
    .description = "allgatherv of any codec's payloads, each rank decoding all of them in rank "
                   "order",
    .sparse_only = false,
    .majority_vote = true,
    .candidate = for_dense_codecs,
    .predict = predict_payload_allgather,
    .bytes = bytes_payload_allgather,
    .run = run_allgather,
    .run_device = run_allgather_device,
};

}  // namespace gcomp::detail
