// gcomp's CUDA backend (library gcomp_cuda, built when nvcc is found): device views for the
// codecs, a small owning device buffer, and whether a usable GPU is there.
//
//   float* d_x = ...;  std::byte* d_out = ...;           // device memory (cudaMalloc)
//   gcomp::Codec codec("qsgd:bits=4");
//   std::size_t bytes = codec.encode(gcomp::cuda::view(d_x, n, stream), seed,
//                                    gcomp::cuda::view(d_out, codec.max_bytes(n), stream));
//   gcomp::decode_add(gcomp::cuda::view(d_payload, bytes, stream),
//                     gcomp::cuda::view(d_acc, n, stream));
//
// The bytes are those the CPU codec writes for the same input, spec and seed. Streams are
// cudaStream_t values passed as void* so that this header needs no CUDA include.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gcomp/codec.hpp"
#include "gcomp/tensor.hpp"

namespace gcomp::cuda {

struct DeviceStatus {
  int count = 0;     // CUDA devices this process can use
  std::string why;   // when count is 0: the CUDA runtime's reason (no driver, no device, ...)
  std::string name;  // device 0's name, and its compute capability as "major.minor"
  std::string capability;
};

// Asks the CUDA runtime; never throws.
DeviceStatus device_status();

// Runs a kernel built for this library's architectures on device 0 and checks what it wrote:
// n = 1000003 elements of out[i] = 2 i + 1. Returns "" on success, else what went wrong.
std::string smoke_test();

// Device views of CUDA memory on `stream` (a cudaStream_t; nullptr is the legacy default stream).
TensorView<float> view(float* data, std::size_t n, void* stream = nullptr);
TensorView<const float> view(const float* data, std::size_t n, void* stream = nullptr);
TensorView<std::byte> view(std::byte* data, std::size_t n, void* stream = nullptr);
TensorView<const std::byte> view(const std::byte* data, std::size_t n, void* stream = nullptr);

// Error-feedback memory of n zeros in device memory, for device tensors (Codec::encode_ef,
// Communicator::allreduce); its views are on `stream`.
ErrorFeedback error_feedback(std::size_t n, void* stream = nullptr);

// Raw device memory and copies; failures throw Error(cuda) with the runtime's reason.
void* device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
// cudaMemcpy with the direction inferred (unified addressing); waits until done.
void copy(void* dst, const void* src, std::size_t bytes);
void synchronize(void* stream = nullptr);

// The current CUDA device of the calling thread, and setting it (cudaGetDevice, cudaSetDevice).
int current_device();
void set_device(int device);
// The device whose memory p points into (device or managed memory); -1 for host memory and for
// pointers CUDA does not know.
int device_of(const void* p);
// Work queued on `stream` from now on runs after the work already queued on `producer`: an event
// recorded on producer, waited for on stream (no host wait). Nothing when they are one stream.
void order_after(void* stream, void* producer);

// An owning array of n T in device memory (uninitialized), for tests, examples and benchmarks.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n)
      : data_(static_cast<T*>(n ? device_alloc(n * sizeof(T)) : nullptr)), size_(n) {}
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { device_free(data_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  TensorView<T> view(void* stream = nullptr) const { return cuda::view(data_, size_, stream); }

  void upload(std::span<const T> host) {
    if (host.size() != size_) {
      throw Error(Status::invalid_argument, "upload of " + std::to_string(host.size()) +
                                                " elements into a buffer of " +
                                                std::to_string(size_));
    }
    if (size_) cuda::copy(data_, host.data(), size_ * sizeof(T));
  }
  std::vector<T> download() const {
    std::vector<T> out(size_);
    if (size_) cuda::copy(out.data(), data_, size_ * sizeof(T));
    return out;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gcomp::cuda
