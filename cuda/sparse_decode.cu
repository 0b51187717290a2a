// The sparse codecs' decode_add on the device (top-k, random-k, threshold: compressors/sparse.cpp's
// layout). A version 2 payload's packed indices are unpacked and checked on the host (the CPU's
// code and messages) and handed to the version 1 kernels, which validate every entry (index in
// range, strictly increasing; value finite) and add it.
#include <algorithm>
#include <string>
#include <vector>

#include "bytes.hpp"
#include "codecs.cuh"
#include "index_pack.hpp"
#include "half_bits.hpp"

namespace gcomp::cuda::detail {

namespace {

template <bool Wide>
__global__ void sparse_validate_kernel(const unsigned char* __restrict__ ip,
                                       const unsigned char* __restrict__ vp, std::size_t nnz,
                                       std::uint64_t n, bool fp16, Report* r) {
  GCOMP_GRID_LOOP(j, nnz) {
    const std::uint64_t i = Wide ? (static_cast<std::uint64_t>(load_u32(ip + 8 * j)) |
                                    (static_cast<std::uint64_t>(load_u32(ip + 8 * j + 4)) << 32))
                                 : load_u32(ip + 4 * j);
    bool bad = i >= n;
    if (j > 0) {
      const std::uint64_t prev =
          Wide ? (static_cast<std::uint64_t>(load_u32(ip + 8 * (j - 1))) |
                  (static_cast<std::uint64_t>(load_u32(ip + 8 * (j - 1) + 4)) << 32))
               : load_u32(ip + 4 * (j - 1));
      bad |= i <= prev;
    }
    if (bad) report_bad(r, 0, j);
    const bool finite = fp16 ? (load_u16(vp + 2 * j) & 0x7c00u) != 0x7c00u
                             : (load_u32(vp + 4 * j) & kInfBits) != kInfBits;
    if (!finite) report_bad_second(r, 1, j);
  }
}

template <bool Wide>
__global__ void sparse_decode_kernel(const unsigned char* __restrict__ ip,
                                     const unsigned char* __restrict__ vp, std::size_t nnz,
                                     bool fp16, float alpha, float* __restrict__ acc,
                                     const Report* r) {
  if (r->code != 0) return;
  GCOMP_GRID_LOOP(j, nnz) {
    const std::uint64_t i = Wide ? (static_cast<std::uint64_t>(load_u32(ip + 8 * j)) |
                                    (static_cast<std::uint64_t>(load_u32(ip + 8 * j + 4)) << 32))
                                 : load_u32(ip + 4 * j);
    const float v = fp16 ? from_half(load_u16(vp + 2 * j)) : __uint_as_float(load_u32(vp + 4 * j));
    acc[i] += alpha * v;  // indices are distinct (validated strictly increasing)
  }
}

// The first pass's grid: resident when it counts a histogram (each block flushes its shared
// histogram once; 65535 blocks flushing theirs cost more than the counting), else one element
// per thread and round.

}  // namespace

void decode_sparse(const DecodeCall& d) {
  // As on the CPU (validate_decode_add_sparse): past the layout, a wrong accumulator size is
  // reported before anything in the sections.
  if (!d.apply) check_size(d);
  const std::uint64_t n = d.p.n;
  const bool fp16 = static_cast<std::uint8_t>(d.p.params[0]) == 1;
  const std::size_t nnz = gcomp::detail::load_le<std::uint64_t>(d.p.params + 8);
  const unsigned char* ip = d.sections[0];
  bool wide = static_cast<std::uint8_t>(d.p.params[1]) == 8;
  // Version 2: the packed indices come to the host, are unpacked and checked by the CPU's code
  // (its messages), and go back to the device as version 1's 4- or 8-byte indices.
  std::vector<unsigned char> flat;
  Stages stages(d.ws->stream(), "decode_add", codec_name(d.p.kind), n);
  if (d.p.version >= 2) {
    std::vector<std::byte> packed(static_cast<std::size_t>(d.p.sections[0].size));
    if (!packed.empty()) {
      GCOMP_CUDA(cudaMemcpyAsync(packed.data(), ip, packed.size(), cudaMemcpyDeviceToHost,
                                 d.ws->stream()));
      GCOMP_CUDA(cudaStreamSynchronize(d.ws->stream()));
    }
    stages.mark("to_host");
    std::vector<std::uint64_t> idx(nnz);
    try {
      gcomp::detail::unpack_indices(packed, nnz, n, idx.data());
    } catch (const Error& e) {
      gcomp::detail::bad_payload(e.what());
    }
    wide = gcomp::detail::index_width(n) == 8;
    const std::size_t ib = wide ? 8 : 4;
    flat.resize(nnz * ib);
    for (std::size_t j = 0; j < nnz; ++j) {
      for (std::size_t b = 0; b < ib; ++b) {
        flat[j * ib + b] = static_cast<unsigned char>(idx[j] >> (8 * b));
      }
    }
    stages.mark("unpack_on_host");
    auto* dev = static_cast<unsigned char*>(d.ws->reserve(std::max<std::size_t>(1, flat.size())));
    if (!flat.empty()) {
      GCOMP_CUDA(cudaMemcpyAsync(dev, flat.data(), flat.size(), cudaMemcpyHostToDevice,
                                 d.ws->stream()));
    }
    stages.mark("to_device");
    ip = dev;
  }
  const unsigned char* vp = d.sections[1];
  const cudaStream_t s = d.ws->stream();
  d.ws->reset_report();
  if (nnz > 0) {
    if (wide) {
      sparse_validate_kernel<true><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, n, fp16,
                                                                      d.ws->report());
      if (d.apply) {
        sparse_decode_kernel<true><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, fp16, d.alpha,
                                                                      d.acc, d.ws->report());
      }
    } else {
      sparse_validate_kernel<false><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, n, fp16,
                                                                       d.ws->report());
      if (d.apply) {
        sparse_decode_kernel<false><<<grid_for(nnz), kThreads, 0, s>>>(ip, vp, nnz, fp16,
                                                                       d.alpha, d.acc,
                                                                       d.ws->report());
      }
    }
    GCOMP_LAUNCHED("sparse decode_add");
    stages.mark("validate_add");
  }
  const Report* r = decode_failure(d, &stages);
  if (!r) return;
  if (r->what & 1u) {
    // The first bad entry, named as the CPU names it.
    const std::size_t j = r->first;
    const std::size_t ib = wide ? 8 : 4;
    std::uint64_t pair[2] = {0, 0};  // prev, i
    unsigned char buf[16] = {};
    const std::size_t from = j > 0 ? j - 1 : 0;
    GCOMP_CUDA(cudaMemcpy(buf, ip + from * ib, (j - from + 1) * ib, cudaMemcpyDeviceToHost));
    for (std::size_t q = 0; q <= j - from; ++q) {
      std::uint64_t val = 0;
      for (std::size_t b = 0; b < ib; ++b) val |= static_cast<std::uint64_t>(buf[q * ib + b]) << (8 * b);
      pair[j > 0 ? q : 1] = val;
    }
    if (pair[1] >= n) {
      gcomp::detail::bad_payload("index " + std::to_string(pair[1]) + " (entry " +
                                 std::to_string(j) + ") is out of range for " +
                                 std::to_string(n) + " elements");
    }
    gcomp::detail::bad_payload("indices not strictly increasing at entry " + std::to_string(j) +
                               " (" + std::to_string(pair[0]) + " then " +
                               std::to_string(pair[1]) + ")");
  }
  gcomp::detail::bad_payload("value of entry " + std::to_string(r->second) + " is NaN or Inf");
}

}  // namespace gcomp::cuda::detail
