// GoogleTest main for the MPI tests, run under `mpiexec.mpich -n P`. Every rank runs every test
// (they are collective); rank 0 prints the usual report, the other ranks print only failures.
// The exit status is the worst over ranks. A watchdog fails the run instead of letting a hang
// run into CTest's timeout unexplained.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace {

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

void on_alarm(int) {
  static const char msg[] = "gcomp_mpi_tests: watchdog: a test hung (no progress for too long)\n";
  (void)!write(2, msg, sizeof msg - 1);
  std::_Exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  // Multiple: gcomp-train's --overlap-steps (tested here) calls MPI from a thread of its own,
  // and the test's own checks gather values while that call is out.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  const char* limit = std::getenv("GCOMP_TEST_WATCHDOG");
  std::signal(SIGALRM, on_alarm);
  alarm(limit ? static_cast<unsigned>(std::atoi(limit)) : 600);
  const int local = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
