// Google Benchmark of gcomp's allreduce algorithms under mpiexec.mpich, next to MPI_Allreduce of
// the same float32 buffer in the same run. Every rank runs every benchmark; the time of an
// iteration is the slowest rank's (so all ranks see the same times and run the same iterations),
// and rank 0 reports.
//
// Names: <algorithm>/<codec>/<n>, e.g. sparse_recursive_doubling/topk:ratio=0.01/16777216, and
// mpi_allreduce/none/<n> and gloo_allreduce/none/<n> (Gloo's ring allreduce, which torch's gloo
// backend runs for DDP; in builds with Gloo) for the peers; <codec>+ef: with error feedback.
// --transport=gloo: gcomp's Communicator on Gloo (mpiexec only starts the ranks; they meet
// through a file store in a directory rank 0 makes), else on MPI. --set=transports: each call of
// the cluster set on an MPI and a Gloo Communicator alternately, medians of each (mpi_s, gloo_s)
// and ratio = gloo_s / mpi_s; row transports/engines: MPI_Allreduce against Gloo's allreduce.
// Counters:
//   bytes_per_rank  bytes this rank handed to MPI (rank 0's; the stats' bytes_sent)
//   algbw, busbw    GB/s as nccl-tests defines them: 4n / time, and algbw * 2(P-1)/P
//   predicted_s     the cost model's time for this algorithm (with the agreed calibration)
//   chosen          for auto: the algorithm it ran (Algorithm value)
//   encode_s, comm_s, decode_s   rank 0's split of its last call (CallStats)
//   ranks
// Flags besides Google Benchmark's: --sizes=N,N,... (default 1048576,16777216),
// --set=full|targets|paired|cluster|versus|timeline (timeline: bm_timeline, what recording a
// timeline costs a call; targets: only what the network targets need; paired: auto
// and MPI_Allreduce alternating, reporting median times and their ratio; cluster: codecs none,
// fp16, QSGD 4-bit, top-k 1% and PowerSGD rank 4 with error feedback, each with auto and every
// algorithm that applies to it, the set scripts/bench-network --cluster runs; versus: auto
// against each of those algorithms, interleaved call by call, reporting medians and auto / the
// fastest), --model-table (print the cost model's extrapolation to 1024 ranks and 1/10/100 Gbit,
// then exit), --scale-table (print each sparse algorithm's predicted time and bytes per rank at
// 8..1024 ranks, then exit), --two-level-table (the flat algorithms against two_level at 8
// ranks a host, 2..128 hosts, each level's time and each host link's bytes, then exit).
// GCOMP_BENCH_LINK=IF: counters link_tx and link_rx, the bytes the
// busiest host's interface IF sent and received per call (LinkMeter).
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/cost_model.hpp"
#include "gcomp/timeline.hpp"

#ifdef GCOMP_BENCH_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace {

// The median of a run's times (the upper middle one of an even count; 0 of none).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int world_rank = 0;
int world_size = 1;
gcomp::Communicator* comm = nullptr;

std::vector<float> input(std::size_t n) {
  std::mt19937 g(1234u + static_cast<unsigned>(world_rank));
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

// What this rank's host link has sent (tx) and received (rx), in bytes: the counters of the
// interface GCOMP_BENCH_LINK names (scripts/bench-network --cluster: each host's eth0, which its
// ranks share), or none (-1) when it is not set or unreadable.
struct LinkBytes {
  double tx = -1, rx = -1;
};
LinkBytes link_bytes() {
  const char* link = std::getenv("GCOMP_BENCH_LINK");
  LinkBytes b;
  if (link == nullptr || *link == '\0') return b;
  const auto read = [&](const char* what) {
    const std::string path = std::string("/sys/class/net/") + link + "/statistics/" + what;
    double v = -1;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      unsigned long long x = 0;
      if (std::fscanf(f, "%llu", &x) == 1) v = static_cast<double>(x);
      std::fclose(f);
    }
    return v;
  };
  b.tx = read("tx_bytes");
  b.rx = read("rx_bytes");
  return b;
}

// Around a benchmark's timed loop: every host's link counters before and after (all ranks lined
// up by a barrier), and the most any host's link sent or received per iteration, as counters
// link_tx and link_rx (bytes per call, Ethernet, IP and TCP headers included; the benchmark's own
// barrier and time reduction, some hundred bytes a call, with them).
class LinkMeter {
 public:
  LinkMeter() {
    MPI_Barrier(MPI_COMM_WORLD);
    start_ = link_bytes();
  }
  void report(benchmark::State& st) {
    MPI_Barrier(MPI_COMM_WORLD);
    const LinkBytes end = link_bytes();
    const double mine[2] = {start_.tx < 0 || end.tx < 0 ? -1 : end.tx - start_.tx,
                            start_.rx < 0 || end.rx < 0 ? -1 : end.rx - start_.rx};
    double most[2];
    MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (most[0] < 0 || st.iterations() == 0) return;
    st.counters["link_tx"] = most[0] / static_cast<double>(st.iterations());
    st.counters["link_rx"] = most[1] / static_cast<double>(st.iterations());
  }

 private:
  LinkBytes start_;
};

