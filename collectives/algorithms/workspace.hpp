// The scratch memory of a Communicator's calls, owned by the Communicator and named by use: a
// few buffers every call may need (the fields below) and one set of buffers per algorithm, of
// a type the algorithm's file defines (`ws.get<SparseSplitBuffers>()`, made on first use).
//
// Every buffer keeps its capacity from call to call, so a warm Communicator allocates nothing:
// fresh memory would cost a page fault per 4 KiB on every call (8 ms for 8M floats). The bound
// on what it keeps is what the calls needed: each buffer holds at most what the largest call
// since the Communicator was made put in it, so the workspace stays within a few times 4 n
// bytes of the largest tensor n allreduced (the whole-tensor payload, x + e, the bucket's fused
// copy, and the algorithm's own: about 5 x 4n for sparse_reduce_scatter, the largest). It is
// freed with the Communicator. docs/internals.md lists the caches beside it and their bounds.
//
// A Communicator's calls do not run at the same time (MPI orders them), so one workspace is
// enough; two Communicators have two. The codecs' own scratch (compressors/) stays per thread:
// a codec is a value that any thread may use.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "gcomp/codec.hpp"

namespace gcomp::detail {

struct DeviceStage;

class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // ---- Shared by the call's steps ----
  std::vector<std::byte> payload;  // the whole-tensor payload (encode_whole)
  std::vector<float> sum;          // x + e formed before the agreement for the uncompressed path
  std::vector<float> own;          // dense: this rank's decoded payload, or x + e, sent from here
  std::vector<float> fused;        // allreduce_buckets: one bucket's tensors side by side
  ErrorFeedback bucket_feedback{0};  // and their residuals (FeedbackSlot::reuse per bucket)
  // The same for device tensors (their fused values are DeviceStage's kFused), made or reset
  // per bucket.
  std::unique_ptr<ErrorFeedback> device_bucket_feedback;
  std::vector<float> staging;      // a device tensor's host staging (n floats)
  std::vector<float> residual;     // dense on a device tensor: the residual copied to the host
  // Device memory for device tensors (payload staging, pinned host memory), made on first use.
  DeviceStage& device_stage();

  // The buffers of type T (an algorithm's, defined in its file), made on first use and kept.
  template <class T>
  T& get() {
    static const char tag = 0;
    for (Slot& s : slots_) {
      if (s.tag == &tag) return *static_cast<T*>(s.object.get());
    }
    slots_.push_back({&tag, Object(new T(), [](void* p) { delete static_cast<T*>(p); })});
    return *static_cast<T*>(slots_.back().object.get());
  }

 private:
  using Object = std::unique_ptr<void, void (*)(void*)>;
  struct Slot {
    const char* tag;
    Object object;
  };
  std::vector<Slot> slots_;
  std::unique_ptr<DeviceStage> stage_;
};

}  // namespace gcomp::detail
