// The Gloo transport (transport_gloo.cpp): processes that meet through a key-value store. Only the
// ways in (collectives/api/) and the Gloo transport's own files include this header.
#pragma once

#include <memory>

#include "gcomp/collective_types.hpp"
#include "transport.hpp"

namespace gloo::rendezvous {
class Store;
}

namespace gcomp::detail {

// Collective over the `size` processes meeting through store under options.prefix. In a build
// without Gloo: Error(invalid_argument).
std::unique_ptr<Net> make_gloo_transport(gloo::rendezvous::Store& store, int rank, int size,
                                         const GlooOptions& options);

}  // namespace gcomp::detail
