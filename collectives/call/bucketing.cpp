// Bucketing (tensor fusion): a model's many tensors are copied into buckets of at most
// bucket_bytes of float32 and each bucket is allreduced as one tensor, so small layers share
// one collective's latency. Tensors with fewer than dense_below elements (biases, norms) are
// fused into one more bucket that is summed uncompressed. Error feedback stays per tensor: each
// tensor's residual is copied into the bucket's before the call and back after it, and so is
// what an algorithm keeps beside the residual (its row's join_state and split_state: the
// bucket's memory made from the tensors' shares of it, and split back). All the state of error
// feedback thus lives in the caller's ErrorFeedback objects: new objects start a new run from
// zero, whatever this communicator did before.
#include <algorithm>
#include <cstring>
#include <string>

#include "algorithm_table.hpp"
#include "communicator_impl.hpp"
#include "device_backend.hpp"
#include "feedback_slot.hpp"
#include "fnv.hpp"
#include "gcomp/communicator.hpp"

namespace gcomp {

namespace {

// A hash of the layout text (the agreement compares it).
std::uint64_t signature_of(std::string_view text) { return detail::Fnv{}.add(text).h; }

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
                         bool shaped, const Codec& codec, const detail::OnDevice* device) {
  if (!shaped) {
    if (std::string why = detail::shapes_missing(codec); !why.empty()) return why;
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
    if (efs[t] && efs[t]->on_device() != (device != nullptr)) {
      return "error-feedback memory " + std::to_string(t) + " is in " +
             (efs[t]->on_device() ? "device" : "host") + " memory but its tensor in " +
             (device ? "device" : "host") + " memory";
    }
    if (efs[t] && device && efs[t]->view().backend() != device->dev) {
      return "error-feedback memory " + std::to_string(t) + " is on another device backend";
    }
  }
  return {};
}

}  // namespace

float* Communicator::Impl::fused_for(std::size_t len, const detail::OnDevice* device,
                                     float* in_place) {
  if (!device) {
    if (in_place) return in_place;
    ws_.fused.resize(len);
    return ws_.fused.data();
  }
  ws_.staging.resize(len);
  if (in_place) return in_place;
  detail::DeviceStage& stage = ws_.device_stage();
  stage.dev = device->dev;
  return static_cast<float*>(stage.get(detail::DeviceStage::kFused, 4 * len));
}

namespace {
// The tensors `members` as one run of memory, in that order (DDP's bucket, whose tensors are
// views of one buffer): the first one's data, else null.
float* contiguous(std::span<const std::span<float>> tensors, std::span<const std::size_t> members) {
  if (members.empty()) return nullptr;
  float* next = tensors[members[0]].data();
  for (std::size_t t : members) {
    if (tensors[t].data() != next) return nullptr;
    next += tensors[t].size();
  }
  return tensors[members[0]].data();
}
}  // namespace

void Communicator::Impl::move_bytes(void* dst, const void* src, std::size_t bytes,
                                    const detail::OnDevice* device) {
  if (!device) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  device->dev->copy(dst, src, bytes, device->stream);
}

