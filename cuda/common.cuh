// Shared pieces of the CUDA codecs: error checks, the per-stream workspace, the report a kernel
// leaves for the host, little-endian byte stores at any alignment, the canonical 16-lane double
// sums of compressors/reduce.hpp and Philox on the device with the CPU's stream layout
// (compressors/philox.hpp).
//
// Bytes match the CPU because every floating-point operation that reaches the wire is the same
// IEEE operation in the same order: the library is compiled with --fmad=false (no fused
// multiply-add contraction, as the CPU's -ffp-contract=off), divisions and square roots are the
// correctly rounded ones (no fast math), and sums follow the canonical order.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <Random123/philox.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp::cuda::detail {

// Throws Error(cuda) with the runtime's name and text of e.
void check(cudaError_t e, const char* what);
#define GCOMP_CUDA(call) ::gcomp::cuda::detail::check((call), #call)
// After a launch: a bad configuration shows here, a fault at the next synchronization.
#define GCOMP_LAUNCHED(name) ::gcomp::cuda::detail::check(cudaGetLastError(), name)

inline constexpr int kThreads = 256;
inline constexpr std::size_t kReduceBlock = 4096;  // compressors/reduce.hpp
inline constexpr std::uint32_t kInfBits = 0x7f800000u;

// Blocks for a grid-stride loop over `work` items of `per_block` each, capped so that a launch
// stays a few waves deep.
inline unsigned grid_for(std::uint64_t work, std::uint64_t per_block = kThreads) {
  const std::uint64_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 65535 ? 65535 : b));
}

// What the kernels of one call report: codes the host turns into gcomp::Error after the stream
// synchronizes. `first` holds the lowest offending index (atomicMin), `count` a device-computed
// size (threshold's selected entries).
enum ReportCode : unsigned { kOk = 0, kNonfinite = 1, kBadPayload = 2 };
struct Report {
  unsigned code;
  unsigned what;             // bit c set: the codec's payload check c failed
  unsigned long long first;   // the lowest index where the codec's (first) indexed check failed
  unsigned long long second;  // the same for a second indexed check (sparse values)
  unsigned long long count;
};

// The scratch memory of one stream: device bytes that grow to the largest request and are then
// reused (so a steady state allocates nothing), a device Report and its pinned host mirror.
// Calls on one stream are serialized by the lock (they are ordered on the stream anyway).
class Workspace {
 public:
  explicit Workspace(cudaStream_t s) : stream_(s) {}
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  std::mutex& mutex() { return mu_; }
  cudaStream_t stream() const { return stream_; }
  // Device memory of at least `bytes` (256-byte aligned), valid until the next reserve().
  void* reserve(std::size_t bytes);
  Report* report() { return report_dev_; }
  // A second stream for copies that overlap the work on stream() (created on first use), and an
  // event to order them after it.
  cudaStream_t side_stream();
  cudaEvent_t side_event();
  // Clears the device report (on the stream).
  void reset_report();
  // Copies the report back and waits for the stream; returns the host copy.
  const Report& finish();

 private:
  void ensure_report();
  std::mutex mu_;
  cudaStream_t stream_;
  void* dev_ = nullptr;
  std::size_t bytes_ = 0;
  Report* report_dev_ = nullptr;
  Report* report_host_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

// The workspace of `stream` on the current device (created on first use, kept for the process).
Workspace& workspace_for(cudaStream_t stream);

// GCOMP_CUDA_STAGES=1 (read once): each encode and decode_add that marks its stages times them
// with CUDA events on its stream and prints one line to stderr when it ends,
//   gcomp-cuda-stages <op>/<codec> n=<n> <stage>=<ms> ...
// where a stage's time runs from the previous mark (or the call's start) to its own, idle gaps
// (the host waiting on a copy back) included. Off, a mark costs one test of a flag.
// scripts/gpu-check runs the benchmark with it once and tabulates the medians.
class Stages {
 public:
  Stages(cudaStream_t s, const char* op, const char* codec, std::size_t n);
  ~Stages();
  Stages(const Stages&) = delete;
  Stages& operator=(const Stages&) = delete;
  void mark(const char* stage);

 private:
  static constexpr int kMax = 24;
  cudaStream_t stream_;
  const char* op_;
  const char* codec_;
  std::size_t n_;
  int count_ = 0;
  cudaEvent_t events_[kMax + 1] = {};
  const char* names_[kMax] = {};
};

// Carves aligned pieces out of one workspace: first sized with a null base (two-phase, as CUB),
// then placed.
class Carve {
 public:
  explicit Carve(void* base = nullptr) : base_(static_cast<char*>(base)) {}
  template <class T>
  T* take(std::size_t count) {
    off_ = (off_ + 255) & ~std::size_t{255};
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += count * sizeof(T);
    return p;
  }
  std::size_t bytes() const { return off_ + 256; }

