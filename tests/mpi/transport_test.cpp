// The transports themselves (collectives/transport/transport.hpp), on whichever the run uses
// (GCOMP_TEST_TRANSPORT): the Communicator says which it is, knows the ranks' hosts, and on Gloo
// takes its options (a host of its own per rank, a bad rank or interface refused) and keeps
// Communicators of different prefixes apart.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/error.hpp"
#include "gcomp/gcomp_mpi.h"
#include "mpi_util.hpp"

#ifdef GCOMP_TEST_HAVE_GLOO
#include <gloo/rendezvous/file_store.h>
#endif

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::status_of;
using test::world;

TEST(Transport, TheCommunicatorSaysWhichItRunsOn) {
  EXPECT_EQ(world().transport(), test::on_gloo() ? Transport::gloo : Transport::mpi);
  EXPECT_STREQ(transport_name(world().transport()), test::on_gloo() ? "gloo" : "mpi");
  EXPECT_EQ(world().comm() == MPI_COMM_NULL, test::on_gloo());
  EXPECT_EQ(world().rank(), rank());
  EXPECT_EQ(world().size(), size());
}

// The tests' ranks all run on this machine, in one network namespace: one host, named by rank 0.
TEST(Transport, RanksOfOneMachineShareAHost) {
  if (std::getenv("GCOMP_HOST")) GTEST_SKIP() << "GCOMP_HOST names hosts here";
  EXPECT_EQ(world().hosts(), std::vector<int>(static_cast<std::size_t>(size()), 0));
}

// Every algorithm on tiny tensors, sizes 0 and 1 included (the point-to-point paths send empty
// messages there): the same bits on every rank, and where the result is the sum of what the
// codecs sent, MPI's reference sum.
TEST(Transport, EveryAlgorithmOnTinyAndEmptyTensors) {
  for (const char* spec : {"topk:k=1", "qsgd:bits=4,bucket=4", "none"}) {
    const Codec codec(spec);
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
      for (int a = 1; a < kAlgorithmCount; ++a) {
        const auto alg = static_cast<Algorithm>(a);
        if (alg == Algorithm::low_rank) continue;  // needs shapes
        AllreduceOptions opt;
        opt.algorithm = alg;
        opt.seed = 3;
        const bool fits = status_of([&] {
                            std::vector<float> probe(n, 1.0f);
                            world().allreduce(probe, codec, nullptr, opt);
                          }) == Status::ok;
        if (!fits) continue;  // the algorithm does not take this codec: every rank said so
        const auto x = test::integers(n, 17 + a);
        std::vector<float> out(n, -1.0f);
        world().allreduce(x, out, codec, nullptr, opt);
        // Every rank holds the same bits.
        std::vector<float> lo(n), hi(n);
        MPI_Allreduce(out.data(), lo.data(), static_cast<int>(n), MPI_FLOAT, MPI_MIN,
                      MPI_COMM_WORLD);
        MPI_Allreduce(out.data(), hi.data(), static_cast<int>(n), MPI_FLOAT, MPI_MAX,
                      MPI_COMM_WORLD);
        EXPECT_EQ(lo, hi) << spec << " " << algorithm_name(alg) << " n=" << n;
        // The sum of what the codecs sent, but where the owners re-encode or select again (or
        // encode the host's sum: two_level's result is tests/mpi/two_level_test.cpp's).
        if (alg == Algorithm::compressed_reduce_scatter ||
            alg == Algorithm::sparse_reduce_scatter || alg == Algorithm::two_level) {
          continue;
        }
        const auto ref = test::mpi_sum(test::contribution(codec, x, 3));
        const auto tol = test::order_tolerance(test::contribution(codec, x, 3));
        for (std::size_t i = 0; i < n; ++i) {
          EXPECT_NEAR(out[i], ref[i], tol[i]) << spec << " " << algorithm_name(alg) << " n=" << n;
        }
      }
    }
  }
}

// Messages on both sides of the size that goes whole in a point-to-point message's first part
// on Gloo (1 MiB less its 8-byte size at up to 9 ranks: a payload of n floats and its header,
// below it for the smallest n here, past it for the largest), several calls back to back (the
// receives posted in advance are taken in turn), and an all-to-all of uneven blocks (sparse
// split's partitions of top-k 50%): sums exact where the codec sends integers whole.
TEST(Transport, MessagesAroundTheFirstPartBackToBack) {
  const Codec none("none");
  for (const std::size_t n : {std::size_t{262100}, std::size_t{262142}, std::size_t{262200}}) {
    for (const Algorithm alg : {Algorithm::allgather, Algorithm::dense}) {
      AllreduceOptions opt;
      opt.algorithm = alg;
      for (std::uint32_t call = 0; call < 3; ++call) {
        const auto x = test::integers(n, 40 + call);
        std::vector<float> out(n, -1.0f);
        world().allreduce(x, out, none, nullptr, opt);
        EXPECT_EQ(out, test::mpi_sum(x)) << algorithm_name(alg) << " n=" << n << " call " << call;
      }
    }
  }
  const Codec half("topk:ratio=0.5");
  AllreduceOptions opt;
  opt.algorithm = Algorithm::sparse_split;
  opt.seed = 5;
  for (std::uint32_t call = 0; call < 3; ++call) {
    const auto x = test::integers(600000, 70 + call);
    std::vector<float> out(x.size(), -1.0f);
    world().allreduce(x, out, half, nullptr, opt);
    EXPECT_EQ(out, test::mpi_sum(test::contribution(half, x, 5))) << "call " << call;
  }
}

