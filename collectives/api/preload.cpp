// libgcomp_preload.so: gcomp's compressed allreduce for MPI programs nobody will edit, through
// MPI's profiling interface (docs/interposer.md):
//
//   LD_PRELOAD=libgcomp_preload.so GCOMP_CODEC=topk:ratio=0.01 mpiexec.mpich -n 4 ./train
//
// It defines MPI_Init, MPI_Init_thread, MPI_Finalize, MPI_Allreduce and MPI_Iallreduce, and
// calls PMPI_* for everything it does not take. MPI_Allreduce is taken when the settings name a
// codec and the call is a float sum over an intracommunicator of at least GCOMP_MIN_COUNT
// elements (from the thread that initialized MPI, under MPI_THREAD_MULTIPLE); the taken call is
// gcomp_allreduce's (the codec always applied), with error feedback kept per call site. Every
// other call, and every MPI_Iallreduce, goes to PMPI untouched. gcomp's own traffic uses the
// large-count MPI_*_c functions, which this library does not define, so it never comes back
// here; a thread-local guard makes sure of it.
#include <mpi.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "communicator_for.hpp"
#include "env_setting.hpp"
#include "fnv.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/error.hpp"
#include "stall_report.hpp"

namespace {

// Residuals unused for this many taken calls are freed (a call site that is gone).
constexpr std::uint64_t kForgetAfterCalls = 1024;

struct Settings {
  std::optional<gcomp::Codec> codec;  // none: GCOMP_CODEC unset, nothing is taken
  std::uint64_t min_count = 65536;
  bool error_feedback = false;  // GCOMP_EF, resolved for the codec
  std::string ef_setting = "on";
  std::string algorithm = "auto";
  bool stats = false;
  std::uint64_t ef_memory = std::uint64_t{4096} << 20;  // bytes of residuals at most

  // What every rank must have alike, as one line.
  std::string canonical() const {
    return (codec ? codec->spec() : std::string("-")) + " " + std::to_string(min_count) + " " +
           (error_feedback ? "ef" : "noef") + " " + algorithm + " " + std::to_string(ef_memory);
  }
};

[[noreturn]] void bad_setting(const std::string& name, const std::string& value,
                              const std::string& why) {
  throw gcomp::Error(gcomp::Status::invalid_argument,
                     name + "=" + value + ": " + why);
}

std::uint64_t parse_count(const char* name, const char* value) {
  const std::string s = value;
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
    bad_setting(name, s, "not a non-negative integer");
  }
  errno = 0;
  const unsigned long long v = std::strtoull(value, nullptr, 10);
  if (errno == ERANGE) bad_setting(name, s, "too large");
  return v;
}

// on/off, with the spellings people use.
std::optional<bool> parse_switch(const std::string& s) {
  if (s == "1" || s == "on" || s == "true" || s == "yes") return true;
  if (s == "0" || s == "off" || s == "false" || s == "no") return false;
  return std::nullopt;
}

// Error feedback where the codec's error contracts (CodecProperties::contraction: top-k,
// threshold, sign, fp16, bf16, unscaled random-k): the unbiased quantizers' residual grows
// (docs/interposer.md).
bool feedback_for(const gcomp::Codec& c, const std::string& setting) {
  if (setting == "always") return true;
  if (setting == "off") return false;
  return c.properties().contraction;
}

