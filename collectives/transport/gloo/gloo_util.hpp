// What the Gloo transport's files share (gloo_transport.hpp's implementation): the slots gcomp's
// messages use, Gloo's errors as gcomp's, the contexts, segmented transfers and the reductions.
// Included only by the files of this folder.
#pragma once

#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gcomp/error.hpp"
#include "transport.hpp"

namespace gcomp::detail::gloo_parts {

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

inline Ms to_ms(double seconds) {
  return std::max(Ms(1), std::min(kForever, Ms(static_cast<std::int64_t>(seconds * 1e3 + 0.5))));
}

// Gloo's exceptions as gcomp's: a connection that closed, a wait that passed its timeout, an
// enforced condition that failed (bad sizes).
[[noreturn]] inline void rethrow_gloo(const char* what) {
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

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

inline ReduceFn reduce_function(Reduction r) {
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

inline std::size_t element_size(Reduction r) { return r == Reduction::sum_float ? 4 : 8; }

}  // namespace gcomp::detail::gloo_parts
