// sparse_allgather: the allgather path for sparse codecs (top-k, random-k, threshold): every
// rank's (index, value) payload goes to every rank and each adds all of them, in rank order.
// Each decode touches only its k entries, so past the zeroing of the output the work is O(P k).
// Simple and latency-light, but the bytes grow with P: it loses to the reducing algorithms
// (recursive doubling, split) once the merged supports overlap or P is large.
//
// Schedule: as allgather: one allgather of sizes, one allgatherv of payloads; each rank sends
// (P-1) * (k (index + value bytes) + header) bytes and receives the same from the others.
#include "algorithm_table.hpp"
#include "model_terms.hpp"

namespace gcomp::detail {

void allgather_payloads(Job& job);

static void run_sparse_allgather(Job& job) { allgather_payloads(job); }


extern const AlgorithmRow kSparseAllgatherRow = {
    .id = Algorithm::sparse_allgather,
    .name = "sparse_allgather",
    .description = "allgatherv of the sparse payloads, each rank decoding all of them in rank "
                   "order",
    .sparse_only = true,
    .candidate = for_sparse_codecs,
    .predict = predict_payload_allgather,
    .bytes = bytes_payload_allgather,
    .run = run_sparse_allgather,
    .run_device = run_allgather_device,
};

}  // namespace gcomp::detail
