// Device tensors through the collectives (collectives/device.cpp), under mpiexec. Built twice:
//   * gcomp_mpi_tests, on every machine: a stand-in device backend keeps "device" memory on the
//     host and runs the CPU codecs, so what the collectives do with device tensors (encode on
//     the device, payloads through the host for MPI, decode on the device, residuals in device
//     memory) runs here;
//   * gcomp_mpi_cuda_tests (GCOMP_TEST_CUDA, where gcomp_cuda is built): the same tests on the
//     CUDA backend and a GPU's memory (skipped without a usable GPU; scripts/gpu-check runs them).
// The CUDA kernels themselves are checked against the CPU codecs byte for byte in tests/cuda/.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "gcomp/cost_model.hpp"
#include "mpi_util.hpp"
#ifdef GCOMP_TEST_CUDA
#include "gcomp/cuda.hpp"
#endif

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::world;

#ifdef GCOMP_TEST_CUDA
// Every rank skips together: they share the machine and its GPU.
#define GCOMP_NEEDS_DEVICE()                                                   \
  do {                                                                         \
    const cuda::DeviceStatus st = cuda::device_status();                       \
    if (st.count == 0) GTEST_SKIP() << "no usable GPU: " << st.why;            \
  } while (0)

const detail::DeviceBackend* backend() {
  return cuda::view(static_cast<const float*>(nullptr), 0).backend();
}

// A device copy of host data, in the GPU's memory.
template <class T>
struct DeviceArrayOf {
  cuda::DeviceBuffer<T> buf;
  explicit DeviceArrayOf(const std::vector<T>& v) : buf(std::span<const T>(v)) {}
  TensorView<T> view() { return buf.view(); }
  std::vector<T> host() const { return buf.download(); }
};

std::vector<float> host_copy(TensorView<float> v) {
  std::vector<float> h(v.size());
  if (!h.empty()) cuda::copy(h.data(), v.data(), 4 * h.size());
  return h;
}
#else
#define GCOMP_NEEDS_DEVICE() \
  do {                       \
  } while (0)

class HostDevice final : public detail::DeviceBackend {
 public:
  mutable std::size_t copied = 0;  // bytes that crossed between "device" and host
  mutable int encodes = 0;
  mutable int decodes = 0;

  std::size_t encode(const detail::CodecImpl& codec, const float* x, const float* e_old,
                     float* e_new, std::size_t n, std::uint64_t seed, std::byte* out,
                     std::size_t cap, void*) const override {
    ++encodes;
    return codec.encode(x, e_old, e_new, n, seed, out, cap);
  }
  void decode_add(const std::byte* payload, std::size_t bytes, float* acc, std::size_t n,
                  float alpha, void*) const override {
    ++decodes;
    gcomp::decode_add(std::span<const std::byte>(payload, bytes), std::span<float>(acc, n), alpha);
  }
  void* alloc(std::size_t bytes) const override {
    return bytes ? ::operator new(bytes) : nullptr;
  }
  void free(void* p) const noexcept override { ::operator delete(p); }
  void copy(void* dst, const void* src, std::size_t bytes, void*) const override {
    if (bytes) std::memcpy(dst, src, bytes);
    copied += bytes;
  }
  void zero(float* p, std::size_t n, void*) const override { std::fill(p, p + n, 0.0f); }
  void scale(float* p, std::size_t n, float a, void*) const override {
    for (std::size_t i = 0; i < n; ++i) p[i] *= a;
  }
  void sync(void*) const override {}
  void* alloc_host(std::size_t bytes) const override { return alloc(bytes); }
  void free_host(void* p) const noexcept override { free(p); }
  void copy_async(void* dst, const void* src, std::size_t bytes, void* s) const override {
    copy(dst, src, bytes, s);
  }
  void wait_copies(void*) const override {}
  void check_finite(const float* x, const float* e, std::size_t n, void*) const override {
    gcomp::check_finite(std::span<const float>(x, n),
                        e ? std::span<const float>(e, n) : std::span<const float>());
  }
};

