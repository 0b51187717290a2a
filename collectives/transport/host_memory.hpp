// Memory the ranks of one host share (a POSIX shared-memory object mapped by each), for
// two_level's steps inside a host: each rank writes its tensor once where the others read it,
// instead of sending it through the engine (on the per-host testbed, and wherever the engine
// goes over TCP inside a host, that is a kernel copy each way). Made collectively over the host's
// ranks, and only where they really share it: every rank checks what the others wrote, and the
// host's ranks agree, so that ranks named one host (GCOMP_HOST) that are not on one machine, or
// that cannot map the object, all fall back to the engine's messages. The object's name is
// removed as soon as every rank has it mapped: nothing is left behind, also after a crash.
#pragma once

#include <cstddef>
#include <memory>

#include "transport.hpp"

namespace gcomp::detail {

class HostMemory {
 public:
  // Collective over `host` (a transport over one host's ranks): at least `bytes` shared bytes,
  // or null on every rank of the host where any of them cannot share them.
  static std::unique_ptr<HostMemory> make(Net& host, std::size_t bytes);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  HostMemory(void* map, std::size_t mapped, std::byte* data, std::size_t bytes)
      : map_(map), mapped_(mapped), data_(data), bytes_(bytes) {}
  void* map_;
  std::size_t mapped_;
  std::byte* data_;
  std::size_t bytes_;
};

}  // namespace gcomp::detail
