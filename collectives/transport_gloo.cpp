// The Gloo transport (transport.hpp): Gloo's TCP device, two contexts for the calls (the first runs
// Gloo's collectives, the agreement, the rests of point-to-point messages and their first parts
// from lower ranks to higher; the second their first parts from higher ranks to lower) and one
// for the watch's questions and answers, all met through a key-value store under the
// Communicator's prefix (gloo::rendezvous::PrefixStore; under gcomp.torch, torch.distributed's
// own store).
//
// What runs on what:
//   dense allreduce      gloo::allreduce (ring), what torch's ProcessGroupGloo runs for DDP
//   small reductions     recursive doubling of eager messages (up to 64 KiB)
//   point to point       two receives always posted per peer: the size and the first part (up
//                        to 1 MiB, less at many ranks) at once, the rest after it in 1 MiB
//                        segments (Gloo's receives need their size)
//   unless GCOMP_GLOO_SOCKETS=0 (alike on every rank) or a device has no IPv4 address: the
//                        agreement, the small reductions and the first parts on the transport's
//                        own sockets instead (socket_mesh.hpp: a TCP connection per pair, polled
//                        by the waiting thread); the rests as above
//   allgatherv,          one point-to-point message each way between every pair: the size
//   all-to-allv          and the first part at once, the rests once every receive is posted
//   all-to-all           gloo::alltoall (fixed blocks)
//   barrier              gloo::barrier
//   the agreement        recursive doubling of eager messages on a channel of its own, the
//                        timeout Gloo's own (on the sockets: theirs); watched by two threads
//                        (GlooWatch below)
// Waits block in Gloo (a condition variable) and on the data's sockets (poll(2)); on the
// agreement's sockets they follow the wait policy, as MPI's waits do (socket_mesh.hpp).
// Gloo's waits take a timeout that ends the whole context when it passes (every connection
// closes), so only the agreement's wait has one (the user's timeout, after which the
// Communicator is broken anyway); every other wait is unlimited, as MPI's are.
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "doubling.hpp"
#include "gcomp/error.hpp"
#include "socket_mesh.hpp"
#include "stall.hpp"
#include "transport.hpp"

#ifdef GCOMP_HAVE_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#endif

namespace gcomp {

bool have_gloo() noexcept {
#ifdef GCOMP_HAVE_GLOO
  return true;
#else
  return false;
#endif
}

namespace detail {

#ifndef GCOMP_HAVE_GLOO

std::unique_ptr<Transport> make_gloo_transport(gloo::rendezvous::Store&, int, int,
                                               const GlooOptions&) {
  throw Error(Status::invalid_argument,
              "this build of gcomp has no Gloo transport (configure it with libgloo-dev "
              "installed); use the MPI transport (mpiexec)");
}

#else

namespace {

using Ms = std::chrono::milliseconds;

// "Unlimited": a year (Gloo adds its timeouts to the steady clock in nanoseconds).
constexpr Ms kForever = std::chrono::duration_cast<Ms>(std::chrono::hours(24 * 365));

// Gloo's collectives use slots with a prefix byte of 1..8 (gloo/types.h); gcomp's own messages
// use 0x67 ('g').
constexpr std::uint64_t kSlotBase = std::uint64_t{0x67} << 56;
constexpr std::uint64_t kSlotPoint = kSlotBase | 1;  // send_bytes, recv_bytes, sendrecv_bytes
constexpr std::uint64_t kSlotShift = kSlotBase | 2;  // the network measurement's shifts
constexpr std::uint64_t kSlotWatch = kSlotBase | 4;  // questions and answers (watch context)
constexpr std::uint64_t kSlotBulk = kSlotBase | 5;   // point to point: what follows the first part
constexpr std::uint64_t kSlotAgree = kSlotBase | 7;  // the agreement (and its barrier)
constexpr std::uint64_t kSlotAgreeBulk = kSlotBase | 8;

Ms to_ms(double seconds) {
  return std::max(Ms(1), std::min(kForever, Ms(static_cast<std::int64_t>(seconds * 1e3 + 0.5))));
}

// Gloo's exceptions as gcomp's: a connection that closed, a wait that passed its timeout, an
// enforced condition that failed (bad sizes).
[[noreturn]] void rethrow_gloo(const char* what) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    throw Error(Status::transport, std::string("Gloo ") + what + ": " + e.what());
  } catch (const gloo::Exception& e) {
    throw Error(Status::transport, std::string("Gloo ") + what + ": " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    throw Error(Status::transport, std::string("Gloo ") + what + ": " + e.what());
  }
}

template <class F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (...) {
    rethrow_gloo(what);
  }
}

// A context whose transport context's default timeout can be set after the rendezvous (Gloo
// sets it from the context's own only then).
class Context final : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  void set_all_timeouts(Ms t) {
    setTimeout(t);
    if (transportContext_) transportContext_->setTimeout(t);
  }
};

std::string first_of_list(const char* text) {
  std::string s = text ? text : "";
  const auto comma = s.find(',');
  return comma == std::string::npos ? s : s.substr(0, comma);
}

// The device, and the IPv4 address it resolved (for the agreement's sockets; empty where the
// address is IPv6).
struct Device {
  std::shared_ptr<gloo::transport::Device> device;
  std::string ipv4;
};

std::string ipv4_of(const gloo::transport::tcp::attr& a) {
  const gloo::transport::tcp::attr resolved = gloo::transport::tcp::CreateDeviceAttr(a);
  if (resolved.ai_family != AF_INET) return "";
  const auto* in = reinterpret_cast<const sockaddr_in*>(&resolved.ai_addr);
  char text[INET_ADDRSTRLEN] = {};
  return inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) ? std::string(text) : "";
}

Device with_address(const gloo::transport::tcp::attr& a) {
  Device d;
  d.device = gloo::transport::tcp::CreateDevice(a);
  d.ipv4 = ipv4_of(a);
  return d;
}