Settings read_settings() {
  Settings s;
  if (const char* v = std::getenv("GCOMP_CODEC"); v && *v) {
    try {
      s.codec.emplace(v);
    } catch (const gcomp::Error& e) {
      bad_setting("GCOMP_CODEC", v, e.what());
    }
    if (s.codec->properties().needs_shapes) {
      bad_setting("GCOMP_CODEC", v,
                  "a low-rank codec needs each tensor's shape, which MPI_Allreduce does not "
                  "give; use gcomp's allreduce_buckets with shapes (C++, the C API's "
                  "gcomp_allreduce_buckets_shaped, Python, gcomp.torch) instead of the "
                  "interposer");
    }
  }
  if (const char* v = std::getenv("GCOMP_MIN_COUNT")) s.min_count = parse_count("GCOMP_MIN_COUNT", v);
  if (const char* v = std::getenv("GCOMP_EF")) {
    const std::string e = v;
    if (e == "always") {
      s.ef_setting = "always";
    } else if (const auto on = parse_switch(e)) {
      s.ef_setting = *on ? "on" : "off";
    } else {
      bad_setting("GCOMP_EF", e, "expected on, off (1, 0, true, false, yes, no) or always");
    }
  }
  if (const auto a = gcomp::detail::algorithm_setting()) s.algorithm = gcomp::algorithm_name(*a);
  if (const char* v = std::getenv("GCOMP_STATS")) {
    const auto on = parse_switch(v);
    if (!on) bad_setting("GCOMP_STATS", v, "expected 1 or 0 (on, off, true, false, yes, no)");
    s.stats = *on;
  }
  if (const char* v = std::getenv("GCOMP_EF_MEMORY_MB")) {
    const std::uint64_t mb = parse_count("GCOMP_EF_MEMORY_MB", v);
    if (mb == 0 || mb > (std::uint64_t{1} << 40)) {
      bad_setting("GCOMP_EF_MEMORY_MB", v, "expected 1 to 2^40 MiB");
    }
    s.ef_memory = mb << 20;
  }
  // Read again by each communicator's Communicator at its first taken call; checked here so
  // that a bad value stops the program at MPI_Init as the other settings do.
  (void)gcomp::detail::wait_limits_from_env();
  if (s.codec) s.error_feedback = feedback_for(*s.codec, s.ef_setting);
  return s;
}

// One call site's residual: (communicator, receive buffer, count).
struct Site {
  gcomp::ErrorFeedback ef;
  std::uint64_t last_call;
  std::list<std::pair<const void*, std::uint64_t>>::iterator lru;
  explicit Site(std::size_t n, std::uint64_t call) : ef(n), last_call(call) {}
};

// What the interposer keeps per communicator (an attribute: freed with the communicator).
struct CommState {
  std::uint64_t calls = 0;  // taken calls, the seed of the next
  std::map<std::pair<const void*, std::uint64_t>, Site> sites;
  std::list<std::pair<const void*, std::uint64_t>> lru;  // least recently used first
  std::uint64_t bytes = 0;                                // residuals held
};

struct Totals {
  gcomp::TotalStats taken;  // the taken calls' statistics, summed as a Communicator sums its own
  std::uint64_t bytes_uncompressed = 0;
  std::atomic<std::uint64_t> passed{0};  // from any thread
  double seconds = 0;
};

struct Interposer {
  bool active = false;  // a codec is set (agreed between ranks)
  Settings settings;
  std::uint64_t min_count = 0;  // agreed: the smallest of the ranks'
  std::string differ;           // the ranks' settings differ: what this rank has
  bool multiple = false;        // MPI_THREAD_MULTIPLE: only the owner thread's calls are taken
  std::thread::id owner;
  int keyval = MPI_KEYVAL_INVALID;
  Totals totals;
};

Interposer& state() {
  static Interposer s;
  return s;
}

thread_local int inside = 0;  // in a taken call: MPI calls made from here pass through

int delete_comm_state(MPI_Comm, int, void* value, void*) {
  delete static_cast<CommState*>(value);
  return MPI_SUCCESS;
}

CommState& comm_state(MPI_Comm comm) {
  Interposer& st = state();
  void* value = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, st.keyval, &value, &found);
  if (found) return *static_cast<CommState*>(value);
  auto created = std::make_unique<CommState>();
  PMPI_Comm_set_attr(comm, st.keyval, created.get());
  return *created.release();
}

