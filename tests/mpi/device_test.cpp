// Device tensors through the collectives (collectives/device.cpp), on every machine: a stand-in
// device backend keeps "device" memory on the host and runs the CPU codecs, so what the
// collectives do with device tensors (encode on the device, payloads through the host for MPI,
// decode on the device, residuals in device memory) runs under mpiexec here; the CUDA kernels
// themselves are checked against the CPU codecs byte for byte in tests/cuda/.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "mpi_util.hpp"

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::world;

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

// A "device" copy of host data.
struct DeviceArray {
  std::vector<float> mem;
  explicit DeviceArray(std::vector<float> v) : mem(std::move(v)) {}
  TensorView<float> view() {
    return TensorView<float>::device(mem.data(), mem.size(), nullptr, &device());
  }
};

std::vector<float> residual_of(const ErrorFeedback& ef) {
  const TensorView<float> v = ef.view();
  return {v.data(), v.data() + v.size()};
}

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
  const std::size_t n = 4099;
  for (const Case& k : kCases) {
    for (bool average : {false, true}) {
      const Codec codec(k.spec);
      AllreduceOptions opt;
      opt.algorithm = k.algorithm;
      opt.average = average;
      opt.seed = 5;
      ErrorFeedback host_ef(n);
      ErrorFeedback dev_ef(n, &device());
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
        EXPECT_TRUE(same_bits(out.mem, want)) << what;
        EXPECT_TRUE(same_bits(residual_of(dev_ef), residual_of(host_ef))) << what;
      }
    }
  }
}

// In place, and on ranks that mix host and device tensors (the bytes are the same).
TEST(DeviceTensors, InPlaceAndMixedWithHostRanks) {
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
    got = io.mem;
  } else {
    got = x;
    world().allreduce(std::span<float>(got), codec, nullptr, opt);
  }
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_TRUE(test::same_on_all_ranks(got));
}

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

// A NaN on one rank's device tensor, or host error-feedback memory with a device tensor: that
// rank throws its own error and every other rank a mismatch, nobody hangs.
TEST(DeviceTensors, FailuresReachEveryRank) {
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

TEST(DeviceTensors, ErrorFeedbackInDeviceMemory) {
  const Codec codec("topk:ratio=0.1");
  ErrorFeedback ef(100, &device());
  EXPECT_TRUE(ef.on_device());
  EXPECT_THROW(ef.residual(), Error);
  std::vector<float> x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 50.0f;
  DeviceArray dx(x);
  std::vector<std::byte> out(codec.max_bytes(100));
  std::vector<std::byte> dev_out(out.size());
  const auto dout = TensorView<std::byte>::device(dev_out.data(), dev_out.size(), nullptr,
                                                  &device());
  const std::size_t bytes = codec.encode_ef(ef, TensorView<const float>(dx.view()), 3, dout);
  ErrorFeedback host(100);
  EXPECT_EQ(bytes, codec.encode_ef(host, x, 3, out));
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + static_cast<long>(bytes), dev_out.begin()));
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
