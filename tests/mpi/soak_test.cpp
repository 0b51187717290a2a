// A soak of mixed calls through one Communicator: every codec family, sizes from 2 thousand to
// 300 thousand floats, with and without error feedback, auto and every algorithm that suits the
// codec, single tensors and allreduce_buckets. Once every kind of call has run (the warm-up: the
// first four passes over the kinds), the workspace and the caches hold all they will hold
// (docs/internals.md, "Memory"), so memory must not grow over the next five.
#include <algorithm>
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"

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
// 3000 calls; the passes over the kinds within the first 1300 (four: auto's learner explores
// its options over a group's first calls, and error feedback's residuals, with them threshold's
// payloads, grow over the first calls) are the warm-up, and the memory is compared between the
// ends of the warm-up's last pass and of the last whole pass.
constexpr std::size_t kCalls = 3000;
constexpr std::size_t kWarmUp = 1300;

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
  gcomp::Communicator comm(MPI_COMM_WORLD);
  const std::vector<Kind> all = kinds();
  ASSERT_LE(4 * all.size(), kWarmUp) << "the warm-up must hold four passes over the kinds";
  ASSERT_LE(kWarmUp + 5 * all.size(), kCalls) << "five passes must follow the warm-up";
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

  // The warm-up's last pass, and the last whole pass.
  const std::size_t warm_calls = (kWarmUp / all.size()) * all.size();
  const std::size_t last_pass = (kCalls / all.size()) * all.size();
  long warm = 0, heap_warm = 0, end = 0, heap_end = 0;
  for (std::size_t i = 0; i < kCalls; ++i) {
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
    // Measured at the ends of passes, where the same kind of call has just run. The heap in use
    // is the lower of two pass ends (the warm-up's last two, the run's last two): a buffer that
    // MPICH holds for a message that came early at one pass end is not the library's, while
    // whatever grows with the calls raises both.
    if (i + 1 == warm_calls - all.size()) heap_warm = heap_kib();
    if (i + 1 == warm_calls) {
      warm = rss_kib();
      heap_warm = std::min(heap_warm, heap_kib());
    }
    if (i + 1 == last_pass - all.size()) heap_end = heap_kib();
    if (i + 1 == last_pass) {
      end = rss_kib();
      heap_end = std::min(heap_end, heap_kib());
    }
    if (std::getenv("GCOMP_SOAK_TRACE") && (i + 1) % all.size() == 0) {
      const struct mallinfo2 mi = mallinfo2();
      std::printf("rank %d: pass %zu, RSS %ld KiB, heap in use %zu bytes\n", rank,
                  (i + 1) / all.size(), rss_kib(), mi.uordblks);
    }
  }
  const long grew[2] = {end - warm, heap_end - heap_warm};
  long most[2] = {0, 0};
  MPI_Allreduce(grew, most, 2, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "soak: %zu kinds of call, %zu calls on %d ranks; rank 0's RSS %ld KiB after the "
        "warm-up, %ld KiB at the end; the most any rank grew: RSS %ld KiB, heap in use "
        "%ld KiB\n",
        all.size(), kCalls, size, warm, end, most[0], most[1]);
  }
  if (warm == 0) GTEST_SKIP() << "no /proc/self/status";
  // Flat: once every kind of call has run, what the library keeps no longer grows with the
  // calls (docs/internals.md, "Memory"). The heap in use counts every allocation still held, so
  // it shows a cache or buffer that grows with the calls even where freed memory is reused
  // (resident memory then does not move); what may still move is MPICH's own and buffers that
  // data-dependent sizes still grow within their bound: from pass to pass the heap in use here
  // moves within 0.35 MiB either way. Growth of 700 bytes a call adds 1 MiB over the 1560 calls
  // measured (the growth this test was written against: 17 KiB a call, 50 MB over 3000 calls).
  // Resident memory also moves with the pages MPICH and the allocator touch (0.1-3.1 MiB
  // measured), so it is held to 8 MiB, 5 KiB a call.
  EXPECT_LE(most[1], 1024) << "the heap in use grew by " << most[1] << " KiB after the warm-up";
  EXPECT_LE(most[0], 8192) << "resident memory grew by " << most[0] << " KiB after the warm-up";
}

}  // namespace
