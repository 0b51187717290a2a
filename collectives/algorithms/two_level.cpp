// The two levels of a transport's ranks and the steps inside a host (two_level.hpp).
#include "two_level.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "algorithm_table.hpp"
#include "algorithms.hpp"
#include "device_backend.hpp"
#include "feedback_slot.hpp"
#include "gcomp/error.hpp"
#include "group_transport.hpp"
#include "host_memory.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

namespace {

void check_host(const Net& host, const Levels& l, const char* who) {
  if (host.size() != static_cast<int>(l.host_ranks.size()) || host.rank() != l.local) {
    throw Error(Status::internal, std::string(who) + ": the host's transport has " +
                                      std::to_string(host.size()) + " ranks; the host " +
                                      std::to_string(l.host_ranks.size()));
  }
}

// The chunks local rank j of the host owns: j, j + L, ... < W.
template <class F>
void each_owned_by(const Levels& l, int j, F f) {
  const int L = static_cast<int>(l.host_ranks.size());
  for (int c = j; c < l.width; c += L) f(c);
}

std::span<const float> floats_of(std::span<const std::byte> b) {
  return {reinterpret_cast<const float*>(b.data()), b.size() / sizeof(float)};
}

[[noreturn]] void bad_size(const char* who, int from, std::size_t got, std::size_t want) {
  throw Error(Status::bad_payload, std::string(who) + ": host rank " + std::to_string(from) +
                                       " sent " + std::to_string(got) + " bytes, not " +
                                       std::to_string(want));
}

}  // namespace

void host_reduce_scatter(Net& host, const Levels& l, std::span<const float> x,
                         std::vector<std::vector<float>>& sums, Traffic& t) {
  check_host(host, l, "host_reduce_scatter");
  const std::uint64_t n = x.size();
  const auto W = static_cast<std::uint64_t>(l.width);
  const int L = host.size();
  std::vector<std::vector<std::byte>> to(static_cast<std::size_t>(L)), from;
  for (int j = 0; j < L; ++j) {
    auto& out = to[static_cast<std::size_t>(j)];
    each_owned_by(l, j, [&](int c) {
      const std::uint64_t b = chunk_bound(n, static_cast<std::uint64_t>(c), W);
      const std::uint64_t e = chunk_bound(n, static_cast<std::uint64_t>(c) + 1, W);
      const auto* p = reinterpret_cast<const std::byte*>(x.data() + b);
      out.insert(out.end(), p, p + (e - b) * sizeof(float));
    });
  }
  host.alltoallv_bytes(to, from, t);
  const std::size_t mine = to[static_cast<std::size_t>(l.local)].size();
  for (int j = 0; j < L; ++j) {
    const std::size_t got = from[static_cast<std::size_t>(j)].size();
    if (got != mine) bad_size("host_reduce_scatter", j, got, mine);
  }
  sums.assign(l.owned.size(), {});
  std::size_t offset = 0;  // in floats, within each rank's message to this one
  for (std::size_t k = 0; k < l.owned.size(); ++k) {
    const auto c = static_cast<std::uint64_t>(l.owned[k]);
    const std::size_t len = chunk_bound(n, c + 1, W) - chunk_bound(n, c, W);
    std::vector<float>& s = sums[k];
    const auto first = floats_of(from[0]).subspan(offset, len);
    s.assign(first.begin(), first.end());
    for (int j = 1; j < L; ++j) {
      const auto piece = floats_of(from[static_cast<std::size_t>(j)]).subspan(offset, len);
      for (std::size_t i = 0; i < len; ++i) s[i] = s[i] + piece[i];
    }
    offset += len;
  }
}

