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

Plan plan(std::span<const std::span<float>> tensors, std::span<const MatrixShape> shapes,
          std::size_t memories, const BucketOptions& options) {
  Plan p;
  std::string layout = "buckets|" + std::to_string(options.bucket_bytes) + "|" +
                       std::to_string(options.dense_below) + "|" + std::to_string(memories) +
                       (shapes.empty() ? "" : "|shaped");
  std::size_t fill = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::size_t n = tensors[t].size();
    layout += '|';
    layout += std::to_string(n);
    if (t < shapes.size()) {
      layout += 'x';
      layout += std::to_string(shapes[t].cols);
    }
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

// What is wrong with the memories (or the shapes, where given) on this rank ("" when nothing).
std::string bad_memories(std::span<const std::span<float>> tensors,
                         std::span<ErrorFeedback* const> efs, std::span<const MatrixShape> shapes,
                         bool shaped, const Codec& codec) {
  if (!shaped && codec.properties().low_rank) {
    return codec.spec() +
           " needs each tensor's shape: use Communicator::allreduce_buckets with shapes (the C "
           "API's gcomp_allreduce_buckets_shaped, the module's allreduce_buckets with shapes=)";
  }
  if (shaped && shapes.size() != tensors.size()) {
    return std::to_string(shapes.size()) + " shapes for " + std::to_string(tensors.size()) +
           " tensors";
  }
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const MatrixShape& s = shapes[t];
    if (s.cols == 0 ? tensors[t].size() != 0 || s.rows != 0
                    : s.rows != tensors[t].size() / s.cols || tensors[t].size() % s.cols != 0) {
      return "tensor " + std::to_string(t) + " of " + std::to_string(tensors[t].size()) +
             " elements has shape " + std::to_string(s.rows) + " x " + std::to_string(s.cols);
    }
  }
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
                                       const AllreduceOptions& opt, std::uint64_t sig,
                                       std::span<const MatrixShape> shapes) {
  Impl& impl = *this;
  std::vector<float>& fused = impl.ws_.fused;
  ErrorFeedback& bucket_ef = impl.ws_.bucket_feedback;
  const bool with_ef = !efs.empty();
  std::vector<std::uint64_t> begin, count;
  std::vector<ErrorFeedback*> parts_efs;
  std::vector<detail::MatrixBlock> matrices;
  std::size_t len = 0;
  for (std::size_t t : members) {
    if (!shapes.empty()) matrices.push_back({len, shapes[t].rows, shapes[t].cols});
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
  // The memories of the rows that run this codec (a low-rank codec's and the others' slots
  // hold different things).
  const CodecProperties props = codec.properties();
  if (with_ef) {
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->join_memory && detail::row_suits(*row, props)) row->join_memory(parts, bucket_ef);
    }
  }
  impl.call(fused, fused, &codec, with_ef ? &bucket_ef : nullptr, opt, nullptr, sig, nullptr,
            matrices);
  if (with_ef) {
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->split_memory && detail::row_suits(*row, props)) row->split_memory(parts, bucket_ef);
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
  impl_->buckets(tensors, {}, false, codec, efs, options);
}

void Communicator::allreduce_buckets(std::span<const std::span<float>> tensors,
                                     std::span<const MatrixShape> shapes, const Codec& codec,
                                     std::span<ErrorFeedback* const> efs,
                                     const BucketOptions& options) {
  impl_->buckets(tensors, shapes, true, codec, efs, options);
}

void Communicator::Impl::buckets(std::span<const std::span<float>> tensors,
                                 std::span<const MatrixShape> shapes, bool shaped,
                                 const Codec& codec, std::span<ErrorFeedback* const> efs,
                                 const BucketOptions& options) {
  const std::span<const MatrixShape> given = shapes;
  if (shapes.size() != tensors.size()) shapes = {};  // reported below
  const Plan p = plan(tensors, shapes, efs.size(), options);
  // Arguments that are wrong on this rank still take part, so that no rank waits.
  if (const std::string bad = bad_memories(tensors, efs, given, shaped, codec); !bad.empty()) {
    const Error e(Status::invalid_argument, bad);
    call({}, {}, &codec, nullptr, options.allreduce, &e, p.sig);
    throw e;
  }
  CallStats sum;
  for (std::size_t b = 0; b < p.buckets.size(); ++b) {
    AllreduceOptions opt = options.allreduce;
    opt.tensor = options.allreduce.tensor * 1000003 + b;
    reduce_bucket(tensors, p.buckets[b], codec, efs, opt, p.sig ^ (0x9e3779b97f4a7c15ull * (b + 1)),
                  shapes);
    sum.add(last_);
  }
  if (p.buckets.empty() && p.small.empty()) {
    // Nothing to sum, but still one agreement: a rank whose list differs must not be left alone.
    static const Codec none("none");
    AllreduceOptions opt = options.allreduce;
    opt.algorithm = Algorithm::dense;
    opt.majority_vote = false;
    call({}, {}, &none, nullptr, opt, nullptr, p.sig);
    return;
  }
  if (!p.small.empty()) {
    reduce_small(tensors, p.small, options.allreduce, p.sig ^ 0x5bd1e995ull);
    sum.add(last_);
  }
  last_ = sum;
}

}  // namespace gcomp
