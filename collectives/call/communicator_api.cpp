// The Communicator's methods around the call (communicator.cpp holds the call's steps): what it
// says of itself, allreduce's ways in (host and device tensors), the statistics' sums, the
// stall and timeout settings, and abandon.
#include <cstdint>
#include <string>
#include <vector>

#include "communicator_impl.hpp"
#include "gcomp/communicator.hpp"
#include "stall_report.hpp"

namespace gcomp {

int Communicator::rank() const noexcept { return impl_->rank_; }
int Communicator::size() const noexcept { return impl_->size_; }
Transport Communicator::transport() const noexcept { return impl_->net_->kind(); }
const std::vector<int>& Communicator::hosts() const noexcept { return impl_->net_->hosts(); }

const NetworkModel& Communicator::network() const noexcept { return impl_->network_; }
const CallStats& Communicator::last_stats() const noexcept { return impl_->last_; }
const TotalStats& Communicator::total_stats() const noexcept { return impl_->total_; }

const NetworkModel& Communicator::host_network() const noexcept { return impl_->host_network_; }

void Communicator::allreduce(std::span<const float> in, std::span<float> out, const Codec& codec,
                             ErrorFeedback* ef, const AllreduceOptions& options) {
  impl_->call(in, out, &codec, ef, options, nullptr, 0);
}

void Communicator::allreduce(TensorView<const float> in, TensorView<float> out, const Codec& codec,
                             ErrorFeedback* ef, const AllreduceOptions& options) {
  if (!in.on_device() && !out.on_device()) {
    return impl_->call(in.host(), out.host(), &codec, ef, options, nullptr, 0);
  }
  if (in.on_device() != out.on_device() || in.backend() != out.backend() ||
      in.stream() != out.stream()) {
    const Error e(Status::invalid_argument,
                  "allreduce: input and output must both be device tensors on one stream");
    impl_->call({}, {}, &codec, ef, options, &e, 0);  // tell the other ranks, then throw
    throw e;
  }
  const detail::DeviceCall call{in.backend(), in.stream(), in.data(), out.data()};
  std::vector<float>& host = impl_->ws_.staging;
  host.resize(in.size());
  if (in.size() != out.size()) {
    const Error e(Status::invalid_argument, "input of " + std::to_string(in.size()) +
                                                " elements but output of " +
                                                std::to_string(out.size()));
    impl_->call({}, {}, &codec, ef, options, &e, 0);
    throw e;
  }
  impl_->call(host, host, &codec, ef, options, nullptr, 0, &call);
}

void Communicator::set_stall_seconds(double seconds) {
  detail::check_wait_seconds(seconds, "stall_seconds");
  impl_->limits_.stall = seconds;
}
void Communicator::set_timeout_seconds(double seconds) {
  detail::check_wait_seconds(seconds, "timeout_seconds");
  impl_->limits_.timeout = seconds;
}
double Communicator::stall_seconds() const noexcept { return impl_->limits_.stall; }
double Communicator::timeout_seconds() const noexcept { return impl_->limits_.timeout; }
std::uint64_t Communicator::calls() const noexcept { return impl_->calls_; }

void Communicator::abandon(Status reason, const std::string& why) {
  const Error e(reason, why);
  impl_->call({}, {}, nullptr, nullptr, {}, &e, 0);
}

namespace {
// What both statistics sum alike: calls, bytes, seconds, calls per algorithm.
template <class Stats>
void add_shared(Stats& t, const CallStats& s) {
  t.calls += s.calls;
  t.bytes_sent += s.bytes_sent;
  t.bytes_received += s.bytes_received;
  t.encode_seconds += s.encode_seconds;
  t.comm_seconds += s.comm_seconds;
  t.decode_seconds += s.decode_seconds;
  t.agree_seconds += s.agree_seconds;
  for (int a = 0; a < kAlgorithmCount; ++a) t.by_algorithm[a] += s.by_algorithm[a];
}
}  // namespace

void CallStats::add(const CallStats& s) noexcept {
  add_shared(*this, s);
  algorithm = s.algorithm;
  compressed = compressed && s.compressed;
  compressed_calls += s.compressed_calls;
}

void TotalStats::add(const CallStats& s) noexcept {
  add_shared(*this, s);
  compressed += s.compressed_calls;
}

}  // namespace gcomp
