// Google Benchmark of gcomp's codecs: encode, encode with error feedback (encode_ef) and
// decode_add for every codec at 1M and 16M standard normal floats, with the library on 1 thread
// and on all cores (gcomp::set_num_threads, not Google Benchmark's ->Threads()).
//
// Names: <op>/<spec>/<n>/threads:<1|all>, e.g. encode/qsgd:bits=4/16777216/threads:1 (Google
// Benchmark appends /real_time). bytes_per_second counts the dense input, 4 n bytes per
// iteration, for every op (decode_add: the dense accumulator it adds into). Counters:
//   gbps     the same rate in GB/s (1e9 bytes), as a plain number
//   ratio    4 n / payload bytes (the compression ratio)
//   threads  the library's thread count during the run
// The default --benchmark_min_time is 0.2 s (the whole run takes 1-2 minutes on 2 cores); pass
// --benchmark_min_time and --benchmark_filter as usual, and --sizes=N,N,... for other sizes
// (bench/python_overhead.py adds 65536).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gcomp/codec.hpp"

namespace {

// The specs benchmarked. threshold: tau = 2.576 keeps about 1% of a standard normal.
const char* const kSpecs[] = {
    "none",
    "fp16",
    "bf16",
    "topk:ratio=0.01",
    "topk:ratio=0.001",
    "randomk:ratio=0.01",
    "threshold:tau=2.576",
    "qsgd:bits=4",
    "qsgd:bits=8",
    "terngrad",
    "sign",
};
std::vector<std::size_t> g_sizes = {std::size_t{1} << 20, std::size_t{1} << 24};
constexpr std::uint64_t kInputSeed = 20240611;

enum class Op { encode, encode_ef, decode_add };

const char* op_name(Op op) {
  switch (op) {
    case Op::encode:
      return "encode";
    case Op::encode_ef:
      return "encode_ef";
    case Op::decode_add:
      return "decode_add";
  }
  return "?";
}

// Standard normal floats, generated once per size with a fixed seed.
const std::vector<float>& input(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<std::vector<float>>> cache;
  auto& slot = cache[n];
  if (!slot) {
    slot = std::make_unique<std::vector<float>>(n);
    std::mt19937_64 rng(kInputSeed ^ n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : *slot) v = normal(rng);
  }
  return *slot;
}

int all_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Sets the library's thread count for one benchmark run and puts it back to 1 afterwards.
class LibraryThreads {
 public:
  explicit LibraryThreads(int threads) { gcomp::set_num_threads(threads); }
  ~LibraryThreads() { gcomp::set_num_threads(1); }
  LibraryThreads(const LibraryThreads&) = delete;
  LibraryThreads& operator=(const LibraryThreads&) = delete;
};

void set_counters(benchmark::State& state, std::size_t n, std::size_t payload_bytes, int threads) {
  const double input_bytes = 4.0 * static_cast<double>(n);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(4 * n));
  state.counters["gbps"] = benchmark::Counter(
      input_bytes * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["ratio"] = input_bytes / static_cast<double>(payload_bytes);
  state.counters["threads"] = threads;
}

void run(benchmark::State& state, const gcomp::Codec& codec, Op op, std::size_t n, int threads) {
  try {
    const std::vector<float>& x = input(n);
    LibraryThreads scope(threads);
    std::vector<std::byte> out(codec.max_bytes(n));
    std::size_t bytes = 0;
    std::uint64_t seed = 1;
    switch (op) {
      case Op::encode:
        for (auto _ : state) {
          bytes = codec.encode(x, seed++, out);
          benchmark::DoNotOptimize(out.data());
          benchmark::ClobberMemory();
        }
        break;
      case Op::encode_ef: {
        gcomp::ErrorFeedback ef(n);  // one residual memory kept across the iterations
        for (auto _ : state) {
          bytes = codec.encode_ef(ef, x, seed++, out);
          benchmark::DoNotOptimize(out.data());
          benchmark::ClobberMemory();
        }
        break;
      }
      case Op::decode_add: {
        bytes = codec.encode(x, seed, out);
        const std::span<const std::byte> payload(out.data(), bytes);
        std::vector<float> acc(n, 0.0f);
        for (auto _ : state) {
          gcomp::decode_add(payload, acc, 1.0f);
          benchmark::DoNotOptimize(acc.data());
          benchmark::ClobberMemory();
        }
        break;
      }
    }
    set_counters(state, n, bytes, threads);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  const Op ops[] = {Op::encode, Op::encode_ef, Op::decode_add};
  const int every = all_threads();
  for (const char* spec : kSpecs) {
    const gcomp::Codec codec(spec);
    for (const Op op : ops) {
      for (const std::size_t n : g_sizes) {
        for (const bool all : {false, true}) {
          const int threads = all ? every : 1;
          const std::string name = std::string(op_name(op)) + "/" + spec + "/" + std::to_string(n) +
                                   "/threads:" + (all ? "all" : "1");
          benchmark::RegisterBenchmark(name.c_str(),
                                       [codec, op, n, threads](benchmark::State& state) {
                                         run(state, codec, op, n, threads);
                                       })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Default --benchmark_min_time to 0.2 s unless given (MinTime() on each benchmark would
  // override the flag instead).
  std::vector<char*> args = {argv[0]};
  bool has_min_time = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--benchmark_min_time", 20) == 0) has_min_time = true;
    if (std::strncmp(argv[i], "--sizes=", 8) == 0) {
      g_sizes.clear();
      for (const char* p = argv[i] + 8; *p;) {
        char* end = nullptr;
        g_sizes.push_back(std::strtoull(p, &end, 10));
        if (end == p || g_sizes.back() == 0 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "gcomp_bench_codecs: bad %s (expected --sizes=N,N,...)\n", argv[i]);
          return 2;
        }
        p = *end ? end + 1 : end;
      }
      continue;
    }
    args.push_back(argv[i]);
  }
  static char min_time[] = "--benchmark_min_time=0.2";
  if (!has_min_time) args.insert(args.begin() + 1, min_time);
  int args_count = static_cast<int>(args.size());
  args.push_back(nullptr);

  gcomp::set_num_threads(1);  // whatever GCOMP_NUM_THREADS says
  benchmark::Initialize(&args_count, args.data());
  if (benchmark::ReportUnrecognizedArguments(args_count, args.data())) return 1;
  register_all();
  benchmark::AddCustomContext("gcomp_all_threads", std::to_string(all_threads()));
  benchmark::AddCustomContext("gcomp_simd_level", std::string(gcomp::simd_level()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
