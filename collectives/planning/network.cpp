// The network measurement behind the cost model (declared in include/gcomp/cost_model.hpp;
// docs/algorithms.md, "The network"): alpha from a ping-pong, beta from every rank sending at
// once, beta_one from one flow alone, beta_all from an all-to-all and beta_allreduce fitted to
// the transport's own allreduce (MPI's, or Gloo's ring). Each rank returns its own numbers; the
// Communicator agrees them by MAX.
#include "network.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "gcomp/cost_model.hpp"
#include "transport.hpp"

namespace gcomp {

namespace detail {

std::vector<int> deal_over_hosts(std::span<const int> host_of) {
  std::vector<std::vector<int>> hosts;  // ranks per host, hosts in order of first appearance
  std::vector<int> index_of(host_of.size(), -1);
  for (std::size_t r = 0; r < host_of.size(); ++r) {
    const auto h = static_cast<std::size_t>(host_of[r]);
    if (index_of[h] < 0) {
      index_of[h] = static_cast<int>(hosts.size());
      hosts.emplace_back();
    }
    hosts[static_cast<std::size_t>(index_of[h])].push_back(static_cast<int>(r));
  }
  std::vector<int> dealt;
  dealt.reserve(host_of.size());
  for (std::size_t round = 0; dealt.size() < host_of.size(); ++round) {
    for (const auto& ranks : hosts) {
      if (round < ranks.size()) dealt.push_back(ranks[round]);
    }
  }
  return dealt;
}

}  // namespace detail

namespace {

// The rank this one ping-pongs with for alpha, and whether it sends first; -1 for none.
std::pair<int, bool> ping_partner(const detail::Net& net) {
  const std::vector<int> dealt = detail::deal_over_hosts(net.hosts());
  const auto at =
      static_cast<std::size_t>(std::find(dealt.begin(), dealt.end(), net.rank()) - dealt.begin());
  const std::size_t other = at ^ 1;
  if (other >= dealt.size()) return {-1, false};
  return {dealt[other], at % 2 == 0};
}

}  // namespace

namespace detail {

NetworkModel measure_network(Net& net, bool fit_allreduce) {
  const int rank = net.rank(), size = net.size();
  NetworkModel m;
  if (size == 1) return m;
  detail::Traffic t;
  // alpha: ping-pong of 8 bytes between rank pairs, across hosts where there are several (see
  // ping_partner); half the median round trip.
  const auto [peer, first] = ping_partner(net);
  std::vector<std::byte> small(8), got;
  if (peer >= 0) {
    std::vector<double> trips;
    for (int it = 0; it < 23; ++it) {
      const double start = now();
      if (first) {
        net.send_bytes(peer, small, t);
        net.recv_bytes(peer, got, t);
      } else {
        net.recv_bytes(peer, got, t);
        net.send_bytes(peer, small, t);
      }
      if (it >= 3) trips.push_back(now() - start);
    }
    std::nth_element(trips.begin(), trips.begin() + trips.size() / 2, trips.end());
    m.alpha = trips[trips.size() / 2] / 2;
  }
  // beta: every rank sends 4 MiB to the next and receives from the previous, all at once.
  constexpr std::size_t kBytes = std::size_t{4} << 20;
  std::vector<std::byte> big(kBytes);
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  double best = 1e30;
  for (int rep = 0; rep < 2; ++rep) {
    net.barrier();
    const double start = now();
    got.resize(kBytes);
    net.shift_bytes(next, big, prev, got);
    best = std::min(best, now() - start);
  }
  m.beta = std::max(0.0, best - m.alpha) / static_cast<double>(kBytes);
  // beta_one: rank 0 sends 4 MiB to rank 1 while the others wait.
  {
    net.barrier();
    double one = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      const double start = now();
      if (rank == 0) net.send_bytes(1, big, t);
      if (rank == 1) net.recv_bytes(0, got, t);
      one = std::min(one, now() - start);
    }
    m.beta_one = rank <= 1 ? std::max(0.0, one - m.alpha) / static_cast<double>(kBytes) : 0.0;
  }
  // beta_allreduce: the transport's own allreduce of 1M floats, fitted to its bandwidth term;
  // and where that is fast (under 40 ms, the slowest rank's), of 8M floats too, since beyond the
  // caches its copies and sums cost more per byte (twice as much on this project's VMs).
  if (fit_allreduce) {
    const double p = size;
    const double rounds = 2 * std::ceil(std::log2(p));
    const auto fit = [&](std::size_t floats, int reps) {
      std::vector<float> a(floats, 1.0f), b(floats);
      double ar = 1e30;
      for (int rep = 0; rep < reps; ++rep) {
        net.barrier();
        const double start = now();
        net.allreduce(a.data(), b.data(), floats, Reduction::sum_float);
        ar = std::min(ar, now() - start);
      }
      double slowest = ar;  // every rank must take the same branch below
      net.allreduce(&ar, &slowest, 1, Reduction::max_double);
      return std::pair{slowest, std::max(0.0, slowest - rounds * m.alpha) /
                                    (2 * (p - 1) / p * 4.0 * static_cast<double>(floats))};
    };
    const auto [seconds, beta] = fit(std::size_t{1} << 20, 3);
    m.beta_allreduce = beta;
    if (size > 1 && seconds < 0.04) m.beta_allreduce_large = fit(std::size_t{1} << 23, 2).second;
  }
  // beta_all: every rank sends 4 MiB spread over all the others, all at once (all-to-all).
  if (size > 2) {
    const std::size_t block = kBytes / static_cast<std::size_t>(size - 1);
    std::vector<std::byte> sbuf(block * static_cast<std::size_t>(size)), rbuf(sbuf.size());
    best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      net.barrier();
      const double start = now();
      net.alltoall_bytes(sbuf, rbuf, block);
      best = std::min(best, now() - start);
    }
    m.beta_all = std::max(0.0, best - m.alpha) / static_cast<double>(block * (size - 1));
  } else {
    m.beta_all = m.beta;
  }
  return m;
}

}  // namespace detail
}  // namespace gcomp
