// A probe of kernel shapes on 256M normal floats, for choosing between them (scripts/gpu-check
// does not run it; build and run by hand on a GPU):
//   nvcc -O3 -std=c++20 -arch=native -o cuda_probe bench/cuda_probe.cu && ./cuda_probe
// Each line: a variant and its median time over 9 launches. Three questions:
//   * statistics of 4096-element blocks, one half-warp per block, lane j summing j, j + 16, ...
//     in order (TernGrad's sum, sum of squares and max): how many loads per lane per batch, and
//     the same with 512-element runs (QSGD's buckets) for reference;
//   * a 2048-bin histogram of |v|'s top 11 bits in shared memory: warp-aggregated counts
//     (labeled_partition) against plain shared atomics;
//   * appending the indices of the elements in one bin: one global atomic per group of lanes
//     against a block's buffer in shared memory with one global atomic per block.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                     \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

namespace cg = cooperative_groups;

__device__ std::uint32_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

__global__ void fill(float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x; i < n;
       i += (std::size_t)gridDim.x * blockDim.x) {
    const float u1 = (mix(2 * i) + 1.0f) * 0x1p-32f;
    const float u2 = mix(2 * i + 1) * 0x1p-32f;
    x[i] = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}

template <int B, int RUN>
__global__ void stats(const float* __restrict__ x, std::size_t n, double* s1, double* s2,
                      std::uint32_t* mxo) {
  const unsigned j = threadIdx.x & 15u;
  const std::size_t runs = n / RUN;
  for (std::size_t w = (blockIdx.x * (std::size_t)blockDim.x + threadIdx.x) / 32; 2 * w < runs;
       w += (std::size_t)gridDim.x * blockDim.x / 32) {
    const std::size_t r = 2 * w + ((threadIdx.x & 31u) >> 4);
    const std::size_t start = r * RUN;
    double a1 = 0, a2 = 0;
    std::uint32_t mx = 0;
    for (int it0 = 0; it0 < RUN / 16; it0 += B) {
      float xs[B];
#pragma unroll
      for (int u = 0; u < B; ++u) xs[u] = x[start + 16 * (it0 + u) + j];
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const float v = xs[u];
        a1 = a1 + (double)v;
        a2 = a2 + (double)v * (double)v;
        const std::uint32_t b = __float_as_uint(v) & 0x7fffffffu;
        mx = b > mx ? b : mx;
      }
    }
    for (int s = 8; s >= 1; s /= 2) {
      a1 = a1 + __shfl_down_sync(0xffffffffu, a1, s, 16);
      a2 = a2 + __shfl_down_sync(0xffffffffu, a2, s, 16);
      const std::uint32_t o = __shfl_down_sync(0xffffffffu, mx, s, 16);
      mx = o > mx ? o : mx;
    }
    if (j == 0) {
      s1[r] = a1;
      s2[r] = a2;
      mxo[r] = mx;
    }
  }
}

constexpr int kU = 4;

