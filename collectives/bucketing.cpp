// Bucketing (tensor fusion): a model's many tensors are copied into buckets of at most
// bucket_bytes of float32 and each bucket is allreduced as one tensor, so small layers share
// one collective's latency. Tensors with fewer than dense_below elements (biases, norms) are
// fused into one more bucket that is summed uncompressed. Error feedback stays per tensor: each
// tensor's residual is copied into the bucket's before the call and back after it, and so is
// compressed_reduce_scatter's owner-side memory: this rank owns one chunk of each bucket, and
// each tensor's ErrorFeedback::secondary keeps the part of that chunk that falls in the tensor.
// All the state of error feedback thus lives in the caller's ErrorFeedback objects: new objects
// start a new run from zero, whatever this communicator did before.
#include <algorithm>
#include <cstring>
#include <string>

#include "algorithms.hpp"
#include "communicator_impl.hpp"
#include "gcomp/communicator.hpp"

namespace gcomp {

std::uint64_t signature_of(std::string_view text);

void Communicator::allreduce_buckets(std::span<const std::span<float>> tensors,
                                     const Codec& codec, std::span<ErrorFeedback* const> efs,
                                     const BucketOptions& options) {
  // The plan: which tensors go into which bucket, decided from sizes only.
  std::string layout = "buckets|" + std::to_string(options.bucket_bytes) + "|" +
                       std::to_string(options.dense_below) + "|" + std::to_string(efs.size());
  std::vector<std::vector<std::size_t>> buckets;
  std::vector<std::size_t> small;
  std::size_t fill = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::size_t n = tensors[t].size();
    layout += '|';
    layout += std::to_string(n);
    if (n < options.dense_below) {
      small.push_back(t);
      continue;
    }
    const std::size_t bytes = 4 * n;
    if (buckets.empty() || fill + bytes > options.bucket_bytes) {
      buckets.emplace_back();
      fill = 0;
    }
    buckets.back().push_back(t);
    fill += bytes;
  }
  const std::uint64_t sig = signature_of(layout);

  // Arguments that are wrong on this rank still take part, so that no rank waits.
  const auto bad = [&]() -> std::string {
    if (!efs.empty() && efs.size() != tensors.size()) {
      return std::to_string(efs.size()) + " error-feedback memories for " +
             std::to_string(tensors.size()) + " tensors";
    }
    for (std::size_t t = 0; t < efs.size(); ++t) {
      if (efs[t] && efs[t]->size() != tensors[t].size()) {
        return "error-feedback memory " + std::to_string(t) + " holds " +
               std::to_string(efs[t]->size()) + " elements, its tensor " +
               std::to_string(tensors[t].size());
      }
    }
    return {};
  }();
  if (!bad.empty()) {
    const Error e(Status::invalid_argument, bad);
    impl_->call({}, {}, &codec, nullptr, options.allreduce, &e, sig);
    throw e;
  }

