// Helpers for the MPI tests: the world communicator, per-rank inputs, and references computed
// with plain MPI from each rank's decoded contribution.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/cost_model.hpp"
#ifdef GCOMP_TEST_HAVE_GLOO
#include <gloo/rendezvous/file_store.h>
#endif

namespace gcomp::test {

inline int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// The network the tests' communicators assume: 10 Gbit/s links, 20 us latency.
inline NetworkModel test_network() {
  NetworkModel m = network_for_rate(10e9, 20e-6);
  m.beta_allreduce = m.beta;
  return m;
}

// Fixed numbers in place of auto's measurements, so that what auto chooses depends neither on
// this machine nor on its load: every codec encodes at 2 ns and decodes at 1 ns per element (per
// entry for sparse codecs), sums at 0.5 ns per element and merges at 5 ns per entry, and a call
// takes what the cost model predicts for the algorithm it ran (on test_network()), so auto's
// learning confirms the model. Derive and override call_seconds() for other truths.
class FixedTiming : public Timing {
 public:
  ComputeModel codec_speeds(const Codec&, std::size_t) override { return {2e-9, 1e-9, 0, 0}; }
  ComputeModel device_codec_speeds(const Codec& codec, std::size_t n,
                                   TensorView<const float>) override {
    return codec_speeds(codec, n);
  }
  ComputeModel shared_speeds() override { return {0, 0, 0.5e-9, 5e-9}; }
  double call_seconds(const Codec& codec, std::size_t n, Choice ran, double) override {
    return predicted(codec, n, ran);
  }
  static double predicted(const Codec& codec, std::size_t n, Choice c) {
    ModelInput in;
    in.n = static_cast<double>(n);
    MPI_Comm_size(MPI_COMM_WORLD, &in.ranks);
    in.network = test_network();
    in.compute = {2e-9, 1e-9, 0.5e-9, 5e-9};
    in.codec_none = codec.kind() == CodecKind::none;
    in.sparse = codec.properties().sparse;
    in.shared_support = codec.kind() == CodecKind::randomk;
    in.sent = static_cast<double>(codec.selected(n));
    in.payload_bytes = static_cast<double>(codec.max_bytes(n));
    if (!c.compressed) return predict_uncompressed(in);
    return predict(in)[static_cast<int>(c.algorithm)];
  }
};

// The transport the tests' Communicators run on: Gloo where GCOMP_TEST_TRANSPORT=gloo (the
// ranks mpiexec started meet through a file store in a directory rank 0 makes; MPI only starts
// them and computes the references), else MPI (MPI_COMM_WORLD).
inline bool on_gloo() {
  const char* t = std::getenv("GCOMP_TEST_TRANSPORT");
  return t && std::string(t) == "gloo";
}

#ifdef GCOMP_TEST_HAVE_GLOO
// The store's directory, made by rank 0 on first use and told to every rank. Rank 0 removes it
// at exit: by then every rank has passed the main's last collective, so every rendezvous is over.
inline const std::string& store_dir() {
  static const std::string dir = [] {
    char path[4096] = {};
    if (rank() == 0) {
      std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
      tmpl += "/gcomp-test-store-XXXXXX";
      std::strncpy(path, tmpl.c_str(), sizeof path - 1);
      if (!mkdtemp(path)) path[0] = '\0';
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    return std::string(path);
  }();
  static const bool removed_at_exit = [] {
    if (rank() == 0 && !dir.empty()) {
      std::atexit([] {
        std::error_code ignored;
        std::filesystem::remove_all(store_dir(), ignored);
      });
    }
    return true;
  }();
  (void)removed_at_exit;
  return dir;
}
#endif

// A Communicator of every rank on the tests' transport, measuring the network (network null)
// or given it and a timing. Each one made on Gloo gets a prefix of its own (every rank makes
// them in the same order).
inline std::unique_ptr<Communicator> make_communicator(const NetworkModel* network = nullptr,
                                                       std::shared_ptr<Timing> timing = nullptr) {
#ifdef GCOMP_TEST_HAVE_GLOO
  if (on_gloo()) {
    static int made = 0;
    if (store_dir().empty()) throw Error(Status::internal, "rank 0 could not make the store");
    gloo::rendezvous::FileStore store(store_dir());
    GlooOptions o;
    o.prefix = "test" + std::to_string(made++);
    if (!network) return std::make_unique<Communicator>(store, rank(), size(), o);
    return std::make_unique<Communicator>(store, rank(), size(), *network, std::move(timing), o);
  }
#endif
  if (!network) return std::make_unique<Communicator>(MPI_COMM_WORLD);
  return std::make_unique<Communicator>(MPI_COMM_WORLD, *network, std::move(timing));
}
inline std::unique_ptr<Communicator> make_communicator(const NetworkModel& network,
                                                       std::shared_ptr<Timing> timing = nullptr) {
  return make_communicator(&network, std::move(timing));
}

// One Communicator for the whole run, on test_network() and FixedTiming.
inline Communicator& world() {
  static const std::unique_ptr<Communicator> c =
      make_communicator(test_network(), std::make_shared<FixedTiming>());
  return *c;
}

// n normal values, different on every rank.
inline std::vector<float> input(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed * 7919u + static_cast<std::uint32_t>(rank()) * 104729u + 1u);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

// Small integers, so that every sum is exact in float32 whatever its order.
inline std::vector<float> integers(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed * 31u + static_cast<std::uint32_t>(rank()) * 977u + 5u);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(d(g));
  return x;
}

// The seed the library gives this rank's codec (documented in communicator.hpp).
inline std::uint64_t rank_seed(const Codec& c, std::uint64_t seed, std::uint64_t tensor = 0) {
  const bool shared = c.kind() == CodecKind::randomk;
  return derive_seed(seed, tensor, 0, shared ? 0 : static_cast<std::uint64_t>(rank()) + 1);
}

// decode(encode(x + e)) as this rank's codec sends it; updates `ef` like the library does.
inline std::vector<float> contribution(const Codec& c, std::span<const float> x, std::uint64_t seed,
                                       ErrorFeedback* ef = nullptr) {
  const auto p = ef ? c.encode_ef(*ef, x, rank_seed(c, seed)) : c.encode(x, rank_seed(c, seed));
  std::vector<float> d(x.size(), 0.0f);
  decode_add(p, d, 1.0f);
  return d;
}

inline std::vector<float> mpi_sum(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  MPI_Allreduce(v.data(), out.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  return out;
}

// The contributions summed in rank order (what allgather computes).
inline std::vector<float> ordered_sum(const std::vector<float>& v) {
  const auto p = static_cast<std::size_t>(size());
  std::vector<float> all(v.size() * p);
  MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_FLOAT, all.data(),
                static_cast<int>(v.size()), MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<float> out(v.size(), 0.0f);
  for (std::size_t r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < v.size(); ++i) out[i] += all[r * v.size() + i];
  }
  return out;
}

// Per element: how far two summation orders of the contributions may differ, 2 P 2^-24 sum |d|.
inline std::vector<float> order_tolerance(const std::vector<float>& v) {
  std::vector<float> a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  auto s = mpi_sum(a);
  const float f = 2.0f * static_cast<float>(size()) * 0x1p-24f;
  for (float& x : s) x = x * f + 1e-30f;
  return s;
}

// True on every rank iff every rank holds the same bits in v.
inline bool same_on_all_ranks(const std::vector<float>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    h = (h ^ u) * 1099511628211ull;
  }
  std::uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

// The status f throws (a gcomp::Error's; ok when it returns), its message into *message.
template <class F>
Status status_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return Status::ok;
}

// All ranks agree that cond holds on all ranks (for EXPECT_TRUE after collective steps).
inline bool all_ranks(bool cond) {
  int v = cond ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

}  // namespace gcomp::test
