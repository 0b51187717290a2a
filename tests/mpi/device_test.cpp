// Device tensors through the collectives (collectives/algorithms/device.cpp), under mpiexec. Built twice:
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
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "codec_impl.hpp"
#include "device_backend.hpp"
#include "gcomp/cost_model.hpp"
#include "low_rank.hpp"
#include "low_rank_reference.hpp"
#include "mpi_util.hpp"
#ifndef GCOMP_TEST_CUDA
#include "standin/standin_device.hpp"
#endif
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
#define GCOMP_NEEDS_DEVICE()                                        \
  do {                                                              \
    const cuda::DeviceStatus st = cuda::device_status();            \
    if (st.count == 0) GTEST_SKIP() << "no usable GPU: " << st.why; \
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

using HostDevice = test::StandinDevice;

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
  explicit DeviceArrayOf(std::vector<T> v) : mem(std::move(v)) {
    device().adopt(mem.data(), sizeof(T) * mem.size());
  }
  ~DeviceArrayOf() { device().forget(mem.data()); }
  DeviceArrayOf(const DeviceArrayOf&) = delete;
  DeviceArrayOf& operator=(const DeviceArrayOf&) = delete;
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
    {"topk:ratio=0.05", Algorithm::sparse_reduce_scatter},
    {"randomk:ratio=0.05", Algorithm::sparse_recursive_doubling},
    {"threshold:tau=1.5", Algorithm::sparse_allgather},
    {"none", Algorithm::two_level},
    {"qsgd:bits=4", Algorithm::two_level},
    {"topk:ratio=0.05", Algorithm::two_level},
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
  EXPECT_EQ(
      st, rank() == size() - 1 ? Status::nonfinite : (size() > 1 ? Status::mismatch : Status::ok));

  ErrorFeedback host_ef(n);
  DeviceArray good(test::input(n, 52));
  st = Status::ok;
  try {
    world().allreduce(good.view(), codec, rank() == 0 ? &host_ef : nullptr);
  } catch (const Error& e) {
    st = e.code();
  }
  EXPECT_EQ(st,
            rank() == 0 ? Status::invalid_argument : (size() > 1 ? Status::mismatch : Status::ok));
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
    const auto timing =
        std::make_shared<PlacedTiming>(slow_device ? 2e-9 : 1e-3, slow_device ? 1e-3 : 2e-9);
    const auto made = test::make_communicator(test::test_network(), timing);
    Communicator& comm = *made;
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
  const std::size_t bytes =
      codec.encode_ef(ef, TensorView<const float>(dx.view()), 3, dev_out.view());
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

// ---- allreduce_buckets on device tensors ----

// A model's tensors in device memory, and their host values.
struct DeviceModel {
  std::vector<std::unique_ptr<DeviceArray>> arrays;
  explicit DeviceModel(const std::vector<std::vector<float>>& values) {
    for (const auto& v : values) arrays.push_back(std::make_unique<DeviceArray>(v));
  }
  std::vector<TensorView<float>> views() {
    std::vector<TensorView<float>> out;
    for (auto& a : arrays) out.push_back(a->view());
    return out;
  }
  std::vector<std::vector<float>> host() const {
    std::vector<std::vector<float>> out;
    for (const auto& a : arrays) out.push_back(a->host());
    return out;
  }
};

std::vector<std::vector<float>> model_values(const std::vector<std::size_t>& sizes,
                                             std::uint32_t seed) {
  std::vector<std::vector<float>> v;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    v.push_back(test::input(sizes[i], seed * 31 + static_cast<std::uint32_t>(i)));
  }
  return v;
}

std::vector<ErrorFeedback*> pointers(std::vector<ErrorFeedback>& efs) {
  std::vector<ErrorFeedback*> p;
  for (ErrorFeedback& e : efs) p.push_back(&e);
  return p;
}

