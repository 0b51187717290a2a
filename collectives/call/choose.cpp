// Auto's side of the Communicator: the codec speeds it measures per (spec, size class), the
// cost model's input for a call, and the choice among the algorithms (the model's first, then
// what the learner measured; planning/learner.hpp, docs/algorithms.md "Learning from its own
// calls").
#include <array>
#include <span>

#include "algorithm_table.hpp"
#include "auto_choice.hpp"
#include "communicator_impl.hpp"
#include "learner.hpp"

namespace gcomp {

using detail::calibration_key;
using detail::default_bytes;
using detail::default_sent;
using detail::model_input;

void Communicator::Impl::place(ModelInput& in) const {
  in.hosts = hosts_;
  in.ranks_per_host = ranks_per_host_;
  in.host_network = host_network_;
  in.host_memory = detail::host_memory_shared(const_cast<detail::Workspace&>(ws_));
}

ComputeModel Communicator::Impl::with_shared_speeds(ComputeModel c) const {
  c.reduce = reduce_speed_;
  c.merge = merge_speed_;
  return c;
}

ComputeModel Communicator::Impl::measure_agreed(const Codec& codec, std::size_t n,
                                                TensorView<const float> device_input,
                                                std::uint64_t key) {
  // All ranks at once (the caller has just lined them up), so that ranks sharing a node compete
  // as they will in the calls; the slowest rank's speeds are agreed. Nothing here may throw
  // before the allreduce: the other ranks are waiting in it.
  double speeds[2] = {0, 0};
  try {
    const ComputeModel m = device_input.on_device()
                               ? timing_->device_codec_speeds(codec, n, device_input)
                               : timing_->codec_speeds(codec, n);
    speeds[0] = m.encode;
    speeds[1] = m.decode;
  } catch (...) {  // out of memory: the other ranks' numbers stand
  }
  double agreed[2];
  net_->allreduce(speeds, agreed, 2, detail::Reduction::max_double);
  const ComputeModel m{agreed[0], agreed[1], 0, 0};
  calibrated_[key] = m;
  return m;
}

ComputeModel Communicator::Impl::compute_model(const Codec& codec, std::size_t n) {
  const std::uint64_t key = calibration_key(codec, n);
  auto it = calibrated_.find(key);
  if (it == calibrated_.end()) it = calibrated_.emplace(key, timing_->codec_speeds(codec, n)).first;
  return with_shared_speeds(it->second);
}

std::array<double, kAlgorithmCount> Communicator::predict(const Codec& codec, std::size_t n,
                                                          std::size_t sent, bool error_feedback) {
  const std::uint64_t s = sent ? sent : default_sent(codec, n);
  ModelInput in =
      model_input(codec, n, s, default_bytes(codec, n, s), impl_->size_, impl_->network_,
                  impl_->compute_model(codec, n), false, error_feedback);
  impl_->place(in);
  return gcomp::predict(in);
}

double Communicator::predict_uncompressed(std::size_t n) {
  static const Codec none("none");
  return gcomp::predict_uncompressed(model_input(none, n, 0, 4 * n, impl_->size_, impl_->network_,
                                                 impl_->compute_model(none, n), false, false));
}

Choice Communicator::Impl::auto_choice(const AutoQuery& q, bool with_pending,
                                       std::vector<detail::Option>* considered) const {
  ModelInput in = model_input(q.codec, q.n, q.sent, q.bytes, size_, network_, q.compute, q.average,
                              q.error_feedback);
  in.allow_uncompressed = q.allow_uncompressed;
  in.shapes = q.shapes;
  place(in);
  const auto t = gcomp::predict(in);
  std::array<detail::Option, kAlgorithmCount + 1> options;
  std::size_t m = 0;
  for (int a = 1; a < kAlgorithmCount; ++a) {
    if (auto_candidate(static_cast<Algorithm>(a), in)) {
      options[m++] = {{static_cast<Algorithm>(a), true}, t[a]};
    }
  }
  if (in.allow_uncompressed && !in.codec_none) {
    options[m++] = {{detail::kUncompressed, false}, gcomp::predict_uncompressed(in)};
  }
  if (considered) considered->assign(options.begin(), options.begin() + m);
  return learner_->choose(detail::AutoLearner::group_of(q.codec.spec(), q.n),
                          std::span<const detail::Option>(options.data(), m),
                          with_pending ? pending_key_ : 0, pending_seconds_);
}

Choice Communicator::choose(const Codec& codec, std::size_t n, std::size_t sent,
                            bool allow_uncompressed) {
  const std::uint64_t key = calibration_key(codec, n);
  if (impl_->calibrated_.find(key) == impl_->calibrated_.end()) {
    // Collective, as in a call, so that every rank's answer is the call's (a rank's own speeds
    // can tip a near tie the other way).
    impl_->measure_agreed(codec, n, TensorView<const float>(), key);
  }
  const std::uint64_t s = sent ? sent : default_sent(codec, n);
  return impl_->auto_choice({.codec = codec,
                             .n = n,
                             .sent = s,
                             .bytes = default_bytes(codec, n, s),
                             .compute = impl_->compute_model(codec, n),
                             .allow_uncompressed = allow_uncompressed});
}

}  // namespace gcomp
