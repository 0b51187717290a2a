// The interface through which gcomp_core hands device tensors to the CUDA backend (gcomp_cuda
// implements it; a device TensorView carries a pointer to it, so the core never links CUDA).
// Arguments are checked by the core first (sizes, nulls, one memory, one stream); the backend
// checks capacity and payloads as the CPU codecs do and throws the same gcomp::Error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "adam_kernel.hpp"
#include "codec_impl.hpp"

namespace gcomp::detail {

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // As CodecImpl::encode, with x, e_old, e_new and out in device memory, ordered on `stream`.
  virtual std::size_t encode(const CodecImpl& codec, const float* x, const float* e_old,
                             float* e_new, std::size_t n, std::uint64_t seed, std::byte* out,
                             std::size_t cap, void* stream) const = 0;
  // acc[0..n) += alpha * decode(payload[0..bytes)), both in device memory, ordered on `stream`.
  virtual void decode_add(const std::byte* payload, std::size_t bytes, float* acc,
                          std::size_t n, float alpha, void* stream) const = 0;

  // Memory, for error-feedback residuals and the collectives' staging. Failures throw Error(cuda).
  virtual void* alloc(std::size_t bytes) const = 0;  // device memory (nullptr for 0 bytes)
  virtual void free(void* p) const noexcept = 0;
  // Copies between host and device memory (either way, or device to device) after the work
  // already on `stream`, and returns when the copy is done.
  virtual void copy(void* dst, const void* src, std::size_t bytes, void* stream) const = 0;
  // p[0..n) = 0, and p[0..n) *= a, on `stream` (queued, not waited for).
  virtual void zero(float* p, std::size_t n, void* stream) const = 0;
  virtual void scale(float* p, std::size_t n, float a, void* stream) const = 0;
  virtual void sync(void* stream) const = 0;  // returns when the work on `stream` is done
  // Page-locked host memory, which copies can overlap device work with.
  virtual void* alloc_host(std::size_t bytes) const = 0;
  virtual void free_host(void* p) const noexcept = 0;
  // Starts a copy that runs after the work already on `stream`, on a side stream, and returns at
  // once (pinned host memory on the host side); wait_copies(stream) returns when every copy
  // started for `stream` is done.
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, void* stream) const = 0;
  virtual void wait_copies(void* stream) const = 0;
  // Throws the CPU's Error(nonfinite) for the first NaN/Inf of x (or of x + e when e is given),
  // as check_finite does; returns when the check is done.
  virtual void check_finite(const float* x, const float* e, std::size_t n, void* stream) const = 0;

  // ---- PowerSGD's arithmetic (compressors/low_rank.hpp) on device memory, queued on `stream` ----
  // out[0..n) = a + b in float32 (x + e, as the CPU forms it; out may be a or b).
  virtual void add(const float* a, const float* b, float* out, std::size_t n,
                   void* stream) const = 0;
  // p = m q and q = m^T p (row-major; m rows x cols, p rows x r, q cols x r), as lr_multiply
  // and lr_multiply_t. These are what a rank contributes to an allreduce, not what ranks must
  // agree on, so the CUDA backend's (cuBLAS) may sum in another order than the CPU's: within
  // the bound stated in cuda/low_rank.cu.
  virtual void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q,
                           std::size_t r, float* p, void* stream) const = 0;
  virtual void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                             std::size_t r, float* q, void* stream) const = 0;
  // As lr_reconstruct (a rows x r, b cols x r, from the allreduced factors) and bit for bit the
  // same: every rank's out must be the same whichever memory it computes in.
  virtual void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                              std::size_t r, double out_scale, float* out, double share_scale,
                              const float* m, float* e, void* stream) const = 0;

  // ---- Adam's element-wise steps (gcomp/adam.hpp, compressors/adam_kernel.hpp) ----
  // The call k over n elements of a's device arrays, queued on `stream`, bit for bit what
  // adam_host(k, a, n) computes on host memory.
  virtual void adam(const AdamKernel& k, const AdamArrays& a, std::size_t n,
                    void* stream) const = 0;
};

}  // namespace gcomp::detail
