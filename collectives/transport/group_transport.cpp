// A Net over some of another's ranks (group_transport.hpp).
#include "group_transport.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "gcomp/error.hpp"

namespace gcomp::detail {

namespace {

std::size_t element_bytes(Reduction op) { return op == Reduction::sum_float ? 4 : 8; }

// acc[i] = acc[i] op x[i] for count elements.
void combine(std::byte* acc, const std::byte* x, std::size_t count, Reduction op) {
  const auto each = [&](auto zero, auto fn) {
    using T = decltype(zero);
    for (std::size_t i = 0; i < count; ++i) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      std::memcpy(&b, x + i * sizeof(T), sizeof(T));
      a = fn(a, b);
      std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
  };
  switch (op) {
    case Reduction::sum_float:
      return each(0.0f, [](float a, float b) { return a + b; });
    case Reduction::sum_uint64:
      return each(std::uint64_t{0}, [](std::uint64_t a, std::uint64_t b) { return a + b; });
    case Reduction::max_double:
      return each(0.0, [](double a, double b) { return std::max(a, b); });
    case Reduction::max_int64:
      return each(std::int64_t{0}, [](std::int64_t a, std::int64_t b) { return std::max(a, b); });
  }
}

int position_of(const std::vector<int>& members, int parent_rank) {
  const auto it = std::lower_bound(members.begin(), members.end(), parent_rank);
  if (it == members.end() || *it != parent_rank) return -1;
  return static_cast<int>(it - members.begin());
}

class GroupTransport final : public Net {
 public:
  GroupTransport(Net& parent, std::vector<int> members, int rank)
      : Net(parent.kind(), rank, static_cast<int>(members.size())),
        parent_(parent),
        members_(std::move(members)) {
    hosts_.resize(members_.size());
    for (std::size_t i = 0; i < members_.size(); ++i) {
      const int host = parent_.hosts()[static_cast<std::size_t>(members_[i])];
      std::size_t first = 0;
      while (parent_.hosts()[static_cast<std::size_t>(members_[first])] != host) ++first;
      hosts_[i] = static_cast<int>(first);
    }
  }

  void allreduce(const void* send, void* recv, std::size_t count, Reduction op) override {
    const std::size_t bytes = count * element_bytes(op);
    Gathered all;
    Traffic t;
    allgatherv_bytes({static_cast<const std::byte*>(send), bytes}, all, t);
    std::vector<std::byte> acc(all.of(0).begin(), all.of(0).end());
    for (int r = 1; r < size(); ++r) combine(acc.data(), all.of(r).data(), count, op);
    if (bytes) std::memcpy(recv, acc.data(), bytes);
  }

  void barrier() override {
    Gathered none;
    Traffic t;
    allgatherv_bytes({}, none, t);
  }

  void allgatherv_bytes(std::span<const std::byte> mine, Gathered& out, Traffic& t) override {
    const int p = size(), me = rank();
    std::vector<std::vector<std::byte>> blocks(static_cast<std::size_t>(p));
    blocks[static_cast<std::size_t>(me)].assign(mine.begin(), mine.end());
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    for (int s = 0; s + 1 < p; ++s) {
      const auto out_block = static_cast<std::size_t>((me - s + p) % p);
      const auto in_block = static_cast<std::size_t>((me - s - 1 + 2 * p) % p);
      sendrecv_bytes(next, blocks[out_block], prev, blocks[in_block], t);
    }
    out.sizes.assign(static_cast<std::size_t>(p), 0);
    out.offsets.assign(static_cast<std::size_t>(p), 0);
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < blocks.size(); ++r) {
      out.offsets[r] = total;
      out.sizes[r] = blocks[r].size();
      total += blocks[r].size();
    }
    out.bytes.resize(static_cast<std::size_t>(total));
    for (std::size_t r = 0; r < blocks.size(); ++r) {
      std::copy(blocks[r].begin(), blocks[r].end(),
                out.bytes.begin() + static_cast<std::ptrdiff_t>(out.offsets[r]));
    }
  }

