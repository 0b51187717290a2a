// The Gloo transport's stall watch: a rank that does not come to a call, watched while this
// rank waits at the agreement (as mpi/stall.hpp's watch on MPI; the words are
// stall_report.hpp's). Included only by transport_gloo.cpp.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gloo_util.hpp"
#include "stall_report.hpp"
#include "transport.hpp"

namespace gcomp::detail::gloo_parts {

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
  // Where each other rank said it is (stall_report.hpp's absent_ranks), for the message of a
  // timeout.
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

}  // namespace gcomp::detail::gloo_parts
