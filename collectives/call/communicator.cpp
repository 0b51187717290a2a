// gcomp::Communicator: the call protocol around the algorithms. Every allreduce is one
// Impl::call of seven named steps, numbered below as docs/algorithms.md ("The call protocol")
// explains them: check_arguments, resolve_algorithm, prepare, agree, decide, run, record. The
// call runs on whatever transport and algorithm rows it is given: what differs between them is
// a row field (algorithm_table.hpp) or a transport method (transport.hpp).
#include "gcomp/communicator.hpp"

#include <sched.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "agreement.hpp"
#include "algorithm_table.hpp"
#include "auto_choice.hpp"
#include "codec_impl.hpp"
#include "communicator_impl.hpp"
#include "device_backend.hpp"
#include "env_setting.hpp"
#include "fnv.hpp"
#include "gcomp/cost_model.hpp"
#include "gcomp/timeline.hpp"
#include "group_transport.hpp"
#include "kernels.hpp"
#include "learner.hpp"
#include "levels.hpp"
#include "network.hpp"
#include "nonfinite.hpp"
#include "sparse_vector.hpp"
#include "stall_report.hpp"
#include "transport.hpp"
#include "waiting.hpp"

namespace gcomp {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

using detail::Agreement;
using detail::bitsd;
using detail::calibration_key;
using detail::dbits;
using detail::default_bytes;
using detail::default_sent;
using detail::Fnv;
using detail::model_input;

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

// Entries in a sparse payload (its nnz parameter).
std::uint64_t payload_entries(std::span<const std::byte> payload) {
  return detail::sparse_nnz(detail::parse_payload(payload));
}

}  // namespace

// The limits and the wait policy from the environment, checked before anything is made (a bad
// GCOMP_WAIT, GCOMP_STALL_SECONDS or GCOMP_TIMEOUT_SECONDS throws here).
detail::WaitLimits Communicator::Impl::checked_environment() {
  detail::apply_wait_policy();
  return detail::wait_limits_from_env();
}

Communicator::~Communicator() = default;

Communicator::Impl::~Impl() = default;

void Communicator::Impl::init(std::unique_ptr<detail::Net> net, const NetworkModel* given,
                              std::shared_ptr<Timing> timing) {
  timing_ = timing ? std::move(timing) : std::make_shared<Timing>();
  net_ = std::move(net);
  rank_ = net_->rank();
  size_ = net_->size();
  timeline::open_from_environment(rank_);  // GCOMP_TIMELINE=FILE
  // More ranks on this node than cores: waits must yield, or a spinning rank steals the
  // timeslice of the rank it waits for (the automatic wait policy; GCOMP_WAIT overrides it).
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (net_->ranks_on_this_machine() > cores) detail::note_oversubscribed();
    detail::apply_wait_policy();
  }
  network_ = given ? *given : detail::measure_network(*net_);
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
  net_->allreduce(local, agreed, 8, detail::Reduction::max_double);
  if (!given) network_ = {agreed[0], agreed[1], agreed[2], agreed[3], agreed[4], agreed[5]};
  // Only ranks 0 and 1 time beta_one (the others send 0): fill the gaps only after the MAX.
  if (network_.beta_all <= 0) network_.beta_all = network_.beta;
  if (network_.beta_one <= 0) network_.beta_one = network_.beta;
  reduce_speed_ = agreed[6];
  merge_speed_ = agreed[7];
  const detail::Levels levels = detail::levels_of(*net_);
  hosts_ = levels.hosts;
  ranks_per_host_ = levels.width;
  // The network inside a host, where there are several hosts and some host has several ranks:
  // each host's ranks measure among themselves at once (a host of one rank measures nothing),
  // and all agree by MAX. Not where the network was given: that stands for both.
  if (!given && hosts_ > 1 && ranks_per_host_ > 1) {
    const std::unique_ptr<detail::Net> host =
        detail::make_group_transport(*net_, levels.host_ranks);
    const NetworkModel h = detail::measure_network(*host, false);
    const double mine[4] = {h.alpha, h.beta, h.beta_all, h.beta_one};
    double most[4];
    net_->allreduce(mine, most, 4, detail::Reduction::max_double);
    host_network_ = {
        most[0], most[1], most[2] > 0 ? most[2] : most[1], most[3] > 0 ? most[3] : most[1], 0, 0};
  }
}

