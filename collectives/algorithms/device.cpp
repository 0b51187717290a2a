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
//     the CPU codec (the same bytes as the GPU's) and the owner's memory in the ErrorFeedback's
//     slot; the gathered
//     chunk payloads are decoded on the device;
//   * sparse_recursive_doubling, sparse_split and the majority vote merge on the host (their
//     merges are steps between messages) and the dense result goes to the device; dense sums the
//     decoded contribution with MPI_Allreduce on the host and copies the sum back;
//   * low_rank (collectives/algorithms/low_rank.cpp, run_low_rank_device): M, the products and the
//     reconstruction on the device, the factors through the host.
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
  return TensorView<const float>::device(p, n, job.buf.stream, job.buf.dev);
}
TensorView<float> dview(const Job& job, float* p, std::size_t n) {
  return TensorView<float>::device(p, n, job.buf.stream, job.buf.dev);
}

// Encodes x[offset, offset + len) (with the residual slices when the job has error feedback) on
// the device into staged[0, cap) (device memory); returns the payload's size.
std::size_t encode_on_device(Job& job, std::uint64_t offset, std::uint64_t len, std::uint64_t seed,
                             std::byte* staged, std::size_t cap) {
  const auto out = TensorView<std::byte>::device(staged, cap, job.buf.stream, job.buf.dev);
  if (job.buf.d_e_old) {
    return job.call.codec->encode_ef(dview(job, job.buf.d_in + offset, len),
                                     dview(job, job.buf.d_e_old + offset, len),
                                     dview(job, job.buf.d_e_new + offset, len), seed, out);
  }
  return job.call.codec->encode(dview(job, job.buf.d_in + offset, len), seed, out);
}

// Adds every rank's (or chunk's) gathered payload on the device: part r goes into
// out[at(r), at(r) + len(r)), which is zeroed first.
template <class At, class Len>
void decode_gathered_on_device(Job& job, const Gathered& all, At at, Len len) {
  const auto timed = job.meter.decoding();
  auto* staged =
      static_cast<std::byte*>(job.buf.stage->get(DeviceStage::kGathered, all.bytes.size()));
  job.buf.dev->copy(staged, all.bytes.data(), all.bytes.size(), job.buf.stream);
  for (int r = 0; r < job.call.size; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const auto payload = TensorView<const std::byte>::device(
        staged + all.offsets[ur], static_cast<std::size_t>(all.sizes[ur]), job.buf.stream,
        job.buf.dev);
    const auto dst = dview(job, job.buf.d_out + at(r), len(r));
    decode_add(payload, dst, 1.0f);
  }
}

// The algorithms that merge on the host: their dense result goes to the device.
void run_on_host(Job& job, void (*run)(Job&)) {
  run(job);
  const auto timed = job.meter.decoding();
  job.buf.dev->copy(job.buf.d_out, job.buf.out.data(), 4 * job.buf.out.size(), job.buf.stream);
}

void zero_out(Job& job) { job.buf.dev->zero(job.buf.d_out, job.buf.out.size(), job.buf.stream); }

void average_on_device(Job& job) {
  if (job.call.average && job.call.size > 1) {
    job.buf.dev->scale(job.buf.d_out, job.buf.out.size(), 1.0f / static_cast<float>(job.call.size),
                       job.buf.stream);
  }
}

}  // namespace

namespace {
struct DeviceAllgatherBuffers {
  Gathered all;  // every rank's payload, on the host
};
}  // namespace

void run_allgather_device(Job& job) {
  if (job.call.majority_vote) return run_on_host(job, algorithm_row(Algorithm::allgather).run);
  const std::span<const std::byte> payload = encode_whole(job);
  Gathered& all = job.ws.get<DeviceAllgatherBuffers>().all;
  job.call.net->allgatherv_bytes(payload, all, job.meter.traffic);
  const std::size_t n = job.buf.out.size();
  zero_out(job);
  decode_gathered_on_device(
      job, all, [](int) { return std::size_t{0}; }, [n](int) { return n; });
  average_on_device(job);
  job.buf.dev->sync(job.buf.stream);
}