Device make_device(const GlooOptions& o) {
  gloo::transport::tcp::attr a;
  std::string iface =
      o.interface.empty() ? first_of_list(std::getenv("GLOO_SOCKET_IFNAME")) : o.interface;
  if (!iface.empty()) {
    if (if_nametoindex(iface.c_str()) == 0) {
      throw Error(Status::invalid_argument,
                  "no network interface '" + iface + "' here (" +
                      (o.interface.empty() ? "GLOO_SOCKET_IFNAME" : "GlooOptions::interface") +
                      ")");
    }
    a.iface = iface;
    return guarded("device", [&] { return with_address(a); });
  }
  if (!o.hostname.empty()) {
    a.hostname = o.hostname;
    return guarded("device", [&] { return with_address(a); });
  }
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') {
    try {
      a.hostname = name;
      return with_address(a);
    } catch (...) {
      // The host's name does not resolve to an address of this host: one host only.
    }
  }
  a.hostname = "127.0.0.1";
  return guarded("device", [&] { return with_address(a); });
}

// This process's host, as the locality sees it: GlooOptions::host, GCOMP_HOST, else the host's
// name and network namespace.
std::string host_key(const GlooOptions& o) {
  if (!o.host.empty()) return o.host;
  if (const char* h = std::getenv("GCOMP_HOST"); h && *h) return h;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  struct stat st {};
  const std::string ns =
      stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
  return std::string(name) + "/netns:" + ns;
}

// GCOMP_GLOO_SOCKETS: 1 (or unset, or empty) the transport's own sockets, 0 not; 2 for any other
// value (every rank then fails, once all have said theirs).
char sockets_setting() {
  const char* v = std::getenv("GCOMP_GLOO_SOCKETS");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return 1;
  return std::strcmp(v, "0") == 0 ? 0 : 2;
}

std::shared_ptr<Context> connect(gloo::rendezvous::Store& store, const std::string& prefix,
                                 int rank, int size,
                                 const std::shared_ptr<gloo::transport::Device>& device,
                                 Ms connect_timeout) {
  auto ctx = std::make_shared<Context>(rank, size);
  ctx->set_all_timeouts(connect_timeout);
  gloo::rendezvous::PrefixStore prefixed(prefix, store);
  auto dev = device;
  guarded("rendezvous", [&] { ctx->connectFullMesh(prefixed, dev); });
  ctx->set_all_timeouts(kForever);
  return ctx;
}

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// Large transfers in segments of at most kSegment bytes, all posted at once (a pair sends a
// slot's messages in order, each as its receiver posts it): what Gloo's own ring allreduce does
// to keep a link busy. Receives first, then sends; wait() waits for all.
class Segments {
 public:
  static constexpr std::size_t kSegment = std::size_t{1} << 20;
  void recv(gloo::Context& ctx, int from, std::uint64_t slot, void* p, std::size_t n) {
    for (std::size_t at = 0; at < n; at += kSegment) {
      recvs_.push_back(
          ctx.createUnboundBuffer(static_cast<char*>(p) + at, std::min(kSegment, n - at)));
      recvs_.back()->recv(from, slot);
    }
  }
  void send(gloo::Context& ctx, int to, std::uint64_t slot, const void* p, std::size_t n) {
    for (std::size_t at = 0; at < n; at += kSegment) {
      sends_.push_back(ctx.createUnboundBuffer(const_cast<char*>(static_cast<const char*>(p)) + at,
                                               std::min(kSegment, n - at)));
      sends_.back()->send(to, slot);
    }
  }
  void wait() {
    for (auto& b : recvs_) b->waitRecv(nullptr, kForever);
    for (auto& b : sends_) b->waitSend(nullptr, kForever);
  }

 private:
  std::vector<Buffer> recvs_, sends_;
};

// ---- The watch (stall.hpp's, for Gloo) ----
//
// While this rank waits at an agreement (blocked in Gloo), two threads of the transport watch,
// on a context of their own:
//   the receiver  blocks on the watch slot; answers every question (through the watcher) with
//                 the call this rank waits at, or none, and records the answers to this rank's
//                 question. It never blocks on anything else, so its receive is always posted
//                 again at once (Gloo sends a message only once its receiver has posted one).
//   the watcher   past half the first limit asks every other rank where it is, past the stall
//                 seconds prints the report, and sends what the receiver queued.
// The timeout itself is Gloo's (the agreement's wait has it); its message names what the
// answers said. Nothing is sent while calls go on in time. Both threads run from the transport's
// creation (a rank that has not yet come to a call must answer too) to its end.
class GlooWatch {
 public:
  GlooWatch() = default;
  GlooWatch(const GlooWatch&) = delete;
  GlooWatch& operator=(const GlooWatch&) = delete;
  ~GlooWatch() { stop(); }

  void start(std::shared_ptr<Context> ctx) {
    ctx_ = std::move(ctx);
    where_.assign(static_cast<std::size_t>(ctx_->size), -1);
    if (ctx_->size == 1) return;
    for (int r = 0; r < ctx_->size; ++r) {
      if (r != ctx_->rank) others_.push_back(r);
    }
    incoming_ = ctx_->createUnboundBuffer(in_.data(), sizeof in_);
    incoming_->recv(others_, kSlotWatch);
    receiver_ = std::thread([this] { receive_loop(); });
    watcher_ = std::thread([this] { watch_loop(); });
  }

  // The wait of call number `call` begins and ends.
  // Neither wakes the watcher, which looks every eighth of the first limit (a call's usual
  // wait is far shorter, and a wakeup per call took a core from the ranks' work on a busy
  // machine); begin() does only when its call's limits are shorter than those it looks by.
  void begin(std::uint64_t call, const WaitLimits& limits,
             const std::function<std::string()>& describe) {
    const std::lock_guard<std::mutex> hold(lock_);
    waiting_ = {call, limits, &describe, now(), false, false};
    active_ = true;
    at_.store(static_cast<std::int64_t>(call));
    const double p = period_of(limits);
    if (p < period_) {
      period_ = p;
      wake_.notify_all();
    }
  }
  void end() {
    const std::lock_guard<std::mutex> hold(lock_);  // the watcher never describes a call past this
    active_ = false;
    at_.store(-1);
  }
  // Where each other rank said it is (stall.hpp's absent_ranks), for the message of a timeout.
  std::string absent(std::uint64_t call) {
    const std::lock_guard<std::mutex> hold(lock_);
    return absent_ranks(where_, ctx_->rank, call);
  }

 private:
  struct Waiting {
    std::uint64_t call = 0;
    WaitLimits limits;
    const std::function<std::string()>* describe = nullptr;
    double start = 0;
    bool asked = false;
    bool reported = false;
  };
  using Message = std::array<std::uint64_t, 3>;  // {kind, call asked about, call answered}
  struct Outgoing {
    int to;
    Message m;
  };
  static constexpr std::uint64_t kQuestion = 1, kAnswer = 2, kNone = ~std::uint64_t{0};