 private:
  char* base_;
  std::size_t off_ = 0;
};

// Up to 96 bytes written to device memory by a kernel whose argument carries them (so nothing on
// the host has to outlive the launch): the payload header (at most kMaxHeaderBytes, 76).
struct SmallBytes {
  unsigned char b[96];
  unsigned len;
};
void write_small(unsigned char* dst, const SmallBytes& bytes, cudaStream_t s);
SmallBytes small_bytes(const std::byte* p, std::size_t len);

// The first i where x[i] (or x[i] + e[i], when e is given) is NaN or Inf; n when there is none.
// Synchronizes the stream.
std::size_t first_nonfinite(const float* x, const float* e, std::size_t n, Workspace& ws);

// Finds the first non-finite x[i] (or, when none and e is given, the first non-finite x[i] + e[i])
// and throws the CPU's Error(nonfinite) message for it. Synchronizes the stream.
[[noreturn]] void throw_nonfinite(const float* x, const float* e, std::size_t n, Workspace& ws);

// ---- device helpers ----

__device__ __forceinline__ void store_u16(unsigned char* p, std::uint32_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
__device__ __forceinline__ void store_u32(unsigned char* p, std::uint32_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
  p[2] = static_cast<unsigned char>(v >> 16);
  p[3] = static_cast<unsigned char>(v >> 24);
}
__device__ __forceinline__ std::uint32_t load_u16(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8);
}
__device__ __forceinline__ std::uint32_t load_u32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
__device__ __forceinline__ bool nonfinite(float v) {
  return (__float_as_uint(v) & kInfBits) == kInfBits;
}
// A failed payload check `check` (at `index`, for the codec's one indexed check).
__device__ __forceinline__ void report_bad(Report* r, unsigned check,
                                           unsigned long long index = ~0ull) {
  atomicMin(&r->first, index);  // ~0 (the reset value) for the checks without an index
  atomicOr(&r->what, 1u << check);
  atomicExch(&r->code, static_cast<unsigned>(kBadPayload));
}
__device__ __forceinline__ void report_bad_second(Report* r, unsigned check,
                                                  unsigned long long index) {
  atomicMin(&r->second, index);
  atomicOr(&r->what, 1u << check);
  atomicExch(&r->code, static_cast<unsigned>(kBadPayload));
}
__device__ __forceinline__ void report_nonfinite(Report* r) {
  atomicExch(&r->code, static_cast<unsigned>(kNonfinite));
}

// float -> fp16 bits: clamp to the largest finite half, then the hardware's round to nearest
// even, which is what compressors/half.hpp's float_to_half computes (values between 65504 and
// 65520 round down to 65504 anyway).
__device__ __forceinline__ std::uint32_t to_half(float v) {
  const float c = fminf(fmaxf(v, -65504.0f), 65504.0f);
  return __half_as_ushort(__float2half_rn(c));
}
__device__ __forceinline__ float from_half(std::uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// Folds the 16 lanes of a half-warp as fold16 (lane[j] += lane[j + w], w = 8, 4, 2, 1); the
// result is in the group's lane 0. All 32 lanes of the warp must call it.
__device__ __forceinline__ double fold16(double v) {
  for (int w = 8; w >= 1; w /= 2) v = v + __shfl_down_sync(0xffffffffu, v, w, 16);
  return v;
}

// Words 0..3 of Philox block `block` of the stream (seed, codec): S[32g + 8w + j] is word w of
// block 8g + j (compressors/philox.hpp).
__device__ __forceinline__ uint4 philox_block(std::uint32_t k0, std::uint32_t k1,
                                              std::uint32_t codec, std::uint64_t block) {
  r123::Philox4x32 rng;
  const r123::Philox4x32::ctr_type ctr = {
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), codec, 0u}};
  const r123::Philox4x32::key_type key = {{k0, k1}};
  const r123::Philox4x32::ctr_type r = rng(ctr, key);
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// One level of the pairwise fold: b[j] = a[2j] + a[2j + 1] for j < count / 2, the odd last one
// carried. a and b are the two halves of a ping-pong and never overlap, so a thread's loads of
// several j can be in flight at once.
__device__ __forceinline__ void tree_level(const double* __restrict__ a, double* __restrict__ b,
                                           std::size_t count) {
  const std::size_t half = count / 2;
#pragma unroll 4
  for (std::size_t j = threadIdx.x; j < half; j += blockDim.x) b[j] = a[2 * j] + a[2 * j + 1];
  if ((count & 1) && threadIdx.x == 0) b[half] = a[count - 1];
}

// The pairwise fold of compressors/reduce.hpp's tree_sum over s1[0..count) (and, when s2 is
// given, over s2[0..count) at the same time, one barrier per level for both) by one block, with
// t1 and t2 (count elements each) as the other halves of the ping-pongs; the totals land in *out1
// and *out2 (0 for count 0). Every thread of the block must call it; s and t are overwritten.
__device__ __forceinline__ void tree_sum_block2(double* s1, double* t1, double* s2, double* t2,
                                                std::size_t count, double* out1, double* out2) {
  double* a1 = s1;
  double* b1 = t1;
  double* a2 = s2;
  double* b2 = t2;
  while (count > 1) {
    tree_level(a1, b1, count);
    if (a2) tree_level(a2, b2, count);
    __syncthreads();
    count = count / 2 + (count & 1);
    double* tmp = a1;
    a1 = b1;
    b1 = tmp;
    tmp = a2;
    a2 = b2;
    b2 = tmp;
  }
  if (threadIdx.x == 0) {
    *out1 = count == 0 ? 0.0 : a1[0];
    if (a2) *out2 = count == 0 ? 0.0 : a2[0];
  }
  __syncthreads();
}

__device__ __forceinline__ void tree_sum_block(double* s, double* t, std::size_t count,
                                               double* out) {
  tree_sum_block2(s, t, nullptr, nullptr, count, out, nullptr);
}

// Runs of elements (4096-element blocks, QSGD buckets) owned by half-warps: warp w owns runs 2w
// and 2w + 1 (lanes 0-15 and 16-31), over a warp-stride loop that is uniform within each warp.
struct HalfWarpRun {
  std::size_t index;  // which run
  bool have;          // index < runs (the last warp may own only one)
  std::size_t start;  // its first element
  std::size_t len;    // its length (the last one may be short; 0 without one)
};
__device__ __forceinline__ std::size_t first_warp() {
  return (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) / 32;
}
__device__ __forceinline__ std::size_t warp_count() {
  return static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
}
__device__ __forceinline__ HalfWarpRun half_warp_run(std::size_t w, std::size_t runs,
                                                     std::size_t run_len, std::size_t n) {
  HalfWarpRun r;
  r.index = 2 * w + ((threadIdx.x & 31u) >> 4);
  r.have = r.index < runs;
  r.start = r.index * run_len;
  r.len = r.have ? (n - r.start < run_len ? n - r.start : run_len) : 0;
  return r;
}

// Grid-stride loop over [0, n).
#define GCOMP_GRID_LOOP(i, n)                                                              \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// The streaming kernels take kUnroll elements per thread per round, a grid stride apart: first
// every load of the round, then the work and the stores. One load in flight per thread leaves
// HBM idle (on an H200, the first GPU run measured such kernels at about 60% of a copy's
// bandwidth); by Little's law a GPU needs tens of KiB in flight per multiprocessor. Each element
// gets the same operations as before, so the bytes do not change.
inline constexpr int kUnroll = 4;
// Rounds over [0, n): element k of a round (k < kUnroll) is i0 + k * stride, when below n.
#define GCOMP_GRID_ROUNDS(i0, stride, n)                                                    \
  for (std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x,              \
                   i0 = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;   \
       i0 < (n); i0 += kUnroll * stride)
// Blocks for such a loop over n elements.
inline unsigned grid_for_rounds(std::uint64_t n) { return grid_for(n, kThreads * kUnroll); }

// The current device's multiprocessors (asked once per device).
unsigned multiprocessors();
// A grid that stays resident (`per_sm` blocks of kThreads per multiprocessor, at most `blocks`):
// for kernels that keep per-block state worth amortizing (a shared histogram flushed once per
// block) or prefetch their next piece while working on this one.
inline unsigned resident_grid(unsigned blocks, unsigned per_sm) {
  const unsigned cap = per_sm * multiprocessors();
  return blocks < cap ? blocks : cap;
}
// The same with as many blocks of kThreads per multiprocessor as `kernel` can keep resident.
template <class Kernel>
unsigned resident_grid(Kernel kernel, unsigned blocks) {
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return resident_grid(blocks, per_sm > 0 ? static_cast<unsigned>(per_sm) : 1u);
}

}  // namespace gcomp::cuda::detail
