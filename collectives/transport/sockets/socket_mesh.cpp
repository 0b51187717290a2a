// SocketMesh (socket_mesh.hpp): non-blocking TCP sockets, poll(2) in the waiting thread.
#include "socket_mesh.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gloo/rendezvous/store.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "gcomp/error.hpp"
#include "transport.hpp"
#include "waiting.hpp"

namespace gcomp::detail {

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(Status::transport, "sockets: " + what + ": " + std::strerror(errno));
}

// Closes a descriptor unless it was handed on.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) fail("fcntl");
}

void set_nodelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) fail("TCP_NODELAY");
}

sockaddr_in ipv4(const std::string& address, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    throw Error(Status::invalid_argument, "sockets: '" + address + "' is not an IPv4 address");
  }
  return a;
}

using Clock = std::chrono::steady_clock;

// Milliseconds left to `deadline` for poll(2) (-1: none), at least 0.
int poll_ms(bool limited, Clock::time_point deadline) {
  if (!limited) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

// poll(2) as the wait policy says (waiting.hpp): spin polls without sleeping, yield yields the
// CPU between polls, sleep blocks in the kernel until a socket is ready. 0 past the deadline.
int poll_as_policy(WaitPolicy mode, pollfd* polls, nfds_t count, bool limited,
                   Clock::time_point deadline) {
  if (mode == WaitPolicy::sleep) return ::poll(polls, count, poll_ms(limited, deadline));
  for (;;) {
    const int r = ::poll(polls, count, 0);
    if (r != 0) return r;
    if (limited && Clock::now() >= deadline) return 0;
    if (mode == WaitPolicy::yield) sched_yield();
  }
}

// Waits until fd is ready for `events`; false past the deadline.
bool wait_for(int fd, short events, bool limited, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_ms(limited, deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) fail("poll");
  }
}

// Writes or reads exactly n bytes of a blocking exchange during the setup.
void setup_io(int fd, void* p, std::size_t n, bool write, Clock::time_point deadline,
              const std::string& what) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    if (!wait_for(fd, write ? POLLOUT : POLLIN, true, deadline)) {
      throw Error(Status::timeout, "sockets: " + what + " timed out");
    }
    const ssize_t r = write ? ::send(fd, c, n, MSG_NOSIGNAL) : ::recv(fd, c, n, 0);
    if (r > 0) {
      c += r;
      n -= static_cast<std::size_t>(r);
    } else if (r == 0) {
      throw Error(Status::transport, "sockets: " + what + ": the peer closed the connection");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      fail(what);
    }
  }
}

}  // namespace

