// What every transport shares (transport.hpp): the clock, the checks and counts of what an
// exchange hands to the engine, the hosts, the transports' names.
#include "transport.hpp"

#include <chrono>
#include <string>

#include "gcomp/error.hpp"
#include "gcomp/timeline.hpp"
#include "waiting.hpp"

namespace gcomp {

const char* transport_name(Transport t) noexcept {
  switch (t) {
    case Transport::mpi:
      return "mpi";
    case Transport::gloo:
      return "gloo";
  }
  return "unknown";
}

namespace detail {

double now() noexcept { return timeline::now(); }

void wire_done(Traffic& t, double start) {
  const double end = now();
  t.seconds += end - start;
  if (timeline::on()) timeline::span("wire", "wire", start, end);
}

void check_announced(std::uint64_t bytes, int from) {
  if (bytes > kMaxMessageBytes) {
    throw Error(Status::bad_payload, "rank " + std::to_string(from) + " announced a message of " +
                                         std::to_string(bytes) + " bytes (more than 2^40)");
  }
}

void count_allgatherv(Traffic& t, std::size_t ranks, std::uint64_t mine, std::uint64_t total) {
  t.sent += (ranks - 1) * (8 + mine);
  t.received += (ranks - 1) * 8 + total - mine;
}

void count_alltoallv(Traffic& t, std::span<const std::uint64_t> sent,
                     std::span<const std::uint64_t> received, std::size_t me) {
  const std::size_t p = sent.size();
  std::uint64_t stotal = 0, rtotal = 0;
  for (std::size_t r = 0; r < p; ++r) {
    stotal += sent[r];
    rtotal += received[r];
  }
  t.sent += 8 * (p - 1) + stotal - sent[me];
  t.received += 8 * (p - 1) + rtotal - received[me];
}

WaitPolicy Net::wait_style() const noexcept { return detail::wait_mode(); }

int Net::ranks_on_this_host() const noexcept {
  int n = 0;
  for (const int h : hosts_) n += h == hosts_[static_cast<std::size_t>(rank_)];
  return n;
}

}  // namespace detail
}  // namespace gcomp
