// SocketMesh (collectives/transport/sockets/socket_mesh.hpp): ranks as threads of one process meeting through
// Gloo's in-memory store on the loopback. Messages arrive whole, in order and unchanged (empty,
// small, and 16 MiB both ways at once, which blocks unless both directions progress together);
// a wait past its limit is Error(timeout), under every wait policy, a closed peer
// Error(transport), and what a peer sends is checked before use: a greeting naming the wrong
// rank, and a length past 2^40.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <gloo/rendezvous/hash_store.h>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/error.hpp"
#include "mpi_util.hpp"
#include "socket_mesh.hpp"
#include "waiting.hpp"

namespace {

using gcomp::Error;
using gcomp::Status;
using gcomp::WaitPolicy;
using gcomp::detail::SocketMesh;
using Bytes = std::vector<std::byte>;

Bytes pattern(std::size_t n, unsigned seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131 + seed * 17) >> 3);
  return b;
}

// Runs body(rank, mesh) on `size` threads, each with its own mesh; rethrows the first failure.
void run_ranks(int size, const std::function<void(int, SocketMesh&)>& body) {
  gloo::rendezvous::HashStore store;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        SocketMesh mesh(store, "test/", r, size, "127.0.0.1", 20);
        body(r, mesh);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(SocketMesh, MessagesArriveWholeInOrderAndUnchanged) {
  for (int size : {1, 2, 3, 5}) {
    run_ranks(size, [size](int r, SocketMesh& mesh) {
      EXPECT_EQ(mesh.rank(), r);
      EXPECT_EQ(mesh.size(), size);
      if (size == 1) return;
      const int next = (r + 1) % size;
      const int prev = (r + size - 1) % size;
      // A ring of messages of every rank's own size (rank 0's empty), three times in a row: the
      // third round's messages are sent before the second's are all received.
      for (unsigned round = 0; round < 3; ++round) {
        const Bytes mine = pattern(static_cast<std::size_t>(r) * 1000 + round, r + round);
        Bytes got;
        mesh.exchange(next, mine, prev, got, 20);
        EXPECT_EQ(got, pattern(static_cast<std::size_t>(prev) * 1000 + round, prev + round))
            << "rank " << r << " from " << prev << " round " << round;
      }
      // Send-only and receive-only halves: two messages queue before the receiver looks.
      Bytes got;
      if (r == 0) {
        mesh.exchange(1, pattern(10, 1), -1, got, 20);
        mesh.exchange(1, pattern(20, 2), -1, got, 20);
      } else if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        mesh.exchange(-1, {}, 0, got, 20);
        EXPECT_EQ(got, pattern(10, 1));
        mesh.exchange(-1, {}, 0, got, 20);
        EXPECT_EQ(got, pattern(20, 2));
      }
    });
  }
}

TEST(SocketMesh, EveryRankToEveryOtherAtOnce) {
  for (int size : {2, 3, 5}) {
    run_ranks(size, [size](int r, SocketMesh& mesh) {
      // Twice: sizes from empty to 3 MiB, a pair's two directions of different sizes.
      for (unsigned round = 0; round < 2; ++round) {
        std::vector<Bytes> mine(static_cast<std::size_t>(size));
        std::vector<std::span<const std::byte>> to(static_cast<std::size_t>(size));
        for (int q = 0; q < size; ++q) {
          mine[static_cast<std::size_t>(q)] =
              pattern(static_cast<std::size_t>((r * 7 + q * 3 + round) % 4) << 20 >> (q % 3), r * 10 + q);
          to[static_cast<std::size_t>(q)] = mine[static_cast<std::size_t>(q)];
        }
        std::vector<Bytes> from;
        mesh.exchange_all(to, from, 60);
        ASSERT_EQ(from.size(), static_cast<std::size_t>(size));
        for (int q = 0; q < size; ++q) {
          if (q == r) continue;
          EXPECT_EQ(from[static_cast<std::size_t>(q)],
                    pattern(static_cast<std::size_t>((q * 7 + r * 3 + round) % 4) << 20 >> (r % 3),
                            q * 10 + r))
              << "rank " << r << " from " << q << " round " << round;
        }
      }
    });
  }
}

TEST(SocketMesh, LargeMessagesBothWaysAtOnce) {
  run_ranks(2, [](int r, SocketMesh& mesh) {
    const Bytes mine = pattern(std::size_t{16} << 20, r + 5);
    Bytes got;
    mesh.exchange(1 - r, mine, 1 - r, got, 60);
    EXPECT_EQ(got, pattern(std::size_t{16} << 20, 1 - r + 5)) << "rank " << r;
  });
}

TEST(SocketMesh, WaitsPastTheirLimitAndClosedPeersAreErrors) {
  run_ranks(2, [](int r, SocketMesh& mesh) {
    Bytes got;
    if (r == 1) {
      const auto start = std::chrono::steady_clock::now();
      try {
        mesh.exchange(-1, {}, 0, got, 0.2);
        ADD_FAILURE() << "no timeout";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Status::timeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("from rank 0"), std::string::npos) << e.what();
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_GE(waited, 0.19);
      mesh.exchange(0, pattern(1, 0), -1, got, 20);  // rank 0 may close now
      try {
        mesh.exchange(-1, {}, 0, got, 20);
        ADD_FAILURE() << "no error for a closed connection";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Status::transport) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank 0 closed"), std::string::npos) << e.what();
      }
    } else {
      mesh.exchange(-1, {}, 1, got, 20);
      // Returning closes rank 0's connections.
    }
  });
  Bytes got;
  run_ranks(2, [&](int r, SocketMesh& mesh) {
    EXPECT_THROW(mesh.exchange(r, {}, -1, got, 1), Error);  // not with itself
    EXPECT_THROW(mesh.exchange(-1, {}, 2, got, 1), Error);  // no such rank
  });
}