  // How often the watcher looks at a waiting call: an eighth of the first limit, at least 1 ms;
  // a minute where neither limit is set.
  static double period_of(const WaitLimits& limits) {
    const double first = first_limit(limits);
    return first > 0 ? std::max(1e-3, first / 8) : 60.0;
  }

  void stop() {
    {
      const std::lock_guard<std::mutex> hold(lock_);
      stopping_ = true;
      wake_.notify_all();
    }
    if (incoming_) incoming_->abortWaitRecv();
    if (receiver_.joinable()) receiver_.join();
    if (watcher_.joinable()) watcher_.join();
  }

  void send(const Outgoing& o) {
    Message m = o.m;
    try {
      Buffer out = ctx_->createUnboundBuffer(m.data(), sizeof m);
      out->send(o.to, kSlotWatch);
      out->waitSend(nullptr, kForever);
    } catch (...) {
      // A rank gone cannot be asked or answered; the agreement's own wait reports it.
    }
  }

  void receive_loop() {
    try {
      for (;;) {
        int from = -1;
        if (!incoming_->waitRecv(&from, kForever)) return;  // stop()
        const Message m = in_;
        incoming_->recv(others_, kSlotWatch);
        if (from < 0 || from >= ctx_->size) continue;
        const std::lock_guard<std::mutex> hold(lock_);
        if (m[0] == kQuestion) {
          const std::int64_t at = at_.load();
          outbox_.push_back(
              {from, {kAnswer, m[1], at < 0 ? kNone : static_cast<std::uint64_t>(at)}});
          wake_.notify_all();
        } else if (m[0] == kAnswer && active_ && m[1] == waiting_.call) {
          where_[static_cast<std::size_t>(from)] =
              m[2] == kNone ? -1 : static_cast<std::int64_t>(m[2]);
        }
        // Anything else from a peer is not gcomp's: dropped.
      }
    } catch (...) {
      // The watch context closed (a peer ended): nothing more to answer.
    }
  }

  // The next time the waiting call needs the watcher (-1: none).
  double next_deadline() const {
    if (!active_) return -1;
    const Waiting& w = waiting_;
    const double first = first_limit(w.limits);
    if (!w.asked && first > 0) return w.start + first / 2;
    if (!w.reported && w.limits.stall > 0) return w.start + w.limits.stall;
    return -1;
  }

  void watch_loop() {
    std::unique_lock<std::mutex> hold(lock_);
    for (;;) {
      if (stopping_) return;
      if (!outbox_.empty()) {
        const Outgoing o = outbox_.front();
        outbox_.pop_front();
        hold.unlock();
        send(o);  // completes once the peer's receiver takes it
        hold.lock();
        continue;
      }
      const double at = next_deadline();
      const double t = now();
      if (at < 0 || t < at) {
        if (active_) period_ = period_of(waiting_.limits);
        wake_.wait_for(hold, std::chrono::duration<double>(period_));
        continue;  // woken (a message to send, stop, shorter limits) or a period on: look again
      }
      Waiting& w = waiting_;
      if (!w.asked) {
        w.asked = true;
        where_.assign(static_cast<std::size_t>(ctx_->size), -1);
        for (const int r : others_) outbox_.push_back({r, {kQuestion, w.call, 0}});
      } else {
        w.reported = true;
        // Held: describe() reads the waiting call's state, which end() keeps alive.
        report_stall(ctx_->rank, t - w.start,
                     "call " + std::to_string(w.call) + " (" + (*w.describe)() + ")",
                     absent_ranks(where_, ctx_->rank, w.call));
      }
    }
  }

  std::shared_ptr<Context> ctx_;
  std::vector<int> others_;
  Message in_{};
  Buffer incoming_;
  std::thread receiver_, watcher_;
  std::atomic<std::int64_t> at_{-1};  // the call this rank waits at, or -1

  std::mutex lock_;  // guards what follows
  std::condition_variable wake_;
  bool stopping_ = false;
  bool active_ = false;
  double period_ = 60;  // the seconds the watcher looks every (period_of)
  Waiting waiting_;
  std::deque<Outgoing> outbox_;      // questions and answers to send, in order
  std::vector<std::int64_t> where_;  // per rank: the call it answered it waits at, or -1
};

// ---- The transport ----

// The most bytes a reduction sends by recursive doubling, whole in each of log2 P rounds; more
// goes round the ring, whose 2 (P - 1) / P of the bytes per rank matter then.
constexpr std::size_t kSmallReduction = std::size_t{64} << 10;

// The first part of a point-to-point message, which one of the two receives posted in advance per
// peer takes at once: 1 MiB (the top-k payloads of most buckets in one message, without the round
// trip that the rest's receive costs), less from 9 ranks on so that the receives hold at most
// 16 MiB.
constexpr std::size_t kEagerBytes = std::size_t{16} << 20;

std::size_t eager_capacity(int ranks) {
  const std::size_t peers = static_cast<std::size_t>(std::max(ranks - 1, 1));
  return std::clamp(kEagerBytes / (2 * peers), std::size_t{64} << 10, std::size_t{1} << 20);
}

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

ReduceFn reduce_function(Reduction r) {
  switch (r) {
    case Reduction::sum_float:
      return static_cast<ReduceFn>(&gloo::sum<float>);
    case Reduction::sum_uint64:
      return static_cast<ReduceFn>(&gloo::sum<std::uint64_t>);
    case Reduction::max_double:
      return static_cast<ReduceFn>(&gloo::max<double>);
    case Reduction::max_int64:
      break;
  }
  return static_cast<ReduceFn>(&gloo::max<std::int64_t>);
}

std::size_t element_size(Reduction r) { return r == Reduction::sum_float ? 4 : 8; }

