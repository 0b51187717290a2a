// Messages of any size between the Gloo transport's ranks, on one of two carriers: Gloo's own
// pairs (GlooMessages) or gcomp's sockets (SocketMessages, ../sockets/). The transport holds one
// for its point-to-point messages and one for its agreement, chosen once when it is made, so
// that nothing else in it asks which carrier it has.
//
// A message is a first part, [its size: 8 bytes little-endian, then up to capacity() - 8 of its
// bytes], sent at once, and where there is more, the rest, sent on the rests' context (Gloo's
// pairs, in 1 MiB segments) into a receive posted for exactly its size once the first part told
// it. Every size a peer announces is checked (check_announced) before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "gloo_util.hpp"
#include "socket_mesh.hpp"

namespace gcomp::detail::gloo_parts {

class Messages {
 public:
  // Where each rank's message goes: given sizes[r] (what rank r sent this rank; this rank's own
  // is to[rank].size()), the places to write them.
  using Place = std::function<std::vector<std::byte*>(const std::vector<std::uint64_t>&)>;

  Messages(int rank, int size, Context& rests, std::uint64_t bulk, std::size_t capacity)
      : rank_(rank), size_(size), rests_(&rests), bulk_(bulk), capacity_(capacity) {}
  virtual ~Messages() = default;
  Messages(const Messages&) = delete;
  Messages& operator=(const Messages&) = delete;

  // The most bytes of a first part (its 8-byte size included).
  std::size_t capacity() const noexcept { return capacity_; }

  // One message to `to` and one from `from` (the same rank or not), at once; either may be
  // absent (-1). Returns the size of the message received (recv is resized to it), or 0.
  virtual std::uint64_t sendrecv(int to, std::span<const std::byte> bytes, int from,
                                 std::vector<std::byte>& recv) = 0;
  void send(int to, std::span<const std::byte> bytes) {
    std::vector<std::byte> none;
    sendrecv(to, bytes, -1, none);
  }
  std::uint64_t recv(int from, std::vector<std::byte>& recv) {
    return sendrecv(-1, {}, from, recv);
  }
  // One message each way between every pair: to[r] goes to rank r, and place(sizes) says where
  // each arrives (to[rank] is copied to its place). The first parts all go at once, so a call
  // whose messages fit costs one message time with no size exchange before it; the rests follow
  // once every receive is posted at its place, each rank's staggered (rank + 1, rank + 2, ...),
  // so both directions of a pair flow at once and the bytes each rank sends and receives are
  // those of the ring allgather's (P - 1 blocks).
  virtual void exchange_all(const std::vector<std::span<const std::byte>>& to,
                            const Place& place) = 0;
  // An element-wise reduction over ranks of `count` elements at `data` by recursive doubling
  // (doubling.hpp: log2 P rounds of one message each way; a rank beyond the largest power of two
  // first hands its elements to a partner and gets the result back): every rank ends with the
  // same bits, since each round's two partners combine the same two operands (fn is
  // commutative). The elements must fit a first part. limit_seconds bounds every wait (0: none).
  virtual void reduce_doubling(void* data, std::size_t count, std::size_t element, ReduceFn fn,
                               double limit_seconds) = 0;
  // Closes the carrier after a failure, so that every rank waiting on this one hears of it at
  // once; false where it closes by itself (Gloo's pairs close at a timeout).
  virtual bool close() { return false; }

 protected:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // [the size; then up to capacity - 8 of the bytes]: a message's first part.
  std::vector<std::byte> first_part(std::span<const std::byte> bytes) const;
  // The bytes of a message of n bytes that its first part holds.
  std::size_t first_bytes(std::uint64_t n) const {
    return static_cast<std::size_t>(std::min<std::uint64_t>(n, capacity_ - 8));
  }
  // The rest of a message of n bytes from `from` (n > first_bytes(n)) into at + first_bytes(n),
  // posted in `rest`; and the rest of `bytes` to `to`.
  void recv_rest(int from, std::uint64_t n, std::byte* at, Segments& rest);
  void send_rest(int to, std::span<const std::byte> bytes, Segments& rest);

