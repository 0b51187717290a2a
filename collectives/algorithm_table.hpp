// The allreduce algorithms as a table: one row per algorithm, each defined in the algorithm's
// own file beside its run function (in designated initializers). A row says what the algorithm
// is called, which codecs it runs, whether auto considers it for a codec, what the cost model
// predicts for it and how it runs on host and device tensors. The Communicator, the cost model
// and the device path read the table. Adding an algorithm: its value in gcomp::Algorithm (last,
// and kLastAlgorithm), its file (the run function and the row), the row in algorithm_table.cpp's
// list, and the file in collectives/CMakeLists.txt (docs/algorithms.md, "Adding an algorithm").
#pragma once

#include <span>

#include "algorithms.hpp"
#include "gcomp/cost_model.hpp"

namespace gcomp::detail {

struct AlgorithmRow {
  Algorithm id;
  const char* name;         // as GCOMP_ALGORITHM, AllreduceOptions and the benchmarks spell it
  const char* description;  // one line: what it sends and who sums
  // Runs only sparse codecs (top-k, random-k, threshold): its streams are (index, value)
  // entries. The others run every codec.
  bool sparse_only;
  // Whether auto weighs it for the codec ModelInput describes (in.sparse, in.codec_none).
  bool (*candidate)(const ModelInput& in);
  // The model's seconds (docs/algorithms.md derives each formula); kNotApplicable where it does
  // not apply.
  double (*predict)(const ModelInput& in);
  // The model's bytes sent per rank (payloads and the collectives' own size exchanges, not the
  // agreement), for the scaling tables.
  double (*bytes)(const ModelInput& in);
  // Host tensors: job.in / job.out.
  void (*run)(Job& job);
  // Device tensors (job.dev set): null runs `run` on the host staging and copies the result
  // to the device.
  void (*run_device)(Job& job);
};

// Every algorithm but automatic, in the order of gcomp::Algorithm. The first call checks the
// table (check_algorithm_table) and throws Error(internal) if it is wrong.
std::span<const AlgorithmRow* const> algorithm_rows();
// The row of an algorithm (not automatic).
const AlgorithmRow& algorithm_row(Algorithm a);
// Throws Error(internal) unless rows holds kAlgorithmCount - 1 rows, none null, row i's id
// i + 1, each with a distinct non-empty name, a description and the functions every row needs.
void check_algorithm_table(std::span<const AlgorithmRow* const> rows);

// Candidate rules shared by rows.
inline bool for_sparse_codecs(const ModelInput& in) { return in.sparse && !in.codec_none; }
inline bool for_dense_codecs(const ModelInput& in) { return !in.sparse && !in.codec_none; }

}  // namespace gcomp::detail
