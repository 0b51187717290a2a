// Transports over some of the ranks (collectives/transport/group_transport.hpp), on the tests' transport
// (MPI or Gloo, GCOMP_TEST_TRANSPORT): the ranks of each parity as two groups at once, each
// group's collectives giving what the same collective over those ranks gives (allgatherv and
// alltoallv of uneven sizes, empty and past Gloo's first part; the reductions in member order,
// the same bits on every member), and a host's ranks and a local index's ranks from the hosts.
// The two levels (collectives/algorithms/two_level.hpp): the chunks' owners on uneven hosts, and the steps
// inside a host giving the host's sum in host-rank order to every rank of it (on MPI every rank
// is on this machine's one host; on Gloo the ranks name two hosts, uneven at odd sizes).
#include "group_transport.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "algorithms.hpp"
#include "gcomp/error.hpp"
#include "gloo_transport.hpp"
#include "mpi_transport.hpp"
#include "mpi_util.hpp"
#include "transport.hpp"
#include "two_level.hpp"

#ifdef GCOMP_TEST_HAVE_GLOO
#include <gloo/rendezvous/file_store.h>
#endif

namespace gcomp {
namespace {

using test::rank;
using test::size;

// A transport of every rank on the tests' engine (each made on Gloo with a prefix of its own).
// On Gloo, host (when not empty) names this rank's host.
std::unique_ptr<detail::Net> parent_transport(const std::string& host = "") {
#ifdef GCOMP_TEST_HAVE_GLOO
  if (test::on_gloo()) {
    static int made = 0;
    gloo::rendezvous::FileStore store(test::store_dir());
    GlooOptions o;
    o.prefix = "group" + std::to_string(made++);
    o.host = host;
    return detail::make_gloo_transport(store, rank(), size(), o);
  }
#endif
  (void)host;
  return detail::make_mpi_transport(MPI_COMM_WORLD);
}

// The ranks of this rank's parity.
std::vector<int> same_parity() {
  std::vector<int> m;
  for (int r = rank() % 2; r < size(); r += 2) m.push_back(r);
  return m;
}

// Bytes that say who sent them to whom: n bytes of from * 31 + to + i.
std::vector<std::byte> bytes_of(int from, int to, std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(from * 31 + to + i);
  return b;
}

TEST(GroupTransport, CollectivesOverEachParityAreThoseOfItsRanks) {
  const auto parent = parent_transport();
  const std::vector<int> members = same_parity();
  const auto g = detail::make_group_transport(*parent, members);
  const int p = static_cast<int>(members.size());
  ASSERT_EQ(g->size(), p);
  ASSERT_EQ(members[static_cast<std::size_t>(g->rank())], rank());
  EXPECT_EQ(g->kind(), parent->kind());
  EXPECT_EQ(g->hosts(), std::vector<int>(static_cast<std::size_t>(p), 0));  // one machine

  // Sizes: empty, small, and past Gloo's first part (1 MiB).
  for (const std::size_t base : {std::size_t{0}, std::size_t{5}, std::size_t{1} << 20}) {
    detail::Traffic t;
    detail::Gathered all;
    const auto size_of = [&](int r) { return base ? base + static_cast<std::size_t>(r) * 3 : 0; };
    g->allgatherv_bytes(bytes_of(g->rank(), 0, size_of(g->rank())), all, t);
    ASSERT_EQ(all.sizes.size(), static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      const auto got = all.of(r);
      EXPECT_EQ(std::vector<std::byte>(got.begin(), got.end()), bytes_of(r, 0, size_of(r)))
          << "allgatherv block " << r << " at " << base;
    }
    std::vector<std::vector<std::byte>> to(static_cast<std::size_t>(p)), from;
    for (int d = 0; d < p; ++d) {
      to[static_cast<std::size_t>(d)] = bytes_of(g->rank(), d, base ? base + d + g->rank() : 0);
    }
    g->alltoallv_bytes(to, from, t);
    ASSERT_EQ(from.size(), static_cast<std::size_t>(p));
    for (int s = 0; s < p; ++s) {
      EXPECT_EQ(from[static_cast<std::size_t>(s)],
                bytes_of(s, g->rank(), base ? base + g->rank() + s : 0))
          << "alltoallv from " << s << " at " << base;
    }
  }

  // The float sum in member order, on every member alike (checked against rank 0 of the group
  // through the group's own allgatherv of the result); the maxima.
  const std::size_t n = 1000;
  std::vector<float> x(n), sum(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 0.1f * static_cast<float>(rank() + 1) + 1e-3f * i;
  g->allreduce(x.data(), sum.data(), n, detail::Reduction::sum_float);
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (std::size_t m = 0; m < members.size(); ++m) {
      want += 0.1f * static_cast<float>(members[m] + 1) + 1e-3f * i;
    }
    ASSERT_EQ(sum[i], want) << i;
  }
  double mx = rank();
  g->allreduce(&mx, &mx, 1, detail::Reduction::max_double);  // in place
  EXPECT_EQ(mx, members.back());
  std::int64_t words[2] = {rank(), -rank()};
  g->allreduce(words, words, 2, detail::Reduction::max_int64);
  EXPECT_EQ(words[0], members.back());
  EXPECT_EQ(words[1], -members.front());
  std::uint64_t count = 1;
  g->allreduce(&count, &count, 1, detail::Reduction::sum_uint64);
  EXPECT_EQ(count, members.size());
  g->barrier();

  // Point to point and shifts, ranks mapped: each member to the next, from the previous.
  const int next = (g->rank() + 1) % p, prev = (g->rank() + p - 1) % p;
  detail::Traffic t;
  std::vector<std::byte> got;
  g->sendrecv_bytes(next, bytes_of(g->rank(), next, 7), prev, got, t);
  EXPECT_EQ(got, bytes_of(prev, g->rank(), 7));
  std::vector<std::byte> fixed(9);
  g->shift_bytes(next, bytes_of(g->rank(), next, 9), prev, fixed);
  EXPECT_EQ(fixed, bytes_of(prev, g->rank(), 9));
  std::vector<std::byte> send(4 * static_cast<std::size_t>(p)), recv(send.size());
  for (int d = 0; d < p; ++d) {
    const auto b = bytes_of(g->rank(), d, 4);
    std::copy(b.begin(), b.end(), send.begin() + 4 * d);
  }
  g->alltoall_bytes(send, recv, 4);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(std::vector<std::byte>(recv.begin() + 4 * s, recv.begin() + 4 * s + 4),
              bytes_of(s, g->rank(), 4));
  }
  EXPECT_THROW(g->agree(nullptr, nullptr, 0, 0, {}, [] { return std::string(); }), Error);
  parent->barrier();
}

TEST(GroupTransport, MembersAreCheckedBeforeUse) {
  const auto parent = parent_transport();
  const auto code = [&](std::vector<int> m) {
    try {
      detail::make_group_transport(*parent, std::move(m));
      return Status::ok;
    } catch (const Error& e) {
      return e.code();
    }
  };
  EXPECT_EQ(code({}), Status::internal);
  EXPECT_EQ(code({rank(), rank()}), Status::internal);
  EXPECT_EQ(code({rank(), size()}), Status::internal);
  if (size() > 1) {
    EXPECT_EQ(code({(rank() + 1) % size()}), Status::internal);  // not this rank
    EXPECT_EQ(code({size() - 1, 0}), Status::internal);          // not ascending
  }
  EXPECT_EQ(code({rank()}), Status::ok);  // alone
  parent->barrier();
}

// A transport that only says its hosts, for the members' functions.
class HostsOnly final : public detail::Net {
 public:
  HostsOnly(int rank, std::vector<int> hosts)
      : Net(gcomp::Transport::mpi, rank, static_cast<int>(hosts.size())) {
    hosts_ = std::move(hosts);
  }
  void allreduce(const void*, void*, std::size_t, detail::Reduction) override {}
  void barrier() override {}
  void allgatherv_bytes(std::span<const std::byte>, detail::Gathered&, detail::Traffic&) override {}
  void alltoallv_bytes(const std::vector<std::vector<std::byte>>&,
                       std::vector<std::vector<std::byte>>&, detail::Traffic&) override {}
  void send_bytes(int, std::span<const std::byte>, detail::Traffic&) override {}
  void recv_bytes(int, std::vector<std::byte>&, detail::Traffic&) override {}
  using Net::sendrecv_bytes;
  void sendrecv_bytes(int, std::span<const std::byte>, int, std::vector<std::byte>&,
                      detail::Traffic&) override {}
  void shift_bytes(int, std::span<const std::byte>, int, std::span<std::byte>) override {}
  void alltoall_bytes(std::span<const std::byte>, std::span<std::byte>, std::size_t) override {}
  void agree(const std::uint64_t*, std::uint64_t*, std::size_t, std::uint64_t,
             const detail::WaitLimits&, const std::function<std::string()>&) override {}
};

TEST(GroupTransport, AHostsRanksAndALocalIndexsRanks) {
  // Hosts of 2, 3 and 1 ranks, the second's not contiguous: ranks 0 1 | 2 3 5 | 4.
  const std::vector<int> hosts = {0, 0, 2, 2, 4, 2};
  const std::vector<std::vector<int>> host_of = {{0, 1},    {0, 1}, {2, 3, 5},
                                                 {2, 3, 5}, {4},    {2, 3, 5}};
  // Local index 0: ranks 0, 2, 4; 1: ranks 1, 3; 2: rank 5.
  const std::vector<std::vector<int>> index_of = {{0, 2, 4}, {1, 3},    {0, 2, 4},
                                                  {1, 3},    {0, 2, 4}, {5}};
  for (int r = 0; r < 6; ++r) {
    const HostsOnly t(r, hosts);
    EXPECT_EQ(detail::host_members(t), host_of[static_cast<std::size_t>(r)]) << r;
    EXPECT_EQ(detail::index_members(t), index_of[static_cast<std::size_t>(r)]) << r;
  }
  HostsOnly t(4, hosts);
  const auto g = detail::make_group_transport(t, {0, 2, 4});
  EXPECT_EQ(g->rank(), 2);
  EXPECT_EQ(g->hosts(), (std::vector<int>{0, 1, 2}));  // three hosts
  const auto h = detail::make_group_transport(t, {2, 3, 4, 5});
  EXPECT_EQ(h->hosts(), (std::vector<int>{0, 0, 2, 0}));
}

TEST(TwoLevel, ChunksAndTheirOwnersOnUnevenHosts) {
  // Hosts of 2, 3 and 1 ranks (ranks 0 1 | 2 3 5 | 4): 3 chunks; chunk c's owners are the
  // (c mod L)-th rank of each host of L ranks.
  const std::vector<int> hosts = {0, 0, 2, 2, 4, 2};
  const std::vector<std::vector<int>> owners = {{0, 2, 4}, {1, 3, 4}, {0, 5, 4}};
  const std::vector<std::vector<int>> owned = {{0, 2}, {1}, {0}, {1}, {0, 1, 2}, {2}};
  for (int r = 0; r < 6; ++r) {
    const detail::Levels l = detail::levels_of(HostsOnly(r, hosts));
    EXPECT_EQ(l.hosts, 3);
    EXPECT_EQ(l.width, 3);
    EXPECT_EQ(l.owners, owners);
    EXPECT_EQ(l.owned, owned[static_cast<std::size_t>(r)]) << r;
    EXPECT_EQ(l.host_ranks[static_cast<std::size_t>(l.local)], r);
    ASSERT_EQ(l.chunk_groups.size(), l.owned.size());
    for (std::size_t k = 0; k < l.owned.size(); ++k) {
      std::vector<int> g = owners[static_cast<std::size_t>(l.owned[k])];
      std::sort(g.begin(), g.end());
      EXPECT_EQ(l.chunk_groups[k], g) << r;
    }
  }
  // Two ranks on each of two hosts: each rank one chunk, its owners the ranks of its index.
  const detail::Levels even = detail::levels_of(HostsOnly(3, {0, 0, 2, 2}));
  EXPECT_EQ(even.owned, std::vector<int>{1});
  EXPECT_EQ(even.chunk_groups, (std::vector<std::vector<int>>{{1, 3}}));
}

TEST(TwoLevel, TheStepsInsideAHostGiveEveryRankItsHostsSum) {
  // Gloo: the first half of the ranks (rounded up) on one host, the rest on another.
  const int half = (size() + 1) / 2;
  const auto parent = parent_transport("host-" + std::to_string(rank() < half ? 0 : 1));
  const detail::Levels l = detail::levels_of(*parent);
  // (On MPI, GCOMP_HOST may name the hosts instead: the ctest layouts.)
  if (test::on_gloo() || !std::getenv("GCOMP_HOST")) {
    EXPECT_EQ(l.hosts, test::on_gloo() && size() > 1 ? 2 : 1);
  }
  const std::vector<int> mates = detail::host_members(*parent);
  ASSERT_EQ(l.host_ranks, mates);
  const auto host = detail::make_group_transport(*parent, mates);
  const auto value = [](int r, std::size_t i) {
    return 0.1f * static_cast<float>(r + 1) + 1e-3f * static_cast<float>(i);
  };
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = value(rank(), i);
    // The host's sum, in host-rank order.
    std::vector<float> want(n);
    for (std::size_t i = 0; i < n; ++i) {
      float s = value(mates[0], i);
      for (std::size_t j = 1; j < mates.size(); ++j) s = s + value(mates[j], i);
      want[i] = s;
    }
    detail::Traffic t;
    std::vector<std::vector<float>> sums;
    detail::host_reduce_scatter(*host, l, x, sums, t);
    ASSERT_EQ(sums.size(), l.owned.size());
    for (std::size_t k = 0; k < sums.size(); ++k) {
      const auto c = static_cast<std::uint64_t>(l.owned[k]);
      const auto w = static_cast<std::uint64_t>(l.width);
      const std::vector<float> chunk(
          want.begin() + static_cast<std::ptrdiff_t>(detail::chunk_bound(n, c, w)),
          want.begin() + static_cast<std::ptrdiff_t>(detail::chunk_bound(n, c + 1, w)));
      EXPECT_EQ(sums[k], chunk) << "chunk " << c << " of n = " << n;
    }
    std::vector<float> out(n, -1.0f);
    detail::host_allgather(*host, l, sums, out, t);
    EXPECT_EQ(out, want) << "n = " << n;
  }
  parent->barrier();
}

}  // namespace
}  // namespace gcomp