namespace {

bool suits(Algorithm a, const Codec& codec) {
  return a == Algorithm::automatic || a == Algorithm::fewest_bytes ||
         detail::row_suits(detail::algorithm_row(a), codec.properties());
}

}  // namespace

namespace {

// The sum of finite contributions can still overflow float32. Every algorithm reports it the
// same way: Error(nonfinite) on every rank (they all hold the same bits, so they all see it),
// before the residual is committed. A row with checks_sum finds it in its run.
void check_sum_finite(const detail::Job& job, Algorithm alg) {
  if (detail::algorithm_row(alg).checks_sum || job.buf.out.empty()) return;
  std::size_t at = job.buf.out.size();
  if (job.buf.dev) {
    try {
      job.buf.dev->check_finite(job.buf.d_out, nullptr, job.buf.out.size(), job.buf.stream);
      return;
    } catch (const Error&) {
      at = job.buf.out.size();  // the device does not say where; the message does not need it
    }
  } else {
    if (!detail::any_nonfinite(job.buf.out.data(), job.buf.out.size())) return;
    at = detail::first_nonfinite(job.buf.out.data(), job.buf.out.size());
  }
  throw Error(Status::nonfinite,
              std::string("the sum over ranks is not finite") +
                  (at < job.buf.out.size() ? " at element " + std::to_string(at) : std::string()) +
                  " (the ranks' finite contributions overflow float32; " + algorithm_name(alg) +
                  ")");
}

}  // namespace

// One call's state through the protocol's steps.
struct Communicator::Impl::Call {
  Call(Impl& s, const Codec* c, ErrorFeedback* e, const AllreduceOptions& o, std::uint64_t extra)
      : self(s), codec(c), ef(e), opt(o), extra_signature(extra) {}
  Impl& self;
  const Codec* codec;
  ErrorFeedback* ef;
  const AllreduceOptions& opt;
  std::uint64_t extra_signature;
  const detail::DeviceCall* device = nullptr;  // set for a call on device tensors
  std::span<const MatrixShape> shapes;         // the tensors' shapes, where given
  std::uint64_t state_signature = 0;           // of the rows' state in ef's slot
  double start = detail::now();
  double cpu_start = detail::thread_cpu_seconds();
  std::optional<detail::Job> job;                // made by make_job
  std::vector<detail::Option> considered;        // auto's options (with a timeline on)
  bool traced = false;                           // its span is on the timeline
  detail::StateStore::States* states = nullptr;  // the algorithms' of this tensor, or null
  Agreement mine{};
  std::uint64_t sig = 0;  // of what must agree (describe() spells it out)
  Algorithm requested = Algorithm::automatic;
  bool choosing = false;  // auto on a codec other than none: the learner decides
  bool known = false;     // the codec's speeds are known (calibrated_)
  // What auto is likely to run, by this rank's numbers (automatic: not known).
  Choice likely{Algorithm::automatic, true};
  std::uint64_t calibration = 0;  // keys of this (codec, size) in calibrated_ and the learner
  std::uint64_t group = 0;
  ComputeModel compute;
  double agree_seconds = 0;
  std::size_t n = 0;         // elements (for the stall report)
  std::uint64_t number = 0;  // this call's number (Impl::calls_)
  bool sum_bounded = false;  // the sum cannot overflow (Agreement::magnitude): not checked
};