void run_crs_device(Job& job) {
  const std::uint64_t n = job.buf.out.size();
  const auto p = static_cast<std::uint64_t>(job.call.size);
  const std::vector<std::uint64_t> bound = even_bounds(n, p);
  // Each chunk's payload is copied to the host (pinned) on a side stream while the next chunk
  // encodes; then into the per-destination buffers for MPI.
  auto& to = crs_outgoing(job);
  to.resize(p);
  {
    const auto timed = job.meter.encoding();
    std::vector<std::size_t> at(p + 1, 0);
    for (std::uint64_t c = 0; c < p; ++c) {
      at[c + 1] =
          at[c] + ((job.call.codec->max_bytes(bound[c + 1] - bound[c]) + 255) & ~std::size_t{255});
    }
    auto* staged = static_cast<std::byte*>(job.buf.stage->get(DeviceStage::kPayload, at[p]));
    auto* pinned = static_cast<std::byte*>(job.buf.stage->get_host(at[p]));
    std::vector<std::size_t> sizes(p);
    for (std::uint64_t c = 0; c < p; ++c) {
      sizes[c] =
          encode_on_device(job, bound[c], bound[c + 1] - bound[c],
                           derive_seed(job.call.seed, c, 0, 0), staged + at[c], at[c + 1] - at[c]);
      job.buf.dev->copy_async(pinned + at[c], staged + at[c], sizes[c], job.buf.stream);
    }
    job.buf.dev->wait_copies(job.buf.stream);
    for (std::uint64_t c = 0; c < p; ++c) to[c].assign(pinned + at[c], pinned + at[c] + sizes[c]);
  }
  const Gathered& all = crs_exchange(job, bound);
  zero_out(job);
  decode_gathered_on_device(
      job, all, [&](int c) { return static_cast<std::size_t>(bound[static_cast<std::size_t>(c)]); },
      [&](int c) {
        const auto uc = static_cast<std::size_t>(c);
        return static_cast<std::size_t>(bound[uc + 1] - bound[uc]);
      });
  job.buf.dev->sync(job.buf.stream);
  crs_commit(job);
}

void device_input_to_host(Job& job, std::span<float> host) {
  const std::size_t n = host.size();
  job.buf.dev->copy(host.data(), job.buf.d_in, 4 * n, job.buf.stream);
  if (job.buf.d_e_old) {
    std::vector<float>& e = job.ws.residual;
    e.resize(n);
    job.buf.dev->copy(e.data(), job.buf.d_e_old, 4 * n, job.buf.stream);
    for (std::size_t i = 0; i < n; ++i) host[i] += e[i];
  }
}

void run_dense_device(Job& job) {
  const std::size_t n = job.buf.out.size();
  std::span<float> host = job.buf.out;  // host staging
  if (job.skip_codec || job.call.codec->kind() == CodecKind::none) {
    // Uncompressed: x + e goes as it is and the residual becomes zero.
    const auto timed = job.meter.encoding();
    device_input_to_host(job, host);
    if (job.buf.d_e_old) job.buf.dev->zero(job.buf.d_e_new, n, job.buf.stream);
    job.input = prepared::Staged{};  // run_dense reduces the staging in place
  }
  run_dense(job);  // with a codec: decodes this rank's payload (host) and sums that; averages
  job.buf.dev->copy(job.buf.d_out, host.data(), 4 * n, job.buf.stream);
}

// The algorithms that merge on the host: their dense result goes to the device.

std::span<const std::byte> device_encode_whole(Job& job) {
  const auto timed = job.meter.encoding();
  const std::size_t cap = job.call.codec->max_bytes(job.buf.out.size());
  auto* staged = static_cast<std::byte*>(job.buf.stage->get(DeviceStage::kPayload, cap));
  const std::size_t bytes =
      encode_on_device(job, 0, job.buf.out.size(), job.call.seed, staged, cap);
  std::vector<std::byte>& payload = job.ws.payload;
  payload.resize(bytes);
  job.buf.dev->copy(payload.data(), staged, bytes, job.buf.stream);
  job.input = prepared::Encoded{payload};
  return payload;
}

void run_device(Job& job, Algorithm algorithm) {
  const AlgorithmRow& row = algorithm_row(algorithm);
  if (row.run_device) return row.run_device(job);
  run_on_host(job, row.run);
}

}  // namespace gcomp::detail