// Several buckets and the small tensors' bucket, with error feedback, three steps: the device
// path's results and residuals are the host path's bits, for codecs of each family.
TEST(DeviceBuckets, SameBitsAsHostBuckets) {
  GCOMP_NEEDS_DEVICE();
  const std::vector<std::size_t> sizes = {3000, 40, 5000, 700, 2500, 9};
  for (const Case& k : {Case{"topk:ratio=0.05", Algorithm::sparse_allgather},
                        Case{"topk:ratio=0.05", Algorithm::sparse_reduce_scatter},
                        Case{"qsgd:bits=4", Algorithm::compressed_reduce_scatter},
                        Case{"fp16", Algorithm::dense}, Case{"none", Algorithm::dense}}) {
    const char* spec = k.spec;
    const Codec codec(spec);
    BucketOptions o;
    o.allreduce.algorithm = k.algorithm;  // auto times host and device codecs apart
    o.bucket_bytes = 4 * 6000;            // buckets [3000], [5000, 700], [2500]; 40 and 9 apart
    o.allreduce.seed = 3;
    std::vector<ErrorFeedback> host_efs, dev_efs;
    for (std::size_t n : sizes) {
      host_efs.emplace_back(n);
      dev_efs.emplace_back(n, backend());
    }
    // One communicator each: what an algorithm remembers of a tensor from call to call
    // (sparse_reduce_scatter's regions) then follows the same calls on both sides.
    const auto host_made = test::make_communicator(test::test_network());
    const auto dev_made = test::make_communicator(test::test_network());
    Communicator& host_comm = *host_made;
    Communicator& dev_comm = *dev_made;
    for (int step = 0; step < 3; ++step) {
      o.allreduce.tensor = static_cast<std::uint64_t>(step);
      const auto values = model_values(sizes, 7 + static_cast<std::uint32_t>(step));
      auto host = values;
      std::vector<std::span<float>> spans(host.begin(), host.end());
      host_comm.allreduce_buckets(spans, codec, pointers(host_efs), o);
      const CallStats host_stats = host_comm.last_stats();
      DeviceModel dev(values);
      const auto views = dev.views();
      dev_comm.allreduce_buckets(views, codec, pointers(dev_efs), o);
      EXPECT_EQ(dev_comm.last_stats().calls, host_stats.calls) << spec;
      EXPECT_EQ(dev_comm.last_stats().bytes_sent, host_stats.bytes_sent) << spec;
      const auto got = dev.host();
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const std::string what =
            std::string(spec) + " step " + std::to_string(step) + " tensor " + std::to_string(t);
        EXPECT_TRUE(same_bits(got[t], host[t])) << what;
        const auto r = host_efs[t].residual();
        EXPECT_TRUE(same_bits(residual_of(dev_efs[t]), std::vector<float>(r.begin(), r.end())))
            << what;
      }
    }
  }
}

// powersgd on device tensors: shapes, error feedback, warm start, several steps.
const std::vector<MatrixShape> kShapes = {{40, 24}, {50, 1}, {6, 5}, {64, 32}};

std::vector<std::size_t> sizes_of(const std::vector<MatrixShape>& shapes) {
  std::vector<std::size_t> n;
  for (const MatrixShape& s : shapes) n.push_back(s.rows * s.cols);
  return n;
}

BucketOptions low_rank_options(bool average, Algorithm a = Algorithm::low_rank) {
  BucketOptions o;
  o.dense_below = 0;  // the 1-D tensor and the small matrix go dense inside low_rank's bucket
  o.allreduce.algorithm = a;
  o.allreduce.average = average;
  o.allreduce.seed = 11;
  return o;
}

