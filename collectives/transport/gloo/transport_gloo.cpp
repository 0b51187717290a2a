// The Gloo transport (../transport.hpp): Gloo's TCP device, two contexts for the calls (the first
// runs Gloo's collectives, the agreement, the rests of point-to-point messages and their first
// parts from lower ranks to higher; the second their first parts from higher ranks to lower) and
// one for the watch's questions and answers, all met through a key-value store under the
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
//                        own sockets instead (../sockets/: a TCP connection per pair, polled
//                        by the waiting thread); the rests as above (messages.hpp)
//   allgatherv,          one point-to-point message each way between every pair: the size
//   all-to-allv          and the first part at once, the rests once every receive is posted
//   all-to-all           gloo::alltoall (fixed blocks)
//   barrier              gloo::barrier
//   the agreement        recursive doubling of eager messages on a channel of its own, the
//                        timeout Gloo's own (on the sockets: theirs); watched by two threads
//                        (watch.hpp)
// Waits block in Gloo (a condition variable) and on the data's sockets (poll(2)); on the
// agreement's sockets they follow the wait policy, as MPI's waits do (socket_mesh.hpp).
// Gloo's waits take a timeout that ends the whole context when it passes (every connection
// closes), so only the agreement's wait has one (the user's timeout, after which the
// Communicator is broken anyway); every other wait is unlimited, as MPI's are.
// This file: the transport and its making. Its parts: gloo_util.hpp (slots, errors, segments),
// gloo_device.hpp (the interface it listens on, the rendezvous), messages.hpp (the two carriers),
// watch.hpp (the stall watch).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gcomp/error.hpp"
#include "gloo_transport.hpp"
#include "stall_report.hpp"
#include "transport.hpp"

#ifdef GCOMP_HAVE_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/prefix_store.h>

#include "gloo_device.hpp"
#include "gloo_util.hpp"
#include "messages.hpp"
#include "socket_mesh.hpp"
#include "watch.hpp"
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

std::unique_ptr<Net> make_gloo_transport(gloo::rendezvous::Store&, int, int, const GlooOptions&) {
  throw Error(Status::invalid_argument,
              "this build of gcomp has no Gloo transport (configure it with libgloo-dev "
              "installed); use the MPI transport (mpiexec)");
}

#else