bool host_allgather(Net& host, const Levels& l, const std::vector<std::vector<float>>& chunks,
                    std::span<float> out, Traffic& t, bool allow_missing) {
  check_host(host, l, "host_allgather");
  const std::uint64_t n = out.size();
  const auto W = static_cast<std::uint64_t>(l.width);
  const auto len_of = [&](int c) {
    return static_cast<std::size_t>(chunk_bound(n, static_cast<std::uint64_t>(c) + 1, W) -
                                    chunk_bound(n, static_cast<std::uint64_t>(c), W));
  };
  if (chunks.size() != l.owned.size()) {
    throw Error(Status::internal, "host_allgather: " + std::to_string(chunks.size()) +
                                      " chunks for " + std::to_string(l.owned.size()) + " owned");
  }
  std::vector<std::byte> mine;
  bool missing = false;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    if (chunks[k].size() != len_of(l.owned[k])) {
      if (allow_missing && chunks[k].empty()) {
        missing = true;
        continue;
      }
      throw Error(Status::internal, "host_allgather: chunk " + std::to_string(l.owned[k]) +
                                        " has " + std::to_string(chunks[k].size()) + " elements");
    }
    const auto* p = reinterpret_cast<const std::byte*>(chunks[k].data());
    mine.insert(mine.end(), p, p + chunks[k].size() * sizeof(float));
  }
  if (missing) mine.clear();  // nothing from this rank: every rank of the host sees it
  Gathered all;
  host.allgatherv_bytes(mine, all, t);
  bool complete = true;
  for (int j = 0; j < host.size(); ++j) {
    std::size_t want = 0;
    each_owned_by(l, j, [&](int c) { want += len_of(c) * sizeof(float); });
    const auto got = all.of(j);
    if (got.size() != want) {
      if (allow_missing && got.empty()) {
        complete = false;
        continue;
      }
      bad_size("host_allgather", j, got.size(), want);
    }
    std::size_t offset = 0;
    each_owned_by(l, j, [&](int c) {
      const std::size_t len = len_of(c);
      if (len == 0) return;  // an empty chunk (n < W), whose memory may be null
      std::memcpy(out.data() + chunk_bound(n, static_cast<std::uint64_t>(c), W),
                  got.data() + offset, len * sizeof(float));
      offset += len * sizeof(float);
    });
  }
  return complete;
}

// ---- The algorithm two_level (docs/algorithms.md, "two_level") ----

namespace {

// The transports of the two levels, made per call from the parent's hosts() (no message).
struct TwoLevels {
  explicit TwoLevels(Net& parent) : levels(levels_of(parent)) {
    host = make_group_transport(parent, levels.host_ranks);
    for (const std::vector<int>& g : levels.chunk_groups) {
      groups.push_back(make_group_transport(parent, g));
    }
  }
  Levels levels;
  std::unique_ptr<Net> host;                 // this host's ranks
  std::vector<std::unique_ptr<Net>> groups;  // per owned chunk, its owners across hosts
};

// The host's shared memory of a Communicator's two_level calls (its workspace's), made on first
// use and grown to the largest call; where the host's ranks cannot share memory (agreed among
// them), never tried again.
struct HostShared {
  std::unique_ptr<HostMemory> memory;
  bool unavailable = false;
};

// The most shared memory a host's ranks map for two_level (larger calls go by messages).
constexpr std::size_t kMaxHostMemory = std::size_t{4} << 30;

// GCOMP_HOST_MEMORY=0: the steps inside a host by the engine's messages only (the same bits).
bool host_memory_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("GCOMP_HOST_MEMORY");
    return v == nullptr || std::string(v) != "0";
  }();
  return allowed;
}

