// The cost model (include/gcomp/cost_model.hpp; the formulas are explained in
// docs/algorithms.md). Times in seconds; P ranks, n elements, alpha + m beta per message.
#include "gcomp/cost_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "algorithm_table.hpp"
#include "calibration.hpp"
#include "device_backend.hpp"
#include "index_pack.hpp"
#include "model_terms.hpp"
#include "sparse_vector.hpp"

namespace gcomp {

using detail::mean_seconds;
using detail::seconds_since;

ComputeModel measure_reduce_and_merge() {
  ComputeModel c;
  {
    constexpr std::size_t kN = std::size_t{1} << 22;  // beyond the caches, as large tensors are
    std::vector<float> a(kN, 1.0f), b(kN, 2.0f);
    c.reduce = mean_seconds(
                   [&] {
                     const auto start = std::chrono::steady_clock::now();
                     for (std::size_t i = 0; i < kN; ++i) a[i] += b[i];
                     return seconds_since(start);
                   },
                   0.02, 3) /
               kN;
    volatile float sink = a[kN / 2];
    (void)sink;
  }
  {
    constexpr std::size_t kEntries = 1 << 16;
    constexpr std::uint64_t kN = std::uint64_t{1} << 24;
    std::mt19937_64 rng(1);
    detail::SparseVector a, b;
    for (detail::SparseVector* s : {&a, &b}) {
      s->n = kN;
      s->idx.resize(kEntries);
      for (auto& i : s->idx) i = rng() % kN;
      std::sort(s->idx.begin(), s->idx.end());
      s->idx.erase(std::unique(s->idx.begin(), s->idx.end()), s->idx.end());
      s->val.assign(s->idx.size(), 1.0f);
    }
    detail::SparseVector acc;
    c.merge = mean_seconds(
                  [&] {
                    acc = a;
                    const auto start = std::chrono::steady_clock::now();
                    detail::merge_into(acc, b);
                    return seconds_since(start);
                  },
                  0.01, 3) /
              static_cast<double>(a.idx.size() + b.idx.size());
  }
  return c;
}


namespace {
using detail::calibration_input;
using detail::calibration_size;
using detail::DeviceMemory;

// The speeds from one encode and one decode_add (each returning when its work is done) on kN
// elements: per element, and decode per entry for sparse codecs.
template <class Encode, class Decode>
ComputeModel time_codec(const Codec& codec, std::size_t kN, Encode encode, Decode decode) {
  ComputeModel c;
  std::size_t bytes = 0;
  const double enc = mean_seconds(
      [&] {
        const auto start = std::chrono::steady_clock::now();
        bytes = encode();
        return seconds_since(start);
      },
      0.02, 2);
  const double dec = mean_seconds(
      [&] {
        const auto start = std::chrono::steady_clock::now();
        decode(bytes);
        return seconds_since(start);
      },
      0.01, 2);
  c.encode = enc / static_cast<double>(kN);
  const double units = codec.properties().sparse
                           ? std::max<double>(1.0, static_cast<double>(codec.selected(kN)))
                           : static_cast<double>(kN);
  c.decode = dec / units;
  return c;
}

}  // namespace

namespace {
// The row that measures this codec's speeds itself (AlgorithmRow::measure), or null.
const detail::AlgorithmRow* measuring_row(const Codec& codec) {
  const CodecProperties p = codec.properties();
  for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
    if (row->measure && detail::row_suits(*row, p)) return row;
  }
  return nullptr;
}
}  // namespace

ComputeModel measure_compute(const Codec& codec, std::size_t n) {
  const std::size_t kN = calibration_size(n);
  if (const detail::AlgorithmRow* row = measuring_row(codec)) {
    return row->measure(codec, n, TensorView<const float>());
  }
  const std::vector<float> x = calibration_input(kN);
  std::vector<std::byte> out(codec.max_bytes(kN));
  std::vector<float> acc(kN, 0.0f);
  return time_codec(
      codec, kN, [&] { return codec.encode(x, 1, out); },
      [&](std::size_t bytes) {
        decode_add(std::span<const std::byte>(out.data(), bytes), acc, 1.0f);
      });
}

