// compressed_reduce_scatter: compress, reduce-scatter, re-compress, allgather (CGX, DeepSpeed's
// 1-bit Adam, Bagua's ByteGrad). The tensor is cut into P chunks, chunk c = [c n / P,
// (c+1) n / P). Each rank encodes every chunk (with its error feedback) and sends chunk c to
// rank c (all-to-all); owner c adds the P payloads in rank order in float32, averages if asked,
// re-encodes the reduced chunk with its own error-feedback memory (ErrorFeedback::secondary),
// and every owner's payload goes to every rank (allgatherv), which decodes them into its output.
// The result is D(C(sum_r D(C(x_r)))): unbiased when the codec is.
//
// If an owner's re-encode fails (the sum overflowed float32), it sends an empty payload; every
// rank sees the empty slot in the allgather and throws, nobody waits.
//
// Schedule: 1 all-to-all and 1 allgatherv; each rank sends about (P-1)/P * B in each, B being the
// encoded size of the whole tensor (n * bits / 8): 2 (P-1)/P * B in all, like a ring allreduce's
// 2 (P-1)/P * 4n, independent of P.
#include <algorithm>

#include "algorithm_table.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

void crs_owner_step(Job& job, const std::vector<std::vector<std::byte>>& from, std::uint64_t len,
                    std::vector<std::byte>& mine, std::vector<float>& owner_next) {
  const auto p = static_cast<std::uint64_t>(job.size);
  double start = now();
  std::vector<float>& acc = scratch_vector<float, 106>();
  acc.assign(len, 0.0f);
  for (std::uint64_t r = 0; r < p; ++r) decode_add(from[r], acc, 1.0f);
  if (job.average && p > 1) {
    const float inv = 1.0f / static_cast<float>(p);
    for (float& v : acc) v *= inv;
  }
  job.decode_seconds += now() - start;
  start = now();
  mine.resize(job.codec->max_bytes(len));
  try {
    if (job.ef) {
      std::vector<float>& memory = job.ef->secondary();
      if (memory.size() != len) memory.assign(len, 0.0f);  // first use, or the layout changed
      owner_next.resize(len);
      mine.resize(job.codec->encode_ef(acc, memory, owner_next, job.owner_seed, mine));
    } else {
      mine.resize(job.codec->encode(acc, job.owner_seed, mine));
    }
  } catch (const Error&) {
    mine.clear();  // the failure marker
  }
  job.encode_seconds += now() - start;
}

void crs_exchange(Job& job, const std::vector<std::uint64_t>& bound,
                  const std::vector<std::vector<std::byte>>& to, Gathered& all,
                  std::vector<float>& owner_next) {
  // 2. Chunk c to its owner.
  auto& from = scratch_vector<std::vector<std::byte>, 105>();
  alltoallv_bytes(job.comm, to, from, job.traffic);
  // 3. The owner sums its chunk, then re-encodes it.
  const auto me = static_cast<std::uint64_t>(job.rank);
  std::vector<std::byte>& mine = scratch_vector<std::byte, 107>();
  crs_owner_step(job, from, bound[me + 1] - bound[me], mine, owner_next);
  // 4. Every owner's chunk to every rank; an empty one marks an owner's failure.
  allgatherv_bytes(job.comm, mine, all, job.traffic);
  for (int c = 0; c < job.size; ++c) {
    if (all.sizes[static_cast<std::size_t>(c)] == 0) {
      throw Error(Status::nonfinite,
                  "compressed_reduce_scatter: the sum of chunk " + std::to_string(c) +
                      " on rank " + std::to_string(c) + " is not finite (float32 overflow)");
    }
  }
}

