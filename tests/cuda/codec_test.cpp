// CPU and CUDA codecs byte for byte: the same input, spec and seed give the same payload, the
// same error-feedback residual and the same decode_add result, at sizes 0, 1, odd and 2^24 + 3.
// Device errors (non-finite input, corrupt payloads, small buffers, mismatched sizes) are the
// CPU's errors. Tests that need a GPU skip with the runtime's reason on a machine without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gcomp/codec.hpp"
#include "gcomp/cuda.hpp"
#include "radix_select.hpp"

namespace {

using gcomp::Codec;
using gcomp::Error;
using gcomp::Status;
using gcomp::cuda::DeviceBuffer;

// Every codec, with the variants that take other paths (odd bit widths, buckets that are not a
// multiple of 16 or of 8, one-element buckets, buckets that tile QSGD's code tile from 64 to
// 2048 elements, no clipping, fp16 values, k = n, scaling; top-k per chunk with codes of 1, 2, 3
// and 8 bits, float values, chunks that keep all, indices packed as gaps or chunk-relative).
const std::vector<std::string> kSpecs = {"none",
                                         "fp16",
                                         "bf16",
                                         "sign",
                                         "terngrad",
                                         "terngrad:clip=0",
                                         "qsgd",
                                         "qsgd:bits=2",
                                         "qsgd:bits=3,bucket=100",
                                         "qsgd:bits=5,bucket=1",
                                         "qsgd:bits=7,bucket=4095",
                                         "qsgd:bits=8,bucket=16",
                                         "qsgd:bits=4,bucket=64",
                                         "qsgd:bits=8,bucket=2048",
                                         "topk:ratio=0.01",
                                         "topk:k=7,values=fp16",
                                         "topk:ratio=1",
                                         "randomk:ratio=0.05",
                                         "randomk:ratio=0.1,scale=true,values=fp16",
                                         "threshold:tau=1.5",
                                         "threshold:tau=1,values=fp16",
                                         "topk:ratio=0.01,chunk=4096,bits=2",
                                         "topk:k=1,chunk=8,bits=3",
                                         "topk:ratio=0.05,chunk=100,bits=8",
                                         "topk:ratio=0.02,chunk=5000,bits=1",
                                         "topk:ratio=0.3,chunk=64,values=fp16",
                                         "topk:ratio=1,chunk=16,bits=2",
                                         "topk:k=3,chunk=1000"};

const std::vector<std::size_t> kSizes = {0, 1, 17, 4097, 1000003, (std::size_t{1} << 24) + 3};

#define REQUIRE_GPU()                                                      \
  do {                                                                     \
    const gcomp::cuda::DeviceStatus s_ = gcomp::cuda::device_status();     \
    if (s_.count == 0) GTEST_SKIP() << "no usable CUDA device: " << s_.why; \
  } while (0)

// Normal values with the awkward ones mixed in: zeros of both signs, fp16 subnormals and values
// beyond fp16's range, exact ties for top-k, tiny and huge magnitudes.
std::vector<float> input(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  const float specials[] = {0.0f, -0.0f, 3e-6f, -6e-8f, 70000.0f, -65519.0f, 1e-30f, 2.5f, -2.5f};
  for (std::size_t k = 0; k < n; k += 97) x[k] = specials[(k / 97) % 9];
  return x;
}

std::vector<std::byte> device_encode(const Codec& c, const std::vector<float>& x,
                                     std::uint64_t seed) {
  DeviceBuffer<float> dx(x);
  DeviceBuffer<std::byte> out(c.max_bytes(x.size()));
  const std::size_t bytes = c.encode(dx.view(), seed, out.view());
  std::vector<std::byte> h = out.download();
  h.resize(bytes);
  return h;
}

// Index of the first differing byte, or -1.
long first_difference(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<long>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<long>(n);
}

// The bytes of both around their first difference, for a failure's message.
std::string around_difference(const std::vector<std::byte>& cpu,
                              const std::vector<std::byte>& gpu) {
  const long d = first_difference(cpu, gpu);
  if (d < 0) return "";
  std::string out;
  for (const auto* side : {&cpu, &gpu}) {
    out += side == &cpu ? " cpu[" : " gpu[";
    const std::size_t from = d >= 4 ? static_cast<std::size_t>(d) - 4 : 0;
    out += std::to_string(from) + "..]:";
    for (std::size_t i = from; i < side->size() && i < static_cast<std::size_t>(d) + 12; ++i) {
      static const char* hex = "0123456789abcdef";
      const unsigned b = static_cast<unsigned>((*side)[i]);
      out += ' ';
      out += hex[b >> 4];
      out += hex[b & 15];
    }
  }
  return out;
}

long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<long>(i);
  }
  return -1;
}

