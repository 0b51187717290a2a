// Packing sparse indices as gaps on the device (compressors/index_pack.hpp's format, the bytes
// pack_indices writes): a warp per block of 128 indices finds its width (block_width_kernel), a
// scan of the blocks' bytes places them, and a warp per block writes its bytes (pack_kernel).
// Shared by the sparse codecs (sparse.cu) and top-k per chunk (topk_chunked.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "index_pack.hpp"

namespace gcomp::cuda::detail {

constexpr std::size_t kBlock = gcomp::detail::kIndexBlock;

// A warp per block of 128 indices (kBlock): lane l holds gaps l, l + 32, l + 64 and l + 96.
static_assert(kBlock == 4 * 32, "a block's gaps are four per lane");

// The gap before entry j: idx[j] - idx[j - 1] - 1, and idx[0] for the first.
template <class Index>
__device__ __forceinline__ unsigned long long gap_at(const Index* __restrict__ idx, std::size_t j) {
  const unsigned long long prev_plus_one =
      j == 0 ? 0ull : static_cast<unsigned long long>(idx[j - 1]) + 1;
  return static_cast<unsigned long long>(idx[j]) - prev_plus_one;
}

// Per block: its width (the bit width of its largest gap) and its bytes.
template <class Index>
__global__ void block_width_kernel(const Index* __restrict__ idx, std::size_t nnz,
                                   unsigned char* __restrict__ widths,
                                   unsigned long long* __restrict__ bytes) {
  const std::size_t blocks = (nnz + kBlock - 1) / kBlock;
  const unsigned lane = threadIdx.x & 31u;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  for (std::size_t b = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
       b < blocks; b += warps) {
    const std::size_t first = b * kBlock;
    const std::size_t end = first + kBlock < nnz ? first + kBlock : nnz;
    unsigned long long any = 0;
#pragma unroll
    for (unsigned q = 0; q < 4; ++q) {
      const std::size_t j = first + lane + 32 * q;
      if (j < end) any |= gap_at(idx, j);
    }
    for (int o = 16; o >= 1; o /= 2) any |= __shfl_xor_sync(0xffffffffu, any, o);
    if (lane == 0) {
      const unsigned w = any == 0 ? 0u : 64u - static_cast<unsigned>(__clzll(any));
      widths[b] = static_cast<unsigned char>(w);
      bytes[b] = 1 + ((end - first) * w + 7) / 8;
    }
  }
}

// Per block: its width byte at its offset, then its gaps at w bits each, least significant
// first (gap j in bits [j w, j w + w)); each block owns its bytes. A warp per block: the gaps
// into shared memory, then each lane builds whole bytes from the gaps they overlap.
template <class Index>
__global__ void __launch_bounds__(kThreads)
    pack_kernel(const Index* __restrict__ idx, std::size_t nnz,
                const unsigned char* __restrict__ widths,
                const unsigned long long* __restrict__ offsets, unsigned char* __restrict__ out) {
  __shared__ unsigned long long gaps[kThreads / 32][kBlock];
  const std::size_t blocks = (nnz + kBlock - 1) / kBlock;
  const unsigned lane = threadIdx.x & 31u;
  unsigned long long* mine = gaps[threadIdx.x / 32];
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  for (std::size_t b = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
       b < blocks; b += warps) {
    const std::size_t first = b * kBlock;
    const unsigned count = static_cast<unsigned>(first + kBlock < nnz ? kBlock : nnz - first);
    const unsigned w = widths[b];
#pragma unroll
    for (unsigned q = 0; q < 4; ++q) {
      const unsigned j = lane + 32 * q;
      if (j < count) mine[j] = gap_at(idx, first + j);
    }
    __syncwarp();
    unsigned char* p = out + offsets[b];
    if (lane == 0) p[0] = static_cast<unsigned char>(w);
    const unsigned nbytes = (count * w + 7) / 8;
    for (unsigned byte = lane; byte < nbytes; byte += 32) {
      const unsigned bit = 8 * byte;
      unsigned j = bit / w;
      unsigned long long val = mine[j] >> (bit - j * w);
      unsigned got = w - (bit - j * w);  // bits of val that are gap j's
      while (got < 8 && ++j < count) {
        val |= mine[j] << got;
        got += w;
      }
      p[1 + byte] = static_cast<unsigned char>(val);
    }
    __syncwarp();  // the gaps are the next block's
  }
}

}  // namespace gcomp::cuda::detail
