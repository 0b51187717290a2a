// The Gloo transport's device and rendezvous: the network interface it listens on (the
// discovery: GlooOptions::interface, GLOO_SOCKET_IFNAME, the host's name, else the loopback), the
// host key the locality compares, GCOMP_GLOO_SOCKETS, and a context met through the store.
#pragma once

#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <memory>
#include <string>

#include "gcomp/collective_types.hpp"
#include "gloo_util.hpp"

namespace gcomp::detail::gloo_parts {

// The device, and the IPv4 address it resolved (for the transport's own sockets; empty where
// the address is IPv6).
struct Device {
  std::shared_ptr<gloo::transport::Device> device;
  std::string ipv4;
};

// The device on GlooOptions::interface, else GLOO_SOCKET_IFNAME's first name, else the address
// of o.hostname or of the host's name, else 127.0.0.1 (one host only). Error(invalid_argument)
// for an interface that is not here.
Device make_device(const GlooOptions& o);

// This process's host, as the locality sees it: GlooOptions::host, GCOMP_HOST, else the host's
// name and network namespace.
std::string host_key(const GlooOptions& o);

// GCOMP_GLOO_SOCKETS: 1 (or unset, or empty) the transport's own sockets, 0 not; 2 for any other
// value (every rank then fails, once all have said theirs).
char sockets_setting();

// A context of `size` ranks met through the store under prefix (a full mesh of Gloo's pairs),
// within connect_timeout; its waits then unlimited.
std::shared_ptr<Context> connect(gloo::rendezvous::Store& store, const std::string& prefix,
                                 int rank, int size,
                                 const std::shared_ptr<gloo::transport::Device>& device,
                                 Ms connect_timeout);

}  // namespace gcomp::detail::gloo_parts
