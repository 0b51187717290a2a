// Steps shared by the algorithms: the whole-tensor encode (with error feedback) and averaging.
#include "algorithms.hpp"
#include "codec_impl.hpp"
#include "sparse_vector.hpp"

namespace gcomp::detail {

std::span<const std::byte> encode_whole(Job& job) {
  if (const auto* done = std::get_if<prepared::Encoded>(&job.input)) return done->payload;
  if (job.buf.dev) return device_encode_whole(job);
  const auto timed = job.meter.encoding();
  const Codec& codec = *job.call.codec;
  std::vector<std::byte>& payload = job.ws.payload;
  payload.resize(codec.max_bytes(job.buf.in.size()));
  std::size_t bytes;
  if (job.buf.ef) {
    bytes = codec.encode_ef(job.buf.in, job.buf.ef->residual(), job.buf.ef_next, job.call.seed,
                            payload);
  } else {
    bytes = codec.encode(job.buf.in, job.call.seed, payload);
  }
  payload.resize(bytes);
  job.input = prepared::Encoded{payload};
  return payload;
}

bool half_values(const Job& job) {
  return job.call.codec != nullptr && job.call.codec->properties().value_bytes == 2;
}

void payload_vector(Job& job, SparseVector& out) {
  const auto timed = job.meter.decoding();
  // The codec's reader fills a SparseEntries: `out` lends it its buffers for the read, so each
  // vector keeps its own from call to call (swapping with a buffer of the workspace would pass a
  // large one from vector to vector, each of them then growing another).
  SparseEntries e;
  e.indices.swap(out.idx);
  e.values.swap(out.val);
  try {
    sparse_entries_own(payload_of(job), e);
  } catch (...) {
    out.idx.swap(e.indices);
    out.val.swap(e.values);
    throw;
  }
  out.n = e.elements;
  out.full = false;
  out.idx.swap(e.indices);
  out.val.swap(e.values);
  if (goes_full(out.idx.size(), out.n)) {
    SparseVector none;
    none.n = out.n;
    merge_into(out, none);  // switches to the full representation
  }
}

std::vector<std::uint64_t> even_bounds(std::uint64_t n, std::uint64_t p) {
  std::vector<std::uint64_t> b(p + 1);
  for (std::uint64_t j = 0; j <= p; ++j) b[j] = chunk_bound(n, j, p);
  return b;
}

namespace {
// reduce_own_region's buffers (the workspace's).
struct RegionExchangeBuffers {
  std::vector<std::vector<std::byte>> to, from;  // the all-to-all's messages, by rank
  SparseVector piece;                            // one rank's part, sliced or received
};
}  // namespace

void reduce_own_region(Job& job, std::span<const std::uint64_t> bound, SparseVector& mine,
                       SparseVector& acc, const std::function<void(const SparseVector&)>& each) {
  encode_whole(job);
  payload_vector(job, mine);
  auto& [to, from, piece] = job.ws.get<RegionExchangeBuffers>();
  to.resize(bound.size() - 1);
  {
    const auto timed = job.meter.decoding();
    for (std::size_t j = 0; j + 1 < bound.size(); ++j) {
      slice(mine, bound[j], bound[j + 1], piece);
      serialize(piece, to[j], half_values(job));
    }
  }
  job.call.net->alltoallv_bytes(to, from, job.meter.traffic);
  const auto timed = job.meter.decoding();
  const auto me = static_cast<std::size_t>(job.call.rank);
  const std::uint64_t len = bound[me + 1] - bound[me];
  for (std::size_t r = 0; r < from.size(); ++r) {
    deserialize(from[r], len, r == 0 ? acc : piece);
    if (each) each(r == 0 ? acc : piece);
    if (r > 0) merge_into(acc, piece);
  }
}

float average_scale(const Job& job) {
  return job.call.average && job.call.size > 1 ? 1.0f / static_cast<float>(job.call.size) : 1.0f;
}

void finish_average(Job& job) {
  const float inv = average_scale(job);
  if (inv == 1.0f) return;
  for (float& v : job.buf.out) v *= inv;
}

}  // namespace gcomp::detail
