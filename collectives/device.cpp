// Device tensors through the collectives. Debian's MPICH is not CUDA-aware, so MPI sees host
// memory only; what crosses between the GPU and the host is the payloads, not the tensor:
//
//   * the codec encodes on the device (with the device residual) into device staging, and only
//     the payload is copied to the host for MPI: once, where the algorithm needs it (encode_whole
//     does this for device tensors; sparse codecs encode before the agreement as on the host);
//   * allgather, sparse_allgather: the gathered payloads go to the device in one copy and are
//     decode_add'ed there into the output, in rank order (the same bits on every rank);
//   * compressed_reduce_scatter: each chunk is encoded on the device and its payload copied to
//     the host; the owner's sum and re-encode of its chunk (n / P elements) run on the host with
//     the CPU codec (the same bytes as the GPU's) and ErrorFeedback::secondary; the gathered
//     chunk payloads are decoded on the device;
//   * sparse_recursive_doubling, sparse_split and the majority vote merge on the host (their
//     merges are steps between messages) and the dense result goes to the device; dense sums the
//     decoded contribution with MPI_Allreduce on the host and copies the sum back.
//
// Results equal the host path's bit for bit: the codecs write the same bytes on both sides and
// every sum runs in the same order.
#include <algorithm>

#include "algorithm_table.hpp"
#include "device_backend.hpp"
#include "sparse_vector.hpp"