// The steps inside a host for one call of n elements: through the host's shared memory where its
// ranks have it (each rank writes its values once, each owner sums its chunks from the others'
// and writes the results once, every rank reads them: no engine copies), else by the engine's
// messages (host_reduce_scatter, host_allgather). The same bits either way. Collective over the
// host's ranks.
class HostStage {
 public:
  HostStage(Workspace& ws, TwoLevels& two, std::size_t n) : two_(two), n_(n) {
    const Levels& l = two.levels;
    const std::size_t ranks = l.host_ranks.size();
    HostShared& shared = ws.get<HostShared>();
    status_bytes_ = (8 * static_cast<std::size_t>(l.width) + 63) / 64 * 64;
    const std::size_t need = status_bytes_ + 4 * n * (ranks + 2);
    if (ranks > 1 && !shared.unavailable && need <= kMaxHostMemory && host_memory_allowed()) {
      if (!shared.memory || shared.memory->bytes() < need) {
        shared.memory.reset();
        shared.memory = HostMemory::make(*two.host, std::bit_ceil(need));
        shared.unavailable = shared.memory == nullptr;
      }
      memory_ = shared.memory.get();
    }
    if (!memory_) own_ = &ws.get<OwnInput>().y;
  }
  // Where this rank writes its n values.
  std::span<float> input() {
    if (memory_) return {slot(two_.levels.local), n_};
    own_->resize(n_);
    return *own_;
  }
  // Per owned chunk, the host's sum (its ranks' values added in host-rank order), once every
  // rank of the host has written its input.
  void reduce(std::vector<std::vector<float>>& sums, Traffic& t) {
    const Levels& l = two_.levels;
    if (!memory_) return host_reduce_scatter(*two_.host, l, *own_, sums, t);
    // The host's step through its memory counts as communication (the engine's messages, the
    // other way, count themselves): the barrier's wait for the host's ranks and the sums.
    const Meter::Phase timed(t.seconds, "wire");
    two_.host->barrier();
    sums.resize(l.owned.size());
    const auto W = static_cast<std::uint64_t>(l.width);
    for (std::size_t k = 0; k < l.owned.size(); ++k) {
      const auto c = static_cast<std::uint64_t>(l.owned[k]);
      const std::uint64_t b = chunk_bound(n_, c, W), len = chunk_bound(n_, c + 1, W) - b;
      std::vector<float>& s = sums[k];
      const float* first = slot(0) + b;
      s.assign(first, first + len);
      for (std::size_t j = 1; j < l.host_ranks.size(); ++j) {
        const float* piece = slot(static_cast<int>(j)) + b;
        for (std::uint64_t i = 0; i < len; ++i) s[i] = s[i] + piece[i];
      }
    }
  }
  // Every chunk's result into out from its owner on this host (results[k]: owned chunk k; empty
  // where its step across hosts failed), and where shares is given (error feedback) every
  // chunk's residual share into e_next (shares[k]: what each rank of the host keeps of owned
  // chunk k's residual). False where some owner's is missing, its chunk left.
  bool gather(const std::vector<std::vector<float>>& results, std::span<float> out,
              const std::vector<std::vector<float>>* shares, std::span<float> e_next, Traffic& t) {
    const Levels& l = two_.levels;
    if (!memory_) {
      const bool complete = host_allgather(*two_.host, l, results, out, t, true);
      // Every rank of the host has error feedback or none (the call's agreement), so all
      // take part in this one or none does.
      if (shares) host_allgather(*two_.host, l, *shares, e_next, t, true);
      return complete;
    }
    const Meter::Phase timed(t.seconds, "wire");  // as reduce's
    const auto W = static_cast<std::uint64_t>(l.width);
    const int L = static_cast<int>(l.host_ranks.size());
    float* result = slot(L);
    float* share = slot(L + 1);
    for (std::size_t k = 0; k < l.owned.size(); ++k) {
      const auto c = static_cast<std::uint64_t>(l.owned[k]);
      const std::uint64_t b = chunk_bound(n_, c, W), len = chunk_bound(n_, c + 1, W) - b;
      const std::uint64_t failed = results[k].size() != len ? 1 : 0;
      std::memcpy(memory_->data() + 8 * c, &failed, 8);
      if (failed || len == 0) continue;
      std::memcpy(result + b, results[k].data(), 4 * len);
      if (shares) std::memcpy(share + b, (*shares)[k].data(), 4 * len);
    }
    two_.host->barrier();
    bool complete = true;
    for (std::uint64_t c = 0; c < W; ++c) {
      std::uint64_t failed = 0;
      std::memcpy(&failed, memory_->data() + 8 * c, 8);
      const std::uint64_t b = chunk_bound(n_, c, W), len = chunk_bound(n_, c + 1, W) - b;
      if (failed) {
        complete = false;
      } else if (len > 0) {
        std::memcpy(out.data() + b, result + b, 4 * len);
        if (shares) std::memcpy(e_next.data() + b, share + b, 4 * len);
      }
    }
    return complete;
  }

 private:
  struct OwnInput {
    std::vector<float> y;
  };
  // Rank j's values (j = L: the results; L + 1: the residual shares).
  float* slot(int j) const {
    return reinterpret_cast<float*>(memory_->data() + status_bytes_) +
           static_cast<std::size_t>(j) * n_;
  }
  TwoLevels& two_;
  std::size_t n_;
  std::size_t status_bytes_ = 0;
  HostMemory* memory_ = nullptr;
  std::vector<float>* own_ = nullptr;
};