 private:
  int rank_;
  int size_;
  Context* rests_;
  std::uint64_t bulk_;
  std::size_t capacity_;
};

// On Gloo's pairs. Gloo delivers a message only into a receive posted for it, of a size known in
// advance, and a send whose receive is not yet posted waits for the receiver's notice (a round
// trip). So every rank keeps receives of capacity() bytes posted for each peer on the slot: a
// message's first part goes at once into one, and is posted again as soon as its bytes are
// taken. Two per peer, taken in turn (a pair delivers a slot's messages in the order they were
// sent, each into the receive posted first): with one, a peer's next message waited for the
// notice of the receive posted again (an exchange of two small messages took 137 us here, 95 us
// with two).
//
// First parts from a lower rank to a higher go on `up`, the others on `down`: for the point
// messages two contexts, so that a pair's two directions are two connections. On one, a send
// waited for the connection's lock while Gloo's thread read what came the other way (an exchange
// of 218 KB between two hosts at 1 Gbit, its link time 1.74 ms, took 1.77 ms median and 4.4 ms
// at the 90th percentile so, 1.62 and 2.2 on two; MPI's 1.57 and 1.65). The rests all go on one
// context, both directions on one connection: split too, an allgather of 64 MiB per rank took
// 1.25-1.31x MPI's time, 1.03-1.11x so.
class GlooMessages final : public Messages {
 public:
  // Posts every peer's two receives.
  GlooMessages(int rank, int size, Context& up, Context& down, Context& rests, std::uint64_t slot,
               std::uint64_t bulk, std::size_t capacity);

  std::uint64_t sendrecv(int to, std::span<const std::byte> bytes, int from,
                         std::vector<std::byte>& recv) override;
  void exchange_all(const std::vector<std::span<const std::byte>>& to, const Place& place) override;
  void reduce_doubling(void* data, std::size_t count, std::size_t element, ReduceFn fn,
                       double limit_seconds) override;

 private:
  struct Eager {
    std::array<std::vector<std::byte>, 2> bytes;
    std::array<Buffer, 2> buf;
    std::size_t next = 0;  // the one the peer's next message goes into
  };
  // A message on its way: its first part (a copy) and, where there is more, the rest (in place);
  // both stay alive until finish_send. The rest is posted apart (post_rest), after this rank has
  // posted its own receives: the rests' connection sends its messages in order, receive notices
  // included, so a notice posted after megabytes of this rank's rest would hold the other
  // direction back until they had gone (an exchange took twice the link's time so).
  struct Outgoing {
    std::vector<std::byte> first;
    Buffer head;
    Segments rest;
    int to = -1;
    std::span<const std::byte> bytes;
    bool rest_posted = false;
  };
  Context& between(int from_rank, int to_rank) const { return from_rank < to_rank ? *up_ : *down_; }
  void start_send(int to, std::span<const std::byte> bytes, Outgoing& out);
  void post_rest(Outgoing& out);
  void finish_send(Outgoing& out, Ms limit = kForever);
  // A message's first part: wait_head waits for it (limit: Gloo ends the context when it passes)
  // and returns the message's size, checked; take_head copies its first bytes to `at`, posts the
  // eager receive again and the rest's receives in `rest` (not waited for).
  std::uint64_t wait_head(int from, Ms limit = kForever);
  void take_head(int from, std::uint64_t n, std::byte* at, Segments& rest);
  std::uint64_t receive_head(int from, std::vector<std::byte>& recv, Segments& rest,
                             Ms limit = kForever);
  std::uint64_t receive(int from, std::vector<std::byte>& recv, Ms limit = kForever);

  Context* up_;
  Context* down_;
  std::uint64_t slot_;
  std::vector<Eager> from_;  // per peer
};

// On gcomp's sockets: the first parts on the mesh, the rests on Gloo's pairs in 1 MiB segments,
// as GlooMessages' rests (one connection per pair carried a 64 MiB allgather at 1.46x MPI's time
// on the testbed, Gloo's segments at 1.03x). A reduction goes whole on the mesh.
class SocketMessages final : public Messages {
 public:
  SocketMessages(std::unique_ptr<SocketMesh> mesh, Context& rests, std::uint64_t bulk,
                 std::size_t capacity)
      : Messages(mesh->rank(), mesh->size(), rests, bulk, capacity), mesh_(std::move(mesh)) {}

  std::uint64_t sendrecv(int to, std::span<const std::byte> bytes, int from,
                         std::vector<std::byte>& recv) override;
  void exchange_all(const std::vector<std::span<const std::byte>>& to, const Place& place) override;
  void reduce_doubling(void* data, std::size_t count, std::size_t element, ReduceFn fn,
                       double limit_seconds) override;
  bool close() override;

 private:
  // The message's size from its first part, checked (the size, and the part's own length).
  std::uint64_t parse_first(const std::vector<std::byte>& f, int from) const;
  // Copies the first part's bytes to `at` and posts the rest's receives in `rest`.
  void take_first(const std::vector<std::byte>& f, int from, std::uint64_t n, std::byte* at,
                  Segments& rest);
  SocketMesh& mesh() const;

  std::unique_ptr<SocketMesh> mesh_;  // null once closed
};

}  // namespace gcomp::detail::gloo_parts