#ifdef GCOMP_TEST_HAVE_GLOO

std::unique_ptr<gloo::rendezvous::FileStore> store() {
  return std::make_unique<gloo::rendezvous::FileStore>(test::store_dir());
}

// Where the host's name cannot tell hosts apart (network namespaces of one machine share it),
// the options (or GCOMP_HOST) name them.
TEST(Gloo, NamedHostsAreHostsOfTheirOwn) {
  if (!test::on_gloo()) GTEST_SKIP() << "the Gloo run's";
  auto s = store();
  GlooOptions o;
  o.prefix = "named-hosts";
  o.host = "host-" + std::to_string(rank() / 2);  // two ranks a host
  Communicator c(*s, rank(), size(), test::test_network(), nullptr, o);
  ASSERT_EQ(c.transport(), Transport::gloo);
  for (int r = 0; r < size(); ++r) EXPECT_EQ(c.hosts()[static_cast<std::size_t>(r)], r / 2 * 2);
  std::vector<float> x(100, 1.0f);
  c.allreduce(x, Codec("none"));
  EXPECT_EQ(x[0], static_cast<float>(size()));
}

// Two Communicators of different prefixes live side by side, each with its own connections.
TEST(Gloo, CommunicatorsOfTwoPrefixesAreApart) {
  if (!test::on_gloo()) GTEST_SKIP() << "the Gloo run's";
  auto s = store();
  GlooOptions a, b;
  a.prefix = "apart-a";
  b.prefix = "apart-b";
  Communicator ca(*s, rank(), size(), test::test_network(), nullptr, a);
  Communicator cb(*s, rank(), size(), test::test_network(), nullptr, b);
  std::vector<float> x(1000, 1.0f), y(1000, 2.0f);
  ca.allreduce(x, Codec("topk:ratio=0.5"));
  cb.allreduce(y, Codec("none"));
  EXPECT_EQ(y[0], 2.0f * static_cast<float>(size()));
  EXPECT_EQ(ca.total_stats().calls, 1u);
  EXPECT_EQ(cb.total_stats().calls, 1u);
}

// What can be checked before connecting fails on the rank that has it, at once.
TEST(Gloo, BadOptionsAreRefusedBeforeConnecting) {
  if (!test::on_gloo()) GTEST_SKIP() << "the Gloo run's";
  auto s = store();
  std::string msg;
  EXPECT_EQ(status_of([&] { Communicator c(*s, size(), size()); }, &msg), Status::invalid_argument);
  EXPECT_NE(msg.find("rank " + std::to_string(size())), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { Communicator c(*s, 0, 0); }), Status::invalid_argument);
  GlooOptions o;
  o.prefix = "";
  EXPECT_EQ(status_of([&] { Communicator c(*s, rank(), size(), o); }), Status::invalid_argument);
  o.prefix = "bad-interface";
  o.interface = "no-such-interface0";
  EXPECT_EQ(status_of([&] { Communicator c(*s, rank(), size(), o); }, &msg),
            Status::invalid_argument);
  EXPECT_NE(msg.find("no-such-interface0"), std::string::npos) << msg;
  o.interface = "";
  o.connect_seconds = -1;
  EXPECT_EQ(status_of([&] { Communicator c(*s, rank(), size(), o); }), Status::invalid_argument);
}