void Communicator::Impl::reduce_bucket(std::span<const std::span<float>> tensors,
                                       std::span<const std::size_t> members, const Codec& codec,
                                       std::span<ErrorFeedback* const> efs,
                                       const AllreduceOptions& opt, std::uint64_t sig,
                                       std::span<const MatrixShape> shapes,
                                       const detail::OnDevice* device) {
  Impl& impl = *this;
  const bool with_ef = !efs.empty();
  std::vector<std::uint64_t> begin, count;
  std::vector<ErrorFeedback*> parts_efs;
  std::vector<MatrixShape> member_shapes;
  std::size_t len = 0;
  for (std::size_t t : members) {
    if (!shapes.empty()) member_shapes.push_back(shapes[t]);
    begin.push_back(len);
    count.push_back(tensors[t].size());
    parts_efs.push_back(with_ef ? efs[t] : nullptr);
    len += tensors[t].size();
  }
  // Tensors that already lie in one run are reduced where they are; others are copied together.
  float* const in_place = contiguous(tensors, members);
  float* const fused = fused_for(len, device, in_place);
  ErrorFeedback* bucket = nullptr;
  if (with_ef && !device) {
    bucket = &impl.ws_.bucket_feedback;
    detail::FeedbackSlot::reuse(*bucket, len, false);  // every part written below
  } else if (with_ef) {
    std::unique_ptr<ErrorFeedback>& d = impl.ws_.device_bucket_feedback;
    if (!d || d->size() != len || d->view().backend() != device->dev ||
        d->view().stream() != device->stream) {
      d.reset();  // its memory freed before the new one is taken
      d = std::make_unique<ErrorFeedback>(len, device->dev, device->stream);
    } else {
      d->reset();  // zeros, the slot empty
    }
    bucket = d.get();
  }
  const auto residual_of = [&](ErrorFeedback& ef) {
    return device ? ef.view().data() : ef.residual().data();
  };
  for (std::size_t j = 0; j < members.size(); ++j) {
    const std::span<float> x = tensors[members[j]];
    if (!in_place) move_bytes(fused + begin[j], x.data(), 4 * x.size(), device);
    if (parts_efs[j]) {
      move_bytes(residual_of(*bucket) + begin[j], residual_of(*parts_efs[j]), 4 * x.size(), device);
    } else if (bucket && !device) {
      std::fill_n(residual_of(*bucket) + begin[j], x.size(), 0.0f);  // (device: reset() zeroed)
    }
  }
  const detail::BucketParts parts{impl.rank_, impl.size_, len, begin, count, parts_efs};
  // The states of the rows that run this codec (a low-rank codec's and the others' slots
  // hold different things).
  const CodecProperties props = codec.properties();
  if (bucket) {
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->join_state && detail::row_suits(*row, props)) row->join_state(parts, *bucket);
    }
  }
  if (device) {
    const detail::DeviceCall call{device->dev, device->stream, fused, fused};
    impl.call(impl.ws_.staging, impl.ws_.staging, &codec, bucket, opt, nullptr, sig, &call,
              member_shapes);
  } else {
    const std::span<float> f(fused, len);
    impl.call(f, f, &codec, bucket, opt, nullptr, sig, nullptr, member_shapes);
  }
  if (bucket) {
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->split_state && detail::row_suits(*row, props)) row->split_state(parts, *bucket);
    }
  }
  for (std::size_t j = 0; j < members.size(); ++j) {
    const std::span<float> x = tensors[members[j]];
    if (!in_place) move_bytes(x.data(), fused + begin[j], 4 * x.size(), device);
    if (parts_efs[j]) {
      move_bytes(residual_of(*parts_efs[j]), residual_of(*bucket) + begin[j], 4 * x.size(), device);
    }
  }
}