template <int Mode>  // 0: labeled_partition, 1: plain shared atomics
__global__ void hist(const float* __restrict__ x, std::size_t n, unsigned long long* h) {
  __shared__ unsigned c[2048];
  for (int b = threadIdx.x; b < 2048; b += blockDim.x) c[b] = 0;
  __syncthreads();
  const std::size_t stride = (std::size_t)gridDim.x * blockDim.x;
  for (std::size_t i0 = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x; i0 < n;
       i0 += kU * stride) {
    std::uint32_t k[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (i0 + u * stride < n) k[u] = (__float_as_uint(x[i0 + u * stride]) & 0x7fffffffu) >> 21;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (i0 + u * stride >= n) continue;
      if (Mode == 0) {
        const cg::coalesced_group a = cg::coalesced_threads();
        const cg::coalesced_group p = cg::labeled_partition(a, k[u]);
        if (p.thread_rank() == 0) atomicAdd(&c[k[u]], p.size());
      } else {
        atomicAdd(&c[k[u]], 1u);
      }
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 2048; b += blockDim.x)
    if (c[b]) atomicAdd(&h[b], (unsigned long long)c[b]);
}

template <int Mode>  // 0: global atomic per coalesced group, 1: block buffer
__global__ void append(const float* __restrict__ x, std::size_t n, std::uint32_t lo,
                       std::uint32_t hi, std::uint32_t* out, unsigned long long* count) {
  constexpr int kBuf = 2048;
  __shared__ std::uint32_t buf[kBuf];
  __shared__ unsigned used;
  __shared__ unsigned long long base;
  if (Mode == 1 && threadIdx.x == 0) used = 0;
  if (Mode == 1) __syncthreads();
  const std::size_t stride = (std::size_t)gridDim.x * blockDim.x;
  for (std::size_t i0 = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x; i0 - threadIdx.x < n;
       i0 += kU * stride) {
    std::uint32_t k[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      k[u] = i0 + u * stride < n ? __float_as_uint(x[i0 + u * stride]) & 0x7fffffffu : 0u;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool m = i0 + u * stride < n && k[u] >= lo && k[u] < hi;
      if (Mode == 0) {
        if (m) {
          const cg::coalesced_group a = cg::coalesced_threads();
          unsigned long long b = 0;
          if (a.thread_rank() == 0) b = atomicAdd(count, (unsigned long long)a.size());
          b = a.shfl(b, 0) + a.thread_rank();
          out[b] = (std::uint32_t)(i0 + u * stride);
        }
      } else {
        const unsigned ballot = __ballot_sync(0xffffffffu, m);
        unsigned slot = 0;
        if ((threadIdx.x & 31u) == 0 && ballot) slot = atomicAdd(&used, __popc(ballot));
        slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(ballot & ((1u << (threadIdx.x & 31u)) - 1));
        if (m) buf[slot] = (std::uint32_t)(i0 + u * stride);
      }
    }
    if (Mode == 1) {
      __syncthreads();
      const unsigned u = used;
      const bool last = i0 - threadIdx.x + kU * stride >= n;
      if (u > kBuf - kU * blockDim.x || last) {
        if (threadIdx.x == 0) base = u ? atomicAdd(count, (unsigned long long)u) : 0;
        __syncthreads();
        for (unsigned t = threadIdx.x; t < u; t += blockDim.x) out[base + t] = buf[t];
        __syncthreads();
        if (threadIdx.x == 0) used = 0;
      }
      __syncthreads();
    }
  }
}

template <class F>
float time_ms(F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  f();  // warm
  for (int r = 0; r < 9; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  const std::size_t n = std::size_t{1} << 28;
  float* x;
  double *s1, *s2;
  std::uint32_t *mx, *out;
  unsigned long long *h, *count;
  CK(cudaMalloc(&x, n * 4));
  CK(cudaMalloc(&s1, n / 512 * 8));
  CK(cudaMalloc(&s2, n / 512 * 8));
  CK(cudaMalloc(&mx, n / 512 * 4));
  CK(cudaMalloc(&out, n / 8 * 4));
  CK(cudaMalloc(&h, 2048 * 8));
  CK(cudaMalloc(&count, 8));
  float* y;
  CK(cudaMalloc(&y, n * 4));
  fill<<<4096, 256>>>(x, n);
  CK(cudaDeviceSynchronize());
  std::printf("copy 1 GiB: %.3f ms\n",
              time_ms([&] { CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice)); }));
  const unsigned g4096 = (unsigned)std::min<std::size_t>(65535, n / 4096 * 16 / 256);
  const unsigned g512 = (unsigned)std::min<std::size_t>(65535, n / 512 * 16 / 256);
  std::printf("stats run 4096 batch 8: %.3f ms\n",
              time_ms([&] { stats<8, 4096><<<g4096, 256>>>(x, n, s1, s2, mx); }));
  std::printf("stats run 4096 batch 16: %.3f ms\n",
              time_ms([&] { stats<16, 4096><<<g4096, 256>>>(x, n, s1, s2, mx); }));
  std::printf("stats run 4096 batch 32: %.3f ms\n",
              time_ms([&] { stats<32, 4096><<<g4096, 256>>>(x, n, s1, s2, mx); }));
  std::printf("stats run 4096 batch 64: %.3f ms\n",
              time_ms([&] { stats<64, 4096><<<g4096, 256>>>(x, n, s1, s2, mx); }));
  std::printf("stats run 512 batch 8: %.3f ms\n",
              time_ms([&] { stats<8, 512><<<g512, 256>>>(x, n, s1, s2, mx); }));
  std::printf("stats run 512 batch 32: %.3f ms\n",
              time_ms([&] { stats<32, 512><<<g512, 256>>>(x, n, s1, s2, mx); }));
  const unsigned gr = (unsigned)std::min<std::size_t>(65535, n / (256 * kU));
  for (unsigned grid : {gr, 132u * 8}) {
    std::printf("hist labeled grid %u: %.3f ms\n", grid, time_ms([&] {
                  CK(cudaMemsetAsync(h, 0, 2048 * 8));
                  hist<0><<<grid, 256>>>(x, n, h);
                }));
    std::printf("hist plain grid %u: %.3f ms\n", grid, time_ms([&] {
                  CK(cudaMemsetAsync(h, 0, 2048 * 8));
                  hist<1><<<grid, 256>>>(x, n, h);
                }));
  }
  // The bin of |v| in [2.5, 2.75): about 0.7% of a normal tensor.
  const std::uint32_t lo = 0x40200000u, hi = 0x40300000u;
  for (unsigned grid : {gr, 132u * 8}) {
    unsigned long long c0 = 0, c1 = 0;
    std::printf("append global grid %u: %.3f ms\n", grid, time_ms([&] {
                  CK(cudaMemsetAsync(count, 0, 8));
                  append<0><<<grid, 256>>>(x, n, lo, hi, out, count);
                }));
    CK(cudaMemcpy(&c0, count, 8, cudaMemcpyDeviceToHost));
    std::printf("append block grid %u: %.3f ms\n", grid, time_ms([&] {
                  CK(cudaMemsetAsync(count, 0, 8));
                  append<1><<<grid, 256>>>(x, n, lo, hi, out, count);
                }));
    CK(cudaMemcpy(&c1, count, 8, cudaMemcpyDeviceToHost));
    std::printf("  appended %llu and %llu\n", c0, c1);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
