// Steps shared by the algorithms: the whole-tensor encode (with error feedback) and averaging.
#include "algorithms.hpp"
#include "codec_impl.hpp"
#include "sparse_vector.hpp"

namespace gcomp::detail {

void encode_whole(Job& job) {
  if (job.have_payload) return;
  if (job.dev) return device_encode_whole(job);
  const double start = now();
  job.payload.resize(job.codec->max_bytes(job.in.size()));
  std::size_t bytes;
  if (job.ef) {
    bytes = job.codec->encode_ef(job.in, job.ef->residual(), job.ef_next, job.seed, job.payload);
  } else {
    bytes = job.codec->encode(job.in, job.seed, job.payload);
  }
  job.payload.resize(bytes);
  job.have_payload = true;
  job.encode_seconds += now() - start;
}

bool half_values(const Job& job) {
  return job.codec != nullptr && job.codec->impl().params().fp16_values;
}

void payload_stream(Job& job, SparseVector& out) {
  const double start = now();
  SparseEntries e;
  sparse_entries_own(job.payload, e);
  out.n = e.elements;
  out.full = false;
  out.idx = std::move(e.indices);
  out.val = std::move(e.values);
  if (goes_full(out.idx.size(), out.n)) {
    SparseVector none;
    none.n = out.n;
    merge_into(out, none);  // switches to the dense representation
  }
  job.decode_seconds += now() - start;
}

std::vector<std::uint64_t> even_bounds(std::uint64_t n, std::uint64_t p) {
  std::vector<std::uint64_t> b(p + 1);
  for (std::uint64_t j = 0; j <= p; ++j) b[j] = chunk_bound(n, j, p);
  return b;
}

void reduce_own_region(Job& job, std::span<const std::uint64_t> bound, SparseVector& mine, SparseVector& acc,
                       const std::function<void(const SparseVector&)>& each) {
  encode_whole(job);
  payload_stream(job, mine);
  double start = now();
  auto& to = scratch_vector<std::vector<std::byte>, 108>();
  auto& from = scratch_vector<std::vector<std::byte>, 109>();
  to.resize(bound.size() - 1);
  thread_local SparseVector piece;
  for (std::size_t j = 0; j + 1 < bound.size(); ++j) {
    slice(mine, bound[j], bound[j + 1], piece);
    serialize(piece, to[j], half_values(job));
  }
  job.decode_seconds += now() - start;
  alltoallv_bytes(job.comm, to, from, job.traffic);
  start = now();
  const auto me = static_cast<std::size_t>(job.rank);
  const std::uint64_t len = bound[me + 1] - bound[me];
  for (std::size_t r = 0; r < from.size(); ++r) {
    deserialize(from[r], len, r == 0 ? acc : piece);
    if (each) each(r == 0 ? acc : piece);
    if (r > 0) merge_into(acc, piece);
  }
  job.decode_seconds += now() - start;
}

float average_scale(const Job& job) {
  return job.average && job.size > 1 ? 1.0f / static_cast<float>(job.size) : 1.0f;
}

void finish_average(Job& job) {
  const float inv = average_scale(job);
  if (inv == 1.0f) return;
  for (float& v : job.out) v *= inv;
}

}  // namespace gcomp::detail
