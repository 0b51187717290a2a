// A rank that does not come (collectives/transport/mpi/stall.cpp): the last rank is late to a call. Past the
// stall seconds each waiting rank names the call and the late rank once, and the call completes
// with the right sum; past a timeout every rank fails with Status::timeout (the late one too,
// when it comes: the barrier after the agreement), later calls fail at once, and nothing hangs.
// The same through the C API, whose settings come from GCOMP_STALL_SECONDS and
// GCOMP_TIMEOUT_SECONDS.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "gcomp/gcomp_mpi.h"
#include "mpi_util.hpp"

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::status_of;

int late() { return size() - 1; }

void sleep_for(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

std::unique_ptr<Communicator> fresh() {
  return test::make_communicator(test::test_network(), std::make_shared<test::FixedTiming>());
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

AllreduceOptions pinned(const char* label) {
  AllreduceOptions o;
  o.algorithm = Algorithm::sparse_allgather;
  o.allow_uncompressed = false;
  o.label = label;
  return o;
}

TEST(Stall, SettingsAreChecked) {
  auto comm = fresh();
  EXPECT_EQ(comm->stall_seconds(), 60.0);  // GCOMP_STALL_SECONDS is not set in these tests
  EXPECT_EQ(comm->timeout_seconds(), 0.0);
  EXPECT_EQ(status_of([&] { comm->set_stall_seconds(-1); }), Status::invalid_argument);
  EXPECT_EQ(status_of([&] { comm->set_timeout_seconds(std::nan("")); }), Status::invalid_argument);
  EXPECT_EQ(status_of([&] { comm->set_timeout_seconds(HUGE_VAL); }), Status::invalid_argument);
  comm->set_stall_seconds(0.25);
  comm->set_timeout_seconds(2);
  EXPECT_EQ(comm->stall_seconds(), 0.25);
  EXPECT_EQ(comm->timeout_seconds(), 2.0);
}

TEST(Stall, ALateRankIsNamedOnceAndTheCallCompletes) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  auto comm = fresh();
  comm->set_stall_seconds(0.5);
  const Codec codec("topk:ratio=0.1");
  const auto x = test::integers(1000, 41);
  std::vector<float> out(x.size());
  const auto opt = pinned("bucket 3 of step 7");
  comm->allreduce(x, out, codec, nullptr, opt);  // call 1, in time
  const std::uint64_t before = comm->calls();
  if (rank() == late()) sleep_for(1.5);
  testing::internal::CaptureStderr();
  comm->allreduce(x, out, codec, nullptr, opt);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(comm->calls(), before + 1);
  EXPECT_EQ(out, test::mpi_sum(test::contribution(codec, x, 0)));
  const std::string said = "gcomp: rank " + std::to_string(rank()) + " has waited ";
  if (rank() == late()) {
    EXPECT_EQ(count(err, "gcomp: rank "), 0) << err;
  } else {
    EXPECT_EQ(count(err, "gcomp: rank "), 1) << err;
    EXPECT_EQ(count(err, said), 1) << err;
    const std::string call =
        " s at the start of call 2 (allreduce of 1000 floats, codec "
        "topk:ratio=0.1,values=fp32, bucket 3 of step 7); not there: rank " +
        std::to_string(late()) + " (at no gcomp call)\n";
    EXPECT_EQ(count(err, call), 1) << err;
  }
  // And the next call, in time, says nothing.
  testing::internal::CaptureStderr();
  comm->allreduce(x, out, codec, nullptr, opt);
  EXPECT_EQ(count(testing::internal::GetCapturedStderr(), "gcomp: rank "), 0);
}

TEST(Stall, ATimeoutFailsEveryRankTheLateOneToo) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  auto comm = fresh();
  comm->set_stall_seconds(0);
  comm->set_timeout_seconds(0.5);
  const Codec codec("topk:ratio=0.1");
  const auto x = test::integers(1000, 42);
  std::vector<float> out(x.size(), 7.0f);
  const auto opt = pinned("bucket 0 of step 12");
  comm->allreduce(x, out, codec, nullptr, opt);  // in time: the barrier passes too
  EXPECT_EQ(out, test::mpi_sum(test::contribution(codec, x, 0)));
  if (rank() == late()) sleep_for(1.5);
  std::string msg;
  EXPECT_EQ(status_of([&] { comm->allreduce(x, out, codec, nullptr, opt); }, &msg), Status::timeout)
      << msg;
  // The ranks that timed out wait here (in MPI: their posted agreement completes when the late
  // rank comes), the late rank after its own timeout at the barrier.
  MPI_Barrier(MPI_COMM_WORLD);
  // On Gloo the late rank does not wait: the others' connections closed when they gave up.
  const bool waited = rank() != late() || !test::on_gloo();
  const std::string me = "rank " + std::to_string(rank()) + (waited ? " waited " : " at ");
  EXPECT_NE(msg.find(me), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::string(waited ? "(the timeout) " : "") +
                     "at the start of call 2 (allreduce of 1000 floats"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("bucket 0 of step 12"), std::string::npos) << msg;
  if (rank() == late()) {
    // Every other rank had come to the agreement and gave up before this one came.
    EXPECT_NE(msg.find("gave up on this call"), std::string::npos) << msg;
    for (int r = 0; r < late(); ++r) {
      EXPECT_NE(msg.find("rank " + std::to_string(r) + " (at no gcomp call)"), std::string::npos)
          << msg;
    }
  } else {
    EXPECT_NE(msg.find("not there: rank " + std::to_string(late()) + " (at no gcomp call)"),
              std::string::npos)
        << msg;
    EXPECT_EQ(count(msg, "(at "), 1) << msg;  // only the late rank is named
  }
  // The Communicator is done: every later call fails at once, saying why.
  EXPECT_EQ(status_of([&] { comm->allreduce(x, out, codec, nullptr, opt); }, &msg),
            Status::timeout);
  EXPECT_NE(msg.find("timed out earlier"), std::string::npos) << msg;
  // A new Communicator works.
  auto next = fresh();
  next->set_timeout_seconds(0.5);
  next->allreduce(x, out, codec, nullptr, opt);
  EXPECT_EQ(out, test::mpi_sum(test::contribution(codec, x, 0)));
}

