// A stand-in device backend for tests on machines without a GPU: "device" memory is host memory
// that the stand-in hands out (or is told about: adopt), and it runs the CPU codecs, so that what
// gcomp does with device tensors (encode on the device, payloads through the host, decode on the
// device, residuals in device memory, streams handed down) runs anywhere. It counts what it does:
// the bytes copied between its memory and the host, the encodes, decodes and products, and the
// streams it was given. Used by tests/mpi/device_test.cpp and the stand-in build of the Python
// module (python/standin_device.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <vector>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "gcomp/codec.hpp"
#include "low_rank.hpp"

namespace gcomp::test {

class StandinDevice final : public detail::DeviceBackend {
 public:
  // What it did, for the tests to check. Read with no call running.
  mutable std::size_t copied = 0;  // bytes that crossed between "device" and host memory
  mutable int encodes = 0;
  mutable int decodes = 0;
  mutable int products = 0;
  mutable int reconstructions = 0;
  mutable std::array<int, 5> adams{};    // Adam's element-wise calls, by detail::AdamOp
  mutable std::set<void*> adam_streams;  // the streams they were queued on
  mutable int syncs = 0;
  mutable std::set<void*> streams;  // every stream a call was queued on

  std::size_t encode(const detail::CodecImpl& codec, const float* x, const float* e_old,
                     float* e_new, std::size_t n, std::uint64_t seed, std::byte* out,
                     std::size_t cap, void* stream) const override {
    seen(stream);
    ++encodes;
    return codec.encode(x, e_old, e_new, n, seed, out, cap);
  }
  void decode_add(const std::byte* payload, std::size_t bytes, float* acc, std::size_t n,
                  float alpha, void* stream) const override {
    seen(stream);
    ++decodes;
    gcomp::decode_add(std::span<const std::byte>(payload, bytes), std::span<float>(acc, n), alpha);
  }
  void* alloc(std::size_t bytes) const override {
    if (!bytes) return nullptr;
    void* p = ::operator new(bytes);
    adopt(p, bytes, current_device);
    return p;
  }
  void free(void* p) const noexcept override {
    forget(p);
    ::operator delete(p);
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) const override {
    seen(stream);
    if (bytes) std::memmove(dst, src, bytes);
    if (on_device(dst) != on_device(src)) copied += bytes;
  }
  // The "device" memory: what alloc gave and what the tests adopt (their device arrays), so
  // that copies within it (allreduce_buckets' fusing) are told apart from those that cross; each
  // block on a device number, as CUDA memory is (alloc: current_device's).
  void adopt(const void* p, std::size_t bytes, int device = 0) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (p && bytes) blocks_[static_cast<const std::byte*>(p)] = {bytes, device};
  }
  void forget(const void* p) const noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    blocks_.erase(static_cast<const std::byte*>(p));
  }
  // The device of the block p points into; -1 for host memory.
  int device_of(const void* p) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto* b = static_cast<const std::byte*>(p);
    auto it = blocks_.upper_bound(b);
    if (it == blocks_.begin()) return -1;
    --it;
    return b < it->first + it->second.bytes ? it->second.device : -1;
  }
  bool on_device(const void* p) const { return device_of(p) >= 0; }
  mutable int current_device = 0;  // where alloc puts its blocks
  void zero(float* p, std::size_t n, void* stream) const override {
    seen(stream);
    std::fill(p, p + n, 0.0f);
  }
  void scale(float* p, std::size_t n, float a, void* stream) const override {
    seen(stream);
    for (std::size_t i = 0; i < n; ++i) p[i] *= a;
  }
  void sync(void* stream) const override {
    seen(stream);
    ++syncs;
  }
  void* alloc_host(std::size_t bytes) const override {
    return bytes ? ::operator new(bytes) : nullptr;
  }
  void free_host(void* p) const noexcept override { ::operator delete(p); }
  void copy_async(void* dst, const void* src, std::size_t bytes, void* s) const override {
    copy(dst, src, bytes, s);
  }
  void wait_copies(void* stream) const override { seen(stream); }
  void check_finite(const float* x, const float* e, std::size_t n, void* stream) const override {
    seen(stream);
    gcomp::check_finite(std::span<const float>(x, n),
                        e ? std::span<const float>(e, n) : std::span<const float>());
  }
  // PowerSGD's arithmetic: the CPU's kernels on the "device" memory.
  void add(const float* a, const float* b, float* out, std::size_t n, void* stream) const override {
    seen(stream);
    for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  void lr_multiply(const float* m, std::size_t rows, std::size_t cols, const float* q,
                   std::size_t r, float* p, void* stream) const override {
    seen(stream);
    ++products;
    detail::lr_multiply(m, rows, cols, q, r, p);
  }
  void lr_multiply_t(const float* m, std::size_t rows, std::size_t cols, const float* p,
                     std::size_t r, float* q, void* stream) const override {
    seen(stream);
    ++products;
    std::vector<double> acc(cols * r);
    detail::lr_multiply_t(m, rows, cols, p, r, q, acc.data());
  }
  void lr_reconstruct(const float* a, const float* b, std::size_t rows, std::size_t cols,
                      std::size_t r, double out_scale, float* out, double share_scale,
                      const float* m, float* e, void* stream) const override {
    seen(stream);
    ++reconstructions;
    std::vector<double> work(cols * r);
    detail::lr_reconstruct(a, b, rows, cols, r, out_scale, out, share_scale, m, e, work.data());
  }
  // Adam's steps: the CPU's loop, on arrays that must all be in the stand-in's memory (a host
  // array handed down as a device one is an error here, where CUDA would fault).
  void adam(const detail::AdamKernel& k, const detail::AdamArrays& a, std::size_t n,
            void* stream) const override {
    seen(stream);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      adam_streams.insert(stream);
    }
    ++adams.at(static_cast<std::size_t>(k.op));
    for (const void* p :
         {static_cast<const void*>(a.param), static_cast<const void*>(a.param_out),
          static_cast<const void*>(a.grad), static_cast<const void*>(a.exp_avg),
          static_cast<const void*>(a.exp_avg_out), static_cast<const void*>(a.exp_avg_sq),
          static_cast<const void*>(a.exp_avg_sq_out), static_cast<const void*>(a.anchor),
          static_cast<const void*>(a.anchor_out), static_cast<const void*>(a.out)}) {
      if (p && !on_device(p)) {
        throw Error(Status::invalid_argument, "stand-in adam: an array is not device memory");
      }
    }
    detail::adam_host(k, a, n);
  }

 private:
  void seen(void* stream) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    streams.insert(stream);
  }
  mutable std::mutex mutex_;
  struct Block {
    std::size_t bytes;
    int device;
  };
  mutable std::map<const std::byte*, Block> blocks_;
};

}  // namespace gcomp::test
