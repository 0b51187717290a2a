// What the cluster test (tests/cluster/cluster_test.sh) asks of a testbed made by scripts/cluster:
// how many hosts MPI sees (MPI_COMM_TYPE_SHARED groups), the network as gcomp's Communicator
// measures it, an MPI_Allreduce and a gcomp allreduce (top-k 1%) checked against the exact sums,
// and MPI_Allreduce's time. Rank 0 prints one line of key=value pairs before MPI_Finalize (which
// can hang over UCX's TCP after large transfers; the caller bounds the run with a timeout).
//   gcomp_cluster_probe [floats]     (default 4M)
//   gcomp_cluster_probe --sleep S    (MPI_Init, a barrier, 'asleep rank=R', then S seconds
//                                    asleep: a run to interrupt)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc > 2 && std::string(argv[1]) == "--sleep") {
    // Every rank is past MPI_Init when the line is out: what a test waits for before it interrupts.
    MPI_Barrier(MPI_COMM_WORLD);
    std::printf("asleep rank=%d\n", rank);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(std::atoi(argv[2])));
    MPI_Finalize();
    return 0;
  }
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{4} << 20;

  // Hosts as MPI sees them: one shared-memory group per host.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_rank = 0;
  MPI_Comm_rank(node, &node_rank);
  int leaders = node_rank == 0 ? 1 : 0, hosts = 0;
  MPI_Allreduce(&leaders, &hosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_free(&node);

  gcomp::Communicator comm(MPI_COMM_WORLD);
  const gcomp::NetworkModel& net = comm.network();

  // MPI_Allreduce of rank + 1 (+ the element's small offset): exact in float32.
  std::vector<float> in(n), out(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 7);
  std::vector<double> times;
  bool exact = true;
  for (int rep = 0; rep < 3; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    times.push_back(MPI_Wtime() - t0);
    for (std::size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(size * (size + 1) / 2) + static_cast<float>(size * (i % 7));
      if (out[i] != want) exact = false;
    }
  }
  double slowest = 0;
  std::sort(times.begin(), times.end());
  MPI_Allreduce(&times[1], &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  // A gcomp allreduce: top-k of a vector whose largest entries are known (rank-independent
  // positions), so the sum is exact where every rank selects the same k.
  const gcomp::Codec topk("topk:ratio=0.01");
  std::vector<float> g(n, 0.0f);
  const std::size_t k = n / 100;
  for (std::size_t j = 0; j < k; ++j) g[j * 100] = 1.0f + static_cast<float>(j % 5);
  comm.allreduce(g, topk);
  bool topk_exact = true;
  for (std::size_t i = 0; i < n; ++i) {
    const float want = i % 100 == 0 && i / 100 < k ? static_cast<float>(size) * (1.0f + static_cast<float>((i / 100) % 5)) : 0.0f;
    if (g[i] != want) topk_exact = false;
  }
  int ok = exact && topk_exact ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  if (rank == 0) {
    const double bytes = 2.0 * (size - 1) / size * 4.0 * static_cast<double>(n);
    std::printf("ranks=%d hosts=%d exact=%d alpha_us=%.1f link_mbit=%.1f one_mbit=%.1f "
                "all_mbit=%.1f allreduce_s=%.4f allreduce_busbw_mbit=%.1f algorithm=%s\n",
                size, hosts, all_ok, net.alpha * 1e6, net.beta > 0 ? 8e-6 / net.beta : 0.0,
                net.beta_one > 0 ? 8e-6 / net.beta_one : 0.0,
                net.beta_all > 0 ? 8e-6 / net.beta_all : 0.0, slowest,
                slowest > 0 ? bytes * 8e-6 / slowest : 0.0,
                gcomp::algorithm_name(comm.last_stats().algorithm));
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
