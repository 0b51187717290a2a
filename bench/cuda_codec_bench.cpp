// Google Benchmark of gcomp's CUDA codecs on device tensors: encode, encode_ef and decode_add of
// every codec at 256M floats (--n to change), next to a device-to-device copy of the same tensor
// (the bandwidth reference: cudaMemcpy reads and writes 4 n bytes). scripts/gpu-check runs it with
// the PyTorch peer (bench/torch_cuda_peer.py) on the same input and prints one table.
//
// Names: <op>/<spec>, e.g. encode/qsgd:bits=4 (Google Benchmark appends /real_time), and copy.
// Every call returns when its result is complete on the device (gcomp's device calls wait for
// their stream), so wall-clock time per iteration is the op's time. Counters:
//   gbps   input GB/s (4 n bytes per iteration, 1e9 bytes per GB), for every op
//   ratio  4 n / payload bytes (encode ops)
//
// Options before Google Benchmark's own: --n N (elements), --input FILE (N raw little-endian
// float32 values, as the peer writes them; without it a fixed-seed normal input is generated).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gcomp/codec.hpp"
#include "gcomp/cuda.hpp"

namespace {

using gcomp::cuda::DeviceBuffer;

// threshold: tau = 2.576 keeps about 1% of a standard normal.
const char* const kSpecs[] = {"none",
                              "fp16",
                              "bf16",
                              "sign",
                              "terngrad",
                              "qsgd:bits=4",
                              "qsgd:bits=8",
                              "topk:ratio=0.01",
                              "topk:ratio=0.001",
                              "randomk:ratio=0.01",
                              "threshold:tau=2.576"};

std::size_t g_n = std::size_t{1} << 28;
std::string g_input;

struct Data {
  DeviceBuffer<float> x;
  DeviceBuffer<float> y;      // copy target, accumulator, residuals
  DeviceBuffer<float> e_old;  // zero residual for encode_ef
  DeviceBuffer<float> e_new;
};

// Normal floats from a counter-based hash (so every thread fills its own part): splitmix64 gives
// two uniforms, Box-Muller one normal.
std::vector<float> generated(std::size_t n) {
  std::vector<float> h(n);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::size_t i = t; i < n; i += threads) {
        std::uint64_t z = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
        z ^= z >> 29;
        const double u1 = (static_cast<double>(z >> 40) + 0.5) / 16777216.0;
        const double u2 = static_cast<double>((z >> 16) & 0xffffff) / 16777216.0;
        h[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      }
    });
  }
  for (auto& th : pool) th.join();
  return h;
}

std::vector<float> from_file(const std::string& path, std::size_t n) {
  std::vector<float> h(n);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open --input " + path);
  const std::size_t got = std::fread(h.data(), sizeof(float), n, f);
  std::fclose(f);
  if (got != n) {
    throw std::runtime_error("--input " + path + " holds " + std::to_string(got) +
                             " floats, expected " + std::to_string(n));
  }
  return h;
}

Data& data() {
  static std::unique_ptr<Data> d;
  if (!d) {
    const std::vector<float> h = g_input.empty() ? generated(g_n) : from_file(g_input, g_n);
    d = std::make_unique<Data>();
    d->x = DeviceBuffer<float>(h);
    d->y = DeviceBuffer<float>(g_n);
    d->e_old = DeviceBuffer<float>(std::vector<float>(g_n, 0.0f));
    d->e_new = DeviceBuffer<float>(g_n);
  }
  return *d;
}

void set_rate(benchmark::State& state, double payload_bytes) {
  const double in = 4.0 * static_cast<double>(g_n);
  state.counters["gbps"] = benchmark::Counter(in * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
  if (payload_bytes > 0) state.counters["ratio"] = in / payload_bytes;
}

void bench_copy(benchmark::State& state) {
  Data& d = data();
  for (auto _ : state) {
    gcomp::cuda::copy(d.y.data(), d.x.data(), 4 * g_n);  // waits until done
  }
  set_rate(state, 0);
}

void bench_encode(benchmark::State& state, const std::string& spec, bool ef) {
  try {
    const gcomp::Codec c(spec);
    Data& d = data();
    DeviceBuffer<std::byte> out(c.max_bytes(g_n));
    std::size_t bytes = 0;
    for (auto _ : state) {
      bytes = ef ? c.encode_ef(d.x.view(), d.e_old.view(), d.e_new.view(), 1, out.view())
                 : c.encode(d.x.view(), 1, out.view());
    }
    set_rate(state, static_cast<double>(bytes));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void bench_decode(benchmark::State& state, const std::string& spec) {
  try {
    const gcomp::Codec c(spec);
    Data& d = data();
    DeviceBuffer<std::byte> out(c.max_bytes(g_n));
    const std::size_t bytes = c.encode(d.x.view(), 1, out.view());
    const auto payload = gcomp::cuda::view(static_cast<const std::byte*>(out.data()), bytes);
    for (auto _ : state) gcomp::decode_add(payload, d.y.view(), 1.0f);
    set_rate(state, static_cast<double>(bytes));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      g_n = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--input" && i + 1 < argc) {
      g_input = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  const gcomp::cuda::DeviceStatus s = gcomp::cuda::device_status();
  if (s.count == 0) {
    std::cerr << "gcomp_bench_cuda: no usable CUDA device: " << s.why << "\n";
    return 2;
  }
  std::cerr << "gcomp_bench_cuda: " << s.name << " (" << s.capability << "), n = " << g_n
            << (g_input.empty() ? " (generated input)" : " from " + g_input) << "\n";
  benchmark::RegisterBenchmark("copy", bench_copy)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (const char* spec : kSpecs) {
    const std::string sp = spec;
    benchmark::RegisterBenchmark(("encode/" + sp).c_str(),
                                 [sp](benchmark::State& st) { bench_encode(st, sp, false); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("encode_ef/" + sp).c_str(),
                                 [sp](benchmark::State& st) { bench_encode(st, sp, true); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("decode_add/" + sp).c_str(),
                                 [sp](benchmark::State& st) { bench_decode(st, sp); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  int bargc = static_cast<int>(rest.size());
  benchmark::Initialize(&bargc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
