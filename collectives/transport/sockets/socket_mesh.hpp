// Byte channels of the job's own between every pair of ranks: one TCP connection per pair (the
// higher rank connects to the lower, which accepts), met through a key-value store (the Gloo
// transport's; under gcomp.torch, torch.distributed's). Its waits poll the sockets in the thread
// that waits (poll(2)): a message reaches its receiver through one wake-up, the kernel's, where
// Gloo's TCP device reads it in its own network thread and then wakes the waiting thread. On a
// host whose cores are busy with the ranks' compute each wake-up waits for a core (docs/results.md,
// "The one line's DDP step"). The Gloo transport sends its agreement, small reductions and the
// first parts of messages on two of these unless GCOMP_GLOO_SOCKETS=0 (transport_gloo.cpp).
//
// Messages are an 8-byte little-endian length and the bytes; a length past kMaxMessageBytes is
// an Error(bad_payload) naming the peer, before anything is allocated. Messages between two
// ranks arrive in the order they were sent. A peer that closes its connection is an
// Error(transport) naming it; a wait past its limit is an Error(timeout).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store;
}

namespace gcomp::detail {

class SocketMesh {
 public:
  // Collective over the `size` processes: each listens on an ephemeral port of `address` (an
  // IPv4 address of this host that the others reach), publishes it under prefix + "socket/" +
  // rank in the store, and connects to every lower rank and accepts every higher one, within
  // connect_seconds (Error(timeout) past it).
  SocketMesh(gloo::rendezvous::Store& store, const std::string& prefix, int rank, int size,
             const std::string& address, double connect_seconds);
  ~SocketMesh();
  SocketMesh(const SocketMesh&) = delete;
  SocketMesh& operator=(const SocketMesh&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // Whether waits follow the wait policy (the default; waiting.hpp: spin polls without a
  // timeout, yield yields between polls, sleep blocks in poll(2)) or always block in poll(2).
  void set_follows_wait_policy(bool follows) noexcept { follows_policy_ = follows; }

  // Sends `bytes` to rank `to` and receives rank `from`'s next message into `out` (resized to
  // it), progressing both at once, so that two ranks exchanging large messages never block each
  // other on full socket buffers. Either side may be absent (to or from -1); to and from may be
  // the same rank, never this one. timeout_seconds 0: no limit.
  void exchange(int to, std::span<const std::byte> bytes, int from, std::vector<std::byte>& out,
                double timeout_seconds);
  // Sends to[r] to every other rank r and receives each one's next message into from[r], all
  // at once (to has an entry per rank; this rank's own is neither sent nor touched in from).
  void exchange_all(const std::vector<std::span<const std::byte>>& to,
                    std::vector<std::vector<std::byte>>& from, double timeout_seconds);

 private:
  struct Flow;
  void progress(std::span<Flow> flows, double timeout_seconds);

  int rank_;
  int size_;
  std::vector<int> fds_;  // fds_[r]: the connection to rank r (-1 for this rank)
  bool follows_policy_ = true;
};

}  // namespace gcomp::detail