// A transport whose float sum runs on two levels (the host's reduce-scatter, each chunk summed
// across hosts by its owners, the host's allgather): the same bits on every rank, the host's
// ranks summed first. Everything else is the parent's. dense (codec none) and low_rank run on
// it unchanged.
class TwoLevelAllreduce final : public Net {
 public:
  TwoLevelAllreduce(Net& parent, Workspace& ws)
      : Net(parent.kind(), parent.rank(), parent.size()),
        parent_(parent),
        ws_(ws),
        levels_(parent) {
    hosts_ = parent.hosts();
  }
  void allreduce(const void* send, void* recv, std::size_t count, Reduction op) override {
    if (op != Reduction::sum_float) return parent_.allreduce(send, recv, count, op);
    HostStage stage(ws_, levels_, count);
    const std::span<float> in = stage.input();
    if (count > 0) std::memcpy(in.data(), send, 4 * count);
    stage.reduce(sums_, traffic_);
    for (std::size_t k = 0; k < sums_.size(); ++k) {
      levels_.groups[k]->allreduce(sums_[k].data(), sums_[k].data(), sums_[k].size(),
                                   Reduction::sum_float);
    }
    stage.gather(sums_, {static_cast<float*>(recv), count}, nullptr, {}, traffic_);
  }
  void barrier() override { parent_.barrier(); }
  void allgatherv_bytes(std::span<const std::byte> mine, Gathered& out, Traffic& t) override {
    parent_.allgatherv_bytes(mine, out, t);
  }
  void alltoallv_bytes(const std::vector<std::vector<std::byte>>& to,
                       std::vector<std::vector<std::byte>>& from, Traffic& t) override {
    parent_.alltoallv_bytes(to, from, t);
  }
  void send_bytes(int to, std::span<const std::byte> send, Traffic& t) override {
    parent_.send_bytes(to, send, t);
  }
  void recv_bytes(int from, std::vector<std::byte>& recv, Traffic& t) override {
    parent_.recv_bytes(from, recv, t);
  }
  void sendrecv_bytes(int to, std::span<const std::byte> send, int from,
                      std::vector<std::byte>& recv, Traffic& t) override {
    parent_.sendrecv_bytes(to, send, from, recv, t);
  }
  void shift_bytes(int to, std::span<const std::byte> send, int from,
                   std::span<std::byte> recv) override {
    parent_.shift_bytes(to, send, from, recv);
  }
  void alltoall_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                      std::size_t block) override {
    parent_.alltoall_bytes(send, recv, block);
  }
  void agree(const std::uint64_t* mine, std::uint64_t* all, std::size_t words, std::uint64_t call,
             const WaitLimits& limits, const std::function<std::string()>& describe) override {
    parent_.agree(mine, all, words, call, limits, describe);
  }

 private:
  Net& parent_;
  Workspace& ws_;
  TwoLevels levels_;
  std::vector<std::vector<float>> sums_;
  Traffic traffic_;  // the run's algorithm counts what it sends itself
};

bool runs_on_two_level_allreduce(const Codec& codec) {
  return codec.kind() == CodecKind::none || codec.properties().low_rank;
}

// The one-level algorithm two_level runs across hosts for a codec that is compressed there.
const AlgorithmRow& across_hosts(const Codec& codec) {
  return algorithm_row(codec.properties().sparse ? Algorithm::sparse_allgather
                                                 : Algorithm::allgather);
}

void add_meter(Meter& into, const Meter& from) {
  into.traffic.sent += from.traffic.sent;
  into.traffic.received += from.traffic.received;
  into.traffic.seconds += from.traffic.seconds;
  into.encode_seconds += from.encode_seconds;
  into.decode_seconds += from.decode_seconds;
}

// `none` and the low-rank codecs: their algorithm (dense, low_rank; host or device form) on the
// two-level sum.
void on_two_level_allreduce(Job& job, void (*run)(Job&)) {
  TwoLevelAllreduce net(*job.call.net, job.ws);
  CallSpec spec = job.call;
  spec.net = &net;
  Job sub(spec, job.buf, job.ws);
  sub.input = job.input;
  sub.skip_codec = job.skip_codec;
  sub.agreed_sent = job.agreed_sent;
  sub.fresh_state = job.fresh_state;
  run(sub);
  job.input = sub.input;
  add_meter(job.meter, sub.meter);
}

struct TwoLevelBuffers {
  std::vector<std::vector<float>> sums, sums_out;  // per owned chunk: the host's sum, the result
  // Per owned chunk, of its residual: the share each other rank of the host keeps, and this
  // rank's own.
  std::vector<std::vector<float>> shares, own;
  ErrorFeedback zero{0};      // the across-hosts step's residual in: zeros
  std::vector<float> e_next;  // device tensors: the new residual on the host
};

