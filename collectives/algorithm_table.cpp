// The algorithm table (algorithm_table.hpp): the rows in the order of gcomp::Algorithm, and the
// names, which the public algorithm_name / parse_algorithm read.
#include "algorithm_table.hpp"

#include <array>
#include <string>

#include "gcomp/error.hpp"

namespace gcomp {

namespace detail {

namespace {

constexpr std::array<const AlgorithmRow*, kAlgorithmCount - 1> kRows = {
    &kDenseRow,         &kSparseAllgatherRow, &kSparseRecursiveDoublingRow,
    &kSparseSplitRow,   &kAllgatherRow,       &kCompressedReduceScatterRow,
    &kSparseReduceScatterRow};

}  // namespace

std::span<const AlgorithmRow* const> algorithm_rows() { return kRows; }

const AlgorithmRow& algorithm_row(Algorithm a) {
  const int i = static_cast<int>(a) - 1;
  if (i < 0 || i >= static_cast<int>(kRows.size())) {
    throw Error(Status::internal, "no algorithm row for " + std::to_string(static_cast<int>(a)));
  }
  return *kRows[static_cast<std::size_t>(i)];
}

}  // namespace detail

const char* algorithm_name(Algorithm a) noexcept {
  if (a == Algorithm::automatic) return "auto";
  const int i = static_cast<int>(a) - 1;
  return i >= 0 && i < kAlgorithmCount - 1 ? detail::algorithm_rows()[static_cast<std::size_t>(i)]->name
                                           : "unknown";
}

Algorithm parse_algorithm(std::string_view name) {
  if (name == "auto") return Algorithm::automatic;
  std::string known = "auto";
  for (const detail::AlgorithmRow* row : detail::algorithm_rows()) {
    if (name == row->name) return row->id;
    known += std::string(", ") + row->name;
  }
  throw Error(Status::invalid_argument,
              "unknown algorithm '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace gcomp
