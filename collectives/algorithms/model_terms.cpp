// The terms the rows' models are written in (model_terms.hpp; the formulas are explained in
// docs/algorithms.md). Times in seconds; P ranks, n elements, alpha + m beta per message.
#include "model_terms.hpp"

#include <algorithm>
#include <cmath>

#include "algorithm_table.hpp"
#include "index_pack.hpp"

namespace gcomp {

namespace detail {

double log2_ceil(int p) { return p <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(p))); }

double union_size(double n, double k, double m, bool shared) {
  if (shared || n <= 0) return std::min(k, n);
  const double d = std::min(1.0, k / n);
  return n * (1.0 - std::pow(1.0 - d, m));
}

double t_allreduce(const ModelInput& in, double bytes, double elements) {
  if (in.two_level_allreduce) return t_two_level_allreduce(in, bytes, elements);
  const double p = in.ranks;
  const double l = log2_ceil(in.ranks);
  const auto& net = in.network;
  if (in.ranks <= 1) return 0;
  if (bytes <= 2048) return l * (net.alpha + bytes * net.beta + elements * in.compute.reduce);
  if (net.beta_allreduce > 0) {
    // Fitted at 4 MiB and (on fast networks) 32 MiB; log-linear between, flat outside.
    double beta = net.beta_allreduce;
    if (net.beta_allreduce_large > 0) {
      const double f = std::clamp(std::log2(bytes / 4194304.0) / 3.0, 0.0, 1.0);
      beta += f * (net.beta_allreduce_large - net.beta_allreduce);
    }
    return 2 * l * net.alpha + 2 * (p - 1) / p * bytes * beta;
  }
  return 2 * l * net.alpha + 2 * (p - 1) / p * bytes * net.beta +
         (p - 1) / p * elements * in.compute.reduce;
}

double t_allgatherv(const ModelInput& in, double bytes) {
  if (in.ranks <= 1) return 0;
  const double p = in.ranks;
  const double l = log2_ceil(in.ranks);
  const double rounds = bytes * p < 512.0 * 1024 ? l : p - 1;
  return (l + rounds) * in.network.alpha + (p - 1) * bytes * in.network.beta;
}

double beta_for(const ModelInput& in, double flows) {
  const auto& net = in.network;
  const double one = net.beta_one > 0 ? net.beta_one : net.beta;
  if (in.ranks <= 1) return net.beta;
  return one + (net.beta - one) * std::clamp((flows - 1) / (in.ranks - 1), 0.0, 1.0);
}

double t_alltoallv(const ModelInput& in, double bytes) {
  if (in.ranks <= 1) return 0;
  const double p = in.ranks;
  const double beta = in.network.beta_all > 0 ? in.network.beta_all : in.network.beta;
  return (log2_ceil(in.ranks) + p - 1) * in.network.alpha + (p - 1) / p * bytes * beta;
}

LocalTerms local_terms(const ModelInput& in) {
  const auto& c = in.compute;
  // With error feedback the encode first adds the residual to the input: one more pass of n
  // adds (the codec's speed is measured without it).
  return {in.n * c.reduce, in.average ? in.n * c.reduce : 0.0,
          in.n * c.encode + (in.error_feedback ? in.n * c.reduce : 0.0),
          in.sparse ? in.sent * c.decode : in.n * c.decode};
}

double stream_entry_bytes(double entries, double range, double value_bytes) {
  const double density = range > 0 ? std::min(1.0, entries / range) : 1.0;
  return value_bytes + expected_packed_index_bytes(density);
}

double stream_entry_bytes(const ModelInput& in) {
  return stream_entry_bytes(in.sent, in.n, in.value_bytes);
}

double predict_region_exchange(const ModelInput& in) {
  const double n = in.n, p = in.ranks;
  const auto& c = in.compute;
  const double merges =
      std::min(in.sent * (p / 2 + 1) * c.merge, n * c.reduce + in.sent * c.merge);
  return in.sent * c.decode + t_alltoallv(in, in.sent * stream_entry_bytes(in) + 8 * p) + merges;
}

double bytes_region_exchange(const ModelInput& in) {
  const double p = in.ranks;
  return (p - 1) / p * in.sent * stream_entry_bytes(in) + 16 * (p - 1);
}

}  // namespace detail

}  // namespace gcomp
