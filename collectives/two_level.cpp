// The two levels of a transport's ranks and the steps inside a host (two_level.hpp).
#include "two_level.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "algorithms.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

Levels levels_of(const Transport& net) {
  const std::vector<int>& of = net.hosts();
  std::vector<int> names(of.begin(), of.end());  // each host named by its lowest rank
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<std::vector<int>> ranks(names.size());
  for (int r = 0; r < net.size(); ++r) {
    const auto h = std::lower_bound(names.begin(), names.end(), of[static_cast<std::size_t>(r)]);
    ranks[static_cast<std::size_t>(h - names.begin())].push_back(r);
  }
  Levels l;
  l.hosts = static_cast<int>(names.size());
  l.width = 1;
  for (const auto& rs : ranks) l.width = std::max(l.width, static_cast<int>(rs.size()));
  const auto mine = static_cast<std::size_t>(
      std::lower_bound(names.begin(), names.end(), of[static_cast<std::size_t>(net.rank())]) -
      names.begin());
  l.host_ranks = ranks[mine];
  l.local = static_cast<int>(std::find(l.host_ranks.begin(), l.host_ranks.end(), net.rank()) -
                             l.host_ranks.begin());
  l.owners.assign(static_cast<std::size_t>(l.width), {});
  for (int c = 0; c < l.width; ++c) {
    for (const auto& rs : ranks) {
      l.owners[static_cast<std::size_t>(c)].push_back(rs[static_cast<std::size_t>(c) % rs.size()]);
    }
    if (l.owners[static_cast<std::size_t>(c)][mine] == net.rank()) {
      l.owned.push_back(c);
      std::vector<int> group = l.owners[static_cast<std::size_t>(c)];
      std::sort(group.begin(), group.end());
      l.chunk_groups.push_back(std::move(group));
    }
  }
  return l;
}

namespace {

void check_host(const Transport& host, const Levels& l, const char* who) {
  if (host.size() != static_cast<int>(l.host_ranks.size()) || host.rank() != l.local) {
    throw Error(Status::internal, std::string(who) + ": the host's transport has " +
                                      std::to_string(host.size()) + " ranks; the host " +
                                      std::to_string(l.host_ranks.size()));
  }
}

// The chunks local rank j of the host owns: j, j + L, ... < W.
template <class F>
void each_owned_by(const Levels& l, int j, F f) {
  const int L = static_cast<int>(l.host_ranks.size());
  for (int c = j; c < l.width; c += L) f(c);
}

std::span<const float> floats_of(std::span<const std::byte> b) {
  return {reinterpret_cast<const float*>(b.data()), b.size() / sizeof(float)};
}

[[noreturn]] void bad_size(const char* who, int from, std::size_t got, std::size_t want) {
  throw Error(Status::bad_payload, std::string(who) + ": host rank " + std::to_string(from) +
                                       " sent " + std::to_string(got) + " bytes, not " +
                                       std::to_string(want));
}

}  // namespace

void host_reduce_scatter(Transport& host, const Levels& l, std::span<const float> x,
                         std::vector<std::vector<float>>& sums, Traffic& t) {
  check_host(host, l, "host_reduce_scatter");
  const std::uint64_t n = x.size();
  const auto W = static_cast<std::uint64_t>(l.width);
  const int L = host.size();
  std::vector<std::vector<std::byte>> to(static_cast<std::size_t>(L)), from;
  for (int j = 0; j < L; ++j) {
    auto& out = to[static_cast<std::size_t>(j)];
    each_owned_by(l, j, [&](int c) {
      const std::uint64_t b = chunk_bound(n, static_cast<std::uint64_t>(c), W);
      const std::uint64_t e = chunk_bound(n, static_cast<std::uint64_t>(c) + 1, W);
      const auto* p = reinterpret_cast<const std::byte*>(x.data() + b);
      out.insert(out.end(), p, p + (e - b) * sizeof(float));
    });
  }
  host.alltoallv_bytes(to, from, t);
  const std::size_t mine = to[static_cast<std::size_t>(l.local)].size();
  for (int j = 0; j < L; ++j) {
    const std::size_t got = from[static_cast<std::size_t>(j)].size();
    if (got != mine) bad_size("host_reduce_scatter", j, got, mine);
  }
  sums.assign(l.owned.size(), {});
  std::size_t offset = 0;  // in floats, within each rank's message to this one
  for (std::size_t k = 0; k < l.owned.size(); ++k) {
    const auto c = static_cast<std::uint64_t>(l.owned[k]);
    const std::size_t len = chunk_bound(n, c + 1, W) - chunk_bound(n, c, W);
    std::vector<float>& s = sums[k];
    const auto first = floats_of(from[0]).subspan(offset, len);
    s.assign(first.begin(), first.end());
    for (int j = 1; j < L; ++j) {
      const auto piece = floats_of(from[static_cast<std::size_t>(j)]).subspan(offset, len);
      for (std::size_t i = 0; i < len; ++i) s[i] = s[i] + piece[i];
    }
    offset += len;
  }
}

void host_allgather(Transport& host, const Levels& l, const std::vector<std::vector<float>>& chunks,
                    std::span<float> out, Traffic& t) {
  check_host(host, l, "host_allgather");
  const std::uint64_t n = out.size();
  const auto W = static_cast<std::uint64_t>(l.width);
  const auto len_of = [&](int c) {
    return static_cast<std::size_t>(chunk_bound(n, static_cast<std::uint64_t>(c) + 1, W) -
                                    chunk_bound(n, static_cast<std::uint64_t>(c), W));
  };
  if (chunks.size() != l.owned.size()) {
    throw Error(Status::internal, "host_allgather: " + std::to_string(chunks.size()) +
                                      " chunks for " + std::to_string(l.owned.size()) + " owned");
  }
  std::vector<std::byte> mine;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    if (chunks[k].size() != len_of(l.owned[k])) {
      throw Error(Status::internal, "host_allgather: chunk " + std::to_string(l.owned[k]) +
                                        " has " + std::to_string(chunks[k].size()) + " elements");
    }
    const auto* p = reinterpret_cast<const std::byte*>(chunks[k].data());
    mine.insert(mine.end(), p, p + chunks[k].size() * sizeof(float));
  }
  Gathered all;
  host.allgatherv_bytes(mine, all, t);
  for (int j = 0; j < host.size(); ++j) {
    std::size_t want = 0;
    each_owned_by(l, j, [&](int c) { want += len_of(c) * sizeof(float); });
    const auto got = all.of(j);
    if (got.size() != want) bad_size("host_allgather", j, got.size(), want);
    std::size_t offset = 0;
    each_owned_by(l, j, [&](int c) {
      const std::size_t len = len_of(c);
      if (len == 0) return;  // an empty chunk (n < W), whose memory may be null
      std::memcpy(out.data() + chunk_bound(n, static_cast<std::uint64_t>(c), W),
                  got.data() + offset, len * sizeof(float));
      offset += len * sizeof(float);
    });
  }
}

}  // namespace gcomp::detail
