// Messages of any size between the Gloo transport's ranks (messages.hpp).
#include "messages.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "doubling.hpp"

namespace gcomp::detail::gloo_parts {

namespace {

// Limits in seconds (0: none) as Gloo's waits take them.
Ms gloo_limit(double seconds) { return seconds > 0 ? to_ms(seconds) : kForever; }

void check_reduction(const std::vector<std::byte>& got, std::size_t bytes, int from) {
  if (got.size() != bytes) {
    throw Error(Status::bad_payload, "rank " + std::to_string(from) + " sent a reduction of " +
                                         std::to_string(got.size()) + " bytes, not " +
                                         std::to_string(bytes));
  }
}

}  // namespace

// ---- What both carriers share ----

std::vector<std::byte> Messages::first_part(std::span<const std::byte> bytes) const {
  const std::size_t inline_bytes = first_bytes(bytes.size());
  std::vector<std::byte> f(8 + inline_bytes);
  const std::uint64_t n = bytes.size();
  for (int b = 0; b < 8; ++b) f[static_cast<std::size_t>(b)] = static_cast<std::byte>(n >> (8 * b));
  if (inline_bytes > 0) std::memcpy(f.data() + 8, bytes.data(), inline_bytes);
  return f;
}

void Messages::recv_rest(int from, std::uint64_t n, std::byte* at, Segments& rest) {
  const std::size_t inline_bytes = first_bytes(n);
  if (n > inline_bytes) {
    rest.recv(*rests_, from, bulk_, at + inline_bytes, static_cast<std::size_t>(n) - inline_bytes);
  }
}

void Messages::send_rest(int to, std::span<const std::byte> bytes, Segments& rest) {
  const std::size_t inline_bytes = first_bytes(bytes.size());
  if (bytes.size() > inline_bytes) {
    rest.send(*rests_, to, bulk_, bytes.data() + inline_bytes, bytes.size() - inline_bytes);
  }
}

// ---- On Gloo's pairs ----

GlooMessages::GlooMessages(int rank, int size, Context& up, Context& down, Context& rests,
                           std::uint64_t slot, std::uint64_t bulk, std::size_t capacity)
    : Messages(rank, size, rests, bulk, capacity), up_(&up), down_(&down), slot_(slot) {
  from_.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    Eager& e = from_[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < e.buf.size(); ++i) {
      e.bytes[i].resize(capacity);
      e.buf[i] = between(r, rank).createUnboundBuffer(e.bytes[i].data(), e.bytes[i].size());
      e.buf[i]->recv(r, slot_, 0, capacity);
    }
  }
}

void GlooMessages::start_send(int to, std::span<const std::byte> bytes, Outgoing& out) {
  out.first = first_part(bytes);
  out.head = between(rank(), to).createUnboundBuffer(out.first.data(), out.first.size());
  out.head->send(to, slot_);
  out.to = to;
  out.bytes = bytes;
}

void GlooMessages::post_rest(Outgoing& out) {
  if (out.rest_posted) return;
  out.rest_posted = true;
  send_rest(out.to, out.bytes, out.rest);
}

void GlooMessages::finish_send(Outgoing& out, Ms limit) {
  post_rest(out);
  out.head->waitSend(nullptr, limit);
  out.rest.wait();
}

std::uint64_t GlooMessages::wait_head(int from, Ms limit) {
  Eager& e = from_[static_cast<std::size_t>(from)];
  e.buf[e.next]->waitRecv(nullptr, limit);
  std::uint64_t n = 0;
  for (int b = 0; b < 8; ++b) {
    n |= static_cast<std::uint64_t>(e.bytes[e.next][static_cast<std::size_t>(b)]) << (8 * b);
  }
  check_announced(n, from);
  return n;
}

void GlooMessages::take_head(int from, std::uint64_t n, std::byte* at, Segments& rest) {
  Eager& e = from_[static_cast<std::size_t>(from)];
  const std::size_t inline_bytes = first_bytes(n);
  if (inline_bytes > 0) std::memcpy(at, e.bytes[e.next].data() + 8, inline_bytes);
  e.buf[e.next]->recv(from, slot_, 0, capacity());
  e.next ^= 1;
  recv_rest(from, n, at, rest);
}