namespace {

using namespace gloo_parts;

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

class GlooTransport final : public Net {
 public:
  GlooTransport(gloo::rendezvous::Store& store, int rank, int size, const GlooOptions& o)
      : Net(gcomp::Transport::gloo, rank, size) {
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
    // The sockets: on the per-host testbed
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
      throw Error(Status::invalid_argument, "GCOMP_GLOO_SOCKETS differs between ranks (0 on rank " +
                                                std::to_string(refuses) + ", 1 or unset on rank " +
                                                std::to_string(wants) +
                                                "): set it alike on every rank");
    }
    // Only after those checks, which every rank makes from the same records (a rank that threw
    // there closes its connections, and a receive posted on one of them would fail with Gloo's
    // error instead of the check's): the messages' carriers (messages.hpp), which post every
    // peer's eager receives on Gloo's pairs. The transport's own sockets carry the agreement,
    // the small reductions and the first parts of messages, polled by the waiting thread
    // (socket_mesh.hpp), unless GCOMP_GLOO_SOCKETS=0 or some rank's device has no IPv4 address.
    if (size > 1 && refuses < 0 && all_can) {
      gloo::rendezvous::PrefixStore prefixed(o.prefix + "/sockets", store);
      auto mesh =
          std::make_unique<SocketMesh>(prefixed, "", rank, size, made.ipv4, o.connect_seconds);
      gloo::rendezvous::PrefixStore data_prefixed(o.prefix + "/data-sockets", store);
      auto data =
          std::make_unique<SocketMesh>(data_prefixed, "", rank, size, made.ipv4, o.connect_seconds);
      // The data's waits block: polling there took the core the kernel's network work needed
      // (a QSGD allgather of 16M floats on the testbed: 1.17-1.21x MPI's time polling, 1.10-1.12x
      // blocking).
      data->set_follows_wait_policy(false);
      point_ =
          std::make_unique<SocketMessages>(std::move(data), *ctx_, kSlotBulk, eager_capacity(size));
      agree_ = std::make_unique<SocketMessages>(std::move(mesh), *ctx_, kSlotAgreeBulk, 256);
    } else {
      point_ = std::make_unique<GlooMessages>(rank, size, *ctx_, *down_ctx_, *ctx_, kSlotPoint,
                                              kSlotBulk, eager_capacity(size));
      // The agreement's all on ctx_: a wait that times out closes its context's connections,
      // which tells every rank waiting on them.
      agree_ = std::make_unique<GlooMessages>(rank, size, *ctx_, *ctx_, *ctx_, kSlotAgree,
                                              kSlotAgreeBulk, 256);
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
      if (bytes + 8 <= std::min(point_->capacity(), kSmallReduction)) {
        point_->reduce_doubling(recv, count, element_size(op), reduce_function(op), 0);
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

  // Gloo's waits block (as sleep does): its calls cost their wall time.
  WaitPolicy wait_style() const noexcept override { return WaitPolicy::sleep; }

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
        point_->exchange_all(std::vector<std::span<const std::byte> >(p, mine),
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
                               for (std::size_t r = 0; r < p; ++r)
                                 at[r] = out.bytes.data() + out.offsets[r];
                               return at;
                             });
      });
    }
    wire_done(t, start);
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
      point_->exchange_all(parts, [&](const std::vector<std::uint64_t>& sizes) {
        std::vector<std::byte*> at(p);
        for (std::size_t r = 0; r < p; ++r) {
          from[r].resize(static_cast<std::size_t>(sizes[r]));
          at[r] = from[r].data();
        }
        recv_sizes = sizes;
        return at;
      });
    });
    wire_done(t, start);
    count_alltoallv(t, send_sizes, recv_sizes, me);
  }

  void send_bytes(int to, std::span<const std::byte> send, Traffic& t) override {
    const double start = now();
    guarded("send", [&] { point_->send(to, send); });
    wire_done(t, start);
    t.sent += send.size();
  }

  void recv_bytes(int from, std::vector<std::byte>& recv, Traffic& t) override {
    const double start = now();
    const std::uint64_t n = guarded("recv", [&] { return point_->recv(from, recv); });
    wire_done(t, start);
    t.received += n;
  }

  using Net::sendrecv_bytes;
  void sendrecv_bytes(int to, std::span<const std::byte> send, int from,
                      std::vector<std::byte>& recv, Traffic& t) override {
    const double start = now();
    const std::uint64_t n =
        guarded("sendrecv", [&] { return point_->sendrecv(to, send, from, recv); });
    wire_done(t, start);
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
    const double start = now();
    if (watched) watch_.begin(call, limits, describe);
    try {
      agree_->reduce_doubling(all, words, 8, &gloo::max<std::uint64_t>, limits.timeout);
      // With a timeout, every rank passes a barrier too (as on MPI): a rank that came after a
      // rank gave up finds the connections closed there at the latest.
      if (limits.timeout > 0) {
        std::uint64_t token = 0;
        agree_->reduce_doubling(&token, 1, 8, &gloo::max<std::uint64_t>, limits.timeout);
      }
    } catch (...) {
      const double waited = now() - start;
      if (watched) watch_.end();
      // The sockets close, so that every rank waiting on this one hears of it at once (as
      // Gloo's timeout closes its context's connections).
      if (agree_->close()) sockets_closed_ = true;
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
  std::shared_ptr<Context> ctx_;       // the calls (first parts: from lower ranks to higher)
  std::shared_ptr<Context> down_ctx_;  // first parts from higher ranks to lower
  // Point to point, allgatherv, all-to-all(v) and small sums; and the agreement's (its sockets
  // closed after a failure).
  std::unique_ptr<Messages> point_;
  std::unique_ptr<Messages> agree_;
  bool sockets_closed_ = false;
  std::shared_ptr<Context> watch_ctx_;  // the watch's questions and answers
  // Declared after the contexts, so destroyed first: its threads end before the connections
  // close.
  GlooWatch watch_;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Net> make_gloo_transport(gloo::rendezvous::Store& store, int rank, int size,
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
