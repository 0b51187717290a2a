// The Communicator's workspace (workspace.hpp).
#include "workspace.hpp"

#include "algorithms.hpp"

namespace gcomp::detail {

Workspace::Workspace() = default;
Workspace::~Workspace() = default;

DeviceStage& Workspace::device_stage() {
  if (!stage_) stage_ = std::make_unique<DeviceStage>();
  return *stage_;
}

}  // namespace gcomp::detail
