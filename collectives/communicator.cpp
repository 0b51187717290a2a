// gcomp::Communicator: the call protocol around the algorithms.
//
// Every allreduce runs in three steps:
//   1. local work that can fail (argument checks, the sparse codecs' encode, the dense codecs'
//      check for NaN/Inf);
//   2. the agreement: one small allreduce (MPI_MAX over int64, see Agreement) that carries
//      a hash of (spec, n, options, requested algorithm), the first failing rank and its status,
//      the largest payload and entry counts, the slowest codec speeds and the previous call's
//      measured time: every rank learns the same things;
//   3. if every rank is fine and all agree, the algorithm (the requested one, or auto's choice
//      from the agreed numbers: the same on every rank; the first time a codec and size class
//      are seen, all ranks measure the codec's speeds together first) runs; otherwise every
//      rank throws, none waits.
#include "gcomp/communicator.hpp"

#include <sched.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "algorithms.hpp"
#include "device_backend.hpp"
#include "fnv.hpp"
#include "gcomp/cost_model.hpp"
#include "kernels.hpp"
#include "learner.hpp"
#include "nonfinite.hpp"
#include "stream.hpp"

namespace gcomp {

namespace {

constexpr const char* kAlgorithmNames[kAlgorithmCount] = {
    "auto",         "dense",     "sparse_allgather",         "sparse_recursive_doubling",
    "sparse_split", "allgather", "compressed_reduce_scatter"};

// ---- the agreement ----

// Every field is combined with MPI_MAX on int64 (a built-in operation MPICH runs on its fast
// path) and kept in [0, 2^63): Debian's MPICH 4.0.2 compares MPI_UINT64_T as signed in MPI_MAX.
// The fields: a 63-bit hash and its 63-bit complement (their maxima are each other's complements
// iff all ranks hold the same hash), the complement of the first failure (status << 32 | rank,
// so the MAX of the complement is the MIN of the failure; zero when the rank is fine), and the
// maxima of the payload sizes and of the codec speeds (non-negative doubles order like their
// bits, whose top bit is zero).
struct Agreement {
  std::uint64_t sig;
  std::uint64_t not_sig;
  std::uint64_t not_fail;
  std::uint64_t sent;             // entries a sparse payload holds
  std::uint64_t bytes;            // whole-tensor payload bytes
  std::uint64_t encode;           // the codec's encode seconds per element (double bits)
  std::uint64_t decode;           // decode seconds per element or entry (double bits)
  std::uint64_t learned_key;      // the previous call's (codec, size, algorithm) key
  std::uint64_t learned_seconds;  // and its seconds on this rank (double bits)
};
constexpr int kAgreementWords = sizeof(Agreement) / 8;
constexpr std::uint64_t k63 = (std::uint64_t{1} << 63) - 1;
constexpr double kInfinity = std::numeric_limits<double>::infinity();
static_assert(sizeof(Agreement) % 8 == 0);

using detail::Fnv;

// What the agreement's hash covers, spelled out for the mismatch message.
std::string describe(const Codec& codec, std::size_t n, Algorithm requested,
                     const AllreduceOptions& opt, bool ef, std::uint64_t extra) {
  return codec.spec() + " n=" + std::to_string(n) + " algorithm=" + algorithm_name(requested) +
         " average=" + std::to_string(opt.average) +
         " majority_vote=" + std::to_string(opt.majority_vote) +
         " tensor=" + std::to_string(opt.tensor) + " seed=" + std::to_string(opt.seed) +
         " error_feedback=" + std::to_string(ef) +
         " allow_uncompressed=" + std::to_string(opt.allow_uncompressed) +
         " layout=" + std::to_string(extra);
}

std::uint64_t dbits(double v) { return std::bit_cast<std::uint64_t>(std::max(0.0, v)); }
double bitsd(std::uint64_t v) { return std::bit_cast<double>(v); }

// ---- measurements ----

NetworkModel measure_network(MPI_Comm comm, int rank, int size) {
  NetworkModel m;
  if (size == 1) return m;
  detail::Traffic t;
  // alpha: ping-pong of 8 bytes between rank pairs (2i, 2i+1); half the median round trip.
  const int peer = rank ^ 1;
  std::vector<std::byte> small(8), got;
  if (peer < size) {
    std::vector<double> trips;
    for (int it = 0; it < 23; ++it) {
      const double start = MPI_Wtime();
      if (rank % 2 == 0) {
        detail::send_bytes(comm, peer, small, t);
        detail::recv_bytes(comm, peer, got, t);
      } else {
        detail::recv_bytes(comm, peer, got, t);
        detail::send_bytes(comm, peer, small, t);
      }
      if (it >= 3) trips.push_back(MPI_Wtime() - start);
    }
    std::nth_element(trips.begin(), trips.begin() + trips.size() / 2, trips.end());
    m.alpha = trips[trips.size() / 2] / 2;
  }
  // beta: every rank sends 4 MiB to the next and receives from the previous, all at once.
  constexpr std::size_t kBytes = std::size_t{4} << 20;
  std::vector<std::byte> big(kBytes);
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  double best = 1e30;
  for (int rep = 0; rep < 2; ++rep) {
    detail::barrier(comm);
    const double start = MPI_Wtime();
    MPI_Request reqs[2];
    got.resize(kBytes);
    GCOMP_CHECK_MPI(MPI_Irecv_c(got.data(), kBytes, MPI_BYTE, prev, 7302, comm, &reqs[0]));
    GCOMP_CHECK_MPI(MPI_Isend_c(big.data(), kBytes, MPI_BYTE, next, 7302, comm, &reqs[1]));
    detail::wait_all(reqs);
    best = std::min(best, MPI_Wtime() - start);
  }
  m.beta = std::max(0.0, best - m.alpha) / static_cast<double>(kBytes);
  // beta_one: rank 0 sends 4 MiB to rank 1 while the others wait.
  {
    detail::barrier(comm);
    double one = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      const double start = MPI_Wtime();
      if (rank == 0) detail::send_bytes(comm, 1, big, t);
      if (rank == 1) detail::recv_bytes(comm, 0, got, t);
      one = std::min(one, MPI_Wtime() - start);
    }
    m.beta_one = rank <= 1 ? std::max(0.0, one - m.alpha) / static_cast<double>(kBytes) : 0.0;
  }
  // beta_allreduce: MPI's own allreduce of 1M floats, fitted to its bandwidth term; and where
  // that is fast (under 40 ms, the slowest rank's), of 8M floats too, since beyond the caches
  // MPI's copies and sums cost more per byte (twice as much on this project's VMs).
  {
    const double p = size;
    const double rounds = 2 * std::ceil(std::log2(p));
    const auto fit = [&](std::size_t floats, int reps) {
      std::vector<float> a(floats, 1.0f), b(floats);
      double ar = 1e30;
      for (int rep = 0; rep < reps; ++rep) {
        detail::barrier(comm);
        const double start = MPI_Wtime();
        detail::allreduce(a.data(), b.data(), static_cast<MPI_Count>(floats), MPI_FLOAT, MPI_SUM,
                          comm);
        ar = std::min(ar, MPI_Wtime() - start);
      }
      double slowest = ar;  // every rank must take the same branch below
      detail::allreduce(&ar, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
      return std::pair{slowest, std::max(0.0, slowest - rounds * m.alpha) /
                                    (2 * (p - 1) / p * 4.0 * static_cast<double>(floats))};
    };
    const auto [seconds, beta] = fit(std::size_t{1} << 20, 3);
    m.beta_allreduce = beta;
    if (size > 1 && seconds < 0.04) m.beta_allreduce_large = fit(std::size_t{1} << 23, 2).second;
  }
  // beta_all: every rank sends 4 MiB spread over all the others, all at once (all-to-all).
  if (size > 2) {
    const std::size_t block = kBytes / static_cast<std::size_t>(size - 1);
    std::vector<std::byte> sbuf(block * static_cast<std::size_t>(size)), rbuf(sbuf.size());
    best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      detail::barrier(comm);
      MPI_Request req;
      const double start = MPI_Wtime();
      GCOMP_CHECK_MPI(MPI_Ialltoall_c(sbuf.data(), static_cast<MPI_Count>(block), MPI_BYTE,
                                      rbuf.data(), static_cast<MPI_Count>(block), MPI_BYTE, comm,
                                      &req));
      detail::wait(req);
      best = std::min(best, MPI_Wtime() - start);
    }
    m.beta_all = std::max(0.0, best - m.alpha) / static_cast<double>(block * (size - 1));
  } else {
    m.beta_all = m.beta;
  }
  return m;
}

// Entries in a sparse payload: its index section over the index width.
std::uint64_t payload_entries(std::span<const std::byte> payload) {
  const PayloadInfo info = inspect(payload);
  const std::uint64_t ib = info.elements <= (std::uint64_t{1} << 32) ? 4 : 8;
  return info.sections[0] / ib;
}

}  // namespace