double slowest(double seconds) {
  double worst = 0;
  MPI_Allreduce(&seconds, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

void set_common(benchmark::State& st, std::size_t n, double bytes, double predicted) {
  const double p = world_size;
  st.counters["bytes_per_rank"] = bytes;
  st.counters["algbw"] = benchmark::Counter(4.0 * static_cast<double>(n) * st.iterations() / 1e9,
                                            benchmark::Counter::kIsRate);
  st.counters["busbw"] = benchmark::Counter(
      4.0 * static_cast<double>(n) * st.iterations() / 1e9 * (p > 1 ? 2 * (p - 1) / p : 1),
      benchmark::Counter::kIsRate);
  st.counters["predicted_s"] = predicted;
  st.counters["ranks"] = p;
}

#ifdef GCOMP_BENCH_HAVE_GLOO
// The store's directory (rank 0 makes it, every rank learns it), and Gloo's own context for the
// peer row, on the device torch's gloo would pick (GLOO_SOCKET_IFNAME, else the host's name).
std::string store_dir() {
  char path[4096] = {};
  if (world_rank == 0) {
    std::snprintf(path, sizeof path, "%s/gcomp-bench-store-XXXXXX",
                  std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(path)) path[0] = '\0';
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (path[0] == '\0') {
    std::fprintf(stderr, "gcomp_bench_collectives: cannot make the store's directory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return path;
}

std::shared_ptr<gloo::Context> gloo_peer;

void make_gloo_peer(gloo::rendezvous::Store& store) {
  gloo::transport::tcp::attr a;
  if (const char* i = std::getenv("GLOO_SOCKET_IFNAME")) {
    a.iface = i;
  } else {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    a.hostname = name;
  }
  auto dev = gloo::transport::tcp::CreateDevice(a);
  gloo::rendezvous::PrefixStore prefixed("peer", store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(world_rank, world_size);
  ctx->connectFullMesh(prefixed, dev);
  gloo_peer = ctx;
}

// Gloo's allreduce as torch's ProcessGroupGloo runs it for a CPU tensor: in place, the ring.
void gloo_sum(std::vector<float>& out) {
  gloo::AllreduceOptions opts(gloo_peer);
  opts.setOutput(out.data(), out.size());
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
  gloo::allreduce(opts);
}

// Gloo's own allreduce (gloo_sum) of n floats.
void bm_gloo_allreduce(benchmark::State& st, std::size_t n) {
  const auto x = input(n);
  std::vector<float> out(n);
  const auto once = [&] {
    std::copy(x.begin(), x.end(), out.begin());
    gloo_sum(out);
  };
  once();
  for (auto _ : st) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    once();
    st.SetIterationTime(slowest(MPI_Wtime() - start));
  }
  const double p = world_size;
  const auto pred = comm->predict(gcomp::Codec("none"), n);
  set_common(st, n, 2 * (p - 1) / p * 4.0 * static_cast<double>(n),
             pred[static_cast<int>(gcomp::Algorithm::dense)]);
}
#endif

void bm_mpi_allreduce(benchmark::State& st, std::size_t n) {
  const auto x = input(n);
  std::vector<float> out(n);
  MPI_Allreduce(x.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  LinkMeter link;
  for (auto _ : st) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(x.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    st.SetIterationTime(slowest(MPI_Wtime() - start));
  }
  link.report(st);
  const double p = world_size;
  const auto pred = comm->predict(gcomp::Codec("none"), n);
  set_common(st, n, 2 * (p - 1) / p * 4.0 * static_cast<double>(n),
             pred[static_cast<int>(gcomp::Algorithm::dense)]);
}

// Calls before auto is timed: past its exploration (3 rounds over at most 5 candidates,
// docs/algorithms.md), so the medians are of what it settles on, which is what a training run
// sees after its first steps.
constexpr int kAutoWarmup = 16;

// Calls with error feedback made before the timed ones: the residual grows from zero over the
// first calls, and sparse_reduce_scatter's threshold, set from the previous call's sums, trails
// that growth (keeping more than it aims at) until it levels off, after about 50 calls of top-k
// 1% (its bytes then within 5% of the model's).
constexpr int kFeedbackWarmup = 64;

// ef: with error feedback, as training runs it: one ErrorFeedback across the calls, and a new
// input every call (the random input rotated by a random offset: each element's value is new,
// as a gradient's is from step to step), past the residual's first growth.
void bm_gcomp(benchmark::State& st, std::string spec, gcomp::Algorithm alg, std::size_t n,
              bool ef) {
  const gcomp::Codec codec(spec);
  const std::vector<float> base = input(n);
  std::vector<float> in(base), out(n);
  gcomp::ErrorFeedback memory(ef ? n : 0);
  gcomp::ErrorFeedback* e = ef ? &memory : nullptr;
  gcomp::AllreduceOptions opt;
  opt.algorithm = alg;
  std::uint64_t seed = 1;
  std::mt19937_64 offsets(99);  // the same offsets on every rank; the inputs differ by rank
  const auto next = [&] {
    if (ef) {
      const auto at = static_cast<std::ptrdiff_t>(offsets() % n);
      std::rotate_copy(base.begin(), base.begin() + at, base.end(), in.begin());
    }
    return std::span<const float>(in);
  };
  // A low-rank codec (powersgd) runs on allreduce_buckets with the tensor's shape: one matrix
  // of 2^ceil(log2(n) / 2) rows (2048 x 2048 at 4M floats), one bucket, in place on out.
  const bool shaped = codec.properties().needs_shapes;
  std::size_t rows = 1;
  while (rows * rows < n) rows *= 2;
  while (rows > 1 && n % rows != 0) rows /= 2;
  const gcomp::MatrixShape shape{rows, n / rows};
  gcomp::BucketOptions bucket;
  bucket.dense_below = 0;
  bucket.bucket_bytes = std::max<std::size_t>(bucket.bucket_bytes, 4 * n);
  const auto call = [&](std::span<const float> x) {
    if (!shaped) return comm->allreduce(x, out, codec, e, opt);
    std::copy(x.begin(), x.end(), out.begin());
    const std::span<float> t[] = {std::span<float>(out)};
    gcomp::ErrorFeedback* const es[] = {e};
    bucket.allreduce = opt;
    comm->allreduce_buckets(
        t, {&shape, 1}, codec,
        e ? std::span<gcomp::ErrorFeedback* const>(es) : std::span<gcomp::ErrorFeedback* const>(),
        bucket);
  };
  // Warm up: first-use calibration, page faults; for auto, past its exploration.
  const int warm =
      std::max(alg == gcomp::Algorithm::automatic ? kAutoWarmup : 1, ef ? kFeedbackWarmup : 1);
  for (int i = 0; i < warm; ++i) call(next());
  LinkMeter link;
  for (auto _ : st) {
    opt.seed = seed++;
    const auto x = next();
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    call(x);
    st.SetIterationTime(slowest(MPI_Wtime() - start));
  }
  link.report(st);
  const gcomp::Algorithm ran = comm->last_stats().algorithm;
  const auto pred = comm->predict(codec, n, 0, ef);
  set_common(st, n, static_cast<double>(comm->last_stats().bytes_sent),
             pred[static_cast<int>(ran)]);
  st.counters["chosen"] = static_cast<double>(static_cast<int>(ran));
  st.counters["encode_s"] = comm->last_stats().encode_seconds;
  st.counters["comm_s"] = comm->last_stats().comm_seconds;
  st.counters["decode_s"] = comm->last_stats().decode_seconds;
}

// MPI_Allreduce and gcomp's auto in alternation, iteration by iteration, so that the machine's
// drift hits both alike; reports the medians and their ratio (auto / MPI_Allreduce). paired_unc:
// auto with allow_uncompressed (it may skip the codec when compression does not pay).
void bm_paired(benchmark::State& st, std::string spec, std::size_t n, bool allow_uncompressed) {
  const gcomp::Codec codec(spec);
  const auto x = input(n);
  std::vector<float> out(n);
  MPI_Allreduce(x.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  gcomp::AllreduceOptions warm;
  warm.allow_uncompressed = allow_uncompressed;
  for (int i = 0; i < kAutoWarmup; ++i) comm->allreduce(x, out, codec, nullptr, warm);
  std::vector<double> mpi, ours;
  std::uint64_t seed = 1;
  for (auto _ : st) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    MPI_Allreduce(x.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double t_mpi = slowest(MPI_Wtime() - start);
    gcomp::AllreduceOptions opt;
    opt.seed = seed++;
    opt.allow_uncompressed = allow_uncompressed;
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    comm->allreduce(x, out, codec, nullptr, opt);
    const double t_ours = slowest(MPI_Wtime() - start);
    mpi.push_back(t_mpi);
    ours.push_back(t_ours);
    st.SetIterationTime(t_mpi + t_ours);
  }
  st.counters["mpi_median_s"] = median(mpi);
  st.counters["auto_median_s"] = median(ours);
  st.counters["ratio"] = median(mpi) > 0 ? median(ours) / median(mpi) : 0;
  st.counters["chosen"] = static_cast<double>(static_cast<int>(comm->last_stats().algorithm));
  st.counters["compressed"] = comm->last_stats().compressed ? 1 : 0;
  st.counters["ranks"] = world_size;
}

// What the timeline (gcomp/timeline.hpp) costs a call: the same call with the timeline paused
// (off) and recording (on) in alternation, iteration by iteration; medians of the slowest rank's
// times, their ratio (on / off) and the events a call writes. The timeline is opened at start
// (--set=timeline) to a file of TMPDIR's, removed at the end.
void bm_timeline(benchmark::State& st, std::string spec, gcomp::Algorithm alg, std::size_t n,
                 bool ef) {
  const gcomp::Codec codec(spec);
  const auto x = input(n);
  std::vector<float> out(n);
  gcomp::ErrorFeedback memory(n);
  gcomp::AllreduceOptions opt;
  opt.algorithm = alg;
  gcomp::timeline::pause();
  for (int i = 0; i < kAutoWarmup; ++i) {
    opt.seed = static_cast<std::uint64_t>(i) + 1;
    comm->allreduce(x, out, codec, ef ? &memory : nullptr, opt);
  }
  std::vector<double> off, on;
  std::uint64_t events = 0, calls = 0;
  std::uint64_t seed = 1000;
  for (auto _ : st) {
    double both = 0;
    for (const bool recording : {false, true}) {
      if (recording) gcomp::timeline::resume();
      const std::uint64_t before = gcomp::timeline::events();
      opt.seed = seed++;
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      comm->allreduce(x, out, codec, ef ? &memory : nullptr, opt);
      const double t = slowest(MPI_Wtime() - start);
      gcomp::timeline::pause();
      (recording ? on : off).push_back(t);
      if (recording) {
        events += gcomp::timeline::events() - before;
        ++calls;
      }
      both += t;
    }
    st.SetIterationTime(both);
  }
  st.counters["off_median_s"] = median(off);
  st.counters["on_median_s"] = median(on);
  st.counters["ratio"] = median(off) > 0 ? median(on) / median(off) : 0;
  st.counters["events_per_call"] = calls ? static_cast<double>(events) / calls : 0;
  st.counters["ranks"] = world_size;
}

// auto against every algorithm that applies to the codec and MPI_Allreduce, interleaved: each
// iteration runs auto once, then each algorithm once, then MPI_Allreduce of the same input, so that
// the machine's drift hits them alike (on a shared VM two runs of the same algorithm minutes apart
// differ by 20%). Each option has its own error-feedback memory and a new input every call (as
// bm_gcomp). Counters: each option's median seconds (auto_s, <algorithm>_s, mpi_allreduce_s),
// best_s (the fastest of the others), ratio (auto / best), chosen (what auto ran last).
void bm_versus(benchmark::State& st, std::string spec, std::size_t n, bool ef) {
  const gcomp::Codec codec(spec);
  std::vector<gcomp::Algorithm> options = {gcomp::Algorithm::automatic};
  const auto pred = comm->predict(codec, n, 0, ef);
  for (int a = 1; a < gcomp::kAlgorithmCount; ++a) {
    if (pred[a] < gcomp::kNotApplicable) options.push_back(static_cast<gcomp::Algorithm>(a));
  }
  const std::vector<float> base = input(n);
  std::vector<float> in(base), out(n);
  std::vector<gcomp::ErrorFeedback> memory;
  for (std::size_t o = 0; o < options.size(); ++o) memory.emplace_back(ef ? n : 0);
  std::mt19937_64 offsets(99);
  // The last option: MPI_Allreduce of the same input (what a user would run instead).
  const std::size_t mpi = options.size();
  const auto call = [&](std::size_t o, std::uint64_t seed) {
    if (o == mpi) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return slowest(MPI_Wtime() - start);
    }
    if (ef) {
      const auto at = static_cast<std::ptrdiff_t>(offsets() % n);
      std::rotate_copy(base.begin(), base.begin() + at, base.end(), in.begin());
    }
    gcomp::AllreduceOptions opt;
    opt.algorithm = options[o];
    opt.seed = seed;
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    comm->allreduce(in, out, codec, ef ? &memory[o] : nullptr, opt);
    return slowest(MPI_Wtime() - start);
  };
  const int warm = std::max(kAutoWarmup, ef ? kFeedbackWarmup : 1);
  for (int i = 0; i < warm; ++i) {
    for (std::size_t o = 0; o <= mpi; ++o) call(o, 1);
  }
  std::vector<std::vector<double>> times(mpi + 1);
  std::array<int, gcomp::kAlgorithmCount> ran{};  // what auto's timed calls ran
  std::uint64_t seed = 2;
  for (auto _ : st) {
    double total = 0;
    for (std::size_t o = 0; o <= mpi; ++o) {
      const double t = call(o, seed);
      if (o == 0) ++ran[static_cast<int>(comm->last_stats().algorithm)];
      times[o].push_back(t);
      total += t;
    }
    ++seed;
    st.SetIterationTime(total);
  }
  double best = 1e30;
  for (std::size_t o = 0; o <= mpi; ++o) {
    const double m = median(times[o]);
    st.counters[o == mpi ? std::string("mpi_allreduce_s")
                         : std::string(gcomp::algorithm_name(options[o])) + "_s"] = m;
    if (o > 0) best = std::min(best, m);
  }
  // What auto ran most often, and on how many of its timed calls something else.
  const auto most = std::max_element(ran.begin(), ran.end());
  st.counters["chosen"] = static_cast<double>(most - ran.begin());
  int total_runs = 0;
  for (int r : ran) total_runs += r;
  st.counters["auto_other_calls"] = total_runs - *most;
  st.counters["best_s"] = best;
  st.counters["ratio"] = best > 0 ? median(times[0]) / best : 0;
  st.counters["ranks"] = world_size;
}

// The cluster set's cases at n: codecs none, fp16, QSGD 4-bit, top-k 1% + EF and PowerSGD rank 4
// + EF (a square matrix, bm_gcomp's), each with auto
// and every algorithm the cost model can predict for it (one that does not apply to the codec is
// predicted kNotApplicable): f(spec, ef, algorithm).
template <class F>
void for_each_cluster_case(std::size_t n, F&& f) {
  const std::pair<const char*, bool> codecs[] = {{"none", false},
                                                 {"fp16", false},
                                                 {"qsgd:bits=4", false},
                                                 {"topk:ratio=0.01", true},
                                                 {"powersgd:rank=4", true}};
  for (const auto& [spec, ef] : codecs) {
    const auto pred = comm->predict(gcomp::Codec(spec), n, 0, ef);
    for (int a = 0; a < gcomp::kAlgorithmCount; ++a) {
      const auto alg = static_cast<gcomp::Algorithm>(a);
      if (alg != gcomp::Algorithm::automatic && !(pred[a] < gcomp::kNotApplicable)) continue;
      f(spec, ef, alg);
    }
  }
}

#ifdef GCOMP_BENCH_HAVE_GLOO
// --set=transports: the same call on a Communicator over MPI and one over Gloo, alternating call
// by call in one run (the machine's drift falls on both alike); medians of each and their ratio.
// Row engines/none: MPI_Allreduce against Gloo's own ring allreduce, the same way.
gcomp::Communicator* comm_mpi = nullptr;
gcomp::Communicator* comm_gloo = nullptr;

void bm_transports(benchmark::State& st, std::string spec, gcomp::Algorithm alg, std::size_t n,
                   bool ef) {
  const bool engines = spec == "engines";
  const gcomp::Codec codec(engines ? "none" : spec);
  const std::vector<float> base = input(n);
  std::vector<float> in(base), out(n);
  gcomp::ErrorFeedback memory[2] = {gcomp::ErrorFeedback(ef ? n : 0),
                                    gcomp::ErrorFeedback(ef ? n : 0)};
  gcomp::Communicator* on[2] = {comm_mpi, comm_gloo};
  std::mt19937_64 offsets(99);
  std::uint64_t sent[2] = {0, 0};
  const auto call = [&](int t, std::uint64_t seed) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    if (engines && t == 0) {
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (engines) {
      std::copy(in.begin(), in.end(), out.begin());
      gloo_sum(out);
    } else {
      gcomp::AllreduceOptions opt;
      opt.algorithm = alg;
      opt.seed = seed;
      on[t]->allreduce(in, out, codec, ef ? &memory[t] : nullptr, opt);
      sent[t] = on[t]->last_stats().bytes_sent;
    }
    return slowest(MPI_Wtime() - start);
  };
  const auto next = [&] {
    if (!ef) return;
    const auto at = static_cast<std::ptrdiff_t>(offsets() % n);
    std::rotate_copy(base.begin(), base.begin() + at, base.end(), in.begin());
  };
  const int warm = engines ? 1 : std::max(kAutoWarmup, ef ? kFeedbackWarmup : 1);
  for (int i = 0; i < warm; ++i) {
    next();
    for (int t = 0; t < 2; ++t) call(t, 1);
  }
  std::vector<double> times[2];
  std::uint64_t seed = 2;
  for (auto _ : st) {
    next();
    double total = 0;
    for (int t = 0; t < 2; ++t) {
      const double s = call(t, seed);
      times[t].push_back(s);
      total += s;
    }
    ++seed;
    st.SetIterationTime(total);
  }
  const double m = median(times[0]), g = median(times[1]);
  st.counters["mpi_s"] = m;
  st.counters["gloo_s"] = g;
  st.counters["ratio"] = m > 0 ? g / m : 0;
  st.counters["mpi_bytes"] = static_cast<double>(sent[0]);
  st.counters["gloo_bytes"] = static_cast<double>(sent[1]);
  st.counters["ranks"] = world_size;
}

void register_transports_set(std::size_t n) {
  benchmark::RegisterBenchmark(("transports/engines/none/" + std::to_string(n)).c_str(),
                               bm_transports, std::string("engines"), gcomp::Algorithm::dense, n,
                               false)
      ->UseManualTime()
      ->Iterations(n >= (std::size_t{1} << 22) ? 9 : 31)
      ->Unit(benchmark::kMillisecond);
  for_each_cluster_case(n, [n](const char* spec, bool ef, gcomp::Algorithm alg) {
    if (gcomp::Codec(spec).properties().needs_shapes) return;  // bm_gcomp's alone
    const std::string name = std::string("transports/") + gcomp::algorithm_name(alg) + "/" +
                             spec + (ef ? "+ef/" : "/") + std::to_string(n);
    benchmark::RegisterBenchmark(name.c_str(), bm_transports, std::string(spec), alg, n, ef)
        ->UseManualTime()
        ->Iterations(n >= (std::size_t{1} << 22) ? 9 : 31)
        ->Unit(benchmark::kMillisecond);
  });
}
#endif

struct Entry {
  const char* spec;
  gcomp::Algorithm alg;
  bool target;      // needed for the network targets
  bool ef = false;  // with error feedback (named spec+ef)
};

const Entry kEntries[] = {
    {"none", gcomp::Algorithm::automatic, true},
    {"none", gcomp::Algorithm::dense, false},
    {"fp16", gcomp::Algorithm::automatic, false},
    {"fp16", gcomp::Algorithm::compressed_reduce_scatter, false},
    {"qsgd:bits=4", gcomp::Algorithm::automatic, true},
    {"qsgd:bits=4", gcomp::Algorithm::compressed_reduce_scatter, true},
    {"qsgd:bits=4", gcomp::Algorithm::allgather, false},
    {"qsgd:bits=4", gcomp::Algorithm::dense, false},
    {"qsgd:bits=8", gcomp::Algorithm::compressed_reduce_scatter, false},
    {"terngrad", gcomp::Algorithm::compressed_reduce_scatter, false},
    {"sign", gcomp::Algorithm::compressed_reduce_scatter, false},
    {"sign", gcomp::Algorithm::allgather, false},
    {"topk:ratio=0.01", gcomp::Algorithm::automatic, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_allgather, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_recursive_doubling, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_split, true},
    {"topk:ratio=0.01", gcomp::Algorithm::dense, false},
    // With error feedback, as training runs it: every sparse algorithm, the global top-k among
    // them (auto weighs sparse_reduce_scatter only with error feedback).
    {"topk:ratio=0.01", gcomp::Algorithm::automatic, true, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_allgather, true, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_recursive_doubling, true, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_split, true, true},
    {"topk:ratio=0.01", gcomp::Algorithm::sparse_reduce_scatter, true, true},
    {"topk:ratio=0.001", gcomp::Algorithm::sparse_reduce_scatter, false, true},
    {"topk:ratio=0.001", gcomp::Algorithm::sparse_allgather, false},
    {"topk:ratio=0.001", gcomp::Algorithm::sparse_recursive_doubling, false},
    {"topk:ratio=0.001", gcomp::Algorithm::sparse_split, false},
    {"topk:ratio=0.1", gcomp::Algorithm::sparse_allgather, false},
    {"topk:ratio=0.1", gcomp::Algorithm::sparse_recursive_doubling, false},
    {"topk:ratio=0.1", gcomp::Algorithm::sparse_split, false},
    {"randomk:ratio=0.01", gcomp::Algorithm::sparse_recursive_doubling, false},
    {"randomk:ratio=0.01", gcomp::Algorithm::sparse_split, false},
};

// The cluster set at n: a benchmark of each of for_each_cluster_case's cases.
void register_cluster_set(std::size_t n) {
  for_each_cluster_case(n, [n](const char* spec, bool ef, gcomp::Algorithm alg) {
    const std::string name = std::string(gcomp::algorithm_name(alg)) + "/" + spec +
                             (ef ? "+ef/" : "/") + std::to_string(n);
    benchmark::RegisterBenchmark(name.c_str(), bm_gcomp, std::string(spec), alg, n, ef)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  });
}

void model_table() {
  const std::vector<std::pair<const char*, double>> rates = {
      {"1 Gbit", 1e9}, {"10 Gbit", 1e10}, {"100 Gbit", 1e11}};
  const std::size_t n = std::size_t{1} << 24;
  std::printf("| codec | network | ranks | dense | best compressed | algorithm | speedup |\n");
  std::printf("|---|---|---:|---:|---:|---|---:|\n");
  for (const char* spec : {"topk:ratio=0.01", "qsgd:bits=4", "sign", "fp16"}) {
    const gcomp::Codec codec(spec);
    const gcomp::ComputeModel compute = gcomp::measure_compute(codec);
    for (const auto& [name, rate] : rates) {
      for (int p : {2, 4, 8, 16, 64, 256, 1024}) {
        gcomp::ModelInput in;
        in.n = static_cast<double>(n);
        in.ranks = p;
        in.network = gcomp::network_for_rate(rate, rate <= 1e9 ? 50e-6 : 5e-6);
        in.compute = compute;
        in.sparse = codec.properties().sparse;
        in.sent = static_cast<double>(codec.selected(n));
        in.payload_bytes = static_cast<double>(codec.max_bytes(n));
        const auto t = gcomp::predict(in);
        const gcomp::Algorithm best = gcomp::cheapest(in);
        double best_comp = 1e30;
        gcomp::Algorithm comp = gcomp::Algorithm::dense;
        for (int a = 2; a < gcomp::kAlgorithmCount; ++a) {
          if (gcomp::auto_candidate(static_cast<gcomp::Algorithm>(a), in) && t[a] < best_comp) {
            best_comp = t[a];
            comp = static_cast<gcomp::Algorithm>(a);
          }
        }
        const double dense = t[static_cast<int>(gcomp::Algorithm::dense)];
        std::printf("| %s | %s | %d | %.4f s | %.4f s | %s | %.1fx%s |\n", spec, name, p, dense,
                    best_comp, gcomp::algorithm_name(comp), dense / best_comp,
                    best == gcomp::Algorithm::dense ? " (auto: dense)" : "");
      }
    }
  }
}

// How far each algorithm scales: the model's time and bytes per rank for top-k 1% of 16M floats
// at P = 8..1024 on 10 and 100 Gbit (alpha 5 us), with this machine's codec speeds.
void scale_table() {
  const std::size_t n = std::size_t{1} << 24;
  const gcomp::Codec codec("topk:ratio=0.01");
  const gcomp::ComputeModel compute = gcomp::measure_compute(codec);
  const std::vector<gcomp::Algorithm> algs = {
      gcomp::Algorithm::dense, gcomp::Algorithm::sparse_allgather,
      gcomp::Algorithm::sparse_recursive_doubling, gcomp::Algorithm::sparse_split,
      gcomp::Algorithm::sparse_reduce_scatter};
  std::printf(
      "top-k 1%% of %zu floats (k = %zu), with error feedback; each cell: predicted time, "
      "MB sent per rank\n\n| network | ranks |",
      n, codec.selected(n));
  for (gcomp::Algorithm a : algs) std::printf(" %s |", gcomp::algorithm_name(a));
  std::printf("\n|---|---:|");
  for (std::size_t i = 0; i < algs.size(); ++i) std::printf("---:|");
  std::printf("\n");
  for (const auto& [name, rate] :
       std::vector<std::pair<const char*, double>>{{"10 Gbit", 1e10}, {"100 Gbit", 1e11}}) {
    for (int p : {8, 64, 256, 1024}) {
      gcomp::ModelInput in;
      in.n = static_cast<double>(n);
      in.ranks = p;
      in.network = gcomp::network_for_rate(rate, 5e-6);
      in.compute = compute;
      in.sparse = true;
      in.error_feedback = true;
      in.sent = static_cast<double>(codec.selected(n));
      in.payload_bytes = static_cast<double>(codec.max_bytes(n));
      const auto t = gcomp::predict(in);
      const auto b = gcomp::predict_bytes(in);
      std::printf("| %s | %d |", name, p);
      for (gcomp::Algorithm a : algs) {
        const int i = static_cast<int>(a);
        std::printf(" %.4f s, %.1f MB |", t[i], b[i] / 1e6);
      }
      std::printf("\n");
    }
  }
}

// The two levels at scale: 8 ranks a host sharing one network card (each rank's share of it when
// all send: beta = 8 x 8 / rate), the steps inside a host through shared memory (this machine's
// memory passes, barriers at 2 us), 2 to 128 hosts; for each codec the best flat algorithm against
// two_level, its time split into the steps inside the host and the step across hosts, and the
// bytes each host's link sends per call. With this machine's codec speeds.
void two_level_table() {
  const std::size_t n = std::size_t{1} << 24;
  const int w = 8;
  std::printf(
      "%zu floats, 8 ranks a host; each host's link shared by its ranks; inside a host shared "
      "memory (this machine's passes), barriers of 2 us\n\n| codec | link | hosts | ranks | best "
      "flat | its time | its MB a host's "
      "link | two_level | inside hosts | across hosts | its MB a host's link | auto |\n",
      n);
  std::printf("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const auto& [spec, ef] : std::vector<std::pair<const char*, bool>>{
           {"topk:ratio=0.01", true}, {"qsgd:bits=4", false}, {"powersgd:rank=4", true}}) {
    const gcomp::Codec codec(spec);
    const gcomp::ComputeModel compute = gcomp::measure_compute(codec);
    const gcomp::ComputeModel shared = gcomp::measure_reduce_and_merge();
    for (const auto& [name, rate] :
         std::vector<std::pair<const char*, double>>{{"10 Gbit", 1e10}, {"100 Gbit", 1e11}}) {
      for (int hosts : {2, 8, 32, 128}) {
        gcomp::ModelInput in;
        in.n = static_cast<double>(n);
        in.ranks = hosts * w;
        in.network = gcomp::network_for_rate(rate / w, 5e-6);
        in.host_network = gcomp::network_for_rate(20e9 * 8, 2e-6);
        in.host_memory = true;
        in.hosts = hosts;
        in.ranks_per_host = w;
        in.compute = {compute.encode, compute.decode, shared.reduce, shared.merge};
        in.codec = &codec;
        in.codec_none = codec.kind() == gcomp::CodecKind::none;
        in.sparse = codec.properties().sparse;
        in.shared_support = codec.properties().shared_support;
        in.error_feedback = ef;
        in.sent = static_cast<double>(codec.selected(n));
        in.payload_bytes =
            codec.properties().low_rank ? 0.0 : static_cast<double>(codec.max_bytes(n));
        const auto t = gcomp::predict(in);
        const auto b = gcomp::predict_bytes(in);
        const int two = static_cast<int>(gcomp::Algorithm::two_level);
        int flat = static_cast<int>(gcomp::Algorithm::dense);
        for (int a = 1; a < gcomp::kAlgorithmCount; ++a) {
          if (a != two && t[a] < t[flat]) flat = a;
        }
        // The step across hosts as two_level runs it: the family's algorithm on n / 8 among
        // the hosts (for none and PowerSGD, their own on the two-level sum: its allreduces).
        gcomp::ModelInput across = in;
        across.n = in.n / w;
        across.ranks = hosts;
        across.hosts = 0;
        across.sent = in.sent / w;
        across.payload_bytes = in.payload_bytes / w;
        across.network = gcomp::network_for_rate(rate / w, 5e-6);
        const auto ta = gcomp::predict(across);
        const auto ba = gcomp::predict_bytes(across);
        const int inner =
            static_cast<int>(in.codec_none                 ? gcomp::Algorithm::dense
                             : codec.properties().low_rank ? gcomp::Algorithm::low_rank
                             : in.sparse                   ? gcomp::Algorithm::sparse_allgather
                                                           : gcomp::Algorithm::allgather);
        // A host's link: the flat algorithm's bytes of its 8 ranks, (P - 8)/(P - 1) of them to
        // other hosts where they spread evenly; two_level's 8 owners' bytes across hosts.
        const double p = in.ranks;
        const double flat_link = b[flat] * w * (p - w) / (p - 1);
        const double two_link = ba[inner] * w;
        const gcomp::Algorithm chose = gcomp::cheapest(in);
        // PowerSGD's steps are its own with each factor allreduce on two levels: no one step
        // across hosts to split off (its factors cross each host's link once, 2 (H-1)/H of them).
        const bool split = !codec.properties().low_rank;
        char inside[32] = "-", outside[32] = "-";
        if (split) {
          std::snprintf(inside, sizeof inside, "%.4f s", t[two] - ta[inner]);
          std::snprintf(outside, sizeof outside, "%.4f s", ta[inner]);
        }
        const double link = split ? two_link
                                  : b[two] / (2.0 * (w - 1) / w + 2.0 * (hosts - 1) / hosts / w) *
                                        2.0 * (hosts - 1) / hosts;
        std::printf("| %s%s | %s | %d | %d | %s | %.4f s | %.1f | %.4f s | %s | %s | %.1f | %s |\n",
                    spec, ef ? "+ef" : "", name, hosts, hosts * w,
                    gcomp::algorithm_name(static_cast<gcomp::Algorithm>(flat)), t[flat],
                    flat_link / 1e6, t[two], inside, outside, link / 1e6,
                    gcomp::algorithm_name(chose));
      }
    }
  }
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  std::vector<std::size_t> sizes = {std::size_t{1} << 20, std::size_t{1} << 24};
  bool targets_only = false;
  bool table = false;
  bool scale = false;
  bool two_levels = false;
  bool paired = false;
  bool cluster = false;
  bool versus = false;
  bool timeline_set = false;
  bool on_gloo = false;
  bool transports = false;
  std::vector<char*> rest = {argv[0]};
  bool min_time_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) {
      sizes.clear();
      std::string list = a.substr(8);
      for (std::size_t pos = 0; pos <= list.size();) {
        const std::size_t comma = list.find(',', pos);
        sizes.push_back(std::stoull(list.substr(pos, comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--transport=gloo" || a == "--transport=mpi") {
      on_gloo = a == "--transport=gloo";
    } else if (a == "--set=transports") {
      transports = true;
    } else if (a == "--set=targets") {
      targets_only = true;
    } else if (a == "--set=full") {
      targets_only = false;
    } else if (a == "--set=paired") {
      paired = true;
    } else if (a == "--set=cluster") {
      cluster = true;
    } else if (a == "--set=versus") {
      versus = true;
    } else if (a == "--set=timeline") {
      timeline_set = true;
    } else if (a == "--model-table") {
      table = true;
    } else if (a == "--two-level-table") {
      two_levels = true;
    } else if (a == "--scale-table") {
      scale = true;
    } else {
      if (a.rfind("--benchmark_min_time", 0) == 0) min_time_given = true;
      if (world_rank != 0 && a.rfind("--benchmark_out", 0) == 0) continue;  // rank 0 writes
      rest.push_back(argv[i]);
    }
  }
  if (table || scale || two_levels) {
    if (world_rank == 0) table ? model_table() : two_levels ? two_level_table() : scale_table();
    MPI_Finalize();
    return 0;
  }
  static char min_time[] = "--benchmark_min_time=0.3";
  if (!min_time_given) rest.push_back(min_time);
  int rest_argc = static_cast<int>(rest.size());
  // The algorithms' names in enum order ("chosen" counters are their numbers), for the scripts
  // that read the JSON (scripts/bench-network).
  std::string names;
  for (int a = 0; a < gcomp::kAlgorithmCount; ++a) {
    if (a > 0) names += ',';
    names += gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a));
  }
  benchmark::AddCustomContext("gcomp_algorithms", names);
  benchmark::AddCustomContext("gcomp_transport", on_gloo ? "gloo" : "mpi");
  benchmark::Initialize(&rest_argc, rest.data());
  {
    std::unique_ptr<gcomp::Communicator> made, second;
#ifdef GCOMP_BENCH_HAVE_GLOO
    {
      gloo::rendezvous::FileStore store(store_dir());
      make_gloo_peer(store);
      if (on_gloo) made = std::make_unique<gcomp::Communicator>(store, world_rank, world_size);
      if (transports) {
        // Both transports: comm (what predictions come from) on MPI, the other on Gloo.
        second = std::make_unique<gcomp::Communicator>(store, world_rank, world_size);
        comm_gloo = second.get();
      }
    }
#else
    if (on_gloo || transports) {
      if (world_rank == 0) std::fprintf(stderr, "--transport=gloo: this build has no Gloo\n");
      MPI_Finalize();
      return 2;
    }
#endif
    if (!made) made = std::make_unique<gcomp::Communicator>(MPI_COMM_WORLD);
    gcomp::Communicator& c = *made;
    comm = &c;
#ifdef GCOMP_BENCH_HAVE_GLOO
    if (transports) comm_mpi = &c;
#endif
    if (world_rank == 0) {
      std::printf(
          "transport %s, ranks %d, network alpha %.2f us, beta %.3f ns/byte (%.2f GB/s per rank), "
          "beta_all %.3f, beta_one %.3f, beta_allreduce %.3f (32 MiB: %.3f) ns/byte\n",
          gcomp::transport_name(c.transport()), world_size, c.network().alpha * 1e6,
          c.network().beta * 1e9, c.network().beta > 0 ? 1e-9 / c.network().beta : 0.0,
          c.network().beta_all * 1e9, c.network().beta_one * 1e9, c.network().beta_allreduce * 1e9,
          c.network().beta_allreduce_large * 1e9);
      if (c.host_network().beta > 0) {
        std::printf(
            "inside a host: alpha %.2f us, beta %.3f ns/byte, beta_all %.3f, beta_one %.3f "
            "ns/byte\n",
            c.host_network().alpha * 1e6, c.host_network().beta * 1e9,
            c.host_network().beta_all * 1e9, c.host_network().beta_one * 1e9);
      }
    }
    std::string timeline_file;
    if (timeline_set) {
      const char* tmp = std::getenv("TMPDIR");
      timeline_file = std::string(tmp && *tmp ? tmp : "/tmp") + "/gcomp_bench_timeline_" +
                      std::to_string(getpid()) + ".json";
      gcomp::timeline::open(timeline_file, world_rank);
    }
    for (std::size_t n : sizes) {
      if (timeline_set) {
        for (const auto& [spec, alg, ef] :
             std::vector<std::tuple<const char*, gcomp::Algorithm, bool>>{
                 {"none", gcomp::Algorithm::dense, false},
                 {"qsgd:bits=4", gcomp::Algorithm::allgather, false},
                 {"topk:ratio=0.01", gcomp::Algorithm::sparse_allgather, true},
                 {"topk:ratio=0.01", gcomp::Algorithm::automatic, true}}) {
          benchmark::RegisterBenchmark(
              (std::string("timeline/") + gcomp::algorithm_name(alg) + "/" + spec +
               (ef ? "+ef/" : "/") + std::to_string(n))
                  .c_str(),
              bm_timeline, std::string(spec), alg, n, ef)
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond);
        }
        continue;
      }
      if (paired) {
        for (const char* spec : {"none", "fp16", "qsgd:bits=4", "sign", "topk:ratio=0.01"}) {
          for (const bool unc : {false, true}) {
            // The uncompressed call of an uncompressed codec is the call itself.
            if (unc && gcomp::Codec(spec).kind() == gcomp::CodecKind::none) continue;
            benchmark::RegisterBenchmark(
                (std::string(unc ? "paired_unc/" : "paired/") + spec + "/" + std::to_string(n))
                    .c_str(),
                bm_paired, std::string(spec), n, unc)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond);
          }
        }
        continue;
      }
      benchmark::RegisterBenchmark(("mpi_allreduce/none/" + std::to_string(n)).c_str(),
                                   bm_mpi_allreduce, n)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
#ifdef GCOMP_BENCH_HAVE_GLOO
      benchmark::RegisterBenchmark(("gloo_allreduce/none/" + std::to_string(n)).c_str(),
                                   bm_gloo_allreduce, n)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
#endif
      if (cluster) {
        register_cluster_set(n);
        continue;
      }
#ifdef GCOMP_BENCH_HAVE_GLOO
      if (transports) {
        register_transports_set(n);
        continue;
      }
#endif
      if (versus) {
        for (const auto& [spec, ef] :
             std::vector<std::pair<const char*, bool>>{{"none", false},
                                                       {"fp16", false},
                                                       {"qsgd:bits=4", false},
                                                       {"topk:ratio=0.01", true}}) {
          benchmark::RegisterBenchmark(
              (std::string("versus/") + spec + (ef ? "+ef/" : "/") + std::to_string(n)).c_str(),
              bm_versus, std::string(spec), n, ef)
              ->UseManualTime()
              ->Iterations(n >= (std::size_t{1} << 22) ? 9 : 31)
              ->Unit(benchmark::kMillisecond);
        }
        continue;
      }
      for (const Entry& e : kEntries) {
        if (targets_only && !e.target) continue;
        const std::string name = std::string(gcomp::algorithm_name(e.alg)) + "/" + e.spec +
                                 (e.ef ? "+ef/" : "/") + std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(), bm_gcomp, std::string(e.spec), e.alg, n, e.ef)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
    if (world_rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      NullReporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    comm = nullptr;
    if (timeline_set) {
      gcomp::timeline::close();
      std::remove(gcomp::timeline::path_for(timeline_file, world_rank).c_str());
    }
#ifdef GCOMP_BENCH_HAVE_GLOO
    comm_mpi = comm_gloo = nullptr;
    gloo_peer.reset();
#endif
  }
  benchmark::Shutdown();
  // MPICH over UCX's TCP transport sometimes spins forever in MPI_Finalize (seen with 3 and 4
  // ranks, shaped or not, in plain MPI programs too). The results are written by now: give
  // Finalize 30 seconds, then leave.
  std::signal(SIGALRM, [](int) {
    static const char msg[] = "gcomp_bench_collectives: MPI_Finalize hung; exiting\n";
    (void)!write(2, msg, sizeof msg - 1);
    std::_Exit(0);
  });
  alarm(30);
  MPI_Finalize();
  return 0;
}
