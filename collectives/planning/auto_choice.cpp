// Auto's pieces that need no Communicator: the default Timing (what it measures), the calibration
// key of a (spec, size class), the cost model's input for a call, and what a call cost. The
// Communicator's choice with them is call/choose.cpp.
#include "auto_choice.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <ctime>
#include <limits>
#include <string>

#include "codec_impl.hpp"
#include "fnv.hpp"
#include "learner.hpp"
#include "sparse_vector.hpp"

namespace gcomp {

using detail::calibration_key;
using detail::default_bytes;
using detail::default_sent;
using detail::Fnv;
using detail::model_input;

ComputeModel Timing::codec_speeds(const Codec& codec, std::size_t n) {
  return measure_compute(codec, n);
}
ComputeModel Timing::device_codec_speeds(const Codec& codec, std::size_t n,
                                         TensorView<const float> input) {
  return measure_compute(codec, n, input);
}
ComputeModel Timing::shared_speeds() { return measure_reduce_and_merge(); }
double Timing::call_seconds(const Codec&, std::size_t, Choice, double seconds) { return seconds; }

namespace detail {

double thread_cpu_seconds() noexcept {
  timespec t{};
  // No clock: NaN, and learned_cost takes the wall time.
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0)
    return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double learned_cost(WaitPolicy mode, int threads, bool device, double wall, double cpu) noexcept {
  const bool burns = mode == WaitPolicy::spin || mode == WaitPolicy::yield;
  return burns && threads == 1 && !device && cpu >= 0 ? std::min(cpu, wall) : wall;
}

std::uint64_t calibration_key(const Codec& codec, std::size_t n, bool device) {
  const int log2n = n == 0 ? 0 : std::bit_width(std::min<std::size_t>(n, std::size_t{1} << 24));
  return Fnv{}.add(codec.spec()).add(static_cast<std::uint64_t>(log2n) * 2 + (device ? 1 : 0)).h;
}

ModelInput model_input(const Codec& codec, std::size_t n, std::uint64_t sent, std::uint64_t bytes,
                       int ranks, const NetworkModel& net, const ComputeModel& compute,
                       bool average, bool ef) {
  ModelInput in;
  in.n = static_cast<double>(n);
  in.ranks = ranks;
  in.network = net;
  in.compute = compute;
  in.codec_none = codec.kind() == CodecKind::none;
  in.error_feedback = ef;
  in.sparse = codec.properties().sparse;
  in.shared_support = codec.properties().shared_support;
  in.sent = static_cast<double>(sent);
  in.payload_bytes = static_cast<double>(bytes);
  const int value_bytes = codec.properties().value_bytes;
  in.value_bytes = value_bytes > 0 ? value_bytes : 4;
  in.average = average;
  in.codec = &codec;
  return in;
}

std::uint64_t default_sent(const Codec& codec, std::size_t n) {
  return codec.properties().sparse ? codec.selected(n) : 0;
}

std::uint64_t default_bytes(const Codec& codec, std::size_t n, std::uint64_t sent) {
  return codec.expected_bytes(n, static_cast<std::size_t>(sent));
}

}  // namespace detail

}  // namespace gcomp