  void alltoallv_bytes(const std::vector<std::vector<std::byte>>& to,
                       std::vector<std::vector<std::byte>>& from, Traffic& t) override {
    const int p = size(), me = rank();
    if (to.size() != static_cast<std::size_t>(p)) {
      throw Error(Status::internal, "alltoallv over a group of " + std::to_string(p) +
                                        " ranks given " + std::to_string(to.size()) + " parts");
    }
    from.resize(static_cast<std::size_t>(p));
    from[static_cast<std::size_t>(me)] = to[static_cast<std::size_t>(me)];
    for (int k = 1; k < p; ++k) {
      const int dst = (me + k) % p, src = (me - k + p) % p;
      sendrecv_bytes(dst, to[static_cast<std::size_t>(dst)], src,
                     from[static_cast<std::size_t>(src)], t);
    }
  }

  void send_bytes(int to, std::span<const std::byte> send, Traffic& t) override {
    parent_.send_bytes(member(to), send, t);
  }
  void recv_bytes(int from, std::vector<std::byte>& recv, Traffic& t) override {
    parent_.recv_bytes(member(from), recv, t);
  }
  using Net::sendrecv_bytes;
  // To and from this rank itself (a group of one): a copy, as an engine would make it.
  void sendrecv_bytes(int to, std::span<const std::byte> send, int from,
                      std::vector<std::byte>& recv, Traffic& t) override {
    if (to == rank() && from == rank()) {
      recv.assign(send.begin(), send.end());
      return;
    }
    parent_.sendrecv_bytes(member(to), send, member(from), recv, t);
  }
  void shift_bytes(int to, std::span<const std::byte> send, int from,
                   std::span<std::byte> recv) override {
    if (to == rank() && from == rank()) {
      std::copy_n(send.begin(), std::min(send.size(), recv.size()), recv.begin());
      return;
    }
    parent_.shift_bytes(member(to), send, member(from), recv);
  }
  void alltoall_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                      std::size_t block) override {
    const int p = size(), me = rank();
    const auto at = [&](auto span, int r) {
      return span.subspan(static_cast<std::size_t>(r) * block, block);
    };
    std::copy_n(at(send, me).begin(), block, at(recv, me).begin());
    for (int k = 1; k < p; ++k) {
      const int dst = (me + k) % p, src = (me - k + p) % p;
      shift_bytes(dst, at(send, dst), src, at(recv, src));
    }
  }

  void agree(const std::uint64_t*, std::uint64_t*, std::size_t, std::uint64_t, const WaitLimits&,
             const std::function<std::string()>&) override {
    throw Error(Status::internal,
                "a group transport has no agreement of its own: it runs inside an agreed call");
  }

 private:
  int member(int r) const {
    if (r < 0 || r >= size()) {
      throw Error(Status::internal,
                  "rank " + std::to_string(r) + " of a group of " + std::to_string(size()));
    }
    return members_[static_cast<std::size_t>(r)];
  }

  Net& parent_;
  std::vector<int> members_;
};

}  // namespace

std::unique_ptr<Net> make_group_transport(Net& parent, std::vector<int> members) {
  const bool ascending = std::adjacent_find(members.begin(), members.end(),
                                            [](int a, int b) { return a >= b; }) == members.end();
  const bool in_range = !members.empty() && members.front() >= 0 && members.back() < parent.size();
  const int rank = ascending && in_range ? position_of(members, parent.rank()) : -1;
  if (rank < 0) {
    throw Error(Status::internal,
                "a group's members must be distinct ranks of the parent in "
                "ascending order, this rank among them");
  }
  return std::make_unique<GroupTransport>(parent, std::move(members), rank);
}

std::vector<int> host_members(const Net& parent) {
  std::vector<int> out;
  const int mine = parent.hosts()[static_cast<std::size_t>(parent.rank())];
  for (int r = 0; r < parent.size(); ++r) {
    if (parent.hosts()[static_cast<std::size_t>(r)] == mine) out.push_back(r);
  }
  return out;
}

std::vector<int> index_members(const Net& parent) {
  const std::vector<int>& hosts = parent.hosts();
  // place[r]: r's place among its host's ranks (0 for the lowest).
  std::vector<int> place(hosts.size(), 0), seen(hosts.size(), 0);
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    place[r] = seen[static_cast<std::size_t>(hosts[r])]++;
  }
  std::vector<int> out;
  const int mine = place[static_cast<std::size_t>(parent.rank())];
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    if (place[r] == mine) out.push_back(static_cast<int>(r));
  }
  return out;
}

}  // namespace gcomp::detail