  CallStats sum;
  thread_local std::vector<float> fused;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::size_t len = 0;
    for (std::size_t t : buckets[b]) len += tensors[t].size();
    fused.resize(len);
    const bool with_ef = !efs.empty();
    ErrorFeedback bucket_ef(with_ef ? len : 0);
    std::size_t off = 0;
    for (std::size_t t : buckets[b]) {
      const std::span<float> x = tensors[t];
      std::memcpy(fused.data() + off, x.data(), 4 * x.size());
      if (with_ef && efs[t]) {
        const auto r = efs[t]->residual();
        std::memcpy(bucket_ef.residual().data() + off, r.data(), 4 * r.size());
      }
      off += x.size();
    }
    const std::uint64_t bucket_sig = sig ^ (0x9e3779b97f4a7c15ull * (b + 1));
    // The owner-side memory of this rank's chunk [lo, hi) of the bucket (the chunks of
    // compressed_reduce_scatter), gathered from the tensors' shares of it: all there and of
    // the right sizes, or it starts from zero.
    const auto p = static_cast<std::uint64_t>(impl_->size_),
               me = static_cast<std::uint64_t>(impl_->rank_);
    const auto lo = static_cast<std::size_t>(detail::chunk_bound(len, me, p));
    const auto hi = static_cast<std::size_t>(detail::chunk_bound(len, me + 1, p));
    const auto share = [&](std::size_t begin, std::size_t n) {
      const std::size_t a = std::max(begin, lo), z = std::min(begin + n, hi);
      return std::pair<std::size_t, std::size_t>{a, z > a ? z - a : 0};
    };
    if (with_ef) {
      std::vector<float>& owner = bucket_ef.secondary();
      owner.assign(hi - lo, 0.0f);
      bool whole = true;
      off = 0;
      for (std::size_t t : buckets[b]) {
        const auto [at, n] = share(off, tensors[t].size());
        off += tensors[t].size();
        if (n == 0 || !efs[t]) continue;  // a tensor without memory contributes zeros
        if (efs[t]->secondary().size() != n) {
          whole = false;
          break;
        }
        std::memcpy(owner.data() + (at - lo), efs[t]->secondary().data(), 4 * n);
      }
      if (!whole) owner.clear();  // sized (to zeros) by the algorithm on first use
    }
    AllreduceOptions opt = options.allreduce;
    opt.tensor = options.allreduce.tensor * 1000003 + b;
    impl_->call(fused, fused, &codec, with_ef ? &bucket_ef : nullptr, opt, nullptr, bucket_sig);
    sum.add(impl_->last_);
    if (with_ef && bucket_ef.secondary().size() == hi - lo) {
      off = 0;
      for (std::size_t t : buckets[b]) {
        const auto [at, n] = share(off, tensors[t].size());
        off += tensors[t].size();
        if (n == 0 || !efs[t]) continue;
        efs[t]->secondary().assign(bucket_ef.secondary().begin() + static_cast<std::ptrdiff_t>(at - lo),
                                   bucket_ef.secondary().begin() + static_cast<std::ptrdiff_t>(at - lo + n));
      }
    }
    off = 0;
    for (std::size_t t : buckets[b]) {
      const std::span<float> x = tensors[t];
      std::memcpy(x.data(), fused.data() + off, 4 * x.size());
      if (with_ef && efs[t]) {
        std::memcpy(efs[t]->residual().data(), bucket_ef.residual().data() + off, 4 * x.size());
      }
      off += x.size();
    }
  }
  static const Codec none("none");
  if (buckets.empty() && small.empty()) {
    // Nothing to sum, but still one agreement: a rank whose list differs must not be left alone.
    AllreduceOptions opt = options.allreduce;
    opt.algorithm = Algorithm::dense;
    opt.majority_vote = false;
    impl_->call({}, {}, &none, nullptr, opt, nullptr, sig);
    return;
  }
  if (!small.empty()) {
    std::size_t len = 0;
    for (std::size_t t : small) len += tensors[t].size();
    fused.resize(len);
    std::size_t off = 0;
    for (std::size_t t : small) {
      std::memcpy(fused.data() + off, tensors[t].data(), 4 * tensors[t].size());
      off += tensors[t].size();
    }
    AllreduceOptions opt = options.allreduce;
    opt.algorithm = Algorithm::dense;
    opt.majority_vote = false;
    impl_->call(fused, fused, &none, nullptr, opt, nullptr, sig ^ 0x5bd1e995ull);
    impl_->last_.compressed_calls = 0;  // summed as they are: the codec was not applied
    sum.add(impl_->last_);
    off = 0;
    for (std::size_t t : small) {
      std::memcpy(tensors[t].data(), fused.data() + off, 4 * tensors[t].size());
      off += tensors[t].size();
    }
  }
  impl_->last_ = sum;
}

}  // namespace gcomp