std::uint64_t GlooMessages::receive_head(int from, std::vector<std::byte>& recv, Segments& rest,
                                         Ms limit) {
  const std::uint64_t n = wait_head(from, limit);
  recv.resize(static_cast<std::size_t>(n));
  take_head(from, n, recv.data(), rest);
  return n;
}

std::uint64_t GlooMessages::receive(int from, std::vector<std::byte>& recv, Ms limit) {
  Segments rest;
  const std::uint64_t n = receive_head(from, recv, rest, limit);
  rest.wait();
  return n;
}

// Both first parts, then both rests.
std::uint64_t GlooMessages::sendrecv(int to, std::span<const std::byte> bytes, int from,
                                     std::vector<std::byte>& recv) {
  Outgoing out;
  if (to >= 0) start_send(to, bytes, out);
  Segments rest;
  const std::uint64_t n = from >= 0 ? receive_head(from, recv, rest) : 0;
  if (to >= 0) post_rest(out);
  rest.wait();
  if (to >= 0) finish_send(out);
  return n;
}

void GlooMessages::exchange_all(const std::vector<std::span<const std::byte>>& to,
                                const Place& place) {
  const auto p = static_cast<std::size_t>(size());
  const auto me = static_cast<std::size_t>(rank());
  std::vector<Outgoing> out(p);
  for (std::size_t k = 1; k < p; ++k) {
    const std::size_t r = (me + k) % p;
    start_send(static_cast<int>(r), to[r], out[r]);
  }
  std::vector<std::uint64_t> sizes(p);
  sizes[me] = to[me].size();
  for (std::size_t k = 1; k < p; ++k) {
    const std::size_t r = (me + p - k) % p;
    sizes[r] = wait_head(static_cast<int>(r));
  }
  const std::vector<std::byte*> at = place(std::as_const(sizes));
  if (!to[me].empty()) std::memcpy(at[me], to[me].data(), to[me].size());
  Segments rest;
  for (std::size_t k = 1; k < p; ++k) {
    const std::size_t r = (me + p - k) % p;
    take_head(static_cast<int>(r), sizes[r], at[r], rest);
  }
  for (std::size_t k = 1; k < p; ++k) post_rest(out[(me + k) % p]);
  rest.wait();
  for (std::size_t k = 1; k < p; ++k) finish_send(out[(me + k) % p]);
}

// Each message is a copy of the elements, taken while they change.
void GlooMessages::reduce_doubling(void* data, std::size_t count, std::size_t element, ReduceFn fn,
                                   double limit_seconds) {
  const Ms limit = gloo_limit(limit_seconds);
  const std::size_t bytes = count * element;
  if (bytes + 8 > capacity()) {
    throw Error(Status::internal, "a reduction by recursive doubling of " + std::to_string(bytes) +
                                      " bytes does not fit its channel");
  }
  std::vector<std::byte> got;
  const std::span<const std::byte> mine(static_cast<const std::byte*>(data), bytes);
  const auto take = [&](int from, bool combine) {
    receive(from, got, limit);
    check_reduction(got, bytes, from);
    if (combine) {
      fn(data, data, got.data(), count);
    } else {
      std::memcpy(data, got.data(), bytes);
    }
  };
  const auto give = [&](int to) {
    Outgoing out;
    start_send(to, mine, out);
    finish_send(out, limit);
  };
  const DoublingSchedule d(rank(), size());
  if (d.folds_into >= 0) give(d.folds_into);
  if (d.folded_from >= 0) take(d.folded_from, true);
  for (const int peer : d.partners) {
    Outgoing out;
    start_send(peer, mine, out);  // a copy: the elements change below
    take(peer, true);
    finish_send(out, limit);
  }
  if (d.folded_from >= 0) give(d.folded_from);
  if (d.folds_into >= 0) take(d.folds_into, false);
}

// ---- On gcomp's sockets ----