#ifndef GCOMP_TEST_CUDA  // the stand-in runs the CPU's kernels: the host path's bits exactly
TEST(DeviceBuckets, PowerSgdSameBitsAsHostBuckets) {
  const std::vector<std::size_t> sizes = sizes_of(kShapes);
  for (const char* spec :
       {"powersgd:rank=2", "powersgd:rank=3,values=fp16", "powersgd:rank=2,alternate=true",
        "powersgd:rank=2,start=1,warm_start=false"}) {
    for (const auto& [average, alg] :
         {std::pair{false, Algorithm::low_rank}, std::pair{true, Algorithm::low_rank},
          std::pair{false, Algorithm::two_level}}) {
      const Codec codec(spec);
      const BucketOptions o = low_rank_options(average, alg);
      std::vector<ErrorFeedback> host_efs, dev_efs;
      for (std::size_t n : sizes) {
        host_efs.emplace_back(n);
        dev_efs.emplace_back(n, backend());
      }
      const int products = device().products;
      const int reconstructions = device().reconstructions;
      for (int step = 0; step < 4; ++step) {
        const auto values = model_values(sizes, 20 + static_cast<std::uint32_t>(step));
        auto host = values;
        std::vector<std::span<float>> spans(host.begin(), host.end());
        world().allreduce_buckets(spans, kShapes, codec, pointers(host_efs), o);
        DeviceModel dev(values);
        const auto views = dev.views();
        world().allreduce_buckets(views, kShapes, codec, pointers(dev_efs), o);
        EXPECT_EQ(world().last_stats().algorithm, alg);
        const auto got = dev.host();
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          const std::string what = std::string(spec) + " " + algorithm_name(alg) +
                                   (average ? " average" : "") + " step " + std::to_string(step) +
                                   " tensor " + std::to_string(t);
          EXPECT_TRUE(same_bits(got[t], host[t])) << what;
          const auto r = host_efs[t].residual();
          EXPECT_TRUE(same_bits(residual_of(dev_efs[t]), std::vector<float>(r.begin(), r.end())))
              << what;
        }
      }
      EXPECT_GT(device().products, products) << spec << ": the products ran on the device";
      EXPECT_GT(device().reconstructions, reconstructions) << spec;
    }
  }
}

// Only the factors cross: per step a 256 x 256 matrix at rank 2 sends Q to the device and P
// back (P = M Q), P^ to it and Q back (Q = M^T P^), and P^ and Q to it for the reconstruction:
// 3 (rows + cols) r floats, where the matrix is 65536.
TEST(DeviceBuckets, PowerSgdMovesOnlyFactors) {
  const std::size_t rows = 256, cols = 256, r = 2;
  const Codec codec("powersgd:rank=2");
  ErrorFeedback ef(rows * cols, backend());
  std::vector<ErrorFeedback*> efs = {&ef};
  const std::vector<MatrixShape> shapes = {{rows, cols}};
  for (int step = 0; step < 2; ++step) {
    DeviceModel dev({test::input(rows * cols, 90 + static_cast<std::uint32_t>(step))});
    const auto views = dev.views();
    const std::size_t before = device().copied;
    world().allreduce_buckets(views, shapes, codec, efs, low_rank_options(true));
    const std::size_t crossed = device().copied - before;
    EXPECT_EQ(crossed, 4 * 3 * (rows + cols) * r) << "step " << step;
  }
}
#endif

// The step against the float64 reference (low_rank_reference.hpp), on device tensors: on a GPU
// each rank's products are float32 SGEMMs, within gamma_k of the exact ones (k = cols for P,
// rows for Q); on the stand-in the CPU's, within u.
TEST(DeviceBuckets, PowerSgdMatchesFloat64Computation) {
  GCOMP_NEEDS_DEVICE();
  const std::size_t rows = 40, cols = 24, r = 3;
  const Codec codec("powersgd:rank=3,warm_start=false");
  const std::vector<MatrixShape> shapes = {{rows, cols}, {50, 1}, {6, 5}};
  const auto values = model_values(sizes_of(shapes), 5);
  const auto q0 = test::first_q(11, 0, cols * r);
#ifdef GCOMP_TEST_CUDA
  const auto gamma = [](std::size_t k) {
    return static_cast<double>(k) * test::kU / (1 - static_cast<double>(k) * test::kU);
  };
  const test::Reference ref =
      test::reference_step(values[0], rows, cols, r, q0, gamma(cols), gamma(rows));
#else
  const test::Reference ref = test::reference_step(values[0], rows, cols, r, q0);
#endif
  DeviceModel dev(values);
  const auto views = dev.views();
  world().allreduce_buckets(views, shapes, codec, {}, low_rank_options(false));
  const std::vector<float> got = dev.host()[0];
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    err += (got[i] - ref.out[i]) * (got[i] - ref.out[i]);
    norm += ref.out[i] * ref.out[i];
  }
  EXPECT_LE(std::sqrt(err), ref.bound) << "||out|| " << std::sqrt(norm);
  EXPECT_LT(ref.bound, 1e-2 * std::sqrt(norm));
  EXPECT_TRUE(test::same_on_all_ranks(got));
}