void Communicator::Impl::reduce_small(std::span<const std::span<float>> tensors,
                                      std::span<const std::size_t> small, AllreduceOptions opt,
                                      std::uint64_t sig, const detail::OnDevice* device) {
  Impl& impl = *this;
  static const Codec none("none");
  std::size_t len = 0;
  for (std::size_t t : small) len += tensors[t].size();
  float* const in_place = contiguous(tensors, small);
  float* const fused = fused_for(len, device, in_place);
  std::size_t off = 0;
  for (std::size_t t : small) {
    if (!in_place) move_bytes(fused + off, tensors[t].data(), 4 * tensors[t].size(), device);
    off += tensors[t].size();
  }
  opt.algorithm = detail::kUncompressed;
  opt.majority_vote = false;
  if (device) {
    const detail::DeviceCall call{device->dev, device->stream, fused, fused};
    impl.call(impl.ws_.staging, impl.ws_.staging, &none, nullptr, opt, nullptr, sig, &call);
  } else {
    const std::span<float> f(fused, len);
    impl.call(f, f, &none, nullptr, opt, nullptr, sig);
  }
  // Summed as they are: the codec was not applied (in the running total too, which the call
  // has counted already).
  impl.total_.compressed -= impl.last_.compressed_calls;
  impl.last_.compressed_calls = 0;
  off = 0;
  for (std::size_t t : small) {
    if (!in_place) move_bytes(tensors[t].data(), fused + off, 4 * tensors[t].size(), device);
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

namespace {
// The views as spans of their addresses, and their memory: all host (device stays null), or all
// in one device backend's memory on one stream; else what is wrong.
std::string spans_of(std::span<const TensorView<float>> views, std::vector<std::span<float>>& out,
                     detail::OnDevice& device, bool& on_device) {
  out.clear();
  on_device = false;
  for (std::size_t t = 0; t < views.size(); ++t) {
    const TensorView<float>& v = views[t];
    if (t == 0) {
      on_device = v.on_device();
      device = {v.backend(), v.stream()};
    } else if (v.on_device() != on_device) {
      return "allreduce_buckets: tensor " + std::to_string(t) + " is in " +
             (v.on_device() ? "device" : "host") + " memory, tensor 0 in " +
             (on_device ? "device" : "host") + " memory (one call takes one memory)";
    } else if (on_device && (v.backend() != device.dev || v.stream() != device.stream)) {
      return "allreduce_buckets: tensor " + std::to_string(t) +
             " is on another device backend or stream than tensor 0";
    }
    out.emplace_back(v.data(), v.size());
  }
  return {};
}
}  // namespace

void Communicator::Impl::view_buckets(std::span<const TensorView<float>> tensors,
                                      std::span<const MatrixShape> shapes, bool shaped,
                                      const Codec& codec, std::span<ErrorFeedback* const> efs,
                                      const BucketOptions& options) {
  std::vector<std::span<float>> spans;
  detail::OnDevice device{};
  bool on_device = false;
  const std::string bad = spans_of(tensors, spans, device, on_device);
  buckets(spans, shapes, shaped, codec, efs, options, on_device ? &device : nullptr, bad);
}

void Communicator::allreduce_buckets(std::span<const TensorView<float>> tensors, const Codec& codec,
                                     std::span<ErrorFeedback* const> efs,
                                     const BucketOptions& options) {
  impl_->view_buckets(tensors, {}, false, codec, efs, options);
}

void Communicator::allreduce_buckets(std::span<const TensorView<float>> tensors,
                                     std::span<const MatrixShape> shapes, const Codec& codec,
                                     std::span<ErrorFeedback* const> efs,
                                     const BucketOptions& options) {
  impl_->view_buckets(tensors, shapes, true, codec, efs, options);
}

void Communicator::Impl::buckets(std::span<const std::span<float>> tensors,
                                 std::span<const MatrixShape> shapes, bool shaped,
                                 const Codec& codec, std::span<ErrorFeedback* const> efs,
                                 const BucketOptions& options, const detail::OnDevice* device,
                                 const std::string& bad_views) {
  const std::span<const MatrixShape> given = shapes;
  if (shapes.size() != tensors.size()) shapes = {};  // reported below
  const Plan p = plan(tensors, shapes, efs.size(), options);
  // Arguments that are wrong on this rank still take part, so that no rank waits.
  if (const std::string bad =
          !bad_views.empty() ? bad_views : bad_memories(tensors, efs, given, shaped, codec, device);
      !bad.empty()) {
    const Error e(Status::invalid_argument, bad);
    call({}, {}, &codec, nullptr, options.allreduce, &e, p.sig);
    throw e;
  }
  CallStats sum;
  for (std::size_t b = 0; b < p.buckets.size(); ++b) {
    AllreduceOptions opt = options.allreduce;
    opt.tensor = options.allreduce.tensor * 1000003 + b;
    reduce_bucket(tensors, p.buckets[b], codec, efs, opt, p.sig ^ (0x9e3779b97f4a7c15ull * (b + 1)),
                  shapes, device);
    sum.add(last_);
  }
  if (p.buckets.empty() && p.small.empty()) {
    // Nothing to sum, but still one agreement: a rank whose list differs must not be left alone.
    static const Codec none("none");
    AllreduceOptions opt = options.allreduce;
    opt.algorithm = detail::kUncompressed;
    opt.majority_vote = false;
    call({}, {}, &none, nullptr, opt, nullptr, p.sig);
    return;
  }
  if (!p.small.empty()) {
    reduce_small(tensors, p.small, options.allreduce, p.sig ^ 0x5bd1e995ull, device);
    sum.add(last_);
  }
  last_ = sum;
}

}  // namespace gcomp
