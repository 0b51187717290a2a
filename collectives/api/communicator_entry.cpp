// The ways into a Communicator from each engine: its constructors on an MPI communicator and on
// a Gloo store, the MPI communicator it runs on, and the network measured on an MPI
// communicator. The only file of the Communicator that names a transport; the call itself
// (collectives/call/) runs on whatever detail::Net it was given.
#include <memory>
#include <utility>

#include "communicator_impl.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/cost_model.hpp"
#include "gloo_transport.hpp"
#include "mpi_transport.hpp"
#include "network.hpp"

namespace gcomp {

Communicator::Communicator(MPI_Comm comm) : impl_(std::make_unique<Impl>()) {
  impl_->limits_ = Impl::checked_environment();
  impl_->init(detail::make_mpi_transport(comm), nullptr, nullptr);
}
Communicator::Communicator(MPI_Comm comm, const NetworkModel& network,
                           std::shared_ptr<Timing> timing)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits_ = Impl::checked_environment();
  impl_->init(detail::make_mpi_transport(comm), &network, std::move(timing));
}
Communicator::Communicator(gloo::rendezvous::Store& store, int rank, int size,
                           const GlooOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits_ = Impl::checked_environment();
  impl_->init(detail::make_gloo_transport(store, rank, size, options), nullptr, nullptr);
}
Communicator::Communicator(gloo::rendezvous::Store& store, int rank, int size,
                           const NetworkModel& network, std::shared_ptr<Timing> timing,
                           const GlooOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits_ = Impl::checked_environment();
  impl_->init(detail::make_gloo_transport(store, rank, size, options), &network, std::move(timing));
}

MPI_Comm Communicator::comm() const noexcept { return detail::mpi_comm_of(*impl_->net_); }

NetworkModel measure_network(MPI_Comm comm) {
  const std::unique_ptr<detail::Net> net = detail::make_mpi_transport(comm);
  return detail::measure_network(*net);
}

}  // namespace gcomp