namespace gcomp::detail {

void* DeviceStage::get(int slot, std::size_t need) {
  if (need <= bytes[slot] && buf[slot]) return buf[slot];
  dev->free(buf[slot]);
  buf[slot] = nullptr;
  bytes[slot] = 0;
  const std::size_t grown = std::max<std::size_t>(need + need / 4, 256);
  buf[slot] = dev->alloc(grown);
  bytes[slot] = grown;
  return buf[slot];
}

void* DeviceStage::get_host(std::size_t need) {
  if (need <= host_bytes && host) return host;
  dev->free_host(host);
  host = nullptr;
  host_bytes = 0;
  const std::size_t grown = std::max<std::size_t>(need + need / 4, 256);
  host = dev->alloc_host(grown);
  host_bytes = grown;
  return host;
}

DeviceStage::~DeviceStage() {
  if (!dev) return;
  for (void* p : buf) dev->free(p);
  dev->free_host(host);
}

namespace {

TensorView<const float> dview(const Job& job, const float* p, std::size_t n) {
  return TensorView<const float>::device(p, n, job.stream, job.dev);
}
TensorView<float> dview(const Job& job, float* p, std::size_t n) {
  return TensorView<float>::device(p, n, job.stream, job.dev);
}

// Encodes x[offset, offset + len) (with the residual slices when the job has error feedback) on
// the device into staged[0, cap) (device memory); returns the payload's size.
std::size_t encode_on_device(Job& job, std::uint64_t offset, std::uint64_t len,
                             std::uint64_t seed, std::byte* staged, std::size_t cap) {
  const auto out = TensorView<std::byte>::device(staged, cap, job.stream, job.dev);
  if (job.d_e_old) {
    return job.codec->encode_ef(dview(job, job.d_in + offset, len),
                                dview(job, job.d_e_old + offset, len),
                                dview(job, job.d_e_new + offset, len), seed, out);
  }
  return job.codec->encode(dview(job, job.d_in + offset, len), seed, out);
}

// Adds every rank's (or chunk's) gathered payload on the device: part r goes into
// out[at(r), at(r) + len(r)), which is zeroed first.
template <class At, class Len>
void decode_gathered_on_device(Job& job, const Gathered& all, At at, Len len) {
  const double start = now();
  auto* staged = static_cast<std::byte*>(job.stage->get(1, all.bytes.size()));
  job.dev->copy(staged, all.bytes.data(), all.bytes.size(), job.stream);
  for (int r = 0; r < job.size; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const auto payload = TensorView<const std::byte>::device(
        staged + all.offsets[ur], static_cast<std::size_t>(all.sizes[ur]), job.stream, job.dev);
    const auto dst = dview(job, job.d_out + at(r), len(r));
    decode_add(payload, dst, 1.0f);
  }
  job.decode_seconds += now() - start;
}

// The algorithms that merge on the host: their dense result goes to the device.
void run_on_host(Job& job, void (*run)(Job&)) {
  run(job);
  const double start = now();
  job.dev->copy(job.d_out, job.out.data(), 4 * job.out.size(), job.stream);
  job.decode_seconds += now() - start;
}

void zero_out(Job& job) { job.dev->zero(job.d_out, job.out.size(), job.stream); }

void average_on_device(Job& job) {
  if (job.average && job.size > 1) {
    job.dev->scale(job.d_out, job.out.size(), 1.0f / static_cast<float>(job.size), job.stream);
  }
}

}  // namespace

void run_allgather_device(Job& job) {
  if (job.majority_vote) return run_on_host(job, algorithm_row(Algorithm::allgather).run);
  encode_whole(job);
  thread_local Gathered all;
  allgatherv_bytes(job.comm, job.payload, all, job.traffic);
  const std::size_t n = job.out.size();
  zero_out(job);
  decode_gathered_on_device(job, all, [](int) { return std::size_t{0}; },
                            [n](int) { return n; });
  average_on_device(job);
  job.dev->sync(job.stream);
}

void run_crs_device(Job& job) {
  const std::uint64_t n = job.out.size();
  const auto p = static_cast<std::uint64_t>(job.size);
  const std::vector<std::uint64_t> bound = even_bounds(n, static_cast<std::uint64_t>(job.size));
  // Each chunk's payload is copied to the host (pinned) on a side stream while the next chunk
  // encodes; then into the per-destination buffers for MPI.
  double start = now();
  auto& to = scratch_vector<std::vector<std::byte>, 104>();
  to.resize(p);
  std::vector<std::size_t> at(p + 1, 0);
  for (std::uint64_t c = 0; c < p; ++c) {
    at[c + 1] = at[c] + ((job.codec->max_bytes(bound[c + 1] - bound[c]) + 255) & ~std::size_t{255});
  }
  auto* staged = static_cast<std::byte*>(job.stage->get(0, at[p]));
  auto* pinned = static_cast<std::byte*>(job.stage->get_host(at[p]));
  std::vector<std::size_t> sizes(p);
  for (std::uint64_t c = 0; c < p; ++c) {
    sizes[c] = encode_on_device(job, bound[c], bound[c + 1] - bound[c],
                                derive_seed(job.seed, c, 0, 0), staged + at[c], at[c + 1] - at[c]);
    job.dev->copy_async(pinned + at[c], staged + at[c], sizes[c], job.stream);
  }
  job.dev->wait_copies(job.stream);
  for (std::uint64_t c = 0; c < p; ++c) to[c].assign(pinned + at[c], pinned + at[c] + sizes[c]);
  job.encode_seconds += now() - start;
  thread_local Gathered all;
  std::vector<float> owner_next;
  crs_exchange(job, bound, to, all, owner_next);
  zero_out(job);
  decode_gathered_on_device(
      job, all, [&](int c) { return static_cast<std::size_t>(bound[static_cast<std::size_t>(c)]); },
      [&](int c) {
        const auto uc = static_cast<std::size_t>(c);
        return static_cast<std::size_t>(bound[uc + 1] - bound[uc]);
      });
  job.dev->sync(job.stream);
  if (job.ef) job.ef->secondary().swap(owner_next);
}

void run_dense_device(Job& job) {
  const std::size_t n = job.out.size();
  std::span<float> host = job.out;  // host staging
  if (job.skip_codec || job.codec->kind() == CodecKind::none) {
    // Uncompressed: x + e goes as it is and the residual becomes zero.
    const double start = now();
    job.dev->copy(host.data(), job.d_in, 4 * n, job.stream);
    if (job.d_e_old) {
      std::vector<float>& e = scratch_vector<float, 121>();
      e.resize(n);
      job.dev->copy(e.data(), job.d_e_old, 4 * n, job.stream);
      for (std::size_t i = 0; i < n; ++i) host[i] += e[i];
      job.dev->zero(job.d_e_new, n, job.stream);
    }
    job.encode_seconds += now() - start;
    job.out_ready = true;  // run_dense reduces job.out in place
  }
  run_dense(job);  // with a codec: decodes this rank's payload (host) and sums that; averages
  job.dev->copy(job.d_out, host.data(), 4 * n, job.stream);
}

// The algorithms that merge on the host: their dense result goes to the device.

void device_encode_whole(Job& job) {
  const double start = now();
  const std::size_t cap = job.codec->max_bytes(job.out.size());
  auto* staged = static_cast<std::byte*>(job.stage->get(0, cap));
  const std::size_t bytes = encode_on_device(job, 0, job.out.size(), job.seed, staged, cap);
  job.payload.resize(bytes);
  job.dev->copy(job.payload.data(), staged, bytes, job.stream);
  job.have_payload = true;
  job.encode_seconds += now() - start;
}

void run_device(Job& job, Algorithm algorithm) {
  const AlgorithmRow& row = algorithm_row(algorithm);
  if (row.run_device) return row.run_device(job);
  run_on_host(job, row.run);
}

}  // namespace gcomp::detail
