// The algorithm two_level (collectives/algorithms/two_level.hpp) through the Communicator, on whatever
// hosts the ranks have: one on a plain run (every rank on this machine), or as GCOMP_HOST names
// them (the ctest layouts: one rank a host, two, and uneven hosts, on MPI and Gloo). The
// result is each host's sum of each chunk, compressed by its owner and summed across hosts in
// rank order, the same bits on every rank, computed here from every rank's input; the residual
// of what a host compressed stays with the host's ranks, an L-th each (the owner the rest), zero
// exactly where the host sent the value, so nothing is lost, momentum factor masking sees what
// each rank's host sent, and a copy of the ErrorFeedback resumes bit for bit; `none` and the
// low-rank codecs run on a two-level sum.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "algorithms.hpp"
#include "gcomp/codec.hpp"
#include "gcomp/communicator.hpp"
#include "mpi_util.hpp"

namespace gcomp {
namespace {

using test::rank;
using test::size;
using test::world;

// Every rank's values, rank after rank.
std::vector<float> gathered(const std::vector<float>& v) {
  std::vector<float> all(v.size() * static_cast<std::size_t>(size()));
  MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_FLOAT, all.data(),
                static_cast<int>(v.size()), MPI_FLOAT, MPI_COMM_WORLD);
  return all;
}

// The layout as the algorithm's contract states it, from the Communicator's hosts(): the hosts
// in the order of their lowest rank, W chunks (the most ranks on a host), chunk c owned on a
// host of L ranks by its (c mod L)-th rank.
struct Layout {
  std::vector<std::vector<int>> hosts;  // each host's ranks, ascending
  int width = 1;
  int owner(int c, std::size_t h) const {
    const auto& rs = hosts[h];
    return rs[static_cast<std::size_t>(c) % rs.size()];
  }
};

Layout layout_of(const std::vector<int>& host_of) {
  std::map<int, std::vector<int>> by;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
    by[host_of[static_cast<std::size_t>(r)]].push_back(r);
  }
  Layout l;
  for (auto& [name, ranks] : by) {
    l.width = std::max(l.width, static_cast<int>(ranks.size()));
    l.hosts.push_back(ranks);
  }
  return l;
}

struct Expected {
  std::vector<float> out;       // the result on every rank
  std::vector<float> residual;  // this rank's new residual
};