// Ranks on device and host tensors in one job (even ranks on the device): every rank's result
// is the same bits, since the reconstruction from the allreduced factors is the CPU's arithmetic
// on the device too; with averaging, a compressed matrix's out + e = M (= x + e_old) on every
// rank to one rounding of M - out (|e + out - M| <= u |e|), over five warm-started steps (the
// dense tensors keep no residual: their out is the average).
TEST(DeviceBuckets, PowerSgdSameResultOnHostAndDeviceRanks) {
  GCOMP_NEEDS_DEVICE();
  const bool on_device = rank() % 2 == 0;
  const std::vector<std::size_t> sizes = sizes_of(kShapes);
  const Codec codec("powersgd:rank=2");
  std::vector<ErrorFeedback> efs;
  for (std::size_t n : sizes) {
    if (on_device) {
      efs.emplace_back(n, backend());
    } else {
      efs.emplace_back(n);
    }
  }
  for (int step = 0; step < 5; ++step) {
    const auto values = model_values(sizes, 40 + static_cast<std::uint32_t>(rank() * 10 + step));
    std::vector<std::vector<float>> m = values;  // x + e_old
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const std::vector<float> e = residual_of(efs[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) m[t][i] = values[t][i] + e[i];
    }
    std::vector<std::vector<float>> got;
    if (on_device) {
      DeviceModel dev(values);
      const auto views = dev.views();
      world().allreduce_buckets(views, kShapes, codec, pointers(efs), low_rank_options(true));
      got = dev.host();
    } else {
      got = values;
      std::vector<std::span<float>> spans(got.begin(), got.end());
      world().allreduce_buckets(spans, kShapes, codec, pointers(efs), low_rank_options(true));
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      EXPECT_TRUE(test::same_on_all_ranks(got[t])) << "step " << step << " tensor " << t;
      if (t == 1 || t == 2) continue;  // 1-D, and below the rate: dense
      const std::vector<float> e = residual_of(efs[t]);
      for (std::size_t i = 0; i < sizes[t]; ++i) {
        const double miss = static_cast<double>(e[i]) + got[t][i] - m[t][i];
        ASSERT_LE(std::fabs(miss), 0x1p-24 * std::fabs(e[i]) + 1e-37)
            << "step " << step << " tensor " << t << " element " << i;
      }
    }
  }
}

// Host and device views in one call, or host error-feedback memory with device tensors: that
// rank throws invalid_argument naming it, the others mismatch; nobody hangs.
TEST(DeviceBuckets, BadArgumentsReachEveryRank) {
  GCOMP_NEEDS_DEVICE();
  const Codec codec("topk:ratio=0.1");
  DeviceArray a(test::input(2000, 1));
  std::vector<float> b = test::input(2000, 2);
  DeviceArray c(test::input(2000, 3));
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<TensorView<float>> views = {a.view(), c.view()};
    ErrorFeedback host_ef(2000);
    std::vector<ErrorFeedback*> efs;
    const bool bad = rank() == (kind == 0 ? 0 : size() - 1);
    if (bad && kind == 0) views[1] = TensorView<float>(std::span<float>(b));
    if (kind == 1) efs = {bad ? &host_ef : nullptr, nullptr};
    Status st = Status::ok;
    std::string what;
    try {
      world().allreduce_buckets(views, codec, efs);
    } catch (const Error& e) {
      st = e.code();
      what = e.what();
    }
    EXPECT_EQ(st, bad ? Status::invalid_argument : (size() > 1 ? Status::mismatch : Status::ok))
        << kind << " " << what;
    if (bad)
      EXPECT_NE(what.find(kind == 0 ? "host memory" : "error-feedback memory 0"), std::string::npos)
          << what;
  }
}