TEST(CudaCodecs, SameBytesAsTheCpu) {
  REQUIRE_GPU();
  for (std::size_t n : kSizes) {
    const std::vector<float> x = input(n, static_cast<std::uint32_t>(n) + 1);
    for (const std::string& spec : kSpecs) {
      const Codec c(spec);
      for (std::uint64_t seed : {std::uint64_t{7}, std::uint64_t{0x123456789abcdefull}}) {
        const std::vector<std::byte> cpu = c.encode(x, seed);
        const std::vector<std::byte> gpu = device_encode(c, x, seed);
        EXPECT_EQ(gpu.size(), cpu.size()) << spec << " n=" << n;
        EXPECT_EQ(first_difference(cpu, gpu), -1)
            << spec << " n=" << n << " seed=" << seed << around_difference(cpu, gpu);
      }
    }
  }
}

TEST(CudaCodecs, ErrorFeedbackGivesTheSameBytesAndResidual) {
  REQUIRE_GPU();
  for (std::size_t n : kSizes) {
    const std::vector<float> x = input(n, static_cast<std::uint32_t>(n) + 2);
    const std::vector<float> e = input(n, static_cast<std::uint32_t>(n) + 3, 0.25f);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<float> de(e);
    DeviceBuffer<float> dnext(n);
    for (const std::string& spec : kSpecs) {
      const Codec c(spec);
      std::vector<float> next(n);
      std::vector<std::byte> cpu(c.max_bytes(n));
      cpu.resize(c.encode_ef(x, e, next, 11, cpu));
      DeviceBuffer<std::byte> out(c.max_bytes(n));
      const std::size_t bytes = c.encode_ef(dx.view(), de.view(), dnext.view(), 11, out.view());
      std::vector<std::byte> gpu = out.download();
      gpu.resize(bytes);
      EXPECT_EQ(first_difference(cpu, gpu), -1)
          << spec << " n=" << n << around_difference(cpu, gpu);
      EXPECT_EQ(first_difference(next, dnext.download()), -1) << spec << " residual, n=" << n;
    }
  }
}

TEST(CudaCodecs, DecodeAddMatchesTheCpu) {
  REQUIRE_GPU();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{1000003}}) {
    const std::vector<float> x = input(n, 5);
    const std::vector<float> acc0 = input(n, 6);
    for (const std::string& spec : kSpecs) {
      const Codec c(spec);
      const std::vector<std::byte> p = c.encode(x, 3);
      std::vector<float> cpu = acc0;
      gcomp::decode_add(p, cpu, -0.75f);
      DeviceBuffer<std::byte> dp(p);
      DeviceBuffer<float> dacc(acc0);
      gcomp::decode_add(gcomp::cuda::view(static_cast<const std::byte*>(dp.data()), dp.size()),
                        dacc.view(), -0.75f);
      EXPECT_EQ(first_difference(cpu, dacc.download()), -1) << spec << " n=" << n;
      // An accumulator 4 bytes past an aligned start (a view into a larger tensor): the kernels
      // that take 16 bytes at a time where they can must not assume they can.
      std::vector<float> shifted(n + 1, 42.0f);
      std::copy(acc0.begin(), acc0.end(), shifted.begin() + 1);
      DeviceBuffer<float> dshift(shifted);
      gcomp::decode_add(gcomp::cuda::view(static_cast<const std::byte*>(dp.data()), dp.size()),
                        gcomp::cuda::view(dshift.data() + 1, n), -0.75f);
      std::vector<float> back = dshift.download();
      EXPECT_EQ(back[0], 42.0f) << spec << " n=" << n << " (shifted)";
      back.erase(back.begin());
      EXPECT_EQ(first_difference(cpu, back), -1) << spec << " n=" << n << " (shifted)";
    }
  }
}

