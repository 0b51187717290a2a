// The transport under the collectives: what the call protocol and the algorithms need from a
// distributed engine, and nothing else, without the engine's headers. Implementations: MPI
// (mpi/, over a duplicated communicator), Gloo (gloo/, over a context met through a key-value
// store, or gcomp's own sockets of sockets/), and the groups of group_transport.hpp. Algorithms
// and the protocol never call MPI or Gloo themselves (collectives/README.md, the layers).
//
// Every call is collective over the transport's ranks unless it names a partner. Bytes handed to
// the engine and delivered by it are counted into a Traffic per destination, as the statistics
// report them. What arrives is bytes: every algorithm validates them before use (a payload
// through parse_payload, a sparse stream through its reader), whatever the transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gcomp/collective_types.hpp"

namespace gcomp::detail {

// Seconds since an arbitrary start (CLOCK_MONOTONIC, the timeline's clock: no engine needs to be
// initialized).
double now() noexcept;

// Bytes handed to and delivered by the engine, and the seconds spent in it.
struct Traffic {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  double seconds = 0;
};

// An engine call that began at start (now()) has returned: its seconds added to t and, with a
// timeline on (gcomp/timeline.hpp), a "wire" span. Every engine ends its calls with it.
void wire_done(Traffic& t, double start);

// Every rank's bytes, concatenated in rank order; offsets[r] and sizes[r] locate rank r's.
struct Gathered {
  std::vector<std::byte> bytes;
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint64_t> offsets;
  std::span<const std::byte> of(int r) const {
    return {bytes.data() + offsets[static_cast<std::size_t>(r)],
            static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)])};
  }
};

// The most bytes a peer may announce for one message (a size header, an allgatherv's or
// all-to-all's size): sizes are bytes from another rank, checked before anything is allocated.
inline constexpr std::uint64_t kMaxMessageBytes = std::uint64_t{1} << 40;
// Throws Error(bad_payload) naming the peer unless bytes <= kMaxMessageBytes.
void check_announced(std::uint64_t bytes, int from);

// What an allgatherv or an all-to-all(v) hands to the engine and gets from it, counted per
// destination as the statistics report them: each rank's 8-byte size to every other, then its
// bytes. allgatherv: this rank's `mine` bytes of `total`; alltoallv: sent[r], received[r] per
// rank r, this rank's own (index me) staying local.
void count_allgatherv(Traffic& t, std::size_t ranks, std::uint64_t mine, std::uint64_t total);
void count_alltoallv(Traffic& t, std::span<const std::uint64_t> sent,
                     std::span<const std::uint64_t> received, std::size_t me);

// The element-wise reductions the protocol and the algorithms use.
enum class Reduction : int {
  sum_float,   // float32 +: the dense allreduce
  sum_uint64,  // uint64 +: histograms (sparse_reduce_scatter)
  max_double,  // double MAX: agreed speeds and measurements
  max_int64,   // int64 MAX: the agreement (every word in [0, 2^63))
};

// How long a rank waits at the agreement for a rank that has not come (stall_report.hpp).
struct WaitLimits {
  double stall = 60;   // seconds before the report (0: never)
  double timeout = 0;  // seconds before Error(timeout) (0: never)
};

// A transport's ranks and the exchanges among them: what the algorithms and the call run on.
// Named apart from gcomp::Transport, the public enum a user picks an engine by (kind()).
class Net {
 public:
  virtual ~Net() = default;
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  gcomp::Transport kind() const noexcept { return kind_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // hosts()[r]: the lowest rank on rank r's host (found when the transport was made).
  const std::vector<int>& hosts() const noexcept { return hosts_; }
  // The ranks on this rank's host.
  int ranks_on_this_host() const noexcept;
  // The ranks sharing this machine's cores: as ranks_on_this_host(), unless the hosts were
  // named (GCOMP_HOST) apart from the machine the engine sees.
  int ranks_on_this_machine() const noexcept {
    return machine_ranks_ > 0 ? machine_ranks_ : ranks_on_this_host();
  }

  // How this transport's waits use the CPU, as a call's learned cost counts it (auto_choice.hpp's
  // learned_cost): the wait policy's mode (waiting.hpp) unless its waits block (as sleep does).
  virtual WaitPolicy wait_style() const noexcept;

  // recv = the reduction over ranks of every rank's `count` values at send; send == recv: in
  // place.
  virtual void allreduce(const void* send, void* recv, std::size_t count, Reduction op) = 0;
  virtual void barrier() = 0;
  // Every rank's `mine`, concatenated in rank order (sizes exchanged first).
  virtual void allgatherv_bytes(std::span<const std::byte> mine, Gathered& out, Traffic& t) = 0;
  // to[r] goes to rank r; from[r] arrives from rank r (to[rank] is copied locally).
  virtual void alltoallv_bytes(const std::vector<std::vector<std::byte>>& to,
                               std::vector<std::vector<std::byte>>& from, Traffic& t) = 0;
  // Point to point: a message of any size, received whole into recv (resized to it). Messages
  // between two ranks arrive in the order they were sent.
  virtual void send_bytes(int to, std::span<const std::byte> send, Traffic& t) = 0;
  virtual void recv_bytes(int from, std::vector<std::byte>& recv, Traffic& t) = 0;
  // Sends `send` to `to` and receives the message (any size) of `from` into recv, at once (a
  // shift when every rank sends to one neighbour and receives from the other).
  virtual void sendrecv_bytes(int to, std::span<const std::byte> send, int from,
                              std::vector<std::byte>& recv, Traffic& t) = 0;
  // The same with one partner both ways.
  void sendrecv_bytes(int partner, std::span<const std::byte> send, std::vector<std::byte>& recv,
                      Traffic& t) {
    sendrecv_bytes(partner, send, partner, recv, t);
  }
  // The network measurement's patterns, sizes known on both sides: send to `to` while receiving
  // from `from` (recv.size() bytes); and every rank sending `block` bytes to every other (block
  // r of send goes to rank r; block r of recv comes from rank r).
  virtual void shift_bytes(int to, std::span<const std::byte> send, int from,
                           std::span<std::byte> recv) = 0;
  virtual void alltoall_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                              std::size_t block) = 0;

  // The agreement of call number `call`: all = the MAX over ranks of every rank's `words`
  // words (each in [0, 2^63)). Watched as `limits` say (stall_report.hpp): a stall report to
  // stderr naming the absent ranks, and Error(timeout) past the timeout; with a timeout, every
  // rank also passes a barrier after it, so that a rank that came after the others gave up fails
  // there instead of going on alone. describe() names the call in those messages. After
  // Error(timeout) the transport is broken: it keeps what the engine may still write (never
  // freed) and every later agreement throws. words is the same on every call.
  virtual void agree(const std::uint64_t* mine, std::uint64_t* all, std::size_t words,
                     std::uint64_t call, const WaitLimits& limits,
                     const std::function<std::string()>& describe) = 0;

 protected:
  Net(gcomp::Transport kind, int rank, int size) : kind_(kind), rank_(rank), size_(size) {}
  // The hosts from every rank's host number (the lowest rank on its host), gathered.
  std::vector<int> hosts_;
  int machine_ranks_ = 0;  // 0: as ranks_on_this_host()

 private:
  gcomp::Transport kind_;
  int rank_;
  int size_;
};

}  // namespace gcomp::detail
