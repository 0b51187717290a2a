// The arrays a call of the Python module takes in place, wherever their memory is:
//   * host memory through the buffer protocol (numpy arrays, bytes, bytearray; torch CPU tensors
//     through their .numpy() view);
//   * CUDA device memory through DLPack (__dlpack__ with the call's stream, __dlpack_device__) or
//     __cuda_array_interface__ (torch CUDA tensors, CuPy, Numba, gcomp.DeviceArray);
// and gcomp.DeviceArray, the device memory the module hands out (payloads of device tensors,
// device residuals), which exports itself through both protocols. Docs: docs/python.md, "GPUs".
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gcomp/tensor.hpp"

struct DLManagedTensor;

namespace gcomp::python {

namespace py = pybind11;

enum class Elem { float32, byte };

// What a call needs, for messages ("a 1-D float32 array ...").
const char* needed(Elem e);
std::string type_name(py::handle obj);
// v (an int, or anything with __index__) as an unsigned 64-bit integer: TypeError for what is
// no int, ValueError for one outside 0..2**64-1, each "<what> must be <wanted>, not ...". The one
// conversion of the binding's seeds, counts, addresses and stream handles.
std::uint64_t to_uint64(py::handle v, const std::string& what, const std::string& wanted);
// Seeds and counts, so named in the messages.
inline std::uint64_t to_seed(py::handle seed, const std::string& what = "seed") {
  return to_uint64(seed, what, "an int in 0..2**64-1");
}
inline std::size_t to_count(py::handle v, const std::string& what) {
  return static_cast<std::size_t>(to_uint64(v, what, "a non-negative int"));
}
// torch.Tensor, when torch has been imported by someone (this module never imports it).
bool is_torch_tensor(py::handle obj);

// The stream= argument of a call on device arrays: a cudaStream_t as an int (0 or None: the
// legacy default stream, torch's default stream; 1 and 2: CUDA's cudaStreamLegacy and
// cudaStreamPerThread) or an object with an int .cuda_stream (torch.cuda.Stream).
struct CallStream {
  void* handle = nullptr;
  bool given = false;
};
CallStream to_stream(py::handle stream);

// An array taken for the length of one call: the object can be neither freed nor resized while
// it is held. Made and destroyed with the GIL held; its memory used without it.
class Held {
 public:
  // stream: the call's stream when the call takes device arrays; nullptr when it takes host
  // memory only (a device array is then a TypeError naming the call's need). A device array when
  // this build has no CUDA, or there is no usable GPU: TypeError / ValueError with the reason.
  Held(py::handle obj, std::string what, Elem elem, bool writable,
       const CallStream* stream = nullptr);
  ~Held();
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

  bool on_device() const noexcept { return device_ >= 0; }
  int device() const noexcept { return device_; }  // the CUDA device; -1 for host memory
  std::size_t size() const noexcept { return size_; }
  const std::string& what() const noexcept { return what_; }
  // Host memory; callers that take device arrays use the views.
  std::span<float> floats() const;
  std::span<std::byte> bytes() const;
  // Host spans, or device views on the call's stream.
  TensorView<float> float_view() const;
  TensorView<std::byte> byte_view() const;

 private:
  void take_buffer(py::handle obj, Elem elem, bool writable, bool torch_cpu);
  void take_dlpack(py::handle obj, Elem elem, const CallStream& stream);
  void take_interface(py::handle obj, Elem elem, bool writable, const CallStream& stream);
  void check_host(py::handle obj, Elem elem, bool writable) const;

  std::string what_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = -1;
  void* stream_ = nullptr;
  // What is held, released by the members themselves, so also when the constructor throws
  // (a refused array is let go at once, not kept exported).
  struct Buffer {
    Py_buffer view{};
    bool held = false;
    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() {
      if (held) PyBuffer_Release(&view);
    }
  };
  struct Export {
    DLManagedTensor* managed = nullptr;  // a DLPack export, given back after the call
    Export() = default;
    Export(const Export&) = delete;
    Export& operator=(const Export&) = delete;
    ~Export();
  };
  py::object numpy_view_;  // a torch CPU tensor's .numpy(), kept for the call
  Buffer buffer_;
  Export export_;
  const Py_buffer& view_ = buffer_.view;
};

// The memory of one call's arrays: all host (-1) or all on one CUDA device (returned). Mixed
// host and device arrays, or two devices: ValueError naming the first two that differ. A stream
// given for host arrays: ValueError.
int same_memory(const std::vector<const Held*>& arrays, const CallStream& stream);

// gcomp.DeviceArray: 1-D device memory of float32 or uint8 that the module hands out.
struct DeviceArray {
  void* data = nullptr;
  std::size_t size = 0;
  Elem elem = Elem::byte;
  int device = 0;
  std::shared_ptr<void> memory;  // the allocation, when this array owns it (else shared by keep)
  py::object keep;               // what keeps data valid (the ErrorFeedback of a residual)
  std::size_t nbytes() const noexcept { return size * (elem == Elem::float32 ? 4 : 1); }
};

// A new DeviceArray of n elements on `device` (the current device must be it), from the device
// backend's allocator.
py::object new_device_array(std::size_t n, Elem elem, int device);
// A DeviceArray over memory that `keep` owns.
py::object device_array_view(void* data, std::size_t n, Elem elem, int device, py::object keep);
bool is_device_array(py::handle obj);
DeviceArray& device_array_of(py::handle obj);

// Registers gcomp.DeviceArray.
void bind_arrays(py::module_& m);

}  // namespace gcomp::python