// Many equal keys at the k-th value: only some of them are taken, the lowest indices first. And
// k outliers alone in the top histogram bin (the select stops after its first level).
TEST(CudaCodecs, TopkTiesGoToTheLowerIndexAsOnTheCpu) {
  REQUIRE_GPU();
  const std::size_t n = 1000003;
  std::vector<float> steps(n);
  std::mt19937 g(21);
  for (float& v : steps) v = static_cast<float>(static_cast<int>(g() % 5) - 2);  // -2..2
  std::vector<float> zeros(n, 0.0f);
  std::vector<float> outliers = input(n, 22);
  for (std::size_t i : {std::size_t{5}, std::size_t{777}, n - 1}) outliers[i] = 1e30f;
  {
    const Codec c("topk:k=3");
    EXPECT_EQ(first_difference(c.encode(outliers, 1), device_encode(c, outliers, 1)), -1)
        << "early stop";
  }
  for (const std::vector<float>* x : {&steps, &zeros}) {
    for (const std::string& spec : {"topk:ratio=0.3", "topk:k=1", "topk:k=200001"}) {
      const Codec c(spec);
      EXPECT_EQ(first_difference(c.encode(*x, 1), device_encode(c, *x, 1)), -1)
          << spec << (x == &zeros ? " (zeros)" : " (steps)");
    }
  }
  // Above 2^20 elements, with the k-th key's first-level bin holding more elements than the
  // candidate buffer (n / 16, at least 2^20): the third histogram reads the whole tensor.
  const std::size_t big = 3000017;
  std::vector<float> many(big);
  for (float& v : many) v = static_cast<float>(static_cast<int>(g() % 5) - 2);
  const std::vector<float> big_zeros(big, 0.0f);
  for (const std::string& spec : {"topk:ratio=0.3", "topk:k=1"}) {
    const Codec c(spec);
    EXPECT_EQ(first_difference(c.encode(many, 1), device_encode(c, many, 1)), -1) << spec;
    EXPECT_EQ(first_difference(c.encode(big_zeros, 1), device_encode(c, big_zeros, 1)), -1)
        << spec << " (zeros)";
  }
}

// Top-k of 2^20 elements or more starts from a sample's threshold. Where the sample misleads it
// (large values at the sampled positions alone: the threshold is above the k-th key) or too
// many keys equal the threshold, the select reads the whole tensor; the bytes and the residual
// are the CPU's either way.
TEST(CudaCodecs, TopkFromAMisleadingSampleIsStillExact) {
  REQUIRE_GPU();
  const std::size_t n = 3000017;
  const std::size_t m = std::min(std::size_t{1} << 18, n / 8);  // sparse.cu's sample
  std::vector<float> spikes = input(n, 31);
  for (std::size_t s = 0; s < 5000; ++s) spikes[gcomp::cuda::detail::sample_index(s, n, m)] = 1e3f;
  std::vector<float> steps(n);
  std::mt19937 g(32);
  for (float& v : steps) v = static_cast<float>(static_cast<int>(g() % 3) - 1);
  for (const std::vector<float>* x : {&spikes, &steps}) {
    for (const std::string& spec : {"topk:ratio=0.01", "topk:k=4000", "topk:ratio=0.1,values=fp16"}) {
      const Codec c(spec);
      EXPECT_EQ(first_difference(c.encode(*x, 1), device_encode(c, *x, 1)), -1)
          << spec << (x == &spikes ? " (spikes)" : " (steps)");
      // With error feedback (e = 0.25 everywhere): the bytes and the residual.
      const std::vector<float> e(n, 0.25f);
      std::vector<float> cpu_e(n);
      std::vector<std::byte> cpu(c.max_bytes(n));
      cpu.resize(c.encode_ef(*x, e, cpu_e, 3, cpu));
      DeviceBuffer<float> dx(*x), de(e), dn(n);
      DeviceBuffer<std::byte> out(c.max_bytes(n));
      const std::size_t gb = c.encode_ef(dx.view(), de.view(), dn.view(), 3, out.view());
      std::vector<std::byte> gpu = out.download();
      gpu.resize(gb);
      EXPECT_EQ(first_difference(cpu, gpu), -1) << spec << " with error feedback";
      EXPECT_EQ(first_difference(cpu_e, dn.download()), -1) << spec << " residual";
    }
  }
}

