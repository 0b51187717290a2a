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

namespace {

// Which tensors go into which bucket, decided from sizes only, and the signature of that plan.
struct Plan {
  std::vector<std::vector<std::size_t>> buckets;  // tensor indices, in order
  std::vector<std::size_t> small;                 // fewer than dense_below elements
  std::uint64_t sig = 0;
};

Plan plan(std::span<const std::span<float>> tensors, std::size_t memories,
          const BucketOptions& options) {
  Plan p;
  std::string layout = "buckets|" + std::to_string(options.bucket_bytes) + "|" +
                       std::to_string(options.dense_below) + "|" + std::to_string(memories);
  std::size_t fill = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::size_t n = tensors[t].size();
    layout += '|';
    layout += std::to_string(n);
    if (n < options.dense_below) {
      p.small.push_back(t);
      continue;
    }
    const std::size_t bytes = 4 * n;
    if (p.buckets.empty() || fill + bytes > options.bucket_bytes) {
      p.buckets.emplace_back();
      fill = 0;
    }
    p.buckets.back().push_back(t);
    fill += bytes;
  }
  p.sig = signature_of(layout);
  return p;
}

// What is wrong with the memories on this rank ("" when nothing).
std::string bad_memories(std::span<const std::span<float>> tensors,
                         std::span<ErrorFeedback* const> efs) {
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
}

}  // namespace

void Communicator::Impl::reduce_bucket(std::span<const std::span<float>> tensors,
                                       std::span<const std::size_t> members, const Codec& codec,
                                       std::span<ErrorFeedback* const> efs,
                                       const AllreduceOptions& opt, std::uint64_t sig) {
  Impl& impl = *this;
  std::vector<float>& fused = impl.ws_.fused;
  ErrorFeedback& bucket_ef = impl.ws_.bucket_feedback;
  const bool with_ef = !efs.empty();
  std::vector<std::uint64_t> begin, count;
  std::vector<ErrorFeedback*> parts_efs;
  std::size_t len = 0;
  for (std::size_t t : members) {
    begin.push_back(len);
    count.push_back(tensors[t].size());
    parts_efs.push_back(with_ef ? efs[t] : nullptr);
    len += tensors[t].size();
  }
  fused.resize(len);
  if (with_ef) detail::FeedbackSlot::reuse(bucket_ef, len);  // zeros
  for (std::size_t j = 0; j < members.size(); ++j) {
    const std::span<float> x = tensors[members[j]];
    std::memcpy(fused.data() + begin[j], x.data(), 4 * x.size());
    if (parts_efs[j]) {
      const auto r = parts_efs[j]->residual();
      std::memcpy(bucket_ef.residual().data() + begin[j], r.data(), 4 * r.size());
    }
  }
  const detail::BucketParts parts{impl.rank_, impl.size_, len, begin, count, parts_efs};
  if (with_ef) {
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->join_memory) row->join_memory(parts, bucket_ef);
    }
  }
  impl.call(fused, fused, &codec, with_ef ? &bucket_ef : nullptr, opt, nullptr, sig);
  if (with_ef) {
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->split_memory) row->split_memory(parts, bucket_ef);
    }
  }
  for (std::size_t j = 0; j < members.size(); ++j) {
    const std::span<float> x = tensors[members[j]];
    std::memcpy(x.data(), fused.data() + begin[j], 4 * x.size());
    if (parts_efs[j]) {
      std::memcpy(parts_efs[j]->residual().data(), bucket_ef.residual().data() + begin[j],
                  4 * x.size());
    }
  }
}

void Communicator::Impl::reduce_small(std::span<const std::span<float>> tensors,
                                      std::span<const std::size_t> small, AllreduceOptions opt,
                                      std::uint64_t sig) {
  Impl& impl = *this;
  static const Codec none("none");
  std::vector<float>& fused = impl.ws_.fused;
  std::size_t len = 0;
  for (std::size_t t : small) len += tensors[t].size();
  fused.resize(len);
  std::size_t off = 0;
  for (std::size_t t : small) {
    std::memcpy(fused.data() + off, tensors[t].data(), 4 * tensors[t].size());
    off += tensors[t].size();
  }
  opt.algorithm = Algorithm::dense;
  opt.majority_vote = false;
  impl.call(fused, fused, &none, nullptr, opt, nullptr, sig);
  // Summed as they are: the codec was not applied (in the running total too, which the call
  // has counted already).
  impl.total_.compressed -= impl.last_.compressed_calls;
  impl.last_.compressed_calls = 0;
  off = 0;
  for (std::size_t t : small) {
    std::memcpy(tensors[t].data(), fused.data() + off, 4 * tensors[t].size());
    off += tensors[t].size();
  }
}

void Communicator::allreduce_buckets(std::span<const std::span<float>> tensors, const Codec& codec,
                                     std::span<ErrorFeedback* const> efs,
                                     const BucketOptions& options) {
  const Plan p = plan(tensors, efs.size(), options);
  // Arguments that are wrong on this rank still take part, so that no rank waits.
  if (const std::string bad = bad_memories(tensors, efs); !bad.empty()) {
    const Error e(Status::invalid_argument, bad);
    impl_->call({}, {}, &codec, nullptr, options.allreduce, &e, p.sig);
    throw e;
  }
  CallStats sum;
  for (std::size_t b = 0; b < p.buckets.size(); ++b) {
    AllreduceOptions opt = options.allreduce;
    opt.tensor = options.allreduce.tensor * 1000003 + b;
    impl_->reduce_bucket(tensors, p.buckets[b], codec, efs, opt,
                         p.sig ^ (0x9e3779b97f4a7c15ull * (b + 1)));
    sum.add(impl_->last_);
  }
  if (p.buckets.empty() && p.small.empty()) {
    // Nothing to sum, but still one agreement: a rank whose list differs must not be left alone.
    static const Codec none("none");
    AllreduceOptions opt = options.allreduce;
    opt.algorithm = Algorithm::dense;
    opt.majority_vote = false;
    impl_->call({}, {}, &none, nullptr, opt, nullptr, p.sig);
    return;
  }
  if (!p.small.empty()) {
    impl_->reduce_small(tensors, p.small, options.allreduce, p.sig ^ 0x5bd1e995ull);
    sum.add(impl_->last_);
  }
  impl_->last_ = sum;
}

}  // namespace gcomp
