// TensorView: n elements of T in host memory or in CUDA device memory, and for device memory the
// CUDA stream that orders the work on it. The same Codec takes either (codec.hpp): host views
// run the CPU codecs, device views the CUDA kernels of gcomp_cuda, with the same bytes.
//
// Host views convert implicitly from spans (and so from vectors). Device views come from
// gcomp::cuda::view() (gcomp/cuda.hpp, library gcomp_cuda), which ties them to the CUDA backend;
// a program that does not link gcomp_cuda cannot make one, so the core never needs CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "gcomp/error.hpp"

namespace gcomp {

namespace detail {
class DeviceBackend;
}

enum class MemoryKind : std::uint8_t { host, device };

template <class T>
class TensorView {
 public:
  TensorView() = default;
  TensorView(std::span<T> host) noexcept : data_(host.data()), size_(host.size()) {}  // NOLINT
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  TensorView(const TensorView<U>& o) noexcept  // NOLINT: float -> const float, as spans do
      : data_(o.data()), size_(o.size()), stream_(o.stream()), backend_(o.backend()) {}

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  MemoryKind memory() const noexcept {
    return backend_ ? MemoryKind::device : MemoryKind::host;
  }
  bool on_device() const noexcept { return backend_ != nullptr; }
  // The cudaStream_t of a device view (nullptr: the legacy default stream); nullptr for host.
  void* stream() const noexcept { return stream_; }
  const detail::DeviceBackend* backend() const noexcept { return backend_; }

  // The elements [offset, offset + count) in the same memory and stream.
  TensorView subview(std::size_t offset, std::size_t count) const {
    if (offset > size_ || count > size_ - offset) {
      throw Error(Status::invalid_argument,
                  "subview [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                      std::to_string(count) + ") of a view of " + std::to_string(size_));
    }
    TensorView v = *this;
    v.data_ = data_ + offset;
    v.size_ = count;
    return v;
  }

  // The host span; throws Error(invalid_argument) for a device view.
  std::span<T> host() const {
    if (on_device()) {
      throw Error(Status::invalid_argument, "a device tensor was given where host memory is needed");
    }
    return {data_, size_};
  }

  // For gcomp_cuda: a device view on `stream`, handled by `backend`.
  static TensorView device(T* data, std::size_t size, void* stream,
                           const detail::DeviceBackend* backend) noexcept {
    TensorView v;
    v.data_ = data;
    v.size_ = size;
    v.stream_ = stream;
    v.backend_ = backend;
    return v;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  void* stream_ = nullptr;
  const detail::DeviceBackend* backend_ = nullptr;
};

}  // namespace gcomp
