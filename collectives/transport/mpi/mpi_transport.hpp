// The MPI transport (transport_mpi.cpp): made from an MPI program's communicator. Only the ways in
// (collectives/api/) and the MPI transport's own files include this header.
#pragma once

#include <mpi.h>

#include <memory>

#include "transport.hpp"

namespace gcomp::detail {

// Collective over comm, which it duplicates (errors return, never abort).
std::unique_ptr<Net> make_mpi_transport(MPI_Comm comm);
// The duplicate an MPI transport runs on; MPI_COMM_NULL for any other transport.
MPI_Comm mpi_comm_of(const Net& net) noexcept;

}  // namespace gcomp::detail