void Communicator::Impl::call(std::span<const float> in, std::span<float> out, const Codec* codec,
                              ErrorFeedback* ef, const AllreduceOptions& opt,
                              const Error* abandoned, std::uint64_t extra_signature,
                              const detail::DeviceCall* device,
                              std::span<const MatrixShape> shapes) {
  Impl& self = *this;
  if (!self.broken_.empty()) throw Error(Status::timeout, self.broken_);
  Call c{self, codec, ef, opt, extra_signature};
  c.device = device;
  c.shapes = shapes;
  c.n = in.size();
  c.number = ++self.calls_;
  // A call that throws is on the timeline too, as failed.
  struct Traced {
    Call& c;
    ~Traced() {
      if (c.traced || !timeline::on()) return;
      try {
        trace(c, nullptr);
      } catch (...) {  // a span lost rather than a destructor that throws
      }
    }
  } traced{c};
  // 1. Local work that may fail: a failure is this rank's part of the agreement.
  std::exception_ptr local;
  try {
    if (abandoned) throw *abandoned;
    check_arguments(c, in, out);
    c.requested = resolve_algorithm(*codec, opt, in.size());
    prepare(c, in, out);
  } catch (const Error& e) {
    local = std::current_exception();
    c.mine.fail(e.code(), self.rank_);
  } catch (const std::bad_alloc&) {
    local = std::current_exception();
    c.mine.fail(Status::internal, self.rank_);
  }
  // 2. The agreement.
  const Agreement all = agree(c);
  if (abandoned) return;
  if (local) std::rethrow_exception(local);
  if (all.any_failed()) {
    detail::check_failure(all, self.size_);
    throw Error(Status::mismatch, "allreduce abandoned: rank " + std::to_string(all.failed_rank()) +
                                      " failed (" + status_name(all.failed_status()) + ")");
  }
  if (!all.same_signature()) {
    throw Error(Status::mismatch,
                "ranks disagree on the allreduce (codec spec, element count, algorithm, "
                "options or seed); this rank: " +
                    describe(*codec, in.size(), c.requested, opt, ef != nullptr, extra_signature) +
                    (opt.label ? std::string(" (") + opt.label + ")" : std::string()));
  }
  detail::check_agreed(all, self.size_, in.size(), codec->max_bytes(in.size()));
  // 3. The algorithm, from the agreed numbers; then the statistics.
  const Algorithm alg = decide(c, all);
  // Uncompressed, every rank sends values of at most the agreed magnitude: when their sum
  // cannot overflow, the check after the collective (a pass over out) is not needed.
  c.sum_bounded = (codec->kind() == CodecKind::none || c.job->skip_codec) &&
                  detail::sum_cannot_overflow(self.size_, all.magnitude);
  run(c, alg);
  record(c, alg);
}

// 1. check_arguments: what this rank can tell is wrong before anything else (a failure it then
// brings to the agreement).
void Communicator::Impl::check_arguments(const Call& c, std::span<const float> in,
                                         std::span<float> out) {
  const ErrorFeedback* ef = c.ef;
  if (!c.codec) throw Error(Status::invalid_argument, "codec is null");
  if (in.size() != out.size()) {
    throw Error(Status::invalid_argument, "input of " + std::to_string(in.size()) +
                                              " elements but output of " +
                                              std::to_string(out.size()));
  }
  if ((in.data() == nullptr && !in.empty()) || (out.data() == nullptr && !out.empty())) {
    throw Error(Status::invalid_argument, "input or output is null");
  }
  if (ef && ef->size() != in.size()) {
    throw Error(Status::invalid_argument, "error-feedback memory of " + std::to_string(ef->size()) +
                                              " elements for a tensor of " +
                                              std::to_string(in.size()));
  }
  if (c.device && ef && (!ef->on_device() || ef->view().backend() != c.device->dev)) {
    throw Error(Status::invalid_argument,
                "a device tensor needs its error-feedback memory in device memory "
                "(gcomp::cuda::error_feedback)");
  }
  if (!c.device && ef && ef->on_device()) {
    throw Error(Status::invalid_argument,
                "a host tensor needs its error-feedback memory in host memory");
  }
  if (c.shapes.empty()) {
    if (std::string why = detail::shapes_missing(*c.codec); !why.empty()) {
      throw Error(Status::invalid_argument, why);
    }
  }
}

