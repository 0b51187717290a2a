// The key-value store a Gloo Communicator made from Python meets through (gcomp.Communicator's
// store=): a directory (Gloo's file store, for processes that share a file system) or any object
// with the methods of torch.distributed.Store (set(key, bytes), get(key) -> bytes, wait(keys,
// timedelta)), such as the store of torch.distributed's default group under gcomp.torch.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

namespace gloo::rendezvous {
class Store;
}

namespace gcomp::python {

// With the GIL held. The store it returns calls back into Python with the GIL taken for each
// call, so it may be used with the GIL released (the Communicator's rendezvous). A method that
// raises becomes gcomp::Error(transport) naming the key. A directory that does not exist is made.
std::unique_ptr<gloo::rendezvous::Store> make_store(pybind11::handle store);

}  // namespace gcomp::python
