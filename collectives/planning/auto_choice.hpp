// The pieces of auto's choice that the call protocol shares with Communicator::choose and
// predict (call/choose.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gcomp/codec.hpp"
#include "gcomp/collective_types.hpp"
#include "gcomp/cost_model.hpp"

namespace gcomp::detail {

// Tensors within a factor of two share a measurement of the codec's speeds; at most 16M
// elements are measured. Device tensors' speeds (the GPU's codec) are kept apart from the host's.
std::uint64_t calibration_key(const Codec& codec, std::size_t n, bool device = false);

// The cost model's input for a call of this codec on n elements whose largest payload holds
// `sent` entries (sparse codecs) in `bytes` bytes.
ModelInput model_input(const Codec& codec, std::size_t n, std::uint64_t sent, std::uint64_t bytes,
                       int ranks, const NetworkModel& net, const ComputeModel& compute,
                       bool average, bool ef);

// The entries (the codec's k; 0 for dense codecs) and payload bytes a call is expected to have
// before any payload exists.
std::uint64_t default_sent(const Codec& codec, std::size_t n);
std::uint64_t default_bytes(const Codec& codec, std::size_t n, std::uint64_t sent);

// The calling thread's CPU time in seconds (user and system: CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_seconds() noexcept;

// What a call cost this rank, as auto learns it (Timing::call_seconds' `seconds`): its thread's
// CPU time where the waits spin or yield (`mode`), the call is on host tensors and the library
// runs one thread; else its wall time. A spinning or yielding wait keeps its core unless another
// thread wants it, so the CPU time is the wait where the cores are free (a slow link) and only
// the work where they are shared (ranks beside training threads on few cores), where a call's
// wall time counts the time other threads had the core. A sleeping wait uses no CPU, device
// work is not the thread's, and the library's other threads are not counted: wall time.
double learned_cost(WaitPolicy mode, int threads, bool device, double wall, double cpu) noexcept;

}  // namespace gcomp::detail