// Never destroyed: the static world() communicator frees its staging through it at exit.
const HostDevice& device() {
  static const HostDevice* d = new HostDevice;
  return *d;
}

const detail::DeviceBackend* backend() { return &device(); }

// A "device" copy of host data.
template <class T>
struct DeviceArrayOf {
  std::vector<T> mem;
  explicit DeviceArrayOf(std::vector<T> v) : mem(std::move(v)) {}
  TensorView<T> view() { return TensorView<T>::device(mem.data(), mem.size(), nullptr, &device()); }
  std::vector<T> host() const { return mem; }
};

std::vector<float> host_copy(TensorView<float> v) { return {v.data(), v.data() + v.size()}; }
#endif
using DeviceArray = DeviceArrayOf<float>;

std::vector<float> residual_of(const ErrorFeedback& ef) { return host_copy(ef.view()); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

struct Case {
  const char* spec;
  Algorithm algorithm;
};

const Case kCases[] = {
    {"none", Algorithm::dense},
    {"fp16", Algorithm::dense},
    {"qsgd:bits=4", Algorithm::allgather},
    {"qsgd:bits=4", Algorithm::compressed_reduce_scatter},
    {"terngrad", Algorithm::compressed_reduce_scatter},
    {"sign", Algorithm::allgather},
    {"topk:ratio=0.05", Algorithm::sparse_allgather},
    {"topk:ratio=0.05", Algorithm::sparse_recursive_doubling},
    {"topk:ratio=0.05", Algorithm::sparse_split},
    {"randomk:ratio=0.05", Algorithm::sparse_recursive_doubling},
    {"threshold:tau=1.5", Algorithm::sparse_allgather},
};

// Three steps of error feedback: the device path gives the host path's bits in the result and
// in the residual, for every algorithm, with and without averaging.
TEST(DeviceTensors, SameBitsAsHostTensors) {
  GCOMP_NEEDS_DEVICE();
  const std::size_t n = 4099;
  for (const Case& k : kCases) {
    for (bool average : {false, true}) {
      const Codec codec(k.spec);
      AllreduceOptions opt;
      opt.algorithm = k.algorithm;
      opt.average = average;
      opt.seed = 5;
      ErrorFeedback host_ef(n);
      ErrorFeedback dev_ef(n, backend());
      for (int step = 0; step < 3; ++step) {
        opt.tensor = static_cast<std::uint64_t>(step);
        const std::vector<float> x = test::input(n, 10 + static_cast<std::uint32_t>(step));
        std::vector<float> want(n);
        world().allreduce(x, want, codec, &host_ef, opt);
        const Algorithm host_alg = world().last_stats().algorithm;
        DeviceArray in(x);
        DeviceArray out(std::vector<float>(n, -1.0f));
        world().allreduce(TensorView<const float>(in.view()), out.view(), codec, &dev_ef, opt);
        const std::string what = std::string(k.spec) + " " + algorithm_name(k.algorithm) +
                                 (average ? " average" : "") + " step " + std::to_string(step);
        EXPECT_EQ(world().last_stats().algorithm, host_alg) << what;
        EXPECT_TRUE(same_bits(out.host(), want)) << what;
        EXPECT_TRUE(same_bits(residual_of(dev_ef), residual_of(host_ef))) << what;
      }
    }
  }
}

// In place, and on ranks that mix host and device tensors (the bytes are the same).
TEST(DeviceTensors, InPlaceAndMixedWithHostRanks) {
  GCOMP_NEEDS_DEVICE();
  const std::size_t n = 10007;
  const Codec codec("qsgd:bits=4");
  AllreduceOptions opt;
  opt.algorithm = Algorithm::compressed_reduce_scatter;
  const std::vector<float> x = test::input(n, 31);
  std::vector<float> want(n);
  world().allreduce(x, want, codec, nullptr, opt);
  std::vector<float> got;
  if (rank() % 2 == 0) {
    DeviceArray io(x);
    world().allreduce(io.view(), codec, nullptr, opt);
    got = io.host();
  } else {
    got = x;
    world().allreduce(std::span<float>(got), codec, nullptr, opt);
  }
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_TRUE(test::same_on_all_ranks(got));
}

#ifndef GCOMP_TEST_CUDA  // counts the stand-in's copies
// Only payloads cross for the compressing algorithms: far less than the 4 n bytes of the tensor.
TEST(DeviceTensors, OnlyPayloadsCrossToTheHost) {
  const std::size_t n = 100000;
  const Codec codec("topk:ratio=0.01");
  AllreduceOptions opt;
  opt.algorithm = Algorithm::sparse_allgather;
  DeviceArray in(test::input(n, 41));
  DeviceArray out{std::vector<float>(n)};
  const std::size_t before = device().copied;
  world().allreduce(TensorView<const float>(in.view()), out.view(), codec, nullptr, opt);
  const std::size_t crossed = device().copied - before;
  // Out: this rank's payload; in: every rank's. Each about k (4 + 4) bytes plus a header.
  const std::size_t bound = static_cast<std::size_t>(size() + 1) * (1000 * 8 + 64);
  EXPECT_LE(crossed, bound) << "bytes copied between device and host";
  EXPECT_LT(crossed, 4 * n);
}
#endif

// A NaN on one rank's device tensor, or host error-feedback memory with a device tensor: that
// rank throws its own error and every other rank a mismatch, nobody hangs.
TEST(DeviceTensors, FailuresReachEveryRank) {
  GCOMP_NEEDS_DEVICE();
  const std::size_t n = 1000;
  const Codec codec("qsgd:bits=4");
  std::vector<float> x = test::input(n, 51);
  if (rank() == size() - 1) x[123] = std::numeric_limits<float>::quiet_NaN();
  DeviceArray in(x);
  DeviceArray out{std::vector<float>(n)};
  Status st = Status::ok;
  try {
    world().allreduce(TensorView<const float>(in.view()), out.view(), codec);
  } catch (const Error& e) {
    st = e.code();
  }
  EXPECT_EQ(st, rank() == size() - 1 ? Status::nonfinite
                                     : (size() > 1 ? Status::mismatch : Status::ok));

  ErrorFeedback host_ef(n);
  DeviceArray good(test::input(n, 52));
  st = Status::ok;
  try {
    world().allreduce(good.view(), codec, rank() == 0 ? &host_ef : nullptr);
  } catch (const Error& e) {
    st = e.code();
  }
  EXPECT_EQ(st, rank() == 0 ? Status::invalid_argument
                            : (size() > 1 ? Status::mismatch : Status::ok));
}

// Auto's cost model times the codec where the tensor is: the device's codec for device tensors
// (Timing::device_codec_speeds, with the call's device and stream), the CPU's for host tensors,
// each measured once per (spec, size class) and kept apart.
class PlacedTiming : public test::FixedTiming {
 public:
  PlacedTiming(double host_encode, double device_encode)
      : host_(host_encode), device_(device_encode) {}
  int host_calls = 0;
  int device_calls = 0;
  const detail::DeviceBackend* backend = nullptr;
  ComputeModel codec_speeds(const Codec&, std::size_t) override {
    ++host_calls;
    return {host_, 1e-9, 0, 0};
  }
  ComputeModel device_codec_speeds(const Codec&, std::size_t,
                                   TensorView<const float> input) override {
    ++device_calls;
    backend = input.backend();
    return {device_, 1e-9, 0, 0};
  }

 private:
  double host_, device_;
};

TEST(DeviceTensors, AutoTimesTheCodecWhereTheTensorIs) {
  GCOMP_NEEDS_DEVICE();
  const std::size_t n = std::size_t{1} << 18;
  const Codec codec("topk:ratio=0.01");
  // Encoding at 2 ns an element pays on test_network() (with 2 ranks or more; on one, nothing
  // does); at 1 ms it never does. Auto's first call takes the model's cheapest option.
  const auto expect_compressed = [](bool got, bool pays, const char* what) {
    if (size() > 1 || !pays) EXPECT_EQ(got, pays) << what;
  };
  for (const bool slow_device : {false, true}) {
    const auto timing = std::make_shared<PlacedTiming>(slow_device ? 2e-9 : 1e-3,
                                                       slow_device ? 1e-3 : 2e-9);
    Communicator comm(MPI_COMM_WORLD, test::test_network(), timing);
    DeviceArray in(test::input(n, 61));
    DeviceArray out{std::vector<float>(n)};
    for (int call = 0; call < 2; ++call) {
      comm.allreduce(TensorView<const float>(in.view()), out.view(), codec);
      if (call == 0) expect_compressed(comm.last_stats().compressed, !slow_device, "device");
    }
    EXPECT_EQ(timing->device_calls, 1) << "measured once, on the device";
    EXPECT_EQ(timing->host_calls, 0);
    EXPECT_EQ(timing->backend, backend());
    // A host tensor of the same size class (another of the learner's groups, so that its first
    // call is the model's too): the CPU's codec, measured apart.
    const std::vector<float> x = test::input(n + n / 4, 62);
    std::vector<float> host_out(x.size());
    comm.allreduce(x, host_out, codec);
    expect_compressed(comm.last_stats().compressed, slow_device, "host");
    EXPECT_EQ(timing->host_calls, 1);
    EXPECT_EQ(timing->device_calls, 1);
  }
}

// The default measurement runs the backend's kernels on its own device memory.
TEST(DeviceTensors, MeasureComputeRunsTheDeviceCodec) {
  GCOMP_NEEDS_DEVICE();
  for (const char* spec : {"qsgd:bits=4", "topk:ratio=0.01"}) {
    const Codec codec(spec);
    DeviceArray like{std::vector<float>(16)};
#ifndef GCOMP_TEST_CUDA
    const int encodes = device().encodes;
    const int decodes = device().decodes;
#endif
    const ComputeModel m = measure_compute(codec, 1 << 16, TensorView<const float>(like.view()));
    EXPECT_TRUE(m.encode > 0 && std::isfinite(m.encode)) << spec << " " << m.encode;
    EXPECT_TRUE(m.decode > 0 && std::isfinite(m.decode)) << spec << " " << m.decode;
#ifndef GCOMP_TEST_CUDA
    EXPECT_GT(device().encodes, encodes) << spec;
    EXPECT_GT(device().decodes, decodes) << spec;
    const int after = device().encodes;
    const std::vector<float> x(16);
    measure_compute(codec, 1 << 16, TensorView<const float>(std::span<const float>(x)));
    EXPECT_EQ(device().encodes, after) << "a host view is timed on the CPU";
#endif
  }
}

TEST(DeviceTensors, ErrorFeedbackInDeviceMemory) {
  GCOMP_NEEDS_DEVICE();
  const Codec codec("topk:ratio=0.1");
  ErrorFeedback ef(100, backend());
  EXPECT_TRUE(ef.on_device());
  EXPECT_THROW(ef.residual(), Error);
  std::vector<float> x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 50.0f;
  DeviceArray dx(x);
  std::vector<std::byte> out(codec.max_bytes(100));
  DeviceArrayOf<std::byte> dev_out(std::vector<std::byte>(out.size()));
  const std::size_t bytes = codec.encode_ef(ef, TensorView<const float>(dx.view()), 3,
                                            dev_out.view());
  ErrorFeedback host(100);
  EXPECT_EQ(bytes, codec.encode_ef(host, x, 3, out));
  const std::vector<std::byte> got = dev_out.host();
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + static_cast<long>(bytes), got.begin()));
  EXPECT_TRUE(same_bits(residual_of(ef), residual_of(host)));
  ErrorFeedback copy = ef;  // deep: its own device memory
  EXPECT_NE(copy.view().data(), ef.view().data());
  EXPECT_TRUE(same_bits(residual_of(copy), residual_of(ef)));
  ef.reset();
  EXPECT_TRUE(same_bits(residual_of(ef), std::vector<float>(100, 0.0f)));
  EXPECT_FALSE(same_bits(residual_of(copy), std::vector<float>(100, 0.0f)));
}

}  // namespace
}  // namespace gcomp