// GCOMP_GLOO_SOCKETS is every rank's to say alike: where ranks differ, or one says neither 0 nor
// 1, every rank fails at the rendezvous with an error naming the variable (no rank hangs or runs
// on without the others' sockets).
TEST(Gloo, RanksThatDisagreeOnTheSocketsAllFail) {
  if (!test::on_gloo() || size() < 2) GTEST_SKIP() << "the Gloo run's, with two ranks";
  const char* was = std::getenv("GCOMP_GLOO_SOCKETS");
  const std::string before = was ? was : "";
  auto s = store();
  GlooOptions o;
  o.connect_seconds = 30;
  std::string msg;
  o.prefix = "sockets-differ";
  setenv("GCOMP_GLOO_SOCKETS", rank() == 0 ? "0" : "1", 1);
  EXPECT_EQ(status_of([&] { Communicator c(*s, rank(), size(), o); }, &msg),
            Status::invalid_argument);
  EXPECT_NE(msg.find("GCOMP_GLOO_SOCKETS differs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0 on rank 0"), std::string::npos) << msg;
  o.prefix = "sockets-bad";
  setenv("GCOMP_GLOO_SOCKETS", rank() == size() - 1 ? "yes" : "1", 1);
  EXPECT_EQ(status_of([&] { Communicator c(*s, rank(), size(), o); }, &msg),
            Status::invalid_argument);
  EXPECT_NE(msg.find("GCOMP_GLOO_SOCKETS on rank " + std::to_string(size() - 1)),
            std::string::npos) << msg;
  if (rank() == size() - 1) EXPECT_NE(msg.find("'yes'"), std::string::npos) << msg;
  // Alike again (0 on every rank): the Communicator runs, on Gloo's connections alone.
  o.prefix = "sockets-off";
  setenv("GCOMP_GLOO_SOCKETS", "0", 1);
  {
    Communicator c(*s, rank(), size(), test::test_network(), nullptr, o);
    std::vector<float> x(100, 1.0f);
    c.allreduce(x, Codec("topk:ratio=0.5"));
    EXPECT_EQ(c.total_stats().calls, 1u);
  }
  if (was) {
    setenv("GCOMP_GLOO_SOCKETS", before.c_str(), 1);
  } else {
    unsetenv("GCOMP_GLOO_SOCKETS");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A rank that never comes to the rendezvous: the others fail after connect_seconds with the
// transport's error instead of waiting for ever.
TEST(Gloo, ARankThatNeverConnectsFailsTheRendezvous) {
  if (!test::on_gloo() || size() < 2) GTEST_SKIP() << "the Gloo run's, with two ranks";
  auto s = store();
  GlooOptions o;
  o.prefix = "never";
  o.connect_seconds = 1;
  if (rank() != size() - 1) {
    EXPECT_EQ(status_of([&] { Communicator c(*s, rank(), size(), o); }), Status::transport);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The C API's communicator on Gloo: made from a directory, says its transport, sums.
TEST(Gloo, TheCApisCommunicator) {
  if (!test::on_gloo()) GTEST_SKIP() << "the Gloo run's";
  gcomp_comm comm = nullptr;
  ASSERT_EQ(gcomp_comm_create_gloo(test::store_dir().c_str(), "capi", rank(), size(), &comm),
            GCOMP_OK)
      << gcomp_last_error();
  EXPECT_STREQ(gcomp_comm_transport(comm), "gloo");
  EXPECT_EQ(gcomp_comm_rank(comm), rank());
  EXPECT_EQ(gcomp_comm_size(comm), size());
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("topk:ratio=0.5", &codec), GCOMP_OK);
  const auto x = test::integers(1000, 7);
  std::vector<float> out(x.size());
  ASSERT_EQ(gcomp_comm_allreduce(comm, x.data(), out.data(), x.size(), codec, nullptr, 5), GCOMP_OK)
      << gcomp_last_error();
  EXPECT_EQ(out, test::mpi_sum(test::contribution(Codec("topk:ratio=0.5"), x, 5)));
  gcomp_stats st{};
  ASSERT_EQ(gcomp_last_stats(&st), GCOMP_OK);
  EXPECT_GT(st.bytes_sent + (size() == 1 ? 1 : 0), 0u);
  // A rank's bad argument fails every rank, none waits.
  const gcomp_status bad = gcomp_comm_allreduce(comm, x.data(), out.data(), x.size(),
                                                rank() == 0 ? nullptr : codec, nullptr, 5);
  EXPECT_EQ(
      bad, rank() == 0 ? GCOMP_ERR_INVALID_ARGUMENT : (size() > 1 ? GCOMP_ERR_MISMATCH : GCOMP_OK));
  gcomp_comm_destroy(comm);
  gcomp_codec_destroy(codec);
  EXPECT_EQ(gcomp_comm_create_gloo(nullptr, nullptr, rank(), size(), &comm),
            GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(gcomp_comm_transport(nullptr), nullptr);
}

#endif

// The C API's communicator on MPI says so and sums as gcomp_allreduce does.
TEST(Transport, TheCApisCommunicatorOnMpi) {
  gcomp_comm comm = nullptr;
  ASSERT_EQ(gcomp_comm_create_mpi(MPI_COMM_WORLD, &comm), GCOMP_OK) << gcomp_last_error();
  EXPECT_STREQ(gcomp_comm_transport(comm), "mpi");
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("qsgd:bits=4", &codec), GCOMP_OK);
  const auto x = test::integers(600, 9);
  std::vector<float> out(x.size());
  ASSERT_EQ(gcomp_comm_allreduce(comm, x.data(), out.data(), x.size(), codec, nullptr, 2), GCOMP_OK)
      << gcomp_last_error();
  const auto mine = test::contribution(Codec("qsgd:bits=4"), x, 2);
  const auto ref = test::mpi_sum(mine);
  const auto tol = test::order_tolerance(mine);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], ref[i], tol[i]);
  gcomp_comm_destroy(comm);
  gcomp_codec_destroy(codec);
}

}  // namespace
}  // namespace gcomp
