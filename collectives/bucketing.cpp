// Bucketing (tensor fusion): a model's many tensors are copied into buckets of at most
// bucket_bytes of float32 and each bucket is allreduced as one tensor, so small layers share
// one collective's latency. Tensors with fewer than dense_below elements (biases, norms) are
// fused into one more bucket that is summed uncompressed. Error feedback stays per tensor: each
// tensor's residual is copied into the bucket's before the call and back after it, and so is
// what an algorithm keeps beside the residual (its row's join_memory and split_memory: the
// bucket's memory made from the tensors' shares of it, and split back). All the state of error
// feedback thus lives in the caller's ErrorFeedback objects: new objects start a new run from
// zero, whatever this communicator did before.
#include <algorithm>
#include <cstring>
#include <string>

#include "algorithm_table.hpp"
#include "communicator_impl.hpp"
#include "feedback_slot.hpp"
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
  std::vector<float>& fused = impl_->ws_.fused;
  std::vector<std::uint64_t> begin, count;  // a bucket's tensors in it
  std::vector<ErrorFeedback*> bucket_efs;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::size_t len = 0;
    for (std::size_t t : buckets[b]) len += tensors[t].size();
    fused.resize(len);
    const bool with_ef = !efs.empty();
    ErrorFeedback& bucket_ef = impl_->ws_.bucket_feedback;
    if (with_ef) detail::FeedbackSlot::reuse(bucket_ef, len);  // zeros
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
    // What the algorithms keep beside the tensors' residuals, joined into the bucket's.
    begin.clear();
    count.clear();
    bucket_efs.clear();
    off = 0;
    for (std::size_t t : buckets[b]) {
      begin.push_back(off);
      count.push_back(tensors[t].size());
      bucket_efs.push_back(with_ef ? efs[t] : nullptr);
      off += tensors[t].size();
    }
    const detail::BucketParts parts{impl_->rank_, impl_->size_, len, begin, count, bucket_efs};
    if (with_ef) {
      for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
        if (row->join_memory) row->join_memory(parts, bucket_ef);
      }
    }
    AllreduceOptions opt = options.allreduce;
    opt.tensor = options.allreduce.tensor * 1000003 + b;
    impl_->call(fused, fused, &codec, with_ef ? &bucket_ef : nullptr, opt, nullptr, bucket_sig);
    sum.add(impl_->last_);
    if (with_ef) {
      for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
        if (row->split_memory) row->split_memory(parts, bucket_ef);
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
