// A soak of mixed calls through one Communicator: every codec family, sizes from 2 thousand to
// 300 thousand floats, with and without error feedback, auto and every algorithm that suits the
// codec, on single tensors and through allreduce_buckets. Once every kind of call has run (the
// warm-up: the first four passes over the kinds), the workspace and the caches hold what they
// will hold (docs/internals.md, "Memory"), up to the buffers whose size follows the data (a
// sparse payload's entries, bounded by its tensor's size), so memory must not grow with the
// calls over the next seven passes.
//
// Every run makes the same calls with the same data: auto's choices come from the tests' fixed
// Timing (the model's seconds), not from the clock, which on a loaded machine made them differ
// from run to run and with them where error feedback's residuals went and how large the sparse
// buffers grew, and when.
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"
#include "mpi_util.hpp"

namespace {

using gcomp::Algorithm;

// Resident memory of this process in KiB (VmRSS), 0 where /proc does not say.
long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  long value = 0;
  while (status >> key) {
    if (key == "VmRSS:") {
      status >> value;
      return value;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

constexpr const char* kSpecs[] = {
    "none",     "fp16", "topk:ratio=0.01", "randomk:ratio=0.01", "threshold:tau=0.9", "qsgd:bits=4",
    "terngrad", "sign"};
constexpr std::size_t kSizes[] = {2000, 65536, 300000};
// Four passes over the kinds warm up (auto's learner explores its options over a group's first
// calls, and error feedback's residuals, with them threshold's payloads, grow over the first
// calls); the memory is then measured at the end of every pass of the next seven.
constexpr std::size_t kWarmUpPasses = 4;
constexpr std::size_t kMeasuredPasses = 7;
// A pass whose heap in use grew by more than this is a growing one. A leak of L bytes a call
// grows every pass by L times the kinds (528): from 125 bytes a call on, every pass grows.
constexpr long kPassGrowthKib = 64;

// The heap's bytes held by allocations (mallinfo2's uordblks), in KiB: not the large blocks
// the allocator maps on their own, which come and go with MPICH's temporary buffers (those a
// growing buffer of ours would make show in the resident memory).
long heap_kib() { return static_cast<long>(mallinfo2().uordblks / 1024); }

struct Kind {
  std::size_t codec;  // in kSpecs
  std::size_t size;   // in kSizes
  bool ef;
  Algorithm algorithm;
  bool buckets;
};

std::vector<Kind> kinds() {
  std::vector<Kind> out;
  for (std::size_t c = 0; c < std::size(kSpecs); ++c) {
    const bool sparse = gcomp::Codec(kSpecs[c]).properties().sparse;
    for (std::size_t n = 0; n < std::size(kSizes); ++n) {
      for (bool ef : {false, true}) {
        out.push_back({c, n, ef, Algorithm::automatic, false});
        out.push_back({c, n, ef, Algorithm::automatic, true});
        for (int a = 1; a < gcomp::kAlgorithmCount; ++a) {
          const auto alg = static_cast<Algorithm>(a);
          const bool sparse_only =
              alg == Algorithm::sparse_allgather || alg == Algorithm::sparse_recursive_doubling ||
              alg == Algorithm::sparse_split || alg == Algorithm::sparse_reduce_scatter;
          if (sparse_only && !sparse) continue;
          if (alg == Algorithm::low_rank) continue;  // powersgd's alone, and it needs shapes
          out.push_back({c, n, ef, alg, false});
          out.push_back({c, n, ef, alg, true});
        }
      }
    }
  }
  return out;
}

TEST(Soak, ResidentMemoryStaysFlatAfterWarmUp) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto made = gcomp::test::make_communicator(gcomp::test::test_network(),
                                                   std::make_shared<gcomp::test::FixedTiming>());
  gcomp::Communicator& comm = *made;
  const std::vector<Kind> all = kinds();
  const std::size_t calls = (kWarmUpPasses + kMeasuredPasses) * all.size();
  // One input and one memory per (size, error feedback, bucketed), reused: the soak measures
  // the library's memory, not the test's.
  std::vector<float> x(300000), out(300000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>((i * 2654435761u + static_cast<std::size_t>(rank) * 97) % 2001) /
               1000.0f -
           1.0f;
  }
  std::vector<gcomp::Codec> codecs;
  for (const char* spec : kSpecs) codecs.emplace_back(spec);
  std::vector<gcomp::ErrorFeedback> memories;  // per size: the tensor's, then its two halves'
  for (std::size_t n : kSizes) {
    memories.emplace_back(n);
    memories.emplace_back(n / 2);
    memories.emplace_back(n - n / 2);
  }

  // The heap in use and the resident memory at the end of every pass.
  std::vector<long> heap_at, rss_at;
  for (std::size_t i = 0; i < calls; ++i) {
    const Kind& k = all[i % all.size()];
    const gcomp::Codec& codec = codecs[k.codec];
    const std::size_t n = kSizes[k.size];
    gcomp::AllreduceOptions opt;
    opt.algorithm = k.algorithm;
    opt.average = true;
    opt.seed = i;
    opt.tensor = k.size;
    std::copy(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n), out.begin());
    if (k.buckets) {
      const std::span<float> t[2] = {std::span<float>(out.data(), n / 2),
                                     std::span<float>(out.data() + n / 2, n - n / 2)};
      gcomp::ErrorFeedback* efs[2] = {&memories[3 * k.size + 1], &memories[3 * k.size + 2]};
      gcomp::BucketOptions b;
      b.allreduce = opt;
      b.bucket_bytes = 4 * (n - n / 2);  // one bucket per half
      b.dense_below = 0;
      comm.allreduce_buckets(t, codec,
                             k.ef ? std::span<gcomp::ErrorFeedback* const>(efs)
                                  : std::span<gcomp::ErrorFeedback* const>(),
                             b);
    } else {
      comm.allreduce(std::span<const float>(out.data(), n), std::span<float>(out.data(), n), codec,
                     k.ef ? &memories[3 * k.size] : nullptr, opt);
    }
    // At a pass end every rank waits for the others before and after it measures, so that no
    // message of the next call can be on its way (MPICH holds one that comes before its receive
    // is posted in the heap): what is measured is what the calls left behind.
    if ((i + 1) % all.size() != 0) continue;
    MPI_Barrier(MPI_COMM_WORLD);
    heap_at.push_back(heap_kib());
    rss_at.push_back(rss_kib());
    if (std::getenv("GCOMP_SOAK_TRACE")) {
      std::printf("rank %d: pass %zu, RSS %ld KiB, heap in use %zu bytes\n", rank, heap_at.size(),
                  rss_at.back(), mallinfo2().uordblks);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // Over the measured passes: how many grew the heap in use by more than kPassGrowthKib, and
  // by how much the heap in use and the resident memory grew in all (the most on any rank).
  long growing = 0;
  std::string passes;
  for (std::size_t p = kWarmUpPasses; p < heap_at.size(); ++p) {
    const long d = heap_at[p] - heap_at[p - 1];
    if (d > kPassGrowthKib) ++growing;
    passes += (passes.empty() ? "" : " ") + std::to_string(d);
  }
  const long mine[3] = {growing, heap_at.back() - heap_at[kWarmUpPasses - 1],
                        rss_at.back() - rss_at[kWarmUpPasses - 1]};
  long most[3] = {0, 0, 0};
  MPI_Allreduce(mine, most, 3, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  const long warm = rss_at[kWarmUpPasses - 1];
  if (rank == 0) {
    std::printf(
        "soak: %zu kinds of call, %zu calls on %d ranks; rank 0's RSS %ld KiB after the "
        "warm-up, %ld KiB at the end, its heap in use grew by %s KiB pass by pass; the most on "
        "any rank: %ld of %zu passes grew, heap in use %+ld KiB, RSS %+ld KiB\n",
        all.size(), calls, size, warm, rss_at.back(), passes.c_str(), most[0], kMeasuredPasses,
        most[1], most[2]);
  }
  if (warm == 0) GTEST_SKIP() << "no /proc/self/status";
  // Flat: once every kind of call has run, what the library keeps no longer grows with the
  // calls (docs/internals.md, "Memory"). The heap in use counts every allocation still held, so
  // it shows a cache or buffer that grows with the calls even where freed memory is reused
  // (resident memory then does not move). A buffer whose size follows the data may still reach
  // a new size now and then (a sparse payload with more entries than any before it in that
  // algorithm; measured: 2 of the 7 passes, 0.7-2.2 MiB each, the same in every run), while a
  // leak of 125 bytes a call or more grows every pass: fewer than half the passes may grow. In
  // all, the buffers that follow the data are bounded by their tensors (a sparse vector of the
  // 300000-float tensor: 3.6 MB), and the heap in use may grow by 8 MiB; resident memory also
  // moves with the pages MPICH and the allocator touch, and is held to the same 8 MiB.
  EXPECT_LT(2 * most[0], static_cast<long>(kMeasuredPasses))
      << most[0] << " of " << kMeasuredPasses << " passes grew the heap in use by more than "
      << kPassGrowthKib << " KiB (rank 0: " << passes << " KiB)";
  EXPECT_LE(most[1], 8192) << "the heap in use grew by " << most[1] << " KiB after the warm-up";
  EXPECT_LE(most[2], 8192) << "resident memory grew by " << most[2] << " KiB after the warm-up";
}

}  // namespace