// The compressed codecs: y (x + e, n elements, written by fill where the host's step reads it)
// summed in the host, each owned chunk's sum compressed by the one-level algorithm across hosts
// with its residual split among the host's ranks into e_next (empty: no error feedback), and
// the host's chunks gathered into out, averaged.
void reduce_then_compress(Job& job, std::uint64_t n,
                          const std::function<void(std::span<float>)>& fill,
                          std::span<float> e_next, std::span<float> out) {
  TwoLevels two(*job.call.net);
  const Levels& l = two.levels;
  auto& b = job.ws.get<TwoLevelBuffers>();
  HostStage stage(job.ws, two, n);
  {
    const auto timed = job.meter.encoding();
    fill(stage.input());
  }
  // e_next needs no clearing: each owned chunk's residual is written across hosts, and every
  // chunk's share by the gather below (or the call throws and nothing is committed).
  stage.reduce(b.sums, job.meter.traffic);
  const auto W = static_cast<std::uint64_t>(l.width);
  const AlgorithmRow& inner = across_hosts(*job.call.codec);
  b.sums_out.resize(l.owned.size());
  // A failure across hosts (a chunk's sum that overflows float32 fails its encode on the owner,
  // and its group's decode of the empty payload it sends instead) is kept until the host's
  // ranks have heard of it: the failed chunk goes to them empty, and every rank throws.
  std::string failed;
  Status failed_status = Status::ok;
  for (std::size_t k = 0; k < l.owned.size(); ++k) {
    const auto c = static_cast<std::uint64_t>(l.owned[k]);
    const std::uint64_t begin = chunk_bound(n, c, W);
    const std::uint64_t len = chunk_bound(n, c + 1, W) - begin;
    const std::vector<int>& group = l.chunk_groups[k];
    CallSpec spec = job.call;
    spec.net = two.groups[k].get();
    spec.rank =
        static_cast<int>(std::find(group.begin(), group.end(), job.call.rank) - group.begin());
    spec.size = static_cast<int>(group.size());
    spec.seed = derive_seed(job.call.seed, c, 4, 0);
    spec.owner_seed = derive_seed(job.call.owner_seed, c, 4, 0);
    spec.shared_seed = derive_seed(job.call.shared_seed, c, 4, 0);
    spec.average = false;
    spec.majority_vote = false;
    spec.shapes = {};
    b.sums_out[k].resize(len);
    CallBuffers buf{.in = b.sums[k], .out = b.sums_out[k], .ef = nullptr, .ef_next = {}};
    if (!e_next.empty()) {
      FeedbackSlot::reuse(b.zero, len);
      buf.ef = &b.zero;
      buf.ef_next = e_next.subspan(begin, len);
    }
    Job sub(spec, buf, job.ws);
    try {
      try {
        encode_whole(sub);
      } catch (const Error&) {
        // This owner's sum: its group learns of it from the empty payload.
        Gathered all;
        sub.call.net->allgatherv_bytes({}, all, sub.meter.traffic);
        throw;
      }
      inner.run(sub);
    } catch (const Error& e) {
      if (failed.empty()) {
        failed = "two_level: chunk " + std::to_string(c) + " across hosts: " + e.what();
        failed_status = e.code() == Status::bad_payload ? Status::nonfinite : e.code();
      }
      b.sums_out[k].clear();
    }
    add_meter(job.meter, sub.meter);
  }
  // Each owned chunk's residual (the host's sum less what was sent) split among the host's L
  // ranks: each other rank keeps q = r / L, the owner r - (L - 1) q, so that the host's shares
  // add up to r (exactly where L - 1 is a power of two: (L - 1) q is exact and the subtraction
  // too, by Sterbenz's lemma; within a rounding of r otherwise) and every rank's
  // residual is zero where its host sent the value and not where it did not, as a rank's own
  // residual is under the one-level algorithms: momentum factor masking (mask_momentum) then
  // zeroes each rank's velocity where its host sent, and the next call, whatever its
  // algorithm, adds each rank's share once.
  const bool feedback = !e_next.empty();
  if (feedback) {
    const auto L = static_cast<float>(l.host_ranks.size());
    b.shares.resize(l.owned.size());
    b.own.resize(l.owned.size());
    for (std::size_t k = 0; k < l.owned.size(); ++k) {
      const auto c = static_cast<std::uint64_t>(l.owned[k]);
      const std::uint64_t begin = chunk_bound(n, c, W);
      const std::uint64_t len = chunk_bound(n, c + 1, W) - begin;
      std::vector<float>& q = b.shares[k];
      std::vector<float>& own = b.own[k];
      if (b.sums_out[k].size() != len) {  // failed: nothing from this chunk
        q.clear();
        own.clear();
        continue;
      }
      q.resize(len);
      own.resize(len);
      const float* r = e_next.data() + begin;
      for (std::uint64_t i = 0; i < len; ++i) {
        q[i] = r[i] / L;
        own[i] = r[i] - (L - 1.0f) * q[i];
      }
    }
  }
  const bool complete =
      stage.gather(b.sums_out, out, feedback ? &b.shares : nullptr, e_next, job.meter.traffic);
  if (feedback) {
    for (std::size_t k = 0; k < l.owned.size(); ++k) {
      const auto c = static_cast<std::uint64_t>(l.owned[k]);
      if (!b.own[k].empty())
        std::copy(b.own[k].begin(), b.own[k].end(),
                  e_next.begin() + static_cast<std::ptrdiff_t>(chunk_bound(n, c, W)));
    }
  }
  if (!failed.empty()) throw Error(failed_status, failed);
  if (!complete) {
    throw Error(Status::nonfinite,
                "two_level: a rank of this host could not reduce its part across hosts (the sum "
                "is not finite: the ranks' finite contributions overflow float32)");
  }
  finish_average(job);
}

