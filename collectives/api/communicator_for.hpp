// The Communicator of an MPI communicator, for the C API and the interposer: kept in an
// attribute of that communicator, so it is made on the first call (collectively: every rank
// makes that call) and freed with the communicator.
#pragma once

#include <mpi.h>

#include "gcomp/communicator.hpp"

namespace gcomp::detail {

Communicator& communicator_for(MPI_Comm comm);

}  // namespace gcomp::detail