// Deterministic codecs only (their encode ignores the seed): y = x + e of every rank.
Expected expected_of(const Codec& codec, const std::vector<float>& all_y, std::size_t n,
                     bool average, const Layout& l) {
  Expected want;
  want.out.assign(n, 0.0f);
  want.residual.assign(n, 0.0f);
  const auto w = static_cast<std::uint64_t>(l.width);
  for (int c = 0; c < l.width; ++c) {
    const std::uint64_t begin = detail::chunk_bound(n, static_cast<std::uint64_t>(c), w);
    const std::uint64_t len = detail::chunk_bound(n, static_cast<std::uint64_t>(c) + 1, w) - begin;
    // Each host's sum of the chunk, in host-rank order, compressed by its owner.
    std::vector<std::pair<int, std::vector<std::byte>>> payloads;
    for (std::size_t h = 0; h < l.hosts.size(); ++h) {
      std::vector<float> s(len);
      for (std::size_t i = 0; i < len; ++i) {
        float v = all_y[static_cast<std::size_t>(l.hosts[h][0]) * n + begin + i];
        for (std::size_t j = 1; j < l.hosts[h].size(); ++j) {
          v = v + all_y[static_cast<std::size_t>(l.hosts[h][j]) * n + begin + i];
        }
        s[i] = v;
      }
      const std::vector<float> zeros(len, 0.0f);
      std::vector<float> e_new(len);
      std::vector<std::byte> payload(codec.max_bytes(len));
      payload.resize(codec.encode_ef(s, zeros, e_new, 0, payload));
      const int owner = l.owner(c, h);
      // The host's residual split among its L ranks: r / L each, the owner r - (L - 1) (r / L).
      const auto& ranks = l.hosts[h];
      if (std::find(ranks.begin(), ranks.end(), rank()) != ranks.end()) {
        const auto L = static_cast<float>(ranks.size());
        for (std::size_t i = 0; i < len; ++i) {
          const float q = e_new[i] / L;
          want.residual[begin + i] = owner == rank() ? e_new[i] - (L - 1.0f) * q : q;
        }
      }
      payloads.emplace_back(owner, std::move(payload));
    }
    // Decoded in the owners' rank order.
    std::sort(payloads.begin(), payloads.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<float> sum(len, 0.0f);
    for (const auto& [owner, payload] : payloads) decode_add(payload, sum, 1.0f);
    std::copy(sum.begin(), sum.end(), want.out.begin() + begin);
  }
  if (average && size() > 1) {
    const float inv = 1.0f / static_cast<float>(size());
    for (float& v : want.out) v *= inv;
  }
  return want;
}

bool same_bits(const std::vector<float>& a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

AllreduceOptions two_level(bool average = false) {
  AllreduceOptions o;
  o.algorithm = Algorithm::two_level;
  o.average = average;
  o.seed = 17;
  return o;
}

TEST(TwoLevelAlgorithm, TheHostsSumsCompressedAcrossHosts) {
  const Layout l = layout_of(world().hosts());
  for (const char* spec : {"topk:ratio=0.1", "topk:ratio=0.3,values=fp16", "sign", "fp16"}) {
    const Codec codec(spec);
    for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{1001}}) {
      for (const bool average : {false, true}) {
        ErrorFeedback ef(n);
        for (std::uint32_t call = 0; call < 3; ++call) {
          const auto x = test::input(n, 100 + call + 7 * static_cast<std::uint32_t>(n));
          std::vector<float> y(n);
          for (std::size_t i = 0; i < n; ++i) y[i] = x[i] + ef.residual()[i];
          const Expected want = expected_of(codec, gathered(y), n, average, l);
          std::vector<float> out(n, -1.0f);
          world().allreduce(x, out, codec, &ef, two_level(average));
          ASSERT_EQ(world().last_stats().algorithm, Algorithm::two_level);
          EXPECT_TRUE(same_bits(want.out, out))
              << spec << " n=" << n << " average=" << average << " call " << call;
          EXPECT_TRUE(same_bits(want.residual, ef.residual()))
              << spec << " n=" << n << " average=" << average << " call " << call;
          EXPECT_TRUE(test::same_on_all_ranks(out)) << spec;
        }
      }
    }
  }
}

// Momentum factor masking (mask_momentum) zeroes a rank's velocity where its residual is zero:
// under two_level every rank of a host must have its zeros exactly where the host sent the value
// (top-k: the chunks' selections of the host's sum), its share of what was not sent elsewhere.
TEST(TwoLevelAlgorithm, EveryRankOfAHostIsZeroWhereItsHostSent) {
  const Layout l = layout_of(world().hosts());
  const std::vector<int> host_of = world().hosts();
  const Codec codec("topk:ratio=0.1");
  const std::size_t n = 1001;
  ErrorFeedback ef(n);
  for (std::uint32_t call = 0; call < 3; ++call) {
    // Every value nonzero and no two alike: only what was sent can leave a zero residual.
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>((i * 7919 + 13 * call + 1) % 10007 + 1) *
             (i % 3 == 0 ? -1.0f : 1.0f) * (1.0f + static_cast<float>(rank()) * 1e-3f);
    }
    std::vector<float> out(n);
    world().allreduce(x, out, codec, &ef, two_level());
    std::vector<float> zero(n);
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < n; ++i) {
      zero[i] = ef.residual()[i] == 0.0f ? 1.0f : 0.0f;
      zeros += ef.residual()[i] == 0.0f ? 1 : 0;
    }
    std::size_t sent = 0;
    const auto w = static_cast<std::uint64_t>(l.width);
    for (std::uint64_t c = 0; c < w; ++c) {
      sent += codec.selected(detail::chunk_bound(n, c + 1, w) - detail::chunk_bound(n, c, w));
    }
    EXPECT_EQ(zeros, sent) << "call " << call;
    const std::vector<float> all = gathered(zero);
    for (int r = 0; r < size(); ++r) {
      if (host_of[static_cast<std::size_t>(r)] != host_of[static_cast<std::size_t>(rank())]) {
        continue;
      }
      EXPECT_TRUE(
          std::equal(zero.begin(), zero.end(), all.begin() + static_cast<std::ptrdiff_t>(n) * r))
          << "rank " << rank() << " and rank " << r << " of its host, call " << call;
    }
  }
}

