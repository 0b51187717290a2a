// The two levels of a transport's ranks (levels.hpp).
#include "levels.hpp"

#include <algorithm>
#include <utility>

namespace gcomp::detail {

Levels levels_of(const Net& net) {
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

}  // namespace gcomp::detail