class GlooTransport final : public Transport {
 public:
  GlooTransport(gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& o)
      : Transport(gcomp::Transport::gloo, rank, size) {
    const Ms connect_timeout = to_ms(o.connect_seconds);
    const Device made = make_device(o);
    device_ = made.device;
    ctx_ = connect(store, o.prefix, rank, size, device_, connect_timeout);
    down_ctx_ = connect(store, o.prefix + "/down", rank, size, device_, connect_timeout);
    watch_ctx_ = connect(store, o.prefix + "/watch", rank, size, device_, connect_timeout);
    watch_.start(watch_ctx_);
    // The hosts: every rank's key gathered; a host is named by its lowest rank. After each key,
    // the rank's say on the sockets (below): whether it wants them, whether its device can.
    constexpr std::size_t kKey = 256, kRecord = kKey + 2;
    std::vector<char> keys(kRecord * static_cast<std::size_t>(size));
    const std::string mine = host_key(o);
    std::vector<char> key(kRecord, '\0');
    std::memcpy(key.data(), mine.data(), std::min(mine.size(), kKey - 1));
    key[kKey] = sockets_setting();
    key[kKey + 1] = made.ipv4.empty() ? 0 : 1;
    guarded("allgather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(key.data(), kRecord);
      opts.setOutput(keys.data(), keys.size());
      opts.setTimeout(connect_timeout);
      gloo::allgather(opts);
    });
    // The sockets (below): the agreement, the small reductions and the first parts of messages
    // on sockets of the transport's own, polled by the waiting thread (socket_mesh.hpp), unless
    // GCOMP_GLOO_SOCKETS=0 or some rank's device has no IPv4 address. On the per-host testbed
    // they made a call of 1024 floats a tenth as long, the algorithms at 16M floats within about
    // 10% of MPI, and the one line's DDP step under torchrun as fast as under mpiexec
    // (docs/results.md). Every rank decides from what all said, so all decide alike; where
    // GCOMP_GLOO_SOCKETS differs between ranks, all fail here.
    int wants = -1, refuses = -1;
    bool all_can = true;
    for (int r = 0; r < size; ++r) {
      const char* record = &keys[kRecord * static_cast<std::size_t>(r)];
      if (record[kKey] == 2) {
        const char* v = std::getenv("GCOMP_GLOO_SOCKETS");
        throw Error(Status::invalid_argument,
                    "GCOMP_GLOO_SOCKETS on rank " + std::to_string(r) + " is " +
                        (r == rank ? "'" + std::string(v ? v : "") + "'" : "neither 0 nor 1") +
                        ": 1 (or unset) for the Gloo transport's own sockets, 0 for Gloo's alone");
      }
      if (record[kKey] == 1 && wants < 0) wants = r;
      if (record[kKey] == 0 && refuses < 0) refuses = r;
      all_can = all_can && record[kKey + 1] != 0;
    }
    if (wants >= 0 && refuses >= 0) {
      throw Error(Status::invalid_argument,
                  "GCOMP_GLOO_SOCKETS differs between ranks (0 on rank " +
                      std::to_string(refuses) + ", 1 or unset on rank " + std::to_string(wants) +
                      "): set it alike on every rank");
    }
    // Only after those checks, which every rank makes from the same records (a rank that threw
    // there closes its connections, and a receive posted on one of them would fail with Gloo's
    // error instead of the check's): every peer's eager receives, posted (point to point).
    open_channel(point_, kSlotPoint, kSlotBulk, eager_capacity(size), *ctx_, *down_ctx_);
    // The agreement's all on ctx_: a wait that times out closes its context's connections,
    // which tells every rank waiting on them.
    open_channel(agree_, kSlotAgree, kSlotAgreeBulk, 256, *ctx_, *ctx_);
    if (size > 1 && refuses < 0 && all_can) {
      gloo::rendezvous::PrefixStore prefixed(o.prefix + "/sockets", store);
      mesh_ = std::make_unique<SocketMesh>(prefixed, "", rank, size, made.ipv4, o.connect_seconds);
      gloo::rendezvous::PrefixStore data_prefixed(o.prefix + "/data-sockets", store);
      data_ = std::make_unique<SocketMesh>(data_prefixed, "", rank, size, made.ipv4,
                                           o.connect_seconds);
      // The data's waits block: polling there took the core the kernel's network work needed
      // (a QSGD allgather of 16M floats on the testbed: 1.17-1.21x MPI's time polling, 1.10-1.12x
      // blocking).
      data_->set_follows_wait_policy(false);
    }
    hosts_.assign(static_cast<std::size_t>(size), 0);
    for (int r = 0; r < size; ++r) {
      for (int q = 0; q <= r; ++q) {
        if (std::memcmp(&keys[kRecord * static_cast<std::size_t>(q)],
                        &keys[kRecord * static_cast<std::size_t>(r)], kKey) == 0) {
          hosts_[static_cast<std::size_t>(r)] = q;
          break;
        }
      }
    }
  }

  void allreduce(const void* send, void* recv, std::size_t count, Reduction op) override {
    const std::size_t bytes = count * element_size(op);
    if (send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    if (size() == 1 || count == 0) return;
    guarded("allreduce", [&] {
      // Up to 64 KiB by recursive doubling of eager messages (gloo::allreduce cost 3.9 ms a
      // call here whatever the size, 2 ranks on the loopback, its allgather 0.1 ms); more, where
      // the ring's bytes matter, as torch's gloo runs it (the ring).
      if (bytes + 8 <= std::min(point_.capacity, kSmallReduction)) {
        if (data_) {
          reduce_doubling_sockets(*data_, recv, count, element_size(op), reduce_function(op), 0);
        } else {
          reduce_doubling(point_, recv, count, element_size(op), reduce_function(op), kForever);
        }
        return;
      }
      gloo::AllreduceOptions opts(ctx_);
      if (op == Reduction::sum_float) {
        opts.setOutput(static_cast<float*>(recv), count);
      } else {
        opts.setOutput(static_cast<std::int64_t*>(recv), count);  // 8-byte elements
      }
      opts.setReduceFunction(reduce_function(op));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(kForever);
      gloo::allreduce(opts);
    });
  }

  void barrier() override {
    if (size() == 1) return;
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(kForever);
      gloo::barrier(opts);
    });
  }

  void allgatherv_bytes(std::span<const std::byte> mine, Gathered& out, Traffic& t) override {
    const auto p = static_cast<std::size_t>(size());
    const auto me = static_cast<std::size_t>(rank());
    const double start = now();
    out.offsets.assign(p, 0);
    if (p == 1) {
      out.sizes.assign(1, mine.size());
      out.bytes.assign(mine.begin(), mine.end());
    } else {
      guarded("allgatherv", [&] {
        exchange_all(std::vector<std::span<const std::byte> >(p, mine),
                     [&](const std::vector<std::uint64_t>& sizes) {
                       std::uint64_t total = 0;
                       for (std::size_t r = 0; r < p; ++r) {
                         check_announced(total + sizes[r], static_cast<int>(r));
                         out.offsets[r] = total;
                         total += sizes[r];
                       }
                       out.sizes = sizes;
                       out.bytes.resize(static_cast<std::size_t>(total));
                       std::vector<std::byte*> at(p);
                       for (std::size_t r = 0; r < p; ++r) at[r] = out.bytes.data() + out.offsets[r];
                       return at;
                     });
      });
    }
    t.seconds += now() - start;
    std::uint64_t total = 0;
    for (const std::uint64_t n : out.sizes) total += n;
    count_allgatherv(t, p, out.sizes[me], total);
  }

  void alltoallv_bytes(const std::vector<std::vector<std::byte> >& to,
                       std::vector<std::vector<std::byte> >& from, Traffic& t) override {
    const auto p = static_cast<std::size_t>(size());
    const auto me = static_cast<std::size_t>(rank());
    const double start = now();
    std::vector<std::uint64_t> send_sizes(p), recv_sizes(p);
    std::vector<std::span<const std::byte> > parts(p);
    for (std::size_t r = 0; r < p; ++r) {
      send_sizes[r] = to[r].size();
      parts[r] = to[r];
    }
    from.resize(p);
    guarded("all-to-all", [&] {
      exchange_all(parts, [&](const std::vector<std::uint64_t>& sizes) {
        std::vector<std::byte*> at(p);
        for (std::size_t r = 0; r < p; ++r) {
          from[r].resize(static_cast<std::size_t>(sizes[r]));
          at[r] = from[r].data();
        }
        recv_sizes = sizes;
        return at;
      });
    });
    t.seconds += now() - start;
    count_alltoallv(t, send_sizes, recv_sizes, me);
  }

  // One message each way between every pair, on the point channel: to[r] goes to rank r, and
  // place(sizes) (sizes[r]: what rank r sent this rank; sizes[rank] = to[rank].size()) returns
  // where each arrives (to[rank] is copied to its place). Each message's first part is eager
  // (below), so a call whose messages fit (the top-k payloads of most buckets) costs one message
  // time, with no size exchange before it (gloo::allgatherv and gloo::alltoallv cost about 4 ms
  // a call here whatever the size, a message 0.05 ms). The rests follow once every receive is
  // posted at its place, each rank's staggered (rank + 1, rank + 2, ...), so both directions of
  // a pair flow at once and the bytes each rank sends and receives are those of the ring
  // allgather's (P - 1 blocks).
  template <class Place>
  void exchange_all(const std::vector<std::span<const std::byte> >& to, Place&& place) {
    const auto p = static_cast<std::size_t>(size());
    const auto me = static_cast<std::size_t>(rank());
    if (data_) {
      // The first parts on the sockets, all at once; the rests as below.
      std::vector<std::vector<std::byte> > firsts(p), got;
      std::vector<std::span<const std::byte> > first_spans(p);
      for (std::size_t r = 0; r < p; ++r) {
        if (r == me) continue;
        firsts[r] = first_part(to[r], point_.capacity);
        first_spans[r] = firsts[r];
      }
      data_->exchange_all(first_spans, got, 0);
      std::vector<std::uint64_t> sizes(p);
      sizes[me] = to[me].size();
      for (std::size_t r = 0; r < p; ++r) {
        if (r != me) sizes[r] = parse_first(got[r], static_cast<int>(r));
      }
      const std::vector<std::byte*> at = place(std::as_const(sizes));
      if (!to[me].empty()) std::memcpy(at[me], to[me].data(), to[me].size());
      Segments rest;
      for (std::size_t k = 1; k < p; ++k) {
        const std::size_t r = (me + p - k) % p;
        take_first(got[r], static_cast<int>(r), sizes[r], at[r], rest);
      }
      for (std::size_t k = 1; k < p; ++k) {
        const std::size_t r = (me + k) % p;
        send_rest_of(static_cast<int>(r), to[r], rest);
      }
      rest.wait();
      return;
    }
    std::vector<Outgoing> out(p);
    for (std::size_t k = 1; k < p; ++k) {
      const std::size_t r = (me + k) % p;
      start_send(point_, static_cast<int>(r), to[r], out[r]);
    }
    std::vector<std::uint64_t> sizes(p);
    sizes[me] = to[me].size();
    for (std::size_t k = 1; k < p; ++k) {
      const std::size_t r = (me + p - k) % p;
      sizes[r] = wait_head(point_, static_cast<int>(r));
    }
    const std::vector<std::byte*> at = place(std::as_const(sizes));
    if (!to[me].empty()) std::memcpy(at[me], to[me].data(), to[me].size());
    Segments rest;
    for (std::size_t k = 1; k < p; ++k) {
      const std::size_t r = (me + p - k) % p;
      take_head(point_, static_cast<int>(r), sizes[r], at[r], rest);
    }
    for (std::size_t k = 1; k < p; ++k) send_rest(out[(me + k) % p]);
    rest.wait();
    for (std::size_t k = 1; k < p; ++k) finish_send(out[(me + k) % p]);
  }

  // Point to point (send_bytes, recv_bytes, sendrecv_bytes; and the agreement, on a channel of
  // its own). Gloo delivers a message only into a receive posted for it, of a size known in
  // advance, and a send whose receive is not yet posted waits for the receiver's notice (a round
  // trip). So every rank keeps receives of `capacity` bytes posted for each peer on the
  // channel's slot: a message's first part, [its size: 8 bytes, then up to capacity - 8 of its
  // bytes], goes at once into one; the rest, where there is more, follows on the channel's bulk
  // slot into a receive posted for exactly its size once the first part told it. An eager
  // receive is posted again as soon as its bytes are taken. Two per peer, taken in turn (a pair
  // delivers a slot's messages in the order they were sent, each into the receive posted
  // first): with one, a peer's next message waited for the notice of the receive posted again
  // (an exchange of two small messages took 137 us here, 95 us with two).
  struct Eager {
    std::array<std::vector<std::byte>, 2> bytes;
    std::array<Buffer, 2> buf;
    std::size_t next = 0;  // the one the peer's next message goes into
  };
  // A channel's first parts from a lower rank to a higher go on `up`, the others on `down`: for
  // the point channel ctx_ and down_ctx_, so that a pair's two directions are two connections. On one, a send waited for the connection's lock while Gloo's thread read what
  // came the other way (an exchange of 218 KB between two hosts at 1 Gbit, its link time
  // 1.74 ms, took 1.77 ms median and 4.4 ms at the 90th percentile so, 1.62 and 2.2 on two;
  // MPI's 1.57 and 1.65). The rests all go on ctx_, both directions on one connection: split
  // too, an allgather of 64 MiB per rank took 1.25-1.31x MPI's time, 1.03-1.11x so.
  struct Channel {
    std::uint64_t slot = 0, bulk = 0;
    std::size_t capacity = 0;
    std::vector<Eager> from;  // per peer
    Context* up = nullptr;
    Context* down = nullptr;
    Context& between(int from_rank, int to_rank) const { return from_rank < to_rank ? *up : *down; }
  };
  void open_channel(Channel& c, std::uint64_t slot, std::uint64_t bulk, std::size_t capacity,
                    Context& up, Context& down) {
    c.slot = slot;
    c.bulk = bulk;
    c.capacity = capacity;
    c.up = &up;
    c.down = &down;
    c.from.resize(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      Eager& e = c.from[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < e.buf.size(); ++i) {
        e.bytes[i].resize(capacity);
        e.buf[i] = c.between(r, rank()).createUnboundBuffer(e.bytes[i].data(), e.bytes[i].size());
        e.buf[i]->recv(r, c.slot, 0, c.capacity);
      }
    }
  }

  // A message on its way: its first part (a copy) and, where there is more, the rest (in
  // place); both stay alive in `out` until finish_send. The rest is posted apart (send_rest),
  // after this rank has posted its own receives: the rests' connection sends its messages in
  // order, receive notices included, so a notice posted after megabytes of this rank's rest
  // would hold the other direction back until they had gone (an exchange took twice the
  // link's time so).
  struct Outgoing {
    std::vector<std::byte> first;
    Buffer head;
    Segments rest;
    int to = -1;
    std::uint64_t bulk = 0;
    std::span<const std::byte> remainder;
    bool rest_posted = false;
  };
  void start_send(Channel& c, int to, std::span<const std::byte> send, Outgoing& out) {
    out.first = first_part(send, c.capacity);
    out.head = c.between(rank(), to).createUnboundBuffer(out.first.data(), out.first.size());
    out.head->send(to, c.slot);
    out.to = to;
    out.bulk = c.bulk;
    out.remainder = send.subspan(out.first.size() - 8);  // what the first part did not hold
  }
  void send_rest(Outgoing& out) {
    if (out.rest_posted) return;
    out.rest_posted = true;
    out.rest.send(*ctx_, out.to, out.bulk, out.remainder.data(), out.remainder.size());
  }
  void finish_send(Outgoing& out, Ms limit = kForever) {
    send_rest(out);
    out.head->waitSend(nullptr, limit);
    out.rest.wait();
  }
  // A message's first part: wait_head waits for it (limit: Gloo ends the context when it passes)
  // and returns the message's size, checked; take_head copies its first bytes to `at`, posts the
  // eager receive again and the rest's receives in `rest` (not waited for).
  std::uint64_t wait_head(Channel& c, int from, Ms limit = kForever) {
    Eager& e = c.from[static_cast<std::size_t>(from)];
    e.buf[e.next]->waitRecv(nullptr, limit);
    std::uint64_t n = 0;
    for (int b = 0; b < 8; ++b) {
      n |= static_cast<std::uint64_t>(e.bytes[e.next][static_cast<std::size_t>(b)]) << (8 * b);
    }
    check_announced(n, from);
    return n;
  }
  void take_head(Channel& c, int from, std::uint64_t n, std::byte* at, Segments& rest) {
    Eager& e = c.from[static_cast<std::size_t>(from)];
    const std::size_t inline_bytes =
        static_cast<std::size_t>(std::min<std::uint64_t>(n, c.capacity - 8));
    if (inline_bytes > 0) std::memcpy(at, e.bytes[e.next].data() + 8, inline_bytes);
    e.buf[e.next]->recv(from, c.slot, 0, c.capacity);
    e.next ^= 1;
    if (n > inline_bytes) {
      rest.recv(*ctx_, from, c.bulk, at + inline_bytes, static_cast<std::size_t>(n) - inline_bytes);
    }
  }
  std::uint64_t receive_head(Channel& c, int from, std::vector<std::byte>& recv, Segments& rest,
                             Ms limit = kForever) {
    const std::uint64_t n = wait_head(c, from, limit);
    recv.resize(static_cast<std::size_t>(n));
    take_head(c, from, n, recv.data(), rest);
    return n;
  }
  std::uint64_t receive(Channel& c, int from, std::vector<std::byte>& recv, Ms limit = kForever) {
    Segments rest;
    const std::uint64_t n = receive_head(c, from, recv, rest, limit);
    rest.wait();
    return n;
  }
  // One message to `to` and one from `from` (the same rank or not): both first parts, then both
  // rests.
  std::uint64_t exchange(Channel& c, int to, std::span<const std::byte> send, int from,
                         std::vector<std::byte>& recv) {
    Outgoing out;
    start_send(c, to, send, out);
    Segments rest;
    const std::uint64_t n = receive_head(c, from, recv, rest);
    send_rest(out);
    rest.wait();
    finish_send(out);
    return n;
  }

  // An element-wise reduction over ranks of `count` elements at `data` by recursive doubling
  // over channel c (doubling.hpp: log2 P rounds of one eager message each way; a rank beyond the
  // largest power of two first hands its elements to a partner and gets the result back):
  // every wait has `limit`. The elements must fit the channel's first part (each message is
  // then a copy, taken while the elements change). Every rank ends with the same bits: each
  // round's two partners combine the same two operands (fn is commutative).
  void reduce_doubling(Channel& c, void* data, std::size_t count, std::size_t element, ReduceFn fn,
                       Ms limit) {
    const std::size_t bytes = count * element;
    if (bytes + 8 > c.capacity) {
      throw Error(Status::internal, "a reduction by recursive doubling of " +
                                        std::to_string(bytes) + " bytes does not fit its channel");
    }
    std::vector<std::byte> got;
    const std::span<const std::byte> mine(static_cast<const std::byte*>(data), bytes);
    const auto take = [&](int from, bool combine) {
      receive(c, from, got, limit);
      if (got.size() != bytes) {
        throw Error(Status::bad_payload, "rank " + std::to_string(from) + " sent a reduction of " +
                                             std::to_string(got.size()) + " bytes, not " +
                                             std::to_string(bytes));
      }
      if (combine) {
        fn(data, data, got.data(), count);
      } else {
        std::memcpy(data, got.data(), bytes);
      }
    };
    const auto give = [&](int to) {
      Outgoing out;
      start_send(c, to, mine, out);
      finish_send(out, limit);
    };
    const DoublingSchedule d(rank(), size());
    if (d.folds_into >= 0) give(d.folds_into);
    if (d.folded_from >= 0) take(d.folded_from, true);
    for (const int peer : d.partners) {
      Outgoing out;
      start_send(c, peer, mine, out);  // a copy: the elements change below
      take(peer, true);
      finish_send(out, limit);
    }
    if (d.folded_from >= 0) give(d.folded_from);
    if (d.folds_into >= 0) take(d.folds_into, false);
  }

  // Messages over the sockets: the first part (the message's size, 8 bytes, then up to the
  // point channel's capacity - 8 of its bytes) on data_, the rest where there is more on Gloo's
  // bulk slot in 1 MiB segments, as the eager channel's rests (one connection per pair carried
  // a 64 MiB allgather at 1.46x MPI's time on the testbed, Gloo's segments at 1.03x).
  std::size_t first_bytes(std::uint64_t n) const {
    return static_cast<std::size_t>(std::min<std::uint64_t>(n, point_.capacity - 8));
  }
  // [the size, 8 bytes little-endian; then up to capacity - 8 of the bytes]: the first part of a
  // message, on the sockets or into a channel's eager receive.
  static std::vector<std::byte> first_part(std::span<const std::byte> send, std::size_t capacity) {
    const std::size_t inline_bytes =
        static_cast<std::size_t>(std::min<std::uint64_t>(send.size(), capacity - 8));
    std::vector<std::byte> f(8 + inline_bytes);
    const std::uint64_t n = send.size();
    for (int b = 0; b < 8; ++b) f[static_cast<std::size_t>(b)] = static_cast<std::byte>(n >> (8 * b));
    if (inline_bytes > 0) std::memcpy(f.data() + 8, send.data(), inline_bytes);
    return f;
  }
  // The message's size from its first part, checked (the size, and the part's own length).
  std::uint64_t parse_first(const std::vector<std::byte>& f, int from) const {
    std::uint64_t n = 0;
    if (f.size() >= 8) {
      for (int b = 0; b < 8; ++b) {
        n |= static_cast<std::uint64_t>(f[static_cast<std::size_t>(b)]) << (8 * b);
      }
      check_announced(n, from);
    }
    if (f.size() < 8 || f.size() != 8 + first_bytes(n)) {
      throw Error(Status::bad_payload, "rank " + std::to_string(from) + " sent a first part of " +
                                           std::to_string(f.size()) + " bytes" +
                                           (f.size() >= 8 ? " for a message of " +
                                                                std::to_string(n) + " bytes"
                                                          : std::string()));
    }
    return n;
  }
  // Copies the first part's bytes to `at` and posts the rest's receives in `rest`.
  void take_first(const std::vector<std::byte>& f, int from, std::uint64_t n, std::byte* at,
                  Segments& rest) {
    const std::size_t inline_bytes = first_bytes(n);
    if (inline_bytes > 0) std::memcpy(at, f.data() + 8, inline_bytes);
    if (n > inline_bytes) {
      rest.recv(*ctx_, from, kSlotBulk, at + inline_bytes, static_cast<std::size_t>(n) - inline_bytes);
    }
  }
  void send_rest_of(int to, std::span<const std::byte> send, Segments& rest) {
    const std::size_t inline_bytes = first_bytes(send.size());
    if (send.size() > inline_bytes) {
      rest.send(*ctx_, to, kSlotBulk, send.data() + inline_bytes, send.size() - inline_bytes);
    }
  }

  // reduce_doubling over sockets (the agreement's on mesh_, small reductions on data_): every
  // wait has `limit` seconds (0: none).
  void reduce_doubling_sockets(SocketMesh& m, void* data, std::size_t count, std::size_t element,
                               ReduceFn fn, double limit) {
    const std::size_t bytes = count * element;
    std::vector<std::byte> got;
    const std::span<const std::byte> mine(static_cast<const std::byte*>(data), bytes);
    const auto check = [&](int from) {
      if (got.size() != bytes) {
        throw Error(Status::bad_payload, "rank " + std::to_string(from) + " sent a reduction of " +
                                             std::to_string(got.size()) + " bytes, not " +
                                             std::to_string(bytes));
      }
    };
    const DoublingSchedule d(rank(), size());
    if (d.folds_into >= 0) m.exchange(d.folds_into, mine, -1, got, limit);
    if (d.folded_from >= 0) {
      m.exchange(-1, {}, d.folded_from, got, limit);
      check(d.folded_from);
      fn(data, data, got.data(), count);
    }
    for (const int peer : d.partners) {
      m.exchange(peer, mine, peer, got, limit);  // data changes only after both are done
      check(peer);
      fn(data, data, got.data(), count);
    }
    if (d.folded_from >= 0) m.exchange(d.folded_from, mine, -1, got, limit);
    if (d.folds_into >= 0) {
      m.exchange(-1, {}, d.folds_into, got, limit);
      check(d.folds_into);
      std::memcpy(data, got.data(), bytes);
    }
  }

  void send_bytes(int to, std::span<const std::byte> send, Traffic& t) override {
    const double start = now();
    guarded("send", [&] {
      if (data_) {
        std::vector<std::byte> none;
        data_->exchange(to, first_part(send, point_.capacity), -1, none, 0);
        Segments rest;
        send_rest_of(to, send, rest);
        rest.wait();
        return;
      }
      Outgoing out;
      start_send(point_, to, send, out);
      finish_send(out);
    });
    t.seconds += now() - start;
    t.sent += send.size();
  }

  void recv_bytes(int from, std::vector<std::byte>& recv, Traffic& t) override {
    const double start = now();
    const std::uint64_t n = guarded("recv", [&]() -> std::uint64_t {
      if (data_) {
        std::vector<std::byte> first;
        data_->exchange(-1, {}, from, first, 0);
        const std::uint64_t n = parse_first(first, from);
        recv.resize(static_cast<std::size_t>(n));
        Segments rest;
        take_first(first, from, n, recv.data(), rest);
        rest.wait();
        return n;
      }
      return receive(point_, from, recv);
    });
    t.seconds += now() - start;
    t.received += n;
  }

  using Transport::sendrecv_bytes;
  void sendrecv_bytes(int to, std::span<const std::byte> send, int from,
                      std::vector<std::byte>& recv, Traffic& t) override {
    const double start = now();
    const std::uint64_t n = guarded("sendrecv", [&]() -> std::uint64_t {
      if (data_) {
        std::vector<std::byte> first;
        data_->exchange(to, first_part(send, point_.capacity), from, first, 0);
        const std::uint64_t n = parse_first(first, from);
        recv.resize(static_cast<std::size_t>(n));
        Segments rest;
        take_first(first, from, n, recv.data(), rest);
        send_rest_of(to, send, rest);
        rest.wait();
        return n;
      }
      return exchange(point_, to, send, from, recv);
    });
    t.seconds += now() - start;
    t.sent += send.size();
    t.received += n;
  }

  void shift_bytes(int to, std::span<const std::byte> send, int from,
                   std::span<std::byte> recv) override {
    guarded("shift", [&] {
      Segments segs;
      segs.recv(*ctx_, from, kSlotShift, recv.data(), recv.size());
      segs.send(*ctx_, to, kSlotShift, send.data(), send.size());
      segs.wait();
    });
  }

  void alltoall_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                      std::size_t block) override {
    if (size() == 1) {
      std::copy(send.begin(), send.begin() + static_cast<std::ptrdiff_t>(block), recv.begin());
      return;
    }
    guarded("alltoall", [&] {
      gloo::AlltoallOptions opts(ctx_);
      opts.setInput(const_cast<std::byte*>(send.data()), block * static_cast<std::size_t>(size()));
      opts.setOutput(recv.data(), block * static_cast<std::size_t>(size()));
      opts.setTimeout(kForever);
      gloo::alltoall(opts);
    });
  }

  void agree(const std::uint64_t* mine, std::uint64_t* all, std::size_t words, std::uint64_t call,
             const WaitLimits& limits, const std::function<std::string()>& describe) override {
    if (broken_) {
      throw Error(Status::timeout, "this Communicator's Gloo connections closed at a timeout");
    }
    if (sockets_closed_) {
      throw Error(Status::transport,
                  "this Communicator's agreement sockets closed at an earlier failure");
    }
    std::copy(mine, mine + words, all);
    if (size() == 1) return;
    const bool watched = limits.stall > 0 || limits.timeout > 0;
    const Ms limit = limits.timeout > 0 ? to_ms(limits.timeout) : kForever;
    const double start = now();
    if (watched) watch_.begin(call, limits, describe);
    try {
      if (mesh_) {
        reduce_doubling_sockets(*mesh_, all, words, 8, &gloo::max<std::uint64_t>, limits.timeout);
      } else {
        reduce_doubling(agree_, all, words, 8, &gloo::max<std::uint64_t>, limit);
      }
      // With a timeout, every rank passes a barrier too (as on MPI): a rank that came after a
      // rank gave up finds the connections closed there at the latest.
      if (limits.timeout > 0) {
        std::uint64_t token = 0;
        if (mesh_) {
          reduce_doubling_sockets(*mesh_, &token, 1, 8, &gloo::max<std::uint64_t>,
                                  limits.timeout);
        } else {
          reduce_doubling(agree_, &token, 1, 8, &gloo::max<std::uint64_t>, limit);
        }
      }
    } catch (...) {
      const double waited = now() - start;
      if (watched) watch_.end();
      // The sockets close, so that every rank waiting on this one hears of it at once (as
      // Gloo's timeout closes its context's connections).
      if (mesh_) {
        mesh_.reset();
        sockets_closed_ = true;
      }
      std::string why;
      try {
        try {
          throw;
        } catch (const Error&) {
          throw;
        } catch (...) {
          rethrow_gloo("agreement");
        }
      } catch (const Error& e) {
        why = e.what();
      }
      if (limits.timeout <= 0) throw Error(Status::transport, why);
      // With a timeout, the connections close when any rank's wait passes it: this rank's own
      // (it waited the timeout) or another's (a rank that gave up, or ended).
      broken_ = true;
      const std::string what = "call " + std::to_string(call) + " (" + describe() + ")";
      const std::string absent = watch_.absent(call);
      if (waited >= limits.timeout * 0.99) throw timeout_error(rank(), waited, what, absent);
      throw Error(Status::timeout,
                  "rank " + std::to_string(rank()) + " at the start of " + what +
                      ": a rank not there gave up on this call (its timeout passed) or ended, "
                      "and the connections closed (" +
                      why + ")" + (absent.empty() ? std::string() : "; not there: " + absent));
    }
    if (watched) watch_.end();
  }

 private:
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<Context> ctx_;        // the calls (first parts: from lower ranks to higher)
  std::shared_ptr<Context> down_ctx_;   // first parts from higher ranks to lower
  Channel point_;                       // point to point: per peer, its posted receives
  Channel agree_;                       // the agreement's (without sockets)
  std::unique_ptr<SocketMesh> mesh_;    // the agreement's sockets (closed after a failure)
  bool sockets_closed_ = false;
  std::unique_ptr<SocketMesh> data_;    // point to point, allgatherv, all-to-all(v), small sums
  std::shared_ptr<Context> watch_ctx_;  // the watch's questions and answers
  // Declared after the contexts, so destroyed first: its threads end before the connections
  // close.
  GlooWatch watch_;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Transport> make_gloo_transport(gloo::rendezvous::Store& store, int rank, int size,
                                               const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(Status::invalid_argument, "a Gloo Communicator needs 0 <= rank < size, not rank " +
                                              std::to_string(rank) + " of size " +
                                              std::to_string(size));
  }
  if (options.prefix.empty()) {
    throw Error(Status::invalid_argument, "GlooOptions::prefix must not be empty");
  }
  if (!(options.connect_seconds > 0) || !std::isfinite(options.connect_seconds)) {
    throw Error(Status::invalid_argument,
                "GlooOptions::connect_seconds must be a finite number "
                "> 0, not " +
                    std::to_string(options.connect_seconds));
  }
  return std::make_unique<GlooTransport>(store, rank, size, options);
}

#endif  // GCOMP_HAVE_GLOO

}  // namespace detail
}  // namespace gcomp
