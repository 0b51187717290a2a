// The pieces of auto's choice that the call protocol shares with Communicator::choose and
// predict (auto_choice.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gcomp/codec.hpp"
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

}  // namespace gcomp::detail