// 2. resolve_algorithm: the algorithm asked for: the option's, or for auto GCOMP_ALGORITHM's (the
// reader the interposer shares); fewest_bytes, the one its byte model says sends the fewest (from
// the codec, n and where the ranks are: the same on every rank); one that does not suit the codec
// is an error, and majority_vote runs on its row (AlgorithmRow::majority_vote).
Algorithm Communicator::Impl::resolve_algorithm(const Codec& codec, const AllreduceOptions& opt,
                                                std::size_t n) const {
  Algorithm requested = opt.algorithm;
  if (requested == Algorithm::automatic) {
    requested = detail::algorithm_setting().value_or(requested);
  }
  if (requested == Algorithm::fewest_bytes && !opt.majority_vote) {
    const std::uint64_t sent = default_sent(codec, n);
    ModelInput in = model_input(codec, n, sent, default_bytes(codec, n, sent), size_, network_,
                                ComputeModel{}, opt.average, false);
    place(in);
    requested = fewest_bytes_algorithm(in);
  }
  if (!suits(requested, codec)) {
    const detail::AlgorithmRow& row = detail::algorithm_row(requested);
    throw Error(
        Status::invalid_argument,
        std::string("algorithm ") + algorithm_name(requested) +
            (codec.properties().low_rank ? " does not run the low-rank codec " + codec.spec() +
                                               ", which runs only on low_rank"
             : row.low_rank ? " runs only the low-rank codecs, not " + codec.spec()
                            : " needs a sparse codec (properties().sparse), not " + codec.spec()));
  }
  if (opt.majority_vote) {
    if (codec.kind() != CodecKind::sign) {
      throw Error(Status::invalid_argument,
                  "majority_vote needs the sign codec, not " + codec.spec());
    }
    const detail::AlgorithmRow& vote = detail::majority_vote_row();
    if (requested != Algorithm::automatic && requested != Algorithm::fewest_bytes &&
        requested != vote.id) {
      throw Error(Status::invalid_argument,
                  std::string("majority_vote runs on the ") + vote.name + " algorithm");
    }
    requested = vote.id;
  }
  return requested;
}

// 3. prepare, make_job: the job the algorithm will run (what the call is, its buffers, the device
// staging), the algorithms' states of the tensor and the signature of what every rank must agree
// on.
void Communicator::Impl::make_job(Call& c, std::span<const float> in, std::span<float> out) {
  Impl& self = c.self;
  const Codec* codec = c.codec;
  ErrorFeedback* ef = c.ef;
  const AllreduceOptions& opt = c.opt;
  c.sig = Fnv{}
              .add(codec->spec())
              .add(in.size())
              .add(static_cast<std::uint64_t>(c.requested))
              .add(opt.average * 1u + opt.majority_vote * 2u + (ef != nullptr) * 4u +
                   opt.allow_uncompressed * 8u)
              .add(opt.tensor)
              .add(opt.seed)
              .add(c.extra_signature)
              .h;
  // Seeds: the rank is mixed in, but random-k's index draw is shared by all ranks.
  const bool shared = codec->properties().shared_support;
  const auto rank = static_cast<std::uint64_t>(self.rank_);
  const detail::CallSpec spec{
      .net = self.net_.get(),
      .rank = self.rank_,
      .size = self.size_,
      .codec = codec,
      .seed = derive_seed(opt.seed, opt.tensor, 0, shared ? 0 : rank + 1),
      .owner_seed = derive_seed(opt.seed, opt.tensor, 1, rank),
      .shared_seed = derive_seed(opt.seed, opt.tensor, 2, 0),
      .average = opt.average,
      .majority_vote = opt.majority_vote,
      .shapes = c.shapes,
  };
  detail::CallBuffers buf{.in = in, .out = out, .ef = ef, .ef_next = {}};
  if (const detail::DeviceCall* device = c.device) {
    detail::DeviceStage& stage = self.ws_.device_stage();
    stage.dev = device->dev;
    buf.dev = device->dev;
    buf.stream = device->stream;
    buf.d_in = device->in;
    buf.d_out = device->out;
    buf.stage = &stage;
    if (ef) {
      buf.d_e_old = ef->view().data();
      buf.d_e_new = ef->scratch_view().data();
    }
  } else if (ef) {
    buf.ef_next = ef->scratch();
  }
  c.job.emplace(spec, buf, self.ws_);
  if (ef) {
    const CodecProperties props = codec->properties();
    for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
      if (row->state_signature && detail::row_suits(*row, props)) {
        c.state_signature ^= row->state_signature(*ef);
      }
    }
  }
  // The algorithms' states of this tensor: the same from step to step (the seed left out),
  // compared in the agreement.
  c.states = &self.states_.of(
      Fnv{}.add(codec->spec()).add(in.size()).add(opt.tensor).add(c.extra_signature).h,
      codec->properties().sparse);
}