TEST(CudaCodecs, NonfiniteInputIsTheCpusError) {
  REQUIRE_GPU();
  std::vector<float> x = input(10000, 9);
  x[4321] = std::numeric_limits<float>::quiet_NaN();
  x[7000] = std::numeric_limits<float>::infinity();
  std::vector<float> big(10000, 0.0f);
  big[55] = 3e38f;
  std::vector<float> e(10000, 0.0f);
  e[55] = 3e38f;  // finite, but x + e overflows
  for (const std::string& spec : kSpecs) {
    const Codec c(spec);
    std::string cpu_msg;
    try {
      c.encode(x, 1);
    } catch (const Error& err) {
      cpu_msg = err.what();
    }
    ASSERT_FALSE(cpu_msg.empty()) << spec;
    try {
      device_encode(c, x, 1);
      ADD_FAILURE() << spec << ": no error on the device";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Status::nonfinite) << spec;
      EXPECT_EQ(std::string(err.what()), cpu_msg) << spec;
    }
    // Error feedback: x and e finite, their sum not.
    DeviceBuffer<float> dx(big);
    DeviceBuffer<float> de(e);
    DeviceBuffer<float> dn(big.size());
    DeviceBuffer<std::byte> out(c.max_bytes(big.size()));
    std::vector<float> next(big.size());
    std::vector<std::byte> hout(c.max_bytes(big.size()));
    std::string want;
    try {
      c.encode_ef(big, e, next, 1, hout);
    } catch (const Error& err) {
      want = err.what();
    }
    try {
      c.encode_ef(dx.view(), de.view(), dn.view(), 1, out.view());
      ADD_FAILURE() << spec << ": no error on the device for an overflowing sum";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Status::nonfinite) << spec;
      EXPECT_EQ(std::string(err.what()), want) << spec;
    }
  }
}

TEST(CudaCodecs, SmallBufferAndMismatchedSizesAreErrors) {
  REQUIRE_GPU();
  const std::vector<float> x = input(1000, 4);
  DeviceBuffer<float> dx(x);
  for (const std::string& spec : kSpecs) {
    const Codec c(spec);
    // One byte short of this payload (threshold's max_bytes assumes every element is selected).
    DeviceBuffer<std::byte> out(c.encode(x, 1).size() - 1);
    try {
      c.encode(dx.view(), 1, out.view());
      ADD_FAILURE() << spec;
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Status::buffer_too_small) << spec;
    }
    // A buffer of exactly the payload's size serves on both or on neither (threshold asks room
    // for its indices' worst packing on both).
    const std::vector<std::byte> p = c.encode(x, 1);
    std::vector<std::byte> exact(p.size());
    Status cpu_exact = Status::ok, gpu_exact = Status::ok;
    try {
      c.encode(x, 1, exact);
    } catch (const Error& err) {
      cpu_exact = err.code();
    }
    DeviceBuffer<std::byte> dexact(p.size());
    try {
      c.encode(dx.view(), 1, dexact.view());
    } catch (const Error& err) {
      gpu_exact = err.code();
    }
    EXPECT_EQ(gpu_exact, cpu_exact) << spec << ": a buffer of the payload's " << p.size()
                                    << " bytes";
    DeviceBuffer<std::byte> dp(p);
    DeviceBuffer<float> acc(999);
    try {
      gcomp::decode_add(gcomp::cuda::view(static_cast<const std::byte*>(dp.data()), dp.size()),
                        acc.view());
      ADD_FAILURE() << spec;
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Status::mismatch) << spec;
    }
  }
}