SocketMesh::SocketMesh(gloo::rendezvous::Store& store, const std::string& prefix, int rank,
                       int size, const std::string& address, double connect_seconds)
    : rank_(rank), size_(size), fds_(static_cast<std::size_t>(size), -1) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(Status::invalid_argument,
                "sockets: rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  if (size == 1) return;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(connect_seconds * 1e3));
  try {
    Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listener.fd < 0) fail("socket");
    sockaddr_in here = ipv4(address, 0);
    if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&here), sizeof here) < 0) {
      fail("bind to " + address);
    }
    if (::listen(listener.fd, size) < 0) fail("listen");
    socklen_t len = sizeof here;
    if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&here), &len) < 0) {
      fail("getsockname");
    }
    set_nonblocking(listener.fd);
    const std::string mine = address + ":" + std::to_string(ntohs(here.sin_port));
    store.set(prefix + "socket/" + std::to_string(rank),
              std::vector<char>(mine.begin(), mine.end()));

    // Connect to every lower rank and say who this is.
    for (int r = 0; r < rank; ++r) {
      const std::string key = prefix + "socket/" + std::to_string(r);
      store.wait(
          {key},
          std::max(std::chrono::milliseconds(1),
                   std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
      const std::vector<char> v = store.get(key);
      const std::string there(v.begin(), v.end());
      const auto colon = there.rfind(':');
      if (colon == std::string::npos) {
        throw Error(Status::bad_payload, "sockets: rank " + std::to_string(r) + " published '" +
                                             there + "', not an address");
      }
      const int port = std::atoi(there.c_str() + colon + 1);
      if (port <= 0 || port > 65535) {
        throw Error(Status::bad_payload, "sockets: rank " + std::to_string(r) + " published '" +
                                             there + "', not an address");
      }
      sockaddr_in to = ipv4(there.substr(0, colon), static_cast<std::uint16_t>(port));
      Fd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (c.fd < 0) fail("socket");
      set_nonblocking(c.fd);
      if (::connect(c.fd, reinterpret_cast<sockaddr*>(&to), sizeof to) < 0 &&
          errno != EINPROGRESS) {
        fail("connect to rank " + std::to_string(r) + " at " + there);
      }
      if (!wait_for(c.fd, POLLOUT, true, deadline)) {
        throw Error(Status::timeout, "sockets: connecting to rank " + std::to_string(r) + " at " +
                                         there + " timed out");
      }
      int err = 0;
      socklen_t el = sizeof err;
      if (::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0) {
        errno = err;
        fail("connect to rank " + std::to_string(r) + " at " + there);
      }
      set_nodelay(c.fd);
      std::uint32_t me = static_cast<std::uint32_t>(rank);
      setup_io(c.fd, &me, sizeof me, true, deadline, "greeting rank " + std::to_string(r));
      fds_[static_cast<std::size_t>(r)] = c.release();
    }
    // Accept every higher rank; each says who it is.
    for (int left = size - 1 - rank; left > 0; --left) {
      if (!wait_for(listener.fd, POLLIN, true, deadline)) {
        throw Error(Status::timeout, "sockets: rank " + std::to_string(rank) + " waited for " +
                                         std::to_string(left) + " higher rank(s) to connect");
      }
      Fd a(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (a.fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
          ++left;
          continue;
        }
        fail("accept");
      }
      set_nodelay(a.fd);
      std::uint32_t who = 0;
      setup_io(a.fd, &who, sizeof who, false, deadline, "a greeting");
      if (who <= static_cast<std::uint32_t>(rank) || who >= static_cast<std::uint32_t>(size) ||
          fds_[who] >= 0) {
        throw Error(Status::bad_payload, "sockets: a connection to rank " + std::to_string(rank) +
                                             " said it was rank " + std::to_string(who));
      }
      fds_[who] = a.release();
    }
  } catch (...) {
    for (int& fd : fds_) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    throw;
  }
}

SocketMesh::~SocketMesh() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

// One peer's part of an exchange: a message to send (the 8-byte length, then the bytes) and
// one to receive (the length, checked, then that many bytes into *out).
struct SocketMesh::Flow {
  int peer = -1;
  int fd = -1;
  bool sending = false;
  std::span<const std::byte> bytes;
  unsigned char head_out[8] = {};
  std::size_t sent = 0;                   // of 8 + bytes.size()
  std::vector<std::byte>* out = nullptr;  // nullptr: nothing to receive
  unsigned char head_in[8] = {};
  std::size_t got_head = 0;
  std::uint64_t n_in = 0;
  std::size_t got = 0;
  bool received = true;
  bool send_pending() const { return sending && sent < 8 + bytes.size(); }
};

void SocketMesh::exchange(int to, std::span<const std::byte> bytes, int from,
                          std::vector<std::byte>& out, double timeout_seconds) {
  const auto valid = [&](int r) { return r >= 0 && r < size_ && r != rank_; };
  if ((to != -1 && !valid(to)) || (from != -1 && !valid(from))) {
    throw Error(Status::invalid_argument, "sockets: rank " + std::to_string(rank_) +
                                              " cannot exchange with " + std::to_string(to) +
                                              " and " + std::to_string(from));
  }
  Flow flows[2];
  std::size_t count = 0;
  if (to != -1) {
    flows[count].peer = to;
    flows[count].sending = true;
    flows[count].bytes = bytes;
    ++count;
  }
  if (from != -1) {
    Flow* f = to == from ? &flows[0] : &flows[count++];
    f->peer = from;
    f->out = &out;
  }
  progress(std::span<Flow>(flows, count), timeout_seconds);
}

void SocketMesh::exchange_all(const std::vector<std::span<const std::byte>>& to,
                              std::vector<std::vector<std::byte>>& from, double timeout_seconds) {
  if (to.size() != static_cast<std::size_t>(size_)) {
    throw Error(Status::internal, "sockets: an exchange with every rank needs a message for each");
  }
  from.resize(static_cast<std::size_t>(size_));
  std::vector<Flow> flows;
  flows.reserve(static_cast<std::size_t>(size_));
  // Each rank starts with the next rank up, so that the ranks do not all send to one at once.
  for (int k = 1; k < size_; ++k) {
    const int r = (rank_ + k) % size_;
    Flow f;
    f.peer = r;
    f.sending = true;
    f.bytes = to[static_cast<std::size_t>(r)];
    f.out = &from[static_cast<std::size_t>(r)];
    flows.push_back(f);
  }
  progress(flows, timeout_seconds);
}

