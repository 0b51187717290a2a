// Uses the installed collectives: one compressed allreduce on however many ranks run it.
#include <gcomp/communicator.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ok = 0;
  {
    gcomp::Communicator comm(MPI_COMM_WORLD);
    std::vector<float> x(1000, 1.0f);
    comm.allreduce(x, gcomp::Codec("topk:ratio=1"));
    ok = x[0] == static_cast<float>(comm.size());
    std::printf("consumer_mpi: %d ranks, x[0] = %g, %s\n", comm.size(), x[0],
                gcomp::algorithm_name(comm.last_stats().algorithm));
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