// 3. prepare, expect: what auto knows before the agreement: the codec's speeds from an earlier call
// of this (spec, size class), or none yet (measured in decide by all ranks at once). `none` has
// nothing to choose (auto's only candidate is dense), and an explicit algorithm needs no speeds.
// Returns whether, by this rank's numbers, the uncompressed allreduce is the likely choice.
bool Communicator::Impl::expect(Call& c) {
  Impl& self = c.self;
  const Codec& codec = *c.codec;
  const std::size_t n = c.job->buf.in.size();
  c.choosing = c.requested == Algorithm::automatic && codec.kind() != CodecKind::none;
  if (!c.choosing) return false;
  c.calibration = calibration_key(codec, n, c.device != nullptr);
  c.group = detail::AutoLearner::group_of(codec.spec(), n);
  if (const auto it = self.calibrated_.find(c.calibration); it != self.calibrated_.end()) {
    c.compute = self.with_shared_speeds(it->second);
    c.known = true;
  }
  if (!c.known) return false;
  const std::uint64_t s0 = default_sent(codec, n);
  // The previous call's time is not agreed yet: count it as this rank measured it.
  c.likely = self.auto_choice({.codec = codec,
                               .n = n,
                               .sent = s0,
                               .bytes = default_bytes(codec, n, s0),
                               .compute = c.compute,
                               .average = c.opt.average,
                               .error_feedback = c.ef != nullptr,
                               .allow_uncompressed = c.opt.allow_uncompressed,
                               .shapes = c.shapes},
                              true);
  return !c.likely.compressed;
}

// 3. prepare: the job (make_job), what auto expects (expect), and the local work before the
// agreement:
// the sparse codecs' encode (their payload's size is data-dependent), the others' check for
// NaN/Inf; what this rank contributes to the agreement.
void Communicator::Impl::prepare(Call& c, std::span<const float> in_, std::span<float> out) {
  make_job(c, in_, out);
  const bool likely_uncompressed = expect(c);
  const detail::DeviceCall* device = c.device;
  const Codec* codec = c.codec;
  ErrorFeedback* ef = c.ef;
  detail::Job& job = *c.job;
  const std::span<const float> in = job.buf.in;
  Agreement& mine = c.mine;
  mine.magnitude = detail::kNotMeasured;
  // A row that encodes after the agreement: nothing to encode now where it was asked for or is
  // auto's likely choice (AlgorithmRow::encodes_after_agreement).
  const auto after_agreement = [](Algorithm a) {
    return a != Algorithm::automatic && a != Algorithm::fewest_bytes &&
           detail::algorithm_row(a).encodes_after_agreement;
  };
  const bool encode_now = codec->properties().sparse && !after_agreement(c.requested) &&
                          !after_agreement(c.likely.algorithm);
  if (device) {
    // As on the host: sparse codecs encode now, the others are checked now and encode
    // later, where the algorithm needs the payload.
    if (encode_now) {
      const std::span<const std::byte> payload = detail::encode_whole(job);
      mine.sent = payload_entries(payload);
      mine.bytes = payload.size();
    } else {
      device->dev->check_finite(device->in, job.buf.d_e_old, in.size(), device->stream);
      mine.bytes = codec->max_bytes(in.size());
    }
  } else if (encode_now && !likely_uncompressed) {
    // Needed by every sparse path; fails here on NaN/Inf.
    const std::span<const std::byte> payload = detail::encode_whole(job);
    mine.sent = payload_entries(payload);
    mine.bytes = payload.size();
  } else {
    // Not encoded now (a dense codec encodes where the algorithm needs it; a sparse one is
    // not encoded when the plain allreduce is the likely choice, and is encoded after the
    // agreement if the agreed choice compresses after all): check for NaN/Inf now. With
    // error feedback and the uncompressed path likely (by this rank's numbers), x + e is
    // formed in the same pass, into the scratch that path sends from. Nothing is written to
    // out before the agreement: a call that fails there leaves it as it was. The same pass
    // finds the largest |x + e|, what this rank sends if the call is not compressed: agreed,
    // it spares that path the check of the sum after the collective (run).
    const std::span<const float> e =
        ef ? std::span<const float>(ef->residual()) : std::span<const float>();
    float magnitude = 0;
    if (ef && (codec->kind() == CodecKind::none || likely_uncompressed)) {
      std::vector<float>& sum = job.ws.sum;
      sum.resize(in.size());
      magnitude = detail::copy_checked_magnitude(in, e, sum);
      job.input = detail::prepared::Summed{sum};
    } else {
      magnitude = detail::checked_magnitude(in, e);
    }
    mine.magnitude = detail::float_bits(magnitude);
    if (codec->properties().sparse) {  // threshold's count is unknown: its bound
      mine.sent = default_sent(*codec, in.size());
      mine.bytes = default_bytes(*codec, in.size(), mine.sent);
    } else {
      mine.bytes = codec->max_bytes(in.size());
    }
  }
  // Infinity asks every rank to measure the codec in step 3.
  mine.encode = dbits(c.choosing && !c.known ? kInfinity : c.compute.encode);
  mine.decode = dbits(c.compute.decode);
}