void SocketMesh::progress(std::span<Flow> flows, double timeout_seconds) {
  const bool limited = timeout_seconds > 0;
  const auto deadline =
      Clock::now() + std::chrono::microseconds(
                         limited ? static_cast<std::int64_t>(std::ceil(timeout_seconds * 1e6)) : 0);
  for (Flow& f : flows) {
    f.fd = fds_[static_cast<std::size_t>(f.peer)];
    const std::uint64_t n = f.bytes.size();
    for (int b = 0; b < 8; ++b) f.head_out[b] = static_cast<unsigned char>(n >> (8 * b));
    if (f.out) {
      f.out->clear();
      f.received = false;
    }
  }
  const WaitPolicy mode = follows_policy_ ? wait_mode() : WaitPolicy::sleep;
  std::vector<pollfd> polls(flows.size());
  std::vector<Flow*> polled(flows.size());
  const auto closed = [&](const Flow& f) {
    return Error(Status::transport, "sockets: rank " + std::to_string(f.peer) +
                                        " closed its connection to rank " + std::to_string(rank_));
  };
  for (;;) {
    nfds_t count = 0;
    for (Flow& f : flows) {
      const short events =
          static_cast<short>((f.send_pending() ? POLLOUT : 0) | (f.received ? 0 : POLLIN));
      if (events == 0) continue;
      polls[count] = {f.fd, events, 0};
      polled[count] = &f;
      ++count;
    }
    if (count == 0) return;
    const int r = poll_as_policy(mode, polls.data(), count, limited, deadline);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("poll");
    }
    if (r == 0) {
      std::string what;
      for (nfds_t i = 0; i < count; ++i) {
        const Flow& f = *polled[i];
        if (!f.received) what += " for a message from rank " + std::to_string(f.peer);
        if (f.send_pending()) what += " to send to rank " + std::to_string(f.peer);
      }
      throw Error(Status::timeout, "sockets: rank " + std::to_string(rank_) + " waited " +
                                       std::to_string(timeout_seconds) + " s" + what);
    }
    for (nfds_t i = 0; i < count; ++i) {
      Flow& f = *polled[i];
      const short ev = polls[i].revents;
      if (f.send_pending() && (ev & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t w = f.sent < 8 ? ::send(f.fd, f.head_out + f.sent, 8 - f.sent, MSG_NOSIGNAL)
                                     : ::send(f.fd, f.bytes.data() + (f.sent - 8),
                                              f.bytes.size() - (f.sent - 8), MSG_NOSIGNAL);
        if (w > 0) {
          f.sent += static_cast<std::size_t>(w);
        } else if (w < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
          if (errno == EPIPE || errno == ECONNRESET) throw closed(f);
          fail("send to rank " + std::to_string(f.peer));
        }
      }
      if (!f.received && (ev & (POLLIN | POLLERR | POLLHUP))) {
        const bool body = f.got_head == 8;
        const ssize_t g =
            body ? ::recv(f.fd, f.out->data() + f.got, static_cast<std::size_t>(f.n_in) - f.got, 0)
                 : ::recv(f.fd, f.head_in + f.got_head, 8 - f.got_head, 0);
        if (g == 0) throw closed(f);
        if (g < 0) {
          if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
            if (errno == ECONNRESET) throw closed(f);
            fail("recv from rank " + std::to_string(f.peer));
          }
        } else if (!body) {
          f.got_head += static_cast<std::size_t>(g);
          if (f.got_head == 8) {
            for (int b = 0; b < 8; ++b)
              f.n_in |= static_cast<std::uint64_t>(f.head_in[b]) << (8 * b);
            check_announced(f.n_in, f.peer);
            f.out->resize(static_cast<std::size_t>(f.n_in));
            f.received = f.n_in == 0;
          }
        } else {
          f.got += static_cast<std::size_t>(g);
          f.received = f.got == f.n_in;
        }
      }
    }
  }
}

}  // namespace gcomp::detail