void run_two_level(Job& job) {
  const Codec& codec = *job.call.codec;
  if (runs_on_two_level_allreduce(codec)) {
    return on_two_level_allreduce(
        job,
        algorithm_row(codec.properties().low_rank ? Algorithm::low_rank : Algorithm::dense).run);
  }
  const std::span<const float> x = job.buf.in;
  const auto* summed = std::get_if<prepared::Summed>(&job.input);  // x + e, formed and checked
  const std::span<const float> e =
      job.buf.ef ? std::span<const float>(job.buf.ef->residual()) : std::span<const float>();
  reduce_then_compress(
      job, x.size(),
      [&](std::span<float> y) {
        if (summed) {
          std::copy(summed->values.begin(), summed->values.end(), y.begin());
        } else if (!e.empty()) {
          for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i] + e[i];
        } else {
          std::copy(x.begin(), x.end(), y.begin());
        }
      },
      job.buf.ef ? job.buf.ef_next : std::span<float>(), job.buf.out);
}

void run_two_level_device(Job& job) {
  const Codec& codec = *job.call.codec;
  if (runs_on_two_level_allreduce(codec)) {
    const AlgorithmRow& row =
        algorithm_row(codec.properties().low_rank ? Algorithm::low_rank : Algorithm::dense);
    return on_two_level_allreduce(job, row.run_device);
  }
  // x + e to the host, the host's form, the result and the residual back.
  const std::size_t n = job.buf.out.size();
  auto& b = job.ws.get<TwoLevelBuffers>();
  b.e_next.resize(job.buf.d_e_new ? n : 0);
  reduce_then_compress(
      job, n, [&](std::span<float> y) { device_input_to_host(job, y); }, b.e_next, job.buf.out);
  job.buf.dev->copy(job.buf.d_out, job.buf.out.data(), 4 * n, job.buf.stream);
  if (job.buf.d_e_new) job.buf.dev->copy(job.buf.d_e_new, b.e_next.data(), 4 * n, job.buf.stream);
}

// ---- The model ----

// One level of the ranks as the one-level formulas see it: `ranks` ranks on `net`.
ModelInput level(const ModelInput& in, int ranks, const NetworkModel& net) {
  ModelInput l = in;
  l.ranks = ranks;
  l.network = net;
  l.two_level_allreduce = false;
  l.hosts = 0;
  return l;
}

const NetworkModel& inside_host(const ModelInput& in) {
  return in.host_network.beta > 0 ? in.host_network : in.network;
}

bool applies(const ModelInput& in) {
  return in.hosts > 1 && in.ranks_per_host > 1 && in.hosts < in.ranks;
}