// The C API reads GCOMP_STALL_SECONDS and GCOMP_TIMEOUT_SECONDS when a communicator is first
// used; a timeout is GCOMP_ERR_TIMEOUT on every rank.
TEST(Stall, TheCApiTimesOutOnEveryRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  gcomp_codec codec = nullptr;
  ASSERT_EQ(gcomp_codec_create("topk:ratio=0.1", &codec), GCOMP_OK);
  const auto x = test::integers(1000, 43);
  std::vector<float> out(x.size());
  // A malformed value: the first call fails on every rank, naming it.
  MPI_Comm bad;
  MPI_Comm_dup(MPI_COMM_WORLD, &bad);
  setenv("GCOMP_TIMEOUT_SECONDS", "soon", 1);
  EXPECT_EQ(gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 1, bad),
            GCOMP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(gcomp_last_error()).find("GCOMP_TIMEOUT_SECONDS=soon"), std::string::npos)
      << gcomp_last_error();
  MPI_Comm_free(&bad);

  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  setenv("GCOMP_TIMEOUT_SECONDS", "0.5", 1);
  setenv("GCOMP_STALL_SECONDS", "0", 1);
  const gcomp_status first =
      gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 1, comm);
  unsetenv("GCOMP_TIMEOUT_SECONDS");
  unsetenv("GCOMP_STALL_SECONDS");
  ASSERT_EQ(first, GCOMP_OK) << gcomp_last_error();
  if (rank() == late()) sleep_for(1.5);
  EXPECT_EQ(gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 2, comm),
            GCOMP_ERR_TIMEOUT);
  const std::string msg = gcomp_last_error();
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_NE(msg.find("(the timeout)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(rank() == late() ? "gave up on this call"
                                      : "not there: rank " + std::to_string(late())),
            std::string::npos)
      << msg;
  EXPECT_EQ(gcomp_allreduce(x.data(), out.data(), x.size(), codec, nullptr, 3, comm),
            GCOMP_ERR_TIMEOUT);
  MPI_Comm_free(&comm);  // frees gcomp's state of it
  gcomp_codec_destroy(codec);
}

}  // namespace
}  // namespace gcomp