SocketMesh& SocketMessages::mesh() const {
  if (!mesh_)
    throw Error(Status::transport, "the transport's sockets closed at an earlier failure");
  return *mesh_;
}

bool SocketMessages::close() {
  mesh_.reset();
  return true;
}

std::uint64_t SocketMessages::parse_first(const std::vector<std::byte>& f, int from) const {
  std::uint64_t n = 0;
  if (f.size() >= 8) {
    for (int b = 0; b < 8; ++b) {
      n |= static_cast<std::uint64_t>(f[static_cast<std::size_t>(b)]) << (8 * b);
    }
    check_announced(n, from);
  }
  if (f.size() < 8 || f.size() != 8 + first_bytes(n)) {
    throw Error(
        Status::bad_payload,
        "rank " + std::to_string(from) + " sent a first part of " + std::to_string(f.size()) +
            " bytes" +
            (f.size() >= 8 ? " for a message of " + std::to_string(n) + " bytes" : std::string()));
  }
  return n;
}

void SocketMessages::take_first(const std::vector<std::byte>& f, int from, std::uint64_t n,
                                std::byte* at, Segments& rest) {
  const std::size_t inline_bytes = first_bytes(n);
  if (inline_bytes > 0) std::memcpy(at, f.data() + 8, inline_bytes);
  recv_rest(from, n, at, rest);
}

std::uint64_t SocketMessages::sendrecv(int to, std::span<const std::byte> bytes, int from,
                                       std::vector<std::byte>& recv) {
  const std::vector<std::byte> head = to >= 0 ? first_part(bytes) : std::vector<std::byte>{};
  std::vector<std::byte> first;
  mesh().exchange(to, head, from, first, 0);
  std::uint64_t n = 0;
  Segments rest;
  if (from >= 0) {
    n = parse_first(first, from);
    recv.resize(static_cast<std::size_t>(n));
    take_first(first, from, n, recv.data(), rest);
  }
  if (to >= 0) send_rest(to, bytes, rest);
  rest.wait();
  return n;
}

void SocketMessages::exchange_all(const std::vector<std::span<const std::byte>>& to,
                                  const Place& place) {
  const auto p = static_cast<std::size_t>(size());
  const auto me = static_cast<std::size_t>(rank());
  std::vector<std::vector<std::byte>> firsts(p), got;
  std::vector<std::span<const std::byte>> first_spans(p);
  for (std::size_t r = 0; r < p; ++r) {
    if (r == me) continue;
    firsts[r] = first_part(to[r]);
    first_spans[r] = firsts[r];
  }
  mesh().exchange_all(first_spans, got, 0);
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
    send_rest(static_cast<int>(r), to[r], rest);
  }
  rest.wait();
}

// Whole messages on the mesh: the elements change only after both of a round's are done.
void SocketMessages::reduce_doubling(void* data, std::size_t count, std::size_t element,
                                     ReduceFn fn, double limit_seconds) {
  SocketMesh& m = mesh();
  const std::size_t bytes = count * element;
  std::vector<std::byte> got;
  const std::span<const std::byte> mine(static_cast<const std::byte*>(data), bytes);
  const DoublingSchedule d(rank(), size());
  if (d.folds_into >= 0) m.exchange(d.folds_into, mine, -1, got, limit_seconds);
  if (d.folded_from >= 0) {
    m.exchange(-1, {}, d.folded_from, got, limit_seconds);
    check_reduction(got, bytes, d.folded_from);
    fn(data, data, got.data(), count);
  }
  for (const int peer : d.partners) {
    m.exchange(peer, mine, peer, got, limit_seconds);
    check_reduction(got, bytes, peer);
    fn(data, data, got.data(), count);
  }
  if (d.folded_from >= 0) m.exchange(d.folded_from, mine, -1, got, limit_seconds);
  if (d.folds_into >= 0) {
    m.exchange(-1, {}, d.folds_into, got, limit_seconds);
    check_reduction(got, bytes, d.folds_into);
    std::memcpy(data, got.data(), bytes);
  }
}

}  // namespace gcomp::detail::gloo_parts
