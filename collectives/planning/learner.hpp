// What auto learns from its own calls (docs/algorithms.md, "Learning from its own calls"): the
// whole-call seconds of each (codec, size group, algorithm, compressed) it ran, and from them, with
// the cost model's predictions for what it has not measured, the next choice. Pure bookkeeping,
// no MPI: the Communicator feeds it only agreed numbers, so every rank holds the same state and
// makes the same choice.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>

#include "gcomp/collective_types.hpp"

namespace gcomp::detail {

// A candidate and the model's seconds for it.
struct Option {
  Choice choice;
  double predicted = 0;
};

class AutoLearner {
 public:
  // Exploration: the options the model puts within kExploreFactor of its best (+ kExploreSlack,
  // since at small sizes its latency terms are least accurate), or of the best measured estimate
  // of an option that has run kTries times where that is higher, run in rounds, cheapest
  // prediction first, until each has run kTries times (rounds, so that the first calls' warm-up
  // does not fall on one option alone). Then the lower quartile of each option's last kWindow runs
  // decides (the model's prediction where nothing was measured; the uncompressed allreduce wins
  // ties); and every kRecheck-th run of a group goes to the least-measured other option within
  // those bounds or within kExploreFactor of the best estimate, so that neither a run at a bad
  // moment nor a slow spell rules an algorithm out for good. Near ties are rechecked more often:
  // every kRecheckClose-th run (between those) goes to the least-measured option whose estimate is
  // within kClose of the best's. A near tie is where runs early in a job decide wrongly most
  // easily (with error feedback the residuals grow over the first tens of calls, and what some
  // algorithms send grows with them) and where a recheck costs least: at most (kClose - 1) /
  // kRecheckClose, about 1%. Rechecks thin out as a group's runs grow, so that exploration does
  // not go on at the same rate for a whole job: the intervals double at 512, 1024 and 2048 runs
  // (kBackoffRuns x 2, 4, 8), to every 256th and every 64th run from there on.
  static constexpr std::size_t kWindow = 8;
  static constexpr std::uint32_t kTries = 3;
  static constexpr double kExploreFactor = 2.0;
  static constexpr double kExploreSlack = 1e-3;
  static constexpr std::uint64_t kRecheck = 32;
  static constexpr std::uint64_t kRecheckClose = 8;
  static constexpr double kClose = 1.1;
  static constexpr std::uint64_t kBackoffRuns = 256;
  static constexpr std::uint64_t kMaxBackoff = 8;
  // The factor the recheck intervals have grown by after a group's `runs`: 1, 2, 4 or 8.
  static std::uint64_t backoff(std::uint64_t runs);

  // A key is (group, algorithm, compressed): the choice in the lower kChoiceBits (the algorithm
  // number times 2, plus 1 if compressed), the group above. Any algorithm number below
  // kMaxAlgorithms fits, whatever the table grows to (checked against kAlgorithmCount at compile
  // time).
  static constexpr int kChoiceBits = 16;
  static constexpr int kGroupBits = 63 - kChoiceBits;
  static constexpr int kMaxAlgorithms = 1 << (kChoiceBits - 1);
  // The most options choose() weighs: each algorithm compressed, and the uncompressed allreduce.
  static constexpr std::size_t kMaxOptions = static_cast<std::size_t>(kAlgorithmCount) + 1;

  // Calls whose sizes lie within a quarter octave (about 19%) of each other share a group: (spec,
  // bit width of n, the two bits after the leading one), hashed to kGroupBits bits, never 0.
  static std::uint64_t group_of(std::string_view spec, std::size_t n);
  // Never 0 (which means "nothing") and below 2^63 (the agreement's MPI_MAX compares signed).
  // Throws Error(internal) for an algorithm number outside [0, kMaxAlgorithms).
  static std::uint64_t key_of(std::uint64_t group, Choice c);
  // The group a key belongs to.
  static std::uint64_t group_of_key(std::uint64_t key) { return key >> kChoiceBits; }

  // One run's seconds (the slowest rank's, agreed).
  void record(std::uint64_t key, double seconds);

  // The next choice among `options` (at most kMaxOptions, in the order ties should go; more
  // throw Error(internal) rather than drop one), for `group`; with pending_key != 0 as if
  // record(pending_key, pending_seconds) had happened first.
  Choice choose(std::uint64_t group, std::span<const Option> options,
                std::uint64_t pending_key = 0, double pending_seconds = 0) const;

  std::uint32_t runs(std::uint64_t key) const;

 private:
  struct Learned {
    std::array<double, kWindow> seconds{};  // the last runs', oldest overwritten first
    std::uint32_t runs = 0;
  };
  std::unordered_map<std::uint64_t, Learned> learned_;
  std::unordered_map<std::uint64_t, std::uint64_t> group_runs_;
};

}  // namespace gcomp::detail