// 4. agree: this rank's Agreement (with the previous call's time, for the learner), combined
// with all.
Agreement Communicator::Impl::agree(Call& c) {
  Impl& self = c.self;
  c.mine.learned_key = self.pending_key_;
  c.mine.learned_seconds = dbits(self.pending_seconds_);
  self.pending_key_ = 0;
  c.mine.seal(c.sig);
  c.mine.seal_state((c.states ? c.states->signature() : 0) ^ c.state_signature);
  const double start = detail::now();
  const std::function<std::string()> describe = [&] {
    std::string d =
        (c.codec ? "allreduce of " + std::to_string(c.n) + " floats, codec " + c.codec->spec()
                 : std::string("a rank's abandoned call"));
    if (c.opt.label) d += ", " + std::string(c.opt.label);
    return d;
  };
  Agreement all{};
  static_assert(sizeof(Agreement) % 8 == 0 && std::is_trivially_copyable_v<Agreement>);
  std::uint64_t mine[sizeof(Agreement) / 8], agreed[sizeof(Agreement) / 8];
  std::memcpy(mine, &c.mine, sizeof mine);
  try {
    self.net_->agree(mine, agreed, sizeof(Agreement) / 8, c.number, self.limits_, describe);
  } catch (const Error& e) {
    if (e.code() == Status::timeout) {
      self.broken_ = std::string(
                         "this Communicator timed out earlier and can make no more calls "
                         "(on MPI its agreement is still posted; on Gloo its connections "
                         "closed): ") +
                     e.what();
    }
    throw;
  }
  std::memcpy(&all, agreed, sizeof all);
  c.agree_seconds = detail::now() - start;
  if (timeline::on()) timeline::span("agreement", "agreement", start, start + c.agree_seconds);
  return all;
}

// 5. decide: the algorithm: the requested one, or auto's choice from the agreed numbers (the same
// on every rank), measuring the codec first where some rank has not.
Algorithm Communicator::Impl::decide(Call& c, const Agreement& all) {
  Impl& self = c.self;
  if (all.learned_key != 0) self.learner_->record(all.learned_key, bitsd(all.learned_seconds));
  // Ranks whose states of the tensor differ (one missed a call) all start afresh.
  if (!all.same_state()) {
    if (c.states) c.states->forget();
    c.job->fresh_state = true;
  }
  c.job->agreed_sent = all.sent;
  if (!c.choosing) {
    return c.requested == Algorithm::automatic ? detail::kUncompressed : c.requested;  // `none`
  }
  const Codec& codec = *c.codec;
  const std::size_t n = c.job->buf.in.size();
  ComputeModel& compute = c.compute;
  if (all.encode == dbits(kInfinity)) {
    // Some rank has not seen this (spec, size class, host or device): all ranks measure it now,
    // where each one's tensor is (a device tensor times the GPU's kernels).
    const ComputeModel m = self.measure_agreed(
        codec, n,
        c.device ? TensorView<const float>::device(c.device->in, n, c.device->stream, c.device->dev)
                 : TensorView<const float>(),
        c.calibration);
    compute.encode = m.encode;
    compute.decode = m.decode;
  } else {
    compute.encode = bitsd(all.encode);
    compute.decode = bitsd(all.decode);
    self.calibrated_[c.calibration] = {compute.encode, compute.decode, 0, 0};
  }
  compute = self.with_shared_speeds(compute);
  const Choice choice = self.auto_choice({.codec = codec,
                                          .n = n,
                                          .sent = all.sent,
                                          .bytes = all.bytes,
                                          .compute = compute,
                                          .average = c.opt.average,
                                          .error_feedback = c.ef != nullptr,
                                          .allow_uncompressed = c.opt.allow_uncompressed,
                                          .shapes = c.shapes},
                                         false, timeline::on() ? &c.considered : nullptr);
  c.job->skip_codec = !choice.compressed;
  return choice.algorithm;
}