// Random codecs: what every rank put in (x + e) is what came out plus what the ranks keep, up
// to float32 rounding: L - 1 adds in a host's sum, e = y - D(C(y)), H - 1 adds across hosts and
// the sums checked here, each off by at most 2^-24 of the magnitudes involved.
TEST(TwoLevelAlgorithm, ErrorFeedbackLosesNothingAndACopyResumesIt) {
  const std::size_t n = 4099;
  for (const char* spec :
       {"qsgd:bits=2,bucket=64", "randomk:ratio=0.05", "terngrad", "topk:k=40"}) {
    const Codec codec(spec);
    ErrorFeedback ef(n);
    for (std::uint32_t call = 0; call < 4; ++call) {
      const auto x = test::input(n, 300 + call);
      std::vector<float> y(n);
      for (std::size_t i = 0; i < n; ++i) y[i] = x[i] + ef.residual()[i];
      const ErrorFeedback before = ef;
      std::vector<float> out(n);
      world().allreduce(x, out, codec, &ef, two_level());
      EXPECT_TRUE(test::same_on_all_ranks(out)) << spec;
      const std::vector<float> kept(ef.residual().begin(), ef.residual().end());
      const auto in_sum = test::ordered_sum(y);
      const auto kept_sum = test::ordered_sum(kept);
      std::vector<float> mag(n);
      for (std::size_t i = 0; i < n; ++i) mag[i] = std::fabs(y[i]) + std::fabs(kept[i]);
      const auto mag_sum = test::ordered_sum(mag);
      const float u = 0x1p-24f;
      for (std::size_t i = 0; i < n; ++i) {
        const float tol = static_cast<float>(size() + 4) * u * (mag_sum[i] + std::fabs(out[i]));
        ASSERT_NEAR(in_sum[i], out[i] + kept_sum[i], tol) << spec << " element " << i;
      }
      // Everything the next call needs is in the ErrorFeedback: a copy gives the same bits.
      ErrorFeedback again = before;
      std::vector<float> out2(n);
      world().allreduce(x, out2, codec, &again, two_level());
      EXPECT_TRUE(same_bits(out, out2)) << spec << " call " << call;
      EXPECT_TRUE(same_bits(kept, again.residual())) << spec << " call " << call;
    }
  }
}

// `none` on the two-level sum: integers sum exactly in any order, so MPI's sum; in place too.
TEST(TwoLevelAlgorithm, NoneIsTheExactSum) {
  const Codec none("none");
  for (const std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{70001}}) {
    const auto x = test::integers(n, 5);
    std::vector<float> out(n);
    world().allreduce(x, out, none, nullptr, two_level());
    EXPECT_EQ(out, test::mpi_sum(x)) << n;
    std::vector<float> in_place = x;
    world().allreduce(in_place, none, nullptr, two_level(true));
    auto want = test::mpi_sum(x);
    for (float& v : want) v *= 1.0f / static_cast<float>(size());
    EXPECT_EQ(in_place, want) << n;
  }
}

}  // namespace
}  // namespace gcomp
