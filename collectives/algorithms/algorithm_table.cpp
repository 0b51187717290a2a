// The algorithm table (algorithm_table.hpp): the rows in the order of gcomp::Algorithm, and the
// names, which the public algorithm_name / parse_algorithm read.
#include "algorithm_table.hpp"

#include <array>
#include <string>
#include <string_view>

#include "fnv.hpp"
#include "gcomp/error.hpp"

namespace gcomp {

namespace detail {

// The rows, each defined in its algorithm's file (as `extern const`), listed in enum order.
extern const AlgorithmRow kDenseRow;
extern const AlgorithmRow kSparseAllgatherRow;
extern const AlgorithmRow kSparseRecursiveDoublingRow;
extern const AlgorithmRow kSparseSplitRow;
extern const AlgorithmRow kAllgatherRow;
extern const AlgorithmRow kCompressedReduceScatterRow;
extern const AlgorithmRow kSparseReduceScatterRow;
extern const AlgorithmRow kLowRankRow;
extern const AlgorithmRow kTwoLevelRow;

namespace {

constexpr std::array<const AlgorithmRow*, kAlgorithmCount - 1> kRows = {
    &kDenseRow,     &kSparseAllgatherRow,         &kSparseRecursiveDoublingRow, &kSparseSplitRow,
    &kAllgatherRow, &kCompressedReduceScatterRow, &kSparseReduceScatterRow,     &kLowRankRow,
    &kTwoLevelRow,
};

}  // namespace

void check_algorithm_table(std::span<const AlgorithmRow* const> rows) {
  const auto fail = [](const std::string& what) {
    throw Error(Status::internal, "the algorithm table is wrong: " + what);
  };
  int votes = 0;
  if (rows.size() != static_cast<std::size_t>(kAlgorithmCount - 1)) {
    fail(std::to_string(rows.size()) + " rows for " + std::to_string(kAlgorithmCount - 1) +
         " algorithms");
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const AlgorithmRow* row = rows[i];
    const std::string at = "row " + std::to_string(i);
    if (row == nullptr) fail(at + " is missing");
    if (static_cast<std::size_t>(row->id) != i + 1) {
      fail(at + " has algorithm " + std::to_string(static_cast<int>(row->id)) + ", not " +
           std::to_string(i + 1));
    }
    if (row->name == nullptr || *row->name == '\0' || std::string_view(row->name) == "auto" ||
        std::string_view(row->name) == "fewest_bytes") {
      fail(at + " has no name of its own");
    }
    if (row->description == nullptr || *row->description == '\0') fail(at + " has no description");
    if (!row->candidate || !row->predict || !row->bytes || !row->run) {
      fail(at + " (" + row->name + ") lacks a function");
    }
    if (!row->join_state != !row->split_state) {
      fail(at + " (" + row->name + ") has one of join_state and split_state");
    }
    if (row->state_signature && !row->join_state) {
      fail(at + " (" + row->name + ") has a state_signature but no state in the ErrorFeedback");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (std::string_view(rows[j]->name) == row->name) fail(at + " repeats " + row->name);
    }
    votes += row->majority_vote;
  }
  if (votes != 1) fail(std::to_string(votes) + " rows run majority_vote, not 1");
}

std::uint64_t StateStore::States::signature() const {
  Fnv h;
  bool any = false;
  for (const auto& m : of) {
    const std::uint64_t sig = m ? m->signature() : 0;
    any = any || sig != 0;
    h.add(sig);
  }
  return any ? h.h | 1 : 0;
}

void StateStore::States::forget() {
  for (const auto& m : of) {
    if (m) m->forget();
  }
}

StateStore::States& StateStore::of(std::uint64_t key, bool sparse_codec) {
  if (const auto it = map_.find(key); it != map_.end()) return it->second;
  if (map_.size() >= kMaxTensors) map_.clear();  // bounded: forget them all
  States& m = map_[key];
  for (const AlgorithmRow* row : algorithm_rows()) {
    if (row->make_state && (sparse_codec || !row->sparse_only)) {
      m.of[static_cast<int>(row->id)] = row->make_state();
    }
  }
  return m;
}

std::span<const AlgorithmRow* const> algorithm_rows() {
  static const bool checked = (check_algorithm_table(kRows), true);
  (void)checked;
  return kRows;
}

const AlgorithmRow& algorithm_row(Algorithm a) {
  const int i = static_cast<int>(a) - 1;
  if (i < 0 || i >= kAlgorithmCount - 1) {
    throw Error(Status::internal, "no algorithm row for " + std::to_string(static_cast<int>(a)));
  }
  return *algorithm_rows()[static_cast<std::size_t>(i)];
}

const AlgorithmRow& majority_vote_row() {
  for (const AlgorithmRow* row : algorithm_rows()) {
    if (row->majority_vote) return *row;
  }
  throw Error(Status::internal, "no algorithm row runs majority_vote");
}

}  // namespace detail

const char* algorithm_name(Algorithm a) noexcept {
  if (a == Algorithm::automatic) return "auto";
  if (a == Algorithm::fewest_bytes) return "fewest_bytes";
  const int i = static_cast<int>(a) - 1;
  return i >= 0 && i < kAlgorithmCount - 1 ? detail::algorithm_rows()[static_cast<std::size_t>(i)]->name
                                           : "unknown";
}

Algorithm parse_algorithm(std::string_view name) {
  if (name == "auto") return Algorithm::automatic;
  if (name == "fewest_bytes") return Algorithm::fewest_bytes;
  std::string known = "auto, fewest_bytes";
  for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
    if (name == row->name) return row->id;
    known += std::string(", ") + row->name;
  }
  throw Error(Status::invalid_argument,
              "unknown algorithm '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace gcomp
