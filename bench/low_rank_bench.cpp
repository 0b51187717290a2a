// PowerSGD's kernels (compressors/low_rank.hpp) beside Eigen's float32 GEMM for the same products,
// what a C++ user would write instead: P = M Q, Q = M^T P and the reconstruction P Q^T, on the
// wide MLP's matrices (784 x 2048, 2048 x 2048) and the small one's (512 x 256), at ranks 1 and
// 4. gcomp's accumulate in float64 in a fixed order, so that every SIMD level and thread count
// gives the same bits (docs/algorithms.md, "low_rank"); Eigen's float32 blocking does not
// promise that. Counters: GFLOP/s (2 rows cols r per product) and the matrix's GB/s.
//   build/bin/gcomp_bench_low_rank --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <Eigen/Dense>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "low_rank.hpp"

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Case {
  std::size_t rows, cols, r;
  std::vector<float> m, q, p, out;
  std::vector<double> work;
  Case(std::size_t rows_, std::size_t cols_, std::size_t r_)
      : rows(rows_),
        cols(cols_),
        r(r_),
        m(rows * cols),
        q(cols * r),
        p(rows * r),
        out(rows * cols),
        work(cols * r) {
    std::mt19937 g(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& v : m) v = d(g);
    for (float& v : q) v = d(g);
    for (float& v : p) v = d(g);
  }
};

enum class Op { multiply, multiply_t, reconstruct };

void counters(benchmark::State& st, const Case& c) {
  const double flops = 2.0 * static_cast<double>(c.rows * c.cols * c.r);
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GB/s"] = benchmark::Counter(4e-9 * static_cast<double>(c.rows * c.cols),
                                           benchmark::Counter::kIsIterationInvariantRate);
}

void bm_gcomp(benchmark::State& st, std::size_t rows, std::size_t cols, std::size_t r, Op op) {
  Case c(rows, cols, r);
  for (auto _ : st) {
    switch (op) {
      case Op::multiply:
        gcomp::detail::lr_multiply(c.m.data(), rows, cols, c.q.data(), r, c.p.data());
        break;
      case Op::multiply_t:
        gcomp::detail::lr_multiply_t(c.m.data(), rows, cols, c.p.data(), r, c.q.data(),
                                     c.work.data());
        break;
      case Op::reconstruct:
        gcomp::detail::lr_reconstruct(c.p.data(), c.q.data(), rows, cols, r, 1.0, c.out.data(), 1.0,
                                      nullptr, nullptr, c.work.data());
        break;
    }
    benchmark::DoNotOptimize(c.out.data());
    benchmark::DoNotOptimize(c.p.data());
    benchmark::DoNotOptimize(c.q.data());
  }
  counters(st, c);
}

void bm_eigen(benchmark::State& st, std::size_t rows, std::size_t cols, std::size_t r, Op op) {
  Case c(rows, cols, r);
  const Eigen::Map<const RowMajor> m(c.m.data(), static_cast<Eigen::Index>(rows),
                                     static_cast<Eigen::Index>(cols));
  Eigen::Map<RowMajor> q(c.q.data(), static_cast<Eigen::Index>(cols), static_cast<Eigen::Index>(r));
  Eigen::Map<RowMajor> p(c.p.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(r));
  Eigen::Map<RowMajor> out(c.out.data(), static_cast<Eigen::Index>(rows),
                           static_cast<Eigen::Index>(cols));
  for (auto _ : st) {
    switch (op) {
      case Op::multiply:
        p.noalias() = m * q;
        break;
      case Op::multiply_t:
        q.noalias() = m.transpose() * p;
        break;
      case Op::reconstruct:
        out.noalias() = p * q.transpose();
        break;
    }
    benchmark::DoNotOptimize(c.out.data());
    benchmark::DoNotOptimize(c.p.data());
    benchmark::DoNotOptimize(c.q.data());
  }
  counters(st, c);
}

void register_all() {
  const struct { std::size_t rows, cols; } shapes[] = {{784, 2048}, {2048, 2048}, {512, 256}};
  const std::pair<Op, const char*> ops[] = {
      {Op::multiply, "MQ"}, {Op::multiply_t, "MtP"}, {Op::reconstruct, "PQt"}};
  for (const auto& s : shapes) {
    for (std::size_t r : {1u, 4u}) {
      for (const auto& [op, name] : ops) {
        const std::string tail = std::string(name) + "/" + std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols) + "/r" + std::to_string(r);
        benchmark::RegisterBenchmark(("gcomp/" + tail).c_str(), bm_gcomp, s.rows, s.cols, r, op)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("eigen/" + tail).c_str(), bm_eigen, s.rows, s.cols, r, op)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