// The one-level input of a chunk's owners across hosts: n / W elements among H ranks.
ModelInput chunk_input(const ModelInput& in) {
  ModelInput c = level(in, in.hosts, in.network);
  const double w = in.ranks_per_host;
  c.n = in.n / w;
  c.sent = in.sent / w;
  c.payload_bytes = in.payload_bytes / w;
  c.shapes = {};
  c.average = false;
  return c;
}

const AlgorithmRow& across_hosts_row(const ModelInput& in) {
  return algorithm_row(in.sparse ? Algorithm::sparse_allgather : Algorithm::allgather);
}

bool low_rank_codec(const ModelInput& in) {
  return in.codec != nullptr && in.codec->properties().low_rank;
}

double predict_two_level(const ModelInput& in) {
  if (!applies(in)) return kNotApplicable;
  if (in.codec_none || low_rank_codec(in)) {
    ModelInput h = in;
    h.two_level_allreduce = true;
    return algorithm_row(low_rank_codec(in) ? Algorithm::low_rank : Algorithm::dense).predict(h);
  }
  const ModelInput host = level(in, in.ranks_per_host, inside_host(in));
  const double w = in.ranks_per_host;
  const double reduce = in.compute.reduce;
  // Inside the host: through shared memory, y written (x + e: one pass either way), the owner's
  // sums of its chunks (the host's n / W elements of each of its ranks: about n adds) and the
  // results copied out (a pass), with two barriers of the host's ranks (a ring of W - 1 empty
  // messages each); by messages, an all-to-all of the tensor and an allgatherv of a chunk.
  const double inside = in.host_memory ? 3 * in.n * reduce + 2 * (w - 1) * host.network.alpha
                                       : (in.error_feedback ? in.n * reduce : 0.0) +
                                             t_alltoallv(host, 4 * in.n) + in.n * reduce +
                                             t_allgatherv(host, 4 * in.n / w);
  return inside + across_hosts_row(in).predict(chunk_input(in)) +
         (in.average ? in.n * reduce : 0.0);
}

double bytes_two_level(const ModelInput& in) {
  if (!applies(in)) return kNotApplicable;
  const double w = in.ranks_per_host;
  const double inside = 2 * (w - 1) / w * 4 * in.n + 2 * (w - 1) * 8;  // both steps, sizes
  if (in.codec_none || low_rank_codec(in)) {
    // The one-level algorithm's allreduce volume, a W-th of it across hosts.
    ModelInput h = in;
    const double flat =
        algorithm_row(low_rank_codec(in) ? Algorithm::low_rank : Algorithm::dense).bytes(h);
    const double p = in.ranks, hosts = in.hosts;
    return flat / (2 * (p - 1) / p) * (2 * (w - 1) / w + 2 * (hosts - 1) / hosts / w);
  }
  return inside + across_hosts_row(in).bytes(chunk_input(in));
}

bool two_level_candidate(const ModelInput& in) { return applies(in) && !in.codec_none; }

}  // namespace

bool host_memory_shared(Workspace& ws) {
  return host_memory_allowed() && !ws.get<HostShared>().unavailable;
}

double t_two_level_allreduce(const ModelInput& in, double bytes, double elements) {
  const double w = std::max(1, in.ranks_per_host);
  const ModelInput host = level(in, in.ranks_per_host, inside_host(in));
  const ModelInput across = level(in, std::max(1, in.hosts), in.network);
  // Inside the host as in predict_two_level; across hosts each chunk's owners gather their sums
  // and add them (the group's allreduce).
  const double inside =
      in.host_memory
          ? 3 * elements * in.compute.reduce + 2 * (w - 1) * host.network.alpha
          : t_alltoallv(host, bytes) + elements * in.compute.reduce + t_allgatherv(host, bytes / w);
  return inside + t_allgatherv(across, bytes / w) +
         (across.ranks - 1) * elements / w * in.compute.reduce;
}

extern const AlgorithmRow kTwoLevelRow = {
    .id = Algorithm::two_level,
    .name = "two_level",
    .description =
        "each host's ranks sum the tensor (a reduce-scatter), each part's owners, one a host, "
        "run the codec's one-level algorithm across hosts, the host's ranks gather the parts",
    .sparse_only = false,
    .any_codec = true,
    .encodes_after_agreement = true,
    .candidate = two_level_candidate,
    .predict = predict_two_level,
    .bytes = bytes_two_level,
    .run = run_two_level,
    .run_device = run_two_level_device,
};

}  // namespace gcomp::detail
