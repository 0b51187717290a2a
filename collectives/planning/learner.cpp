// AutoLearner (learner.hpp).
#include "learner.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "algorithm_table.hpp"
#include "fnv.hpp"
#include "gcomp/error.hpp"

namespace gcomp::detail {

namespace {

constexpr std::uint64_t kGroupMask = (std::uint64_t{1} << AutoLearner::kGroupBits) - 1;
static_assert(kAlgorithmCount <= AutoLearner::kMaxAlgorithms,
              "the learner's keys hold algorithm numbers below kMaxAlgorithms");

struct Candidate {
  Choice choice;
  double predicted;
  double estimate;  // the lower quartile of its last runs, or the prediction
  std::uint32_t runs;
};

bool same(Choice a, Choice b) { return a.algorithm == b.algorithm && a.compressed == b.compressed; }

}  // namespace

std::uint64_t AutoLearner::group_of(std::string_view spec, std::size_t n) {
  const int w = std::bit_width(n);
  const std::uint64_t quarter = w >= 3 ? (n >> (w - 3)) & 3 : n;
  return (Fnv{}.add(spec).add(static_cast<std::uint64_t>(w) * 4 + quarter).h & kGroupMask) | 1;
}

std::uint64_t AutoLearner::key_of(std::uint64_t group, Choice c) {
  const int a = static_cast<int>(c.algorithm);
  if (a < 0 || a >= kMaxAlgorithms) {
    throw Error(Status::internal, "the learner has no key for algorithm " + std::to_string(a));
  }
  return group << kChoiceBits |
         (static_cast<std::uint64_t>(a) * 2 + (c.compressed ? 1 : 0));
}

void AutoLearner::record(std::uint64_t key, double seconds) {
  Learned& l = learned_[key];
  l.seconds[l.runs % kWindow] = seconds;
  ++l.runs;
  ++group_runs_[group_of_key(key)];
}

std::uint64_t AutoLearner::backoff(std::uint64_t runs) {
  return std::min(kMaxBackoff, std::bit_floor(std::max<std::uint64_t>(1, runs / kBackoffRuns)));
}

std::uint32_t AutoLearner::runs(std::uint64_t key) const {
  const auto it = learned_.find(key);
  return it == learned_.end() ? 0 : it->second.runs;
}

Choice AutoLearner::choose(std::uint64_t group, std::span<const Option> options,
                           std::uint64_t pending_key, double pending_seconds) const {
  if (options.size() > kMaxOptions) {
    throw Error(Status::internal, "the learner was given " + std::to_string(options.size()) +
                                      " options, more than " + std::to_string(kMaxOptions));
  }
  std::array<Candidate, kMaxOptions> c{};
  std::size_t m = 0;
  for (const Option& o : options) {
    if (!std::isfinite(o.predicted)) continue;
    Candidate& x = c[m++];
    x = {o.choice, o.predicted, o.predicted, 0};
    const std::uint64_t key = key_of(group, o.choice);
    const auto it = learned_.find(key);
    Learned l = it != learned_.end() ? it->second : Learned{};
    if (pending_key != 0 && key == pending_key) {
      l.seconds[l.runs % kWindow] = pending_seconds;
      ++l.runs;
    }
    if (l.runs == 0) continue;
    x.runs = l.runs;
    // The lower quartile: on a shared machine every algorithm has slow spells, and the runs of
    // different options fall at different times.
    const std::size_t kept = std::min<std::size_t>(l.runs, kWindow);
    const auto q = l.seconds.begin() + static_cast<std::ptrdiff_t>((kept - 1) / 4);
    std::nth_element(l.seconds.begin(), q, l.seconds.begin() + static_cast<std::ptrdiff_t>(kept));
    x.estimate = *q;
  }
  if (m == 0) return {detail::kUncompressed, true};
  const std::span<Candidate> all(c.data(), m);
  // A stable insertion sort (no allocation, unlike std::stable_sort): ties keep the given order.
  const auto sort_by = [&](double Candidate::*field) {
    for (std::size_t i = 1; i < m; ++i) {
      for (std::size_t j = i; j > 0 && all[j].*field < all[j - 1].*field; --j) {
        std::swap(all[j], all[j - 1]);
      }
    }
  };
  sort_by(&Candidate::predicted);
  // What is explored: within kExploreFactor of the best prediction, or of the best measured
  // estimate of an option run kTries times where that is higher. A model optimistic about its
  // favourite (predicted 10 ms, measured 45) would otherwise keep out an option predicted
  // between 2x the one and 2x the other, which may well be faster than the favourite really is.
  double base = all[0].predicted;
  double measured = std::numeric_limits<double>::infinity();
  for (const Candidate& x : all) {
    if (x.runs >= kTries) measured = std::min(measured, x.estimate);
  }
  if (std::isfinite(measured)) base = std::max(base, measured);
  const double limit = kExploreFactor * base + kExploreSlack;
  for (std::uint32_t round = 1; round <= kTries; ++round) {
    for (const Candidate& x : all) {
      if (x.predicted <= limit && x.runs < round) return x.choice;
    }
  }
  sort_by(&Candidate::estimate);
  Choice best = all[0].choice;
  for (const Candidate& x : all) {
    if (!x.choice.compressed && x.estimate <= all[0].estimate) best = x.choice;
  }
  const auto g = group_runs_.find(group);
  const std::uint64_t runs = (g != group_runs_.end() ? g->second : 0) +
                             (pending_key != 0 && group_of_key(pending_key) == group ? 1 : 0);
  // A recheck: in estimate order, among the least measured others that `fits`, the fastest.
  const auto recheck = [&](auto fits) -> const Candidate* {
    const Candidate* pick = nullptr;
    for (const Candidate& x : all) {
      if (!same(x.choice, best) && fits(x) && (!pick || x.runs < pick->runs)) pick = &x;
    }
    return pick;
  };
  const Candidate* pick = nullptr;
  const std::uint64_t thinned = backoff(runs);
  const std::uint64_t every = kRecheck * thinned;
  const std::uint64_t every_close = kRecheckClose * thinned;
  if (runs % every == every - 1) {
    pick = recheck([&](const Candidate& x) {
      return x.predicted <= limit || x.estimate <= kExploreFactor * all[0].estimate;
    });
  } else if (runs % every_close == every_close - 1) {
    pick = recheck(
        [&](const Candidate& x) { return x.runs > 0 && x.estimate <= kClose * all[0].estimate; });
  }
  return pick ? pick->choice : best;
}

}  // namespace gcomp::detail