// A payload corrupted after its header (which the CRC guards) is rejected by the device as by
// the CPU, and the accumulator is left as it was.
TEST(CudaCodecs, CorruptPayloadsAreRejectedAndLeaveTheAccumulator) {
  REQUIRE_GPU();
  const std::vector<float> x = input(1001, 8);
  struct Case {
    std::string spec;
    std::vector<std::pair<std::size_t, unsigned char>> writes;  // (offset after the header, byte)
    bool in_values = false;  // sparse: the offsets count from the values (after the indices)
  };
  const std::vector<Case> cases = {
      {"none", {{4 * 500 + 2, 0xc0}, {4 * 500 + 3, 0x7f}}},  // a NaN value
      {"fp16", {{2 * 17 + 1, 0x7c}}},                        // an fp16 Inf or NaN
      {"bf16", {{2 * 17, 0x80}, {2 * 17 + 1, 0x7f}}},        // a bf16 Inf
      {"sign", {{3, 0xff}}},                                 // a negative NaN scale
      {"sign", {{4 + 125, 0xff}}},                           // padding bits set (1001 elements)
      {"terngrad", {{4 + 10, 0x03}}},                        // code 3
      {"qsgd", {{4 * 1 + 3, 0x80}}},                         // a negative norm
      {"topk:k=10", {{0, 65}}},                              // a gap width beyond 64 bits
      {"topk:k=10", {{0, 16}}},                              // a block past the section's end
      {"topk:k=10", {{4 * 2 + 2, 0x80}, {4 * 2 + 3, 0x7f}}, true},  // an Inf value
  };
  for (const Case& k : cases) {
    const Codec c(k.spec);
    std::vector<std::byte> p = c.encode(x, 2);
    const gcomp::PayloadInfo info = gcomp::inspect(p);
    const std::size_t head = info.header_bytes + (k.in_values ? info.sections[0] : 0);
    for (const auto& [at, value] : k.writes) p[head + at] = static_cast<std::byte>(value);
    std::vector<float> acc(x.size(), 1.5f);
    Status cpu = Status::ok;
    try {
      gcomp::decode_add(p, acc);
    } catch (const Error& err) {
      cpu = err.code();
    }
    ASSERT_EQ(cpu, Status::bad_payload) << k.spec << " (the case is wrong)";
    DeviceBuffer<std::byte> dp(p);
    DeviceBuffer<float> dacc(acc);
    try {
      gcomp::decode_add(gcomp::cuda::view(static_cast<const std::byte*>(dp.data()), dp.size()),
                        dacc.view());
      ADD_FAILURE() << k.spec << ": accepted on the device";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Status::bad_payload) << k.spec;
    }
    EXPECT_EQ(first_difference(acc, dacc.download()), -1) << k.spec << ": accumulator changed";
    // Corrupt and the wrong size: the device reports what the CPU reports first (the corruption
    // for the dense and quantizing codecs, the size for the sparse ones, whose sections are
    // checked as they are added).
    std::vector<float> host_small(x.size() - 1);
    Status cpu_small = Status::ok;
    try {
      gcomp::decode_add(p, host_small);
    } catch (const Error& err) {
      cpu_small = err.code();
    }
    ASSERT_EQ(cpu_small, c.properties().sparse ? Status::mismatch : Status::bad_payload)
        << k.spec << " (the case is wrong)";
    DeviceBuffer<float> small(x.size() - 1);
    try {
      gcomp::decode_add(gcomp::cuda::view(static_cast<const std::byte*>(dp.data()), dp.size()),
                        small.view());
      ADD_FAILURE() << k.spec << ": accepted into a smaller accumulator";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), cpu_small) << k.spec;
    }
  }
}