// The backend's PowerSGD kernels beside the CPU's: x + e and the reconstruction the same bits,
// the products within (gamma_k + u + k 2^-53) S of the CPU's (cuda/low_rank.cu's bound; S =
// sum |m q| of the element's terms, k the sum's length).
TEST(DeviceLowRank, KernelsAgainstTheCpu) {
  GCOMP_NEEDS_DEVICE();
  const std::size_t rows = 300, cols = 200;
  for (const std::size_t r : {std::size_t{1}, std::size_t{3}, std::size_t{4}}) {
    const std::vector<float> m = test::input(rows * cols, 70);
    const std::vector<float> e = test::input(rows * cols, 71, 0.1f);
    const std::vector<float> q = test::input(cols * r, 72);
    const std::vector<float> p = test::input(rows * r, 73);
    DeviceArray dm(m), de(e), dq(q), dp(p);
    DeviceArray dsum{std::vector<float>(rows * cols)}, dpq{std::vector<float>(rows * r)},
        dqp{std::vector<float>(cols * r)}, dout{std::vector<float>(rows * cols)};
    const detail::DeviceBackend* dev = backend();
    dev->add(dm.view().data(), de.view().data(), dsum.view().data(), rows * cols, nullptr);
    dev->lr_multiply(dm.view().data(), rows, cols, dq.view().data(), r, dpq.view().data(), nullptr);
    dev->lr_multiply_t(dm.view().data(), rows, cols, dp.view().data(), r, dqp.view().data(),
                       nullptr);
    // e (in place) -= p q^T / 4, out = p q^T / 2.
    dev->lr_reconstruct(dp.view().data(), dq.view().data(), rows, cols, r, 0.5, dout.view().data(),
                        0.25, de.view().data(), de.view().data(), nullptr);
    dev->sync(nullptr);

    std::vector<float> sum(rows * cols), pq(rows * r), qp(cols * r), out(rows * cols), e2 = e;
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = m[i] + e[i];
    detail::lr_multiply(m.data(), rows, cols, q.data(), r, pq.data());
    std::vector<double> work(std::max(rows, cols) * r);
    detail::lr_multiply_t(m.data(), rows, cols, p.data(), r, qp.data(), work.data());
    detail::lr_reconstruct(p.data(), q.data(), rows, cols, r, 0.5, out.data(), 0.25, e2.data(),
                           e2.data(), work.data());
    EXPECT_TRUE(same_bits(dsum.host(), sum)) << r;
    EXPECT_TRUE(same_bits(dout.host(), out)) << r;
    EXPECT_TRUE(same_bits(de.host(), e2)) << r;
    const auto bound = [](std::size_t k, double s) {
      const double kk = static_cast<double>(k), u = 0x1p-24;
      return (kk * u / (1 - kk * u) + u + kk * 0x1p-53) * s;
    };
    // got[o][j] against cpu[o][j], o < outer, each the sum over l < k of term(o, l, j).
    const auto within = [&](const std::vector<float>& got, const std::vector<float>& cpu,
                            std::size_t outer, std::size_t k, auto term, const char* what) {
      for (std::size_t o = 0; o < outer; ++o) {
        for (std::size_t j = 0; j < r; ++j) {
          double s = 0;
          for (std::size_t l = 0; l < k; ++l) s += std::fabs(term(o, l, j));
          ASSERT_LE(std::fabs(double(got[o * r + j]) - cpu[o * r + j]), bound(k, s))
              << what << " " << o << " " << j << " r " << r;
        }
      }
    };
    within(
        dpq.host(), pq, rows, cols,
        [&](std::size_t i, std::size_t k, std::size_t j) {
          return double(m[i * cols + k]) * q[k * r + j];
        },
        "P");
    within(
        dqp.host(), qp, cols, rows,
        [&](std::size_t k, std::size_t i, std::size_t j) {
          return double(m[i * cols + k]) * p[i * r + j];
        },
        "Q");
  }
}

}  // namespace
}  // namespace gcomp