// sleep's naps: 10 us doubling to 100 us, then in a long wait an eighth of the time waited, at
// most 1 ms.
TEST(SocketMesh, SleepNapsGrowWithTheWaitToAMillisecond) {
  using gcomp::detail::nap_nanoseconds;
  EXPECT_EQ(nap_nanoseconds(0, 30e-6), 10000);
  EXPECT_EQ(nap_nanoseconds(1, 40e-6), 20000);
  EXPECT_EQ(nap_nanoseconds(3, 100e-6), 80000);
  EXPECT_EQ(nap_nanoseconds(4, 500e-6), 100000);  // an eighth, 62.5 us, is less
  EXPECT_EQ(nap_nanoseconds(4, 4e-3), 500000);
  EXPECT_EQ(nap_nanoseconds(4, 8e-3), 1000000);
  EXPECT_EQ(nap_nanoseconds(4, 3.0), 1000000);
  EXPECT_EQ(nap_nanoseconds(40, 0.0), 100000);  // naps past 4 as 4
}

// The waits follow the wait policy (mpi_util.hpp): spin polls without a timeout, yield yields
// between polls, sleep blocks in poll(2). Under each, a ring of 3 ranks delivers, and a wait
// for a message that never comes ends at its limit (a polling loop that missed the deadline
// would hang here, and the test's timeout would fail it).
TEST(SocketMesh, EveryWaitPolicyDeliversAndEndsAtItsLimit) {
  const WaitPolicy before = gcomp::detail::wait_mode();
  for (const WaitPolicy mode : {WaitPolicy::spin, WaitPolicy::yield, WaitPolicy::sleep}) {
    gcomp::detail::set_wait_mode(mode);
    ASSERT_EQ(gcomp::detail::wait_mode(), mode);
    run_ranks(3, [mode](int r, SocketMesh& mesh) {
      const int next = (r + 1) % 3, prev = (r + 2) % 3;
      for (unsigned round = 0; round < 3; ++round) {
        Bytes got;
        mesh.exchange(next, pattern(std::size_t{100000} * r + round, r + round), prev, got, 20);
        EXPECT_EQ(got, pattern(std::size_t{100000} * prev + round, prev + round))
            << gcomp::wait_policy_name(mode) << ": rank " << r << " round " << round;
      }
      // Rank 2 waits for a message rank 0 has not sent, then lets rank 0 go.
      Bytes got;
      if (r == 2) {
        const auto start = std::chrono::steady_clock::now();
        try {
          mesh.exchange(-1, {}, 0, got, 0.1);
          ADD_FAILURE() << gcomp::wait_policy_name(mode) << ": no timeout";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Status::timeout) << gcomp::wait_policy_name(mode) << ": " << e.what();
        }
        EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  0.09);
        mesh.exchange(0, pattern(1, 0), -1, got, 20);
      } else if (r == 0) {
        mesh.exchange(-1, {}, 2, got, 20);
      }
    });
  }
  gcomp::detail::set_wait_mode(before);
}

// The test plays rank 1 by hand against a real rank 0.
void against_rank0(const std::function<void(int fd)>& as_rank1, Status expect, const char* what) {
  gloo::rendezvous::HashStore store;
  std::exception_ptr error;
  std::thread rank0([&] {
    try {
      SocketMesh mesh(store, "t/", 0, 2, "127.0.0.1", 5);
      Bytes got;
      mesh.exchange(-1, {}, 1, got, 5);
    } catch (...) {
      error = std::current_exception();
    }
  });
  store.wait({"t/socket/0"}, std::chrono::seconds(5));
  const std::vector<char> v = store.get("t/socket/0");
  const std::string there(v.begin(), v.end());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(there.substr(there.rfind(':') + 1))));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  as_rank1(fd);
  rank0.join();
  close(fd);
  ASSERT_TRUE(error) << what;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expect) << what << ": " << e.what();
  }
}

TEST(SocketMesh, WhatPeersSendIsCheckedBeforeUse) {
  against_rank0(
      [](int fd) {
        const std::uint32_t who = 7;  // not a rank of 2
        ASSERT_EQ(send(fd, &who, sizeof who, 0), 4);
      },
      Status::bad_payload, "a greeting naming rank 7");
  against_rank0(
      [](int fd) {
        const std::uint32_t who = 1;
        ASSERT_EQ(send(fd, &who, sizeof who, 0), 4);
        unsigned char head[8] = {0, 0, 0, 0, 0, 2, 0, 0};  // 2^41 bytes
        ASSERT_EQ(send(fd, head, sizeof head, 0), 8);
      },
      Status::bad_payload, "a length of 2^41");
}

}  // namespace