TEST(CudaCodecs, StreamsAndRepeatedCallsGiveTheSameBytes) {
  REQUIRE_GPU();
  const std::vector<float> small = input(5000, 12);
  const std::vector<float> large = input(3000001, 13);
  const Codec c("qsgd:bits=4");
  const std::vector<std::byte> want_small = c.encode(small, 4);
  const std::vector<std::byte> want_large = c.encode(large, 4);
  // The workspace grows from small to large and is reused; results never depend on it.
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(first_difference(device_encode(c, small, 4), want_small), -1) << round;
    EXPECT_EQ(first_difference(device_encode(c, large, 4), want_large), -1) << round;
  }
}

// gcomp::cuda::error_feedback: the residual lives on the device across steps, and encode_ef with
// it gives the host ErrorFeedback's bytes and residual at every step; copies are deep.
TEST(CudaCodecs, ErrorFeedbackInDeviceMemoryAcrossSteps) {
  REQUIRE_GPU();
  const std::size_t n = 100003;
  for (const std::string& spec : {"topk:ratio=0.01", "sign", "qsgd:bits=3", "fp16"}) {
    const Codec c(spec);
    gcomp::ErrorFeedback host(n);
    gcomp::ErrorFeedback dev = gcomp::cuda::error_feedback(n);
    ASSERT_TRUE(dev.on_device());
    DeviceBuffer<std::byte> out(c.max_bytes(n));
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> x = input(n, 70 + static_cast<std::uint32_t>(step));
      const std::vector<std::byte> want = c.encode_ef(host, x, 9);
      DeviceBuffer<float> dx(x);
      const std::size_t bytes =
          c.encode_ef(dev, gcomp::TensorView<const float>(dx.view()), 9, out.view());
      std::vector<std::byte> got = out.download();
      got.resize(bytes);
      EXPECT_EQ(first_difference(want, got), -1) << spec << " step " << step;
      const gcomp::TensorView<float> r = dev.view();
      std::vector<float> residual(n);
      gcomp::cuda::copy(residual.data(), r.data(), 4 * n);
      const std::span<const float> hr = host.residual();
      EXPECT_EQ(first_difference(std::vector<float>(hr.begin(), hr.end()), residual), -1)
          << spec << " residual, step " << step;
    }
    gcomp::ErrorFeedback copy = dev;
    EXPECT_NE(copy.view().data(), dev.view().data());
    dev.reset();
    std::vector<float> zero(n, 1.0f);
    gcomp::cuda::copy(zero.data(), dev.view().data(), 4 * n);
    EXPECT_EQ(first_difference(zero, std::vector<float>(n, 0.0f)), -1) << spec << " reset";
  }
}

// These need no GPU: the views are checked before anything reaches the device.
TEST(CudaViews, MixedMemoryIsAnError) {
  const Codec c("fp16");
  std::vector<float> x(10, 1.0f);
  std::vector<std::byte> out(c.max_bytes(10));
  float* fake = reinterpret_cast<float*>(0x1000);  // never dereferenced
  try {
    c.encode(gcomp::cuda::view(static_cast<const float*>(fake), 10), 1,
             gcomp::TensorView<std::byte>(std::span<std::byte>(out)));
    ADD_FAILURE() << "host output for a device input was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Status::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("different memories"), std::string::npos) << err.what();
  }
  int s1 = 0;
  int s2 = 0;
  auto* bytes = reinterpret_cast<std::byte*>(0x2000);
  try {
    c.encode(gcomp::cuda::view(static_cast<const float*>(fake), 10, &s1), 1,
             gcomp::cuda::view(bytes, 100, &s2));
    ADD_FAILURE() << "views on two streams were accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Status::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("streams"), std::string::npos) << err.what();
  }
}

TEST(CudaViews, HostViewsRunTheCpuCodec) {
  const Codec c("qsgd");
  const std::vector<float> x = input(3000, 14);
  std::vector<std::byte> out(c.max_bytes(x.size()));
  const std::size_t bytes = c.encode(gcomp::TensorView<const float>(std::span<const float>(x)), 5,
                                     gcomp::TensorView<std::byte>(std::span<std::byte>(out)));
  out.resize(bytes);
  EXPECT_EQ(first_difference(out, c.encode(x, 5)), -1);
}

}  // namespace