// The residual of a call site, made on first use; sites unused for kForgetAfterCalls calls, and
// the least recently used past the memory bound, are freed.
gcomp::ErrorFeedback& feedback_for_site(CommState& cs, const void* buf, std::uint64_t count) {
  const auto key = std::make_pair(buf, count);
  const std::uint64_t call = cs.calls;
  auto it = cs.sites.find(key);
  if (it != cs.sites.end()) {
    it->second.last_call = call;
    cs.lru.splice(cs.lru.end(), cs.lru, it->second.lru);
  } else {
    const std::uint64_t limit = state().settings.ef_memory;
    while (!cs.lru.empty() &&
           (cs.bytes + 4 * count > limit ||
            call - cs.sites.at(cs.lru.front()).last_call > kForgetAfterCalls)) {
      cs.bytes -= 4 * cs.lru.front().second;
      cs.sites.erase(cs.lru.front());
      cs.lru.pop_front();
    }
    it = cs.sites.try_emplace(key, static_cast<std::size_t>(count), call).first;
    it->second.lru = cs.lru.insert(cs.lru.end(), key);
    cs.bytes += 4 * count;
  }
  return it->second.ef;
}

// Reads and checks the settings on every rank, agrees them, and fails every rank (a non-zero
// exit after a one-line message from the lowest failing rank) when one is bad.
void on_init(int provided) {
  Interposer& st = state();
  int rank = 0, size = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string error;
  try {
    st.settings = read_settings();
  } catch (const gcomp::Error& e) {
    error = e.what();
  }
  int mine = error.empty() ? size : rank, first_bad = size;
  PMPI_Allreduce(&mine, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first_bad < size) {
    if (rank == first_bad) {
      std::fprintf(stderr, "gcomp preload: rank %d: %s\n", rank, error.c_str());
      std::fflush(stderr);
    }
    PMPI_Barrier(MPI_COMM_WORLD);
    PMPI_Finalize();
    std::exit(2);
  }
  // Every rank must take the same calls: compare the settings, and decide which calls to take
  // from values that are the same everywhere.
  const std::uint64_t h = gcomp::detail::Fnv{}.add(st.settings.canonical()).h;
  std::uint64_t lo = 0, hi = 0, min_count = 0;
  int any_codec = 0, codec = st.settings.codec ? 1 : 0;
  PMPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  PMPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  PMPI_Allreduce(&st.settings.min_count, &min_count, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  PMPI_Allreduce(&codec, &any_codec, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  st.active = any_codec != 0;
  st.min_count = min_count;
  if (lo != hi) {
    st.differ = "the ranks' settings differ (GCOMP_CODEC GCOMP_MIN_COUNT GCOMP_EF GCOMP_ALGORITHM "
                "GCOMP_EF_MEMORY_MB); this rank has: " +
                st.settings.canonical();
  }
  st.multiple = provided == MPI_THREAD_MULTIPLE;
  st.owner = std::this_thread::get_id();
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &delete_comm_state, &st.keyval, nullptr);
}

bool takes(int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const Interposer& st = state();
  if (!st.active || inside || type != MPI_FLOAT || op != MPI_SUM || count < 0 ||
      static_cast<std::uint64_t>(count) < st.min_count || comm == MPI_COMM_NULL) {
    return false;
  }
  if (st.multiple && std::this_thread::get_id() != st.owner) return false;
  int inter = 0;
  if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return false;
  return true;
}

}  // namespace

