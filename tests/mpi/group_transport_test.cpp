// Transports over some of the ranks (collectives/group_transport.hpp), on the tests' transport
// (MPI or Gloo, GCOMP_TEST_TRANSPORT): the ranks of each parity as two groups at once, each
// group's collectives giving what the same collective over those ranks gives (allgatherv and
// alltoallv of uneven sizes, empty and past Gloo's first part; the reductions in member order,
// the same bits on every member), and a host's ranks and a local index's ranks from the hosts.
#include "group_transport.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gcomp/error.hpp"
#include "mpi_util.hpp"
#include "transport.hpp"

#ifdef GCOMP_TEST_HAVE_GLOO
#include <gloo/rendezvous/file_store.h>
#endif

namespace gcomp {
namespace {

using test::rank;
using test::size;

// A transport of every rank on the tests' engine (each made on Gloo with a prefix of its own).
std::unique_ptr<detail::Transport> parent_transport() {
#ifdef GCOMP_TEST_HAVE_GLOO
  if (test::on_gloo()) {
    static int made = 0;
    gloo::rendezvous::FileStore store(test::store_dir());
    GlooOptions o;
    o.prefix = "group" + std::to_string(made++);
    return detail::make_gloo_transport(store, rank(), size(), o);
  }
#endif
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
class HostsOnly final : public detail::Transport {
 public:
  HostsOnly(int rank, std::vector<int> hosts)
      : Transport(gcomp::Transport::mpi, rank, static_cast<int>(hosts.size())) {
    hosts_ = std::move(hosts);
  }
  void allreduce(const void*, void*, std::size_t, detail::Reduction) override {}
  void barrier() override {}
  void allgatherv_bytes(std::span<const std::byte>, detail::Gathered&, detail::Traffic&) override {}
  void alltoallv_bytes(const std::vector<std::vector<std::byte>>&,
                       std::vector<std::vector<std::byte>>&, detail::Traffic&) override {}
  void send_bytes(int, std::span<const std::byte>, detail::Traffic&) override {}
  void recv_bytes(int, std::vector<std::byte>&, detail::Traffic&) override {}
  using Transport::sendrecv_bytes;
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

}  // namespace
}  // namespace gcomp
