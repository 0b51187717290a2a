// compressed_reduce_scatter: compress, reduce-scatter, re-compress, allgather (CGX, DeepSpeed's
// 1-bit Adam, Bagua's ByteGrad). The tensor is cut into P chunks, chunk c = [c n / P,
// (c+1) n / P). Each rank encodes every chunk (with its error feedback) and sends chunk c to
// rank c (all-to-all); owner c adds the P payloads in rank order in float32, averages if asked,
// re-encodes the reduced chunk with its own error-feedback memory (kept in the ErrorFeedback's
// slot, compressors/feedback_slot.hpp),
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
#include "feedback_slot.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

namespace {
// The workspace's buffers of this algorithm (host and device forms).
struct CrsBuffers {
  std::vector<std::vector<std::byte>> to, from;  // chunk c to and from rank c
  std::vector<float> acc;                        // the owner's sum of its chunk
  std::vector<std::byte> mine;                   // the owner's re-encoded chunk
  Gathered all;                                  // every owner's chunk
  std::vector<float> owner_next;  // the owner's next error-feedback memory (crs_commit)
};
}  // namespace

std::vector<std::vector<std::byte>>& crs_outgoing(Job& job) { return job.ws.get<CrsBuffers>().to; }

static void crs_owner_step(Job& job, const std::vector<std::vector<std::byte>>& from,
                           std::uint64_t len, std::vector<std::byte>& mine,
                           std::vector<float>& owner_next) {
  const auto p = static_cast<std::uint64_t>(job.call.size);
  const Codec& codec = *job.call.codec;
  std::vector<float>& acc = job.ws.get<CrsBuffers>().acc;
  {
    const auto timed = job.meter.decoding();
    acc.assign(len, 0.0f);
    for (std::uint64_t r = 0; r < p; ++r) decode_add(from[r], acc, 1.0f);
    if (job.call.average && p > 1) {
      const float inv = 1.0f / static_cast<float>(p);
      for (float& v : acc) v *= inv;
    }
  }
  const auto timed = job.meter.encoding();
  mine.resize(codec.max_bytes(len));
  try {
    if (job.buf.ef) {
      std::vector<float>& state = FeedbackSlot::of(*job.buf.ef);
      if (state.size() != len) state.assign(len, 0.0f);  // first use, or the layout changed
      owner_next.resize(len);
      mine.resize(codec.encode_ef(acc, state, owner_next, job.call.owner_seed, mine));
    } else {
      mine.resize(codec.encode(acc, job.call.owner_seed, mine));
    }
  } catch (const Error&) {
    mine.clear();  // the failure marker
  }
}

const Gathered& crs_exchange(Job& job, const std::vector<std::uint64_t>& bound) {
  CrsBuffers& b = job.ws.get<CrsBuffers>();
  // 2. Chunk c to its owner.
  job.call.net->alltoallv_bytes(b.to, b.from, job.meter.traffic);
  // 3. The owner sums its chunk, then re-encodes it.
  const auto me = static_cast<std::uint64_t>(job.call.rank);
  crs_owner_step(job, b.from, bound[me + 1] - bound[me], b.mine, b.owner_next);
  // 4. Every owner's chunk to every rank; an empty one marks an owner's failure.
  job.call.net->allgatherv_bytes(b.mine, b.all, job.meter.traffic);
  for (int c = 0; c < job.call.size; ++c) {
    if (b.all.sizes[static_cast<std::size_t>(c)] == 0) {
      throw Error(Status::nonfinite,
                  "compressed_reduce_scatter: the sum of chunk " + std::to_string(c) +
                      " on rank " + std::to_string(c) + " is not finite (float32 overflow)");
    }
  }
  return b.all;
}

void crs_commit(Job& job) {
  // Copied, not swapped: each memory keeps its own capacity, so that calls on tensors of
  // different sizes do not trade buffers and reallocate them.
  if (job.buf.ef) FeedbackSlot::of(*job.buf.ef) = job.ws.get<CrsBuffers>().owner_next;
}