namespace {

// A failed taken call: its message on this rank, then the communicator's error handler (fatal by
// default: the job ends non-zero; MPI_ERRORS_RETURN: the caller gets MPI_ERR_OTHER).
int fail(MPI_Comm comm, const std::string& why) {
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "gcomp preload: rank %d: MPI_Allreduce: %s\n", rank, why.c_str());
  std::fflush(stderr);
  PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

int taken_allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Comm comm) {
  Interposer& st = state();
  if (!st.differ.empty()) {
    // Every rank knows (the settings were compared at MPI_Init) and takes this same call: each
    // says so before any handler ends the job.
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "gcomp preload: rank %d: MPI_Allreduce: %s\n", rank, st.differ.c_str());
    std::fflush(stderr);
    PMPI_Barrier(comm);
    PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
  }
  const Settings& s = st.settings;
  ++inside;
  struct Leave {
    ~Leave() { --inside; }
  } leave;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    gcomp::Communicator& c = gcomp::detail::communicator_for(comm);
    CommState& cs = comm_state(comm);
    const auto n = static_cast<std::size_t>(count);
    float* out = static_cast<float*>(recvbuf);
    const float* in = sendbuf == MPI_IN_PLACE ? out : static_cast<const float*>(sendbuf);
    gcomp::ErrorFeedback* ef = s.error_feedback ? &feedback_for_site(cs, recvbuf, n) : nullptr;
    gcomp::AllreduceOptions opt;
    // Its name in a stall report or a timeout's message.
    const std::string label = "the program's MPI_Allreduce, taken call " +
                              std::to_string(cs.calls + 1) + " on its communicator";
    opt.label = label.c_str();
    opt.seed = cs.calls++;
    opt.allow_uncompressed = false;  // the codec always applied, as gcomp_allreduce
    if (s.algorithm != "auto") opt.algorithm = gcomp::parse_algorithm(s.algorithm);
    c.allreduce({in, n}, {out, n}, *s.codec, ef, opt);
    Totals& t = st.totals;
    t.taken.add(c.last_stats());
    const double p = c.size();
    t.bytes_uncompressed += static_cast<std::uint64_t>(2 * (p - 1) / p * 4.0 * count);
    t.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return MPI_SUCCESS;
  } catch (const std::exception& e) {
    return fail(comm, e.what());
  }
}

void print_stats() {
  const Interposer& st = state();
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  const Totals& t = st.totals;
  const std::uint64_t sent = t.taken.bytes_sent;
  const double reduction = sent > 0 ? static_cast<double>(t.bytes_uncompressed) / sent : 0.0;
  std::string algorithms;
  for (int a = 0; a < gcomp::kAlgorithmCount; ++a) {
    if (t.taken.by_algorithm[a] == 0) continue;
    if (!algorithms.empty()) algorithms += ',';
    algorithms += gcomp::algorithm_name(static_cast<gcomp::Algorithm>(a));
    algorithms += ':' + std::to_string(t.taken.by_algorithm[a]);
  }
  std::fprintf(
      stderr,
      "gcomp preload: rank 0: taken=%llu passed=%llu bytes_sent=%llu "
      "bytes_uncompressed=%llu reduction=%.1fx seconds=%.3f codec=%s ef=%s "
      "algorithms=%s\n",
      static_cast<unsigned long long>(t.taken.calls),
      static_cast<unsigned long long>(t.passed.load()), static_cast<unsigned long long>(sent),
      static_cast<unsigned long long>(t.bytes_uncompressed), reduction, t.seconds,
      st.settings.codec ? st.settings.codec->spec().c_str() : "-",
      st.settings.error_feedback ? "on" : "off", algorithms.empty() ? "-" : algorithms.c_str());
  std::fflush(stderr);
}

}  // namespace

extern "C" {

int MPI_Init(int* argc, char*** argv) {
  const int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) {
    int provided = MPI_THREAD_SINGLE;
    PMPI_Query_thread(&provided);
    on_init(provided);
  }
  return rc;
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) on_init(*provided);
  return rc;
}

int MPI_Finalize(void) {
  // Before PMPI_Finalize: MPICH over UCX's TCP transport can hang in it after large messages.
  if (state().settings.stats) print_stats();
  return PMPI_Finalize();
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  if (takes(count, datatype, op, comm)) return taken_allreduce(sendbuf, recvbuf, count, comm);
  if (!inside) ++state().totals.passed;
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

// Passed through: a nonblocking call completes in MPI_Wait, which the interposer does not see.
int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype,
                   MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  if (!inside) ++state().totals.passed;
  return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
}

}  // extern "C"