static void run_compressed_reduce_scatter(Job& job) {
  const std::uint64_t n = job.out.size();
  const auto p = static_cast<std::uint64_t>(job.size);
  const std::vector<std::uint64_t> bound = even_bounds(n, static_cast<std::uint64_t>(job.size));
  const auto chunk_of = [&](std::span<const float> v, std::uint64_t c) {
    return v.subspan(bound[c], bound[c + 1] - bound[c]);
  };

  // 1. Encode every chunk; each gets its own seed, so chunks do not share random draws.
  double start = now();
  auto& to = scratch_vector<std::vector<std::byte>, 104>();
  to.resize(p);
  for (std::uint64_t c = 0; c < p; ++c) {
    const std::span<const float> x = chunk_of(job.in, c);
    to[c].resize(job.codec->max_bytes(x.size()));
    const std::uint64_t seed = derive_seed(job.seed, c, 0, 0);
    std::size_t bytes;
    if (job.ef) {
      bytes = job.codec->encode_ef(x, chunk_of(job.ef->residual(), c),
                                   job.ef_next.subspan(bound[c], x.size()), seed, to[c]);
    } else {
      bytes = job.codec->encode(x, seed, to[c]);
    }
    to[c].resize(bytes);
  }
  job.encode_seconds += now() - start;

  thread_local Gathered all;
  // The owner's next error-feedback memory; swapped with the current one below, so that it
  // holds last call's memory afterwards, of the right size: no allocation (and no page faults
  // on fresh memory, 8 ms for 8M floats) from call to call.
  thread_local std::vector<float> owner_next;
  crs_exchange(job, bound, to, all, owner_next);
  // 5. Decode all chunks.
  start = now();
  for (std::uint64_t c = 0; c < p; ++c) {
    std::span<float> dst = job.out.subspan(bound[c], bound[c + 1] - bound[c]);
    std::fill(dst.begin(), dst.end(), 0.0f);
    decode_add(all.of(static_cast<int>(c)), dst, 1.0f);
  }
  job.decode_seconds += now() - start;
  if (job.ef) job.ef->secondary().swap(owner_next);
}


namespace {

// Chunks all-to-all, owners decode P chunks and re-encode one, allgather of the re-encoded
// chunks, everyone decodes n elements. On a sparse codec (explicit only: recompressing a sparse
// sum changes the result) the decodes are per entry.
double predict_compressed_reduce_scatter(const ModelInput& in) {
  const LocalTerms l = local_terms(in);
  const double n = in.n, p = in.ranks, b = in.payload_bytes;
  const auto& c = in.compute;
  if (!in.sparse) {
    return l.encode + t_alltoallv(in, b) + n * c.decode + n * c.encode / p +
           (in.error_feedback ? n / p * c.reduce : 0.0) + t_allgatherv(in, b / p) +
           n * c.decode + l.write_out;
  }
  // The owner sums its chunk densely (n / P zeroed, the P payloads' entries added) and
  // re-encodes it: a codec pass over n / P, and with error feedback its own residual's.
  const double owner = n / p * c.reduce + p * l.decode_one + n / p * c.encode +
                       (in.error_feedback ? n / p * c.reduce : 0.0);
  return l.encode + t_alltoallv(in, b) + owner + t_allgatherv(in, b / p) + l.decode_one * p +
         l.write_out;
}

// The chunks out, the owners' chunks to every rank, with their sizes.
double bytes_compressed_reduce_scatter(const ModelInput& in) {
  const double p = in.ranks;
  return 2 * (p - 1) / p * in.payload_bytes + 16 * (p - 1);
}

}  // namespace

extern const AlgorithmRow kCompressedReduceScatterRow = {
    .id = Algorithm::compressed_reduce_scatter,
    .name = "compressed_reduce_scatter",
    .description = "chunks encoded and exchanged all-to-all, each owner sums and re-encodes its "
                   "chunk, the owners' payloads gathered",
    .sparse_only = false,
    .candidate = for_dense_codecs,
    .predict = predict_compressed_reduce_scatter,
    .bytes = bytes_compressed_reduce_scatter,
    .run = run_compressed_reduce_scatter,
    .run_device = run_crs_device,
};

}  // namespace gcomp::detail