// 6. run: the algorithm's run (its row's), the check of the sum, the residual committed.
void Communicator::Impl::run(Call& c, Algorithm alg) {
  detail::Job& job = *c.job;
  job.state = c.states ? c.states->of[static_cast<int>(alg)].get() : nullptr;
  if (job.buf.dev) {
    detail::run_device(job, alg);
  } else {
    detail::algorithm_row(alg).run(job);
  }
  if (!c.sum_bounded) check_sum_finite(job, alg);
  if (c.ef) c.ef->commit();
}

// 7. record: what the call did: the learner's pending time, the last call's and the running
// statistics.
void Communicator::Impl::record(Call& c, Algorithm alg) {
  Impl& self = c.self;
  const detail::Job& job = *c.job;
  if (c.choosing) {
    const Choice ran{alg, !job.skip_codec};
    self.pending_key_ = detail::AutoLearner::key_of(c.group, ran);
    const double cost =
        detail::learned_cost(self.net_->wait_style(), num_threads(), c.device != nullptr,
                             detail::now() - c.start, detail::thread_cpu_seconds() - c.cpu_start);
    self.pending_seconds_ = self.timing_->call_seconds(*c.codec, job.buf.in.size(), ran, cost);
  }
  CallStats& s = self.last_;
  s.bytes_sent = job.meter.traffic.sent + 2 * sizeof(Agreement);
  s.bytes_received = job.meter.traffic.received + 2 * sizeof(Agreement);
  s.encode_seconds = job.meter.encode_seconds;
  s.comm_seconds = job.meter.traffic.seconds + c.agree_seconds;
  s.decode_seconds = job.meter.decode_seconds;
  s.agree_seconds = c.agree_seconds;
  s.algorithm = alg;
  s.compressed = !job.skip_codec;
  s.calls = 1;
  s.by_algorithm = {};
  s.by_algorithm[static_cast<int>(alg)] = 1;
  s.compressed_calls = s.compressed ? 1 : 0;
  self.total_.add(s);
  if (timeline::on()) trace(c, &alg);
}

void Communicator::Impl::trace(Call& c, const Algorithm* alg) {
  const double end = detail::now();
  std::string a = "\"n\":" + std::to_string(c.n);
  if (c.codec) a += ",\"codec\":" + timeline::quoted(c.codec->spec());
  a += ",\"requested\":" + timeline::quoted(algorithm_name(c.requested));
  if (!alg) {
    a += ",\"failed\":true";
  } else {
    const CallStats& s = c.self.last_;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  ",\"compressed\":%s,\"bytes_sent\":%llu,\"bytes_received\":%llu,"
                  "\"encode_s\":%.6g,\"wire_s\":%.6g,\"agreement_s\":%.6g,\"decode_s\":%.6g,"
                  "\"measured_s\":%.6g",
                  s.compressed ? "true" : "false", static_cast<unsigned long long>(s.bytes_sent),
                  static_cast<unsigned long long>(s.bytes_received), s.encode_seconds,
                  s.comm_seconds - s.agree_seconds, s.agree_seconds, s.decode_seconds,
                  end - c.start);
    a += ",\"algorithm\":" + timeline::quoted(algorithm_name(*alg)) + buf;
    if (!c.considered.empty()) {  // auto's choice: each option's predicted seconds
      a += ",\"predicted_s\":{";
      for (std::size_t i = 0; i < c.considered.size(); ++i) {
        const detail::Option& o = c.considered[i];
        std::snprintf(buf, sizeof buf, "%s%s:%.6g", i ? "," : "",
                      timeline::quoted(std::string(algorithm_name(o.choice.algorithm)) +
                                       (o.choice.compressed ? "" : " uncompressed"))
                          .c_str(),
                      o.predicted);
        a += buf;
      }
      a += "}";
    }
  }
  c.traced = true;
  timeline::span(c.opt.label ? c.opt.label : "allreduce", "call", c.start, end, a);
}

}  // namespace gcomp