const char* algorithm_name(Algorithm a) noexcept {
  const int i = static_cast<int>(a);
  return i >= 0 && i < kAlgorithmCount ? kAlgorithmNames[i] : "unknown";
}

Algorithm parse_algorithm(std::string_view name) {
  for (int i = 0; i < kAlgorithmCount; ++i) {
    if (name == kAlgorithmNames[i]) return static_cast<Algorithm>(i);
  }
  std::string known;
  for (const char* k : kAlgorithmNames) known += std::string(known.empty() ? "" : ", ") + k;
  throw Error(Status::invalid_argument,
              "unknown algorithm '" + std::string(name) + "' (known: " + known + ")");
}

ComputeModel Timing::codec_speeds(const Codec& codec, std::size_t n) {
  return measure_compute(codec, n);
}
ComputeModel Timing::shared_speeds() { return measure_reduce_and_merge(); }
double Timing::call_seconds(const Codec&, std::size_t, Choice, double wall) { return wall; }

Communicator::Communicator(MPI_Comm comm) { init(comm, nullptr, nullptr); }
Communicator::Communicator(MPI_Comm comm, const NetworkModel& network,
                           std::shared_ptr<Timing> timing) {
  init(comm, &network, std::move(timing));
}

Communicator::~Communicator() {
  if (comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
}

void Communicator::init(MPI_Comm comm, const NetworkModel* given, std::shared_ptr<Timing> timing) {
  if (comm == MPI_COMM_NULL) throw Error(Status::invalid_argument, "communicator is MPI_COMM_NULL");
  timing_ = timing ? std::move(timing) : std::make_shared<Timing>();
  learner_ = std::make_unique<detail::AutoLearner>();
  GCOMP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  GCOMP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  GCOMP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  GCOMP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  // More ranks on this node than cores: waits must yield, or a spinning rank steals the
  // timeslice of the rank it waits for.
  {
    MPI_Comm node;
    GCOMP_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (local > cores) detail::set_yielding(true);
  }
  network_ = given ? *given : measure_network(comm_, rank_, size_);
  const ComputeModel rm = timing_->shared_speeds();
  double local[8] = {network_.alpha,
                     network_.beta,
                     network_.beta_all,
                     network_.beta_one,
                     network_.beta_allreduce,
                     network_.beta_allreduce_large,
                     rm.reduce,
                     rm.merge};
  double agreed[8];
  detail::allreduce(local, agreed, 8, MPI_DOUBLE, MPI_MAX, comm_);
  if (!given) network_ = {agreed[0], agreed[1], agreed[2], agreed[3], agreed[4], agreed[5]};
  // Only ranks 0 and 1 time beta_one (the others send 0): fill the gaps only after the MAX.
  if (network_.beta_all <= 0) network_.beta_all = network_.beta;
  if (network_.beta_one <= 0) network_.beta_one = network_.beta;
  reduce_speed_ = agreed[6];
  merge_speed_ = agreed[7];
}

namespace {
// Tensors within a factor of two share a measurement; at most 16M elements are measured.
std::uint64_t calibration_key(const Codec& codec, std::size_t n) {
  const int log2n = n == 0 ? 0 : std::bit_width(std::min<std::size_t>(n, std::size_t{1} << 24));
  return Fnv{}.add(codec.spec()).add(static_cast<std::uint64_t>(log2n)).h;
}
}  // namespace

ComputeModel Communicator::with_shared_speeds(ComputeModel c) const {
  c.reduce = reduce_speed_;
  c.merge = merge_speed_;
  return c;
}

ComputeModel Communicator::compute_model(const Codec& codec, std::size_t n) {
  const std::uint64_t key = calibration_key(codec, n);
  auto it = calibrated_.find(key);
  if (it == calibrated_.end()) it = calibrated_.emplace(key, timing_->codec_speeds(codec, n)).first;
  return with_shared_speeds(it->second);
}

namespace {

ModelInput model_input(const Codec& codec, std::size_t n, std::uint64_t sent, std::uint64_t bytes,
                       int ranks, const NetworkModel& net, const ComputeModel& compute,
                       bool average, bool ef) {
  ModelInput in;
  in.n = static_cast<double>(n);
  in.ranks = ranks;
  in.network = net;
  in.compute = compute;
  in.codec_none = codec.kind() == CodecKind::none;
  in.error_feedback = ef;
  in.sparse = codec.properties().sparse;
  in.shared_support = codec.kind() == CodecKind::randomk;
  in.sent = static_cast<double>(sent);
  in.payload_bytes = static_cast<double>(bytes);
  in.value_bytes = codec.spec().find("values=fp16") != std::string::npos ? 2 : 4;
  in.average = average;
  return in;
}

std::uint64_t default_sent(const Codec& codec, std::size_t n) {
  return codec.properties().sparse ? codec.selected(n) : 0;
}

std::uint64_t default_bytes(const Codec& codec, std::size_t n, std::uint64_t sent) {
  if (!codec.properties().sparse) return codec.max_bytes(n);
  const std::uint64_t ib = n <= (std::size_t{1} << 32) ? 4 : 8;
  const std::uint64_t vb = codec.spec().find("values=fp16") != std::string::npos ? 2 : 4;
  return 52 + sent * (ib + vb);
}

}  // namespace

std::array<double, kAlgorithmCount> Communicator::predict(const Codec& codec, std::size_t n,
                                                          std::size_t sent) {
  const std::uint64_t s = sent ? sent : default_sent(codec, n);
  return gcomp::predict(model_input(codec, n, s, default_bytes(codec, n, s), size_, network_,
                                    compute_model(codec, n), false, false));
}

double Communicator::predict_uncompressed(std::size_t n) {
  static const Codec none("none");
  return gcomp::predict_uncompressed(
      model_input(none, n, 0, 4 * n, size_, network_, compute_model(none, n), false, false));
}

Choice Communicator::choose_learned(std::uint64_t group, const ModelInput& in,
                                    bool with_pending) const {
  const auto t = gcomp::predict(in);
  std::array<detail::Option, kAlgorithmCount + 1> options;
  std::size_t m = 0;
  options[m++] = {{Algorithm::dense, true}, t[static_cast<int>(Algorithm::dense)]};
  for (int a = 2; a < kAlgorithmCount; ++a) {
    if (auto_candidate(static_cast<Algorithm>(a), in)) {
      options[m++] = {{static_cast<Algorithm>(a), true}, t[a]};
    }
  }
  if (in.allow_uncompressed && !in.codec_none) {
    options[m++] = {{Algorithm::dense, false}, gcomp::predict_uncompressed(in)};
  }
  return learner_->choose(group, std::span<const detail::Option>(options.data(), m),
                          with_pending ? pending_key_ : 0, pending_seconds_);
}

Choice Communicator::choose(const Codec& codec, std::size_t n, std::size_t sent,
                            bool allow_uncompressed) {
  const std::uint64_t s = sent ? sent : default_sent(codec, n);
  ModelInput in = model_input(codec, n, s, default_bytes(codec, n, s), size_, network_,
                              compute_model(codec, n), false, false);
  in.allow_uncompressed = allow_uncompressed;
  return choose_learned(detail::AutoLearner::group_of(codec.spec(), n), in);
}

namespace {

bool suits(Algorithm a, const Codec& codec) {
  const bool sparse = codec.properties().sparse;
  switch (a) {
    case Algorithm::sparse_allgather:
    case Algorithm::sparse_recursive_doubling:
    case Algorithm::sparse_split:
      return sparse;
    default:
      return true;
  }
}

}  // namespace

namespace {

// The sum of finite contributions can still overflow float32. Every algorithm reports it the
// same way: Error(nonfinite) on every rank (they all hold the same bits, so they all see it),
// before the residual is committed. compressed_reduce_scatter finds it earlier, when an owner
// cannot re-encode its chunk.
void check_sum_finite(const detail::Job& job, Algorithm alg) {
  if (alg == Algorithm::compressed_reduce_scatter || job.out.empty()) return;
  std::size_t at = job.out.size();
  if (job.dev) {
    try {
      job.dev->check_finite(job.d_out, nullptr, job.out.size(), job.stream);
      return;
    } catch (const Error&) {
      at = job.out.size();  // the device does not say where; the message does not need it
    }
  } else {
    if (!detail::any_nonfinite(job.out.data(), job.out.size())) return;
    at = detail::first_nonfinite(job.out.data(), job.out.size());
  }
  throw Error(Status::nonfinite,
              std::string("the sum over ranks is not finite") +
                  (at < job.out.size() ? " at element " + std::to_string(at) : std::string()) +
                  " (the ranks' finite contributions overflow float32; " + algorithm_name(alg) +
                  ")");
}

}  // namespace

// A call on device tensors: in and out of Impl::run are then host staging of n floats.
struct DeviceCall {
  const detail::DeviceBackend* dev;
  void* stream;
  const float* in;
  float* out;
};

// The shared protocol. `local_error` set means this rank cannot take part (abandon()).
struct Communicator::Impl {
  static void run(Communicator& self, std::span<const float> in, std::span<float> out,
                  const Codec* codec, ErrorFeedback* ef, const AllreduceOptions& opt,
                  const Error* abandoned, std::uint64_t extra_signature,
                  const DeviceCall* device = nullptr) {
    const double call_start = MPI_Wtime();
    detail::Job job;
    job.comm = self.comm_;
    job.rank = self.rank_;
    job.size = self.size_;
    job.codec = codec;
    job.in = in;
    job.out = out;
    job.ef = ef;
    job.average = opt.average;
    job.majority_vote = opt.majority_vote;

    // 1. Local work that may fail.
    Agreement mine{};
    std::uint64_t sig = 0;          // of what must agree (describe() spells it out)
    bool choosing = false;          // auto on a codec other than none: the learner decides
    std::uint64_t calibration = 0;  // keys of this (codec, size) in calibrated_ and the learner
    std::uint64_t group = 0;
    Algorithm requested = opt.algorithm;
    std::exception_ptr local;
    ComputeModel compute;
    try {
      if (abandoned) throw *abandoned;
      if (!codec) throw Error(Status::invalid_argument, "codec is null");
      if (in.size() != out.size()) {
        throw Error(Status::invalid_argument, "input of " + std::to_string(in.size()) +
                                                  " elements but output of " +
                                                  std::to_string(out.size()));
      }
      if ((in.data() == nullptr && !in.empty()) || (out.data() == nullptr && !out.empty())) {
        throw Error(Status::invalid_argument, "input or output is null");
      }
      if (ef && ef->size() != in.size()) {
        throw Error(Status::invalid_argument,
                    "error-feedback memory of " + std::to_string(ef->size()) +
                        " elements for a tensor of " + std::to_string(in.size()));
      }
      if (requested == Algorithm::automatic) {
        if (const char* env = std::getenv("GCOMP_ALGORITHM"); env && *env) {
          try {
            requested = parse_algorithm(env);
          } catch (const Error& e) {
            throw Error(Status::invalid_argument, std::string("GCOMP_ALGORITHM: ") + e.what());
          }
        }
      }
      if (!suits(requested, *codec)) {
        throw Error(Status::invalid_argument, std::string("algorithm ") +
                                                  algorithm_name(requested) +
                                                  " needs a sparse codec (topk, randomk, "
                                                  "threshold), not " +
                                                  codec->spec());
      }
      if (opt.majority_vote) {
        if (codec->kind() != CodecKind::sign) {
          throw Error(Status::invalid_argument,
                      "majority_vote needs the sign codec, not " + codec->spec());
        }
        if (requested != Algorithm::automatic && requested != Algorithm::allgather) {
          throw Error(Status::invalid_argument, "majority_vote runs on the allgather algorithm");
        }
        requested = Algorithm::allgather;
      }
      sig = Fnv{}
                .add(codec->spec())
                .add(in.size())
                .add(static_cast<std::uint64_t>(requested))
                .add(opt.average * 1u + opt.majority_vote * 2u + (ef != nullptr) * 4u +
                     opt.allow_uncompressed * 8u)
                .add(opt.tensor)
                .add(opt.seed)
                .add(extra_signature)
                .h;
      // Seeds: the rank is mixed in, but random-k's index draw is shared by all ranks.
      const bool shared = codec->kind() == CodecKind::randomk;
      job.seed = derive_seed(opt.seed, opt.tensor, 0,
                             shared ? 0 : static_cast<std::uint64_t>(self.rank_) + 1);
      job.owner_seed = derive_seed(opt.seed, opt.tensor, 1, static_cast<std::uint64_t>(self.rank_));
      if (device) {
        if (ef && (!ef->on_device() || ef->view().backend() != device->dev)) {
          throw Error(Status::invalid_argument,
                      "a device tensor needs its error-feedback memory in device memory "
                      "(gcomp::cuda::error_feedback)");
        }
        if (!self.stage_) self.stage_ = std::make_unique<detail::DeviceStage>();
        self.stage_->dev = device->dev;
        job.dev = device->dev;
        job.stream = device->stream;
        job.d_in = device->in;
        job.d_out = device->out;
        job.stage = self.stage_.get();
        if (ef) {
          job.d_e_old = ef->view().data();
          job.d_e_new = ef->scratch_view().data();
        }
      } else if (ef) {
        if (ef->on_device()) {
          throw Error(Status::invalid_argument,
                      "a host tensor needs its error-feedback memory in host memory");
        }
        job.ef_next = ef->scratch();
      }
      // The codec's speeds, for auto: known from an earlier call of this (spec, size class), or
      // measured in step 3 by all ranks at once. `none` has nothing to choose (auto's only
      // candidate is dense), and an explicit algorithm needs no speeds.
      choosing = requested == Algorithm::automatic && codec->kind() != CodecKind::none;
      bool known = false;
      if (choosing) {
        calibration = calibration_key(*codec, in.size());
        group = detail::AutoLearner::group_of(codec->spec(), in.size());
        if (const auto it = self.calibrated_.find(calibration); it != self.calibrated_.end()) {
          compute = self.with_shared_speeds(it->second);
          known = true;
        }
      }
      // With allow_uncompressed the plain allreduce may win; by this rank's numbers, will it?
      bool likely_uncompressed = false;
      if (choosing && known && opt.allow_uncompressed) {
        const std::uint64_t s0 = default_sent(*codec, in.size());
        ModelInput mi = model_input(*codec, in.size(), s0, default_bytes(*codec, in.size(), s0),
                                    self.size_, self.network_, compute, opt.average, ef != nullptr);
        mi.allow_uncompressed = true;
        // The previous call's time is not agreed yet: count it as this rank measured it.
        likely_uncompressed = !self.choose_learned(group, mi, true).compressed;
      }
      if (device) {
        // As on the host: sparse codecs encode now (their payload's size is data-dependent),
        // the others are checked now and encode later, where the algorithm needs the payload.
        if (codec->properties().sparse) {
          detail::encode_whole(job);
          mine.sent = payload_entries(job.payload);
          mine.bytes = job.payload.size();
        } else {
          device->dev->check_finite(device->in, job.d_e_old, in.size(), device->stream);
          mine.bytes = codec->max_bytes(in.size());
        }
      } else if (codec->properties().sparse && !likely_uncompressed) {
        detail::encode_whole(job);  // needed by every sparse path; fails here on NaN/Inf
        mine.sent = payload_entries(job.payload);
        mine.bytes = job.payload.size();
      } else {
        // Not encoded now (a dense codec encodes where the algorithm needs it; a sparse one is
        // not encoded when the plain allreduce is the likely choice, and is encoded after the
        // agreement if the agreed choice compresses after all): check for NaN/Inf now. With
        // error feedback and the uncompressed path likely (by this rank's numbers), x + e is
        // formed in the same pass, into the scratch that path sends from. Nothing is written to
        // out before the agreement: a call that fails there leaves it as it was.
        const std::span<const float> e =
            ef ? std::span<const float>(ef->residual()) : std::span<const float>();
        if (ef && (codec->kind() == CodecKind::none || likely_uncompressed)) {
          std::vector<float>& sum = detail::scratch_vector<float, 101>();
          sum.resize(in.size());
          copy_checked(in, e, sum);
          job.sum_ready = true;
        } else {
          check_finite(in, e);
        }
        if (codec->properties().sparse) {  // threshold's count is unknown: its bound
          mine.sent = default_sent(*codec, in.size());
          mine.bytes = default_bytes(*codec, in.size(), mine.sent);
        } else {
          mine.bytes = codec->max_bytes(in.size());
        }
      }
      // Infinity asks every rank to measure the codec in step 3.
      mine.encode = dbits(choosing && !known ? kInfinity : compute.encode);
      mine.decode = dbits(compute.decode);
    } catch (const Error& e) {
      local = std::current_exception();
      mine.not_fail = k63 & ~((static_cast<std::uint64_t>(e.code()) << 32) |
                              static_cast<std::uint32_t>(self.rank_));
    } catch (const std::bad_alloc&) {
      local = std::current_exception();
      mine.not_fail = k63 & ~((static_cast<std::uint64_t>(Status::internal) << 32) |
                              static_cast<std::uint32_t>(self.rank_));
    }
    mine.learned_key = self.pending_key_;
    mine.learned_seconds = dbits(self.pending_seconds_);
    self.pending_key_ = 0;
    mine.sig = sig & k63;
    mine.not_sig = k63 & ~mine.sig;

    // 2. The agreement.
    Agreement all{};
    const double agree_start = MPI_Wtime();
    detail::allreduce(&mine, &all, kAgreementWords, MPI_INT64_T, MPI_MAX, self.comm_);
    const double agree_seconds = MPI_Wtime() - agree_start;
    if (abandoned) return;
    if (local) std::rethrow_exception(local);
    if (all.not_fail != 0) {
      const std::uint64_t fail = k63 & ~all.not_fail;
      const auto who = static_cast<int>(fail & 0xffffffffu);
      const auto why = static_cast<Status>(fail >> 32);
      throw Error(Status::mismatch, "allreduce abandoned: rank " + std::to_string(who) +
                                        " failed (" + status_name(why) + ")");
    }
    if (all.sig != (k63 & ~all.not_sig)) {
      throw Error(Status::mismatch,
                  "ranks disagree on the allreduce (codec spec, element count, algorithm, "
                  "options or seed); this rank: " +
                      describe(*codec, in.size(), requested, opt, ef != nullptr, extra_signature));
    }

    // 3. The algorithm, from the agreed numbers.
    if (all.learned_key != 0) self.learner_->record(all.learned_key, bitsd(all.learned_seconds));
    Algorithm alg = requested;
    if (alg == Algorithm::automatic && !choosing) alg = Algorithm::dense;  // `none`
    if (choosing) {
      if (all.encode == dbits(kInfinity)) {
        // Some rank has not seen this (spec, size class): all ranks measure the codec now, at
        // once (the agreement has just lined them up), so that ranks sharing a node compete as
        // they will in the calls; the slowest rank's speeds are agreed. Nothing here may throw
        // before the allreduce: the other ranks are waiting in it.
        double speeds[2] = {0, 0};
        try {
          const ComputeModel m = self.timing_->codec_speeds(*codec, in.size());
          speeds[0] = m.encode;
          speeds[1] = m.decode;
        } catch (...) {  // out of memory: the other ranks' numbers stand
        }
        double agreed[2];
        detail::allreduce(speeds, agreed, 2, MPI_DOUBLE, MPI_MAX, self.comm_);
        compute.encode = agreed[0];
        compute.decode = agreed[1];
      } else {
        compute.encode = bitsd(all.encode);
        compute.decode = bitsd(all.decode);
      }
      self.calibrated_[calibration] = {compute.encode, compute.decode, 0, 0};
      compute = self.with_shared_speeds(compute);
      ModelInput mi = model_input(*codec, in.size(), all.sent, all.bytes, self.size_, self.network_,
                                  compute, opt.average, ef != nullptr);
      mi.allow_uncompressed = opt.allow_uncompressed;
      const Choice choice = self.choose_learned(group, mi);
      alg = choice.algorithm;
      job.skip_codec = !choice.compressed;
    }
    if (job.dev) {
      detail::run_device(job, alg);
    } else
      switch (alg) {
        case Algorithm::dense:
          detail::run_dense(job);
          break;
        case Algorithm::sparse_allgather:
          detail::run_sparse_allgather(job);
          break;
        case Algorithm::sparse_recursive_doubling:
          detail::run_sparse_recursive_doubling(job);
          break;
        case Algorithm::sparse_split:
          detail::run_sparse_split(job);
          break;
        case Algorithm::allgather:
          detail::run_allgather(job);
          break;
        case Algorithm::compressed_reduce_scatter:
          detail::run_compressed_reduce_scatter(job);
          break;
        case Algorithm::automatic:
          break;
      }
    check_sum_finite(job, alg);
    if (ef) ef->commit();
    if (choosing) {
      const Choice ran{alg, !job.skip_codec};
      self.pending_key_ = detail::AutoLearner::key_of(group, ran);
      self.pending_seconds_ =
          self.timing_->call_seconds(*codec, in.size(), ran, MPI_Wtime() - call_start);
    }

    CallStats& s = self.last_;
    s.bytes_sent = job.traffic.sent + 2 * sizeof(Agreement);
    s.bytes_received = job.traffic.received + 2 * sizeof(Agreement);
    s.encode_seconds = job.encode_seconds;
    s.comm_seconds = job.traffic.seconds + agree_seconds;
    s.decode_seconds = job.decode_seconds;
    s.algorithm = alg;
    s.compressed = !job.skip_codec;
    s.calls = 1;
    s.by_algorithm = {};
    s.by_algorithm[static_cast<int>(alg)] = 1;
    s.compressed_calls = s.compressed ? 1 : 0;
    TotalStats& t = self.total_;
    ++t.calls;
    t.bytes_sent += s.bytes_sent;
    t.bytes_received += s.bytes_received;
    t.encode_seconds += s.encode_seconds;
    t.comm_seconds += s.comm_seconds;
    t.decode_seconds += s.decode_seconds;
    ++t.by_algorithm[static_cast<int>(alg)];
    if (s.compressed) ++t.compressed;
  }
};

std::uint64_t signature_of(std::string_view text) { return Fnv{}.add(text).h; }

void Communicator::run_call(std::span<const float> in, std::span<float> out, const Codec* codec,
                            ErrorFeedback* ef, const AllreduceOptions& options,
                            const Error* abandoned, std::uint64_t extra_signature) {
  Impl::run(*this, in, out, codec, ef, options, abandoned, extra_signature);
}

void Communicator::allreduce(std::span<const float> in, std::span<float> out, const Codec& codec,
                             ErrorFeedback* ef, const AllreduceOptions& options) {
  run_call(in, out, &codec, ef, options, nullptr, 0);
}

void Communicator::allreduce(TensorView<const float> in, TensorView<float> out, const Codec& codec,
                             ErrorFeedback* ef, const AllreduceOptions& options) {
  if (!in.on_device() && !out.on_device()) {
    return run_call(in.host(), out.host(), &codec, ef, options, nullptr, 0);
  }
  if (in.on_device() != out.on_device() || in.backend() != out.backend() ||
      in.stream() != out.stream()) {
    const Error e(Status::invalid_argument,
                  "allreduce: input and output must both be device tensors on one stream");
    run_call({}, {}, &codec, ef, options, &e, 0);  // tell the other ranks, then throw
    throw e;
  }
  const DeviceCall call{in.backend(), in.stream(), in.data(), out.data()};
  std::vector<float>& host = detail::scratch_vector<float, 120>();
  host.resize(in.size());
  if (in.size() != out.size()) {
    const Error e(Status::invalid_argument, "input of " + std::to_string(in.size()) +
                                                " elements but output of " +
                                                std::to_string(out.size()));
    run_call({}, {}, &codec, ef, options, &e, 0);
    throw e;
  }
  Impl::run(*this, host, host, &codec, ef, options, nullptr, 0, &call);
}

void Communicator::abandon(Status reason, const std::string& why) {
  const Error e(reason, why);
  run_call({}, {}, nullptr, nullptr, {}, &e, 0);
}

}  // namespace gcomp