static void run_compressed_reduce_scatter(Job& job) {
  const std::uint64_t n = job.buf.out.size();
  const auto p = static_cast<std::uint64_t>(job.call.size);
  const std::vector<std::uint64_t> bound = even_bounds(n, p);
  const auto chunk_of = [&](std::span<const float> v, std::uint64_t c) {
    return v.subspan(bound[c], bound[c + 1] - bound[c]);
  };

  // 1. Encode every chunk; each gets its own seed, so chunks do not share random draws.
  auto& to = crs_outgoing(job);
  to.resize(p);
  {
    const auto timed = job.meter.encoding();
    const Codec& codec = *job.call.codec;
    for (std::uint64_t c = 0; c < p; ++c) {
      const std::span<const float> x = chunk_of(job.buf.in, c);
      to[c].resize(codec.max_bytes(x.size()));
      const std::uint64_t seed = derive_seed(job.call.seed, c, 0, 0);
      std::size_t bytes;
      if (job.buf.ef) {
        bytes = codec.encode_ef(x, chunk_of(job.buf.ef->residual(), c),
                                job.buf.ef_next.subspan(bound[c], x.size()), seed, to[c]);
      } else {
        bytes = codec.encode(x, seed, to[c]);
      }
      to[c].resize(bytes);
    }
  }
  const Gathered& all = crs_exchange(job, bound);
  // 5. Decode all chunks.
  {
    const auto timed = job.meter.decoding();
    for (std::uint64_t c = 0; c < p; ++c) {
      std::span<float> dst = job.buf.out.subspan(bound[c], bound[c + 1] - bound[c]);
      std::fill(dst.begin(), dst.end(), 0.0f);
      decode_add(all.of(static_cast<int>(c)), dst, 1.0f);
    }
  }
  crs_commit(job);
}

// The owner-side memory of this rank's chunk [lo, hi) of a bucket, as the bucket's tensors'
// shares of it: each tensor's slot keeps the part of the chunk that falls in the tensor.
struct OwnerChunk {
  std::uint64_t lo, hi;
  explicit OwnerChunk(const BucketParts& parts)
      : lo(chunk_bound(parts.len, static_cast<std::uint64_t>(parts.rank),
                       static_cast<std::uint64_t>(parts.size))),
        hi(chunk_bound(parts.len, static_cast<std::uint64_t>(parts.rank) + 1,
                       static_cast<std::uint64_t>(parts.size))) {}
  // Tensor t's share: where it starts in the bucket and how many elements.
  std::pair<std::uint64_t, std::uint64_t> share(const BucketParts& parts, std::size_t t) const {
    const std::uint64_t a = std::max(parts.begin[t], lo),
                        z = std::min(parts.begin[t] + parts.n[t], hi);
    return {a, z > a ? z - a : 0};
  }
};

// Gathered from the tensors' shares: all there and of the right sizes, or it starts from zero.
static void join_owner_state(const BucketParts& parts, ErrorFeedback& bucket) {
  const OwnerChunk chunk(parts);
  std::vector<float>& owner = FeedbackSlot::of(bucket);
  owner.assign(chunk.hi - chunk.lo, 0.0f);
  for (std::size_t t = 0; t < parts.efs.size(); ++t) {
    const auto [at, n] = chunk.share(parts, t);
    if (n == 0 || !parts.efs[t]) continue;  // a tensor without memory contributes zeros
    const std::vector<float>& mine = FeedbackSlot::of(*parts.efs[t]);
    if (mine.size() != n) {
      owner.clear();  // sized (to zeros) by the algorithm on first use
      return;
    }
    std::copy(mine.begin(), mine.end(), owner.begin() + static_cast<std::ptrdiff_t>(at - chunk.lo));
  }
}

static void split_owner_state(const BucketParts& parts, const ErrorFeedback& bucket) {
  const OwnerChunk chunk(parts);
  const std::vector<float>& owner = FeedbackSlot::of(bucket);
  if (owner.size() != chunk.hi - chunk.lo) return;  // the bucket's call did not run this
  for (std::size_t t = 0; t < parts.efs.size(); ++t) {
    const auto [at, n] = chunk.share(parts, t);
    if (n == 0 || !parts.efs[t]) continue;
    const auto from = owner.begin() + static_cast<std::ptrdiff_t>(at - chunk.lo);
    FeedbackSlot::of(*parts.efs[t]).assign(from, from + static_cast<std::ptrdiff_t>(n));
  }
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
    .description =
        "chunks encoded and exchanged all-to-all, each owner sums and re-encodes its "
        "chunk, the owners' payloads gathered",
    .sparse_only = false,
    .checks_sum = true,
    .candidate = for_dense_codecs,
    .predict = predict_compressed_reduce_scatter,
    .bytes = bytes_compressed_reduce_scatter,
    .run = run_compressed_reduce_scatter,
    .run_device = run_crs_device,
    .join_state = join_owner_state,
    .split_state = split_owner_state,
};

}  // namespace gcomp::detail