ComputeModel measure_compute(const Codec& codec, std::size_t n, TensorView<const float> like) {
  if (!like.on_device()) return measure_compute(codec, n);
  const detail::DeviceBackend* dev = like.backend();
  void* stream = like.stream();
  if (const detail::AlgorithmRow* row = measuring_row(codec)) return row->measure(codec, n, like);
  const std::size_t kN = calibration_size(n);
  const std::size_t cap = codec.max_bytes(kN);
  DeviceMemory x(dev, 4 * kN), out(dev, cap), acc(dev, 4 * kN);
  {
    const std::vector<float> host = calibration_input(kN);
    dev->copy(x.p, host.data(), 4 * kN, stream);
  }
  dev->zero(static_cast<float*>(acc.p), kN, stream);
  const auto dx = TensorView<const float>::device(static_cast<const float*>(x.p), kN, stream, dev);
  const auto dout = TensorView<std::byte>::device(static_cast<std::byte*>(out.p), cap, stream, dev);
  const auto dacc = TensorView<float>::device(static_cast<float*>(acc.p), kN, stream, dev);
  return time_codec(
      codec, kN,
      [&] {
        const std::size_t bytes = codec.encode(dx, 1, dout);
        dev->sync(stream);
        return bytes;
      },
      [&](std::size_t bytes) {
        decode_add(TensorView<const std::byte>(dout.subview(0, bytes)), dacc);
        dev->sync(stream);
      });
}

NetworkModel network_for_rate(double bits_per_second, double latency_seconds) {
  return {latency_seconds, 8.0 / bits_per_second, 8.0 / bits_per_second, 8.0 / bits_per_second, 0.0};
}

bool auto_candidate(Algorithm a, const ModelInput& in) {
  if (a == Algorithm::automatic) return false;
  const detail::AlgorithmRow& row = detail::algorithm_row(a);
  return detail::row_suits(row, in) && row.candidate(in);
}

namespace {
template <class F>
std::array<double, kAlgorithmCount> per_row(const ModelInput& in, F f) {
  std::array<double, kAlgorithmCount> t;
  t.fill(kNotApplicable);
  for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
    if (!detail::row_suits(*row, in)) continue;
    t[static_cast<int>(row->id)] = f(*row);
  }
  return t;
}
}  // namespace

std::array<double, kAlgorithmCount> predict(const ModelInput& in) {
  return per_row(in, [&](const detail::AlgorithmRow& row) { return row.predict(in); });
}

std::array<double, kAlgorithmCount> predict_bytes(const ModelInput& in) {
  return per_row(in, [&](const detail::AlgorithmRow& row) { return row.bytes(in); });
}

double predict_uncompressed(const ModelInput& in) {
  const double n = in.n;
  return detail::t_allreduce(in, 4 * n, n) + (in.error_feedback ? n * in.compute.reduce : 0.0) +
         (in.average ? n * in.compute.reduce : 0.0);
}

Algorithm fewest_bytes_algorithm(const ModelInput& in) {
  const auto bytes = predict_bytes(in);
  Algorithm best = detail::kUncompressed;
  double best_bytes = kNotApplicable;
  for (int a = 1; a < kAlgorithmCount; ++a) {
    const auto alg = static_cast<Algorithm>(a);
    // auto's candidates (no second compression of a sparse codec's sum); dense only for none
    // (for another codec it sends float32, not the codec's bytes).
    if (!auto_candidate(alg, in) || (alg == detail::kUncompressed && !in.codec_none)) continue;
    if (bytes[a] < best_bytes) {
      best_bytes = bytes[a];
      best = alg;
    }
  }
  return best;
}

Algorithm cheapest(const ModelInput& in) {
  const auto t = predict(in);
  Algorithm best = detail::kUncompressed;
  double best_t = t[static_cast<int>(detail::kUncompressed)];
  for (int a = 1; a < kAlgorithmCount; ++a) {
    const auto alg = static_cast<Algorithm>(a);
    if (!auto_candidate(alg, in)) continue;
    if (t[a] < best_t) {
      best_t = t[a];
      best = alg;
    }
  }
  return best;
}

}  // namespace gcomp
