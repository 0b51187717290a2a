// What a gcomp::Communicator holds (its pimpl), and the call protocol's steps over it. The state
// is grouped as PowerSGDState groups its: what the ranks agreed at creation, what auto learns,
// the algorithms' states, and the statistics. The protocol (communicator.cpp; its steps in
// docs/algorithms.md, "The call protocol"); auto's side is choose.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "agreement.hpp"
#include "algorithm_table.hpp"
#include "algorithms.hpp"
#include "gcomp/communicator.hpp"
#include "gcomp/cost_model.hpp"
#include "learner.hpp"
#include "stall_report.hpp"
#include "transport.hpp"
#include "workspace.hpp"

namespace gcomp {

namespace detail {
// A call on device tensors: the protocol's in and out are then host staging of n floats.
struct DeviceCall {
  const DeviceBackend* dev;
  void* stream;
  const float* in;
  float* out;
};
// Device tensors (allreduce_buckets' TensorView forms): every tensor (and ErrorFeedback) in
// this backend's memory, on this stream; the spans then hold device addresses.
struct OnDevice {
  const DeviceBackend* dev;
  void* stream;
};
}  // namespace detail

struct Communicator::Impl {
  Impl() = default;
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The limits and the wait policy from the environment, checked before a transport is made.
  static detail::WaitLimits checked_environment();
  // Collective over the transport's ranks: measures (or takes) the network and the shared
  // speeds, and agrees them by MAX.
  void init(std::unique_ptr<detail::Net> net, const NetworkModel* given,
            std::shared_ptr<Timing> timing);

  // ---- Agreed at creation ----
  std::unique_ptr<detail::Net> net_;  // MPI (a duplicate) or Gloo (transport.hpp)
  int rank_ = 0;
  int size_ = 1;
  NetworkModel network_;
  // Where the ranks are (two_level's model): hosts, the most ranks on one, the network inside
  // a host (zeros: not measured, as network_).
  int hosts_ = 1;
  int ranks_per_host_ = 1;
  NetworkModel host_network_;
  // The cost model's input told where the ranks are (defined in choose.cpp).
  void place(ModelInput& in) const;
  std::shared_ptr<Timing> timing_;  // where auto's numbers come from
  double reduce_speed_ = 0;         // seconds per float32 element summed
  double merge_speed_ = 0;          // seconds per sparse entry merged

  // ---- What auto learns (collectives/planning/learner.hpp), fed only agreed numbers ----
  std::unique_ptr<detail::AutoLearner> learner_ = std::make_unique<detail::AutoLearner>();
  std::uint64_t pending_key_ = 0;  // the last call's key and seconds, still to be agreed
  double pending_seconds_ = 0;
  // Per codec spec and size class (calibration_key): the agreed codec speeds. One entry per
  // (spec, size class, host or device) seen; a size class is a power of two, so at most 61 x 2
  // per spec.
  std::unordered_map<std::uint64_t, ComputeModel> calibrated_;

  // ---- The algorithms' states of tensors (bounded: StateStore::kMaxTensors) ----
  detail::StateStore states_;

  // ---- The calls' scratch memory (workspace.hpp: no allocation once warm, and its bound) ----
  detail::Workspace ws_;

  // ---- Statistics ----
  CallStats last_;
  TotalStats total_;

  // ---- A rank that does not come (stall_report.hpp; the transport watches its agreement) ----
  detail::WaitLimits limits_;
  std::uint64_t calls_ = 0;  // the calls made, each numbered in the agreement
  std::string broken_;       // set by a timeout: what every later call throws

  // ---- auto (choose.cpp) ----
  ComputeModel compute_model(const Codec& codec, std::size_t n);
  // Collective: the codec's encode and decode speeds measured by every rank at once (on
  // device_input's device and stream when it is a device view), the slowest agreed and kept
  // in calibrated_ under key.
  ComputeModel measure_agreed(const Codec& codec, std::size_t n,
                              TensorView<const float> device_input, std::uint64_t key);
  ComputeModel with_shared_speeds(ComputeModel c) const;  // reduce and merge from creation
  // What auto decides about a call: the one rule a call's expect and decide and the public
  // choose() share. The model's seconds for every candidate (from these numbers: agreed ones,
  // or before the agreement this rank's), weighed by what the learner measured of the group;
  // with_pending: also count the last call's own, not yet agreed, time.
  struct AutoQuery {
    const Codec& codec;
    std::size_t n;
    std::uint64_t sent;   // entries a sparse payload holds (the codec's k, where not known)
    std::uint64_t bytes;  // whole-tensor payload bytes
    ComputeModel compute;
    bool average = false;
    bool error_feedback = false;
    bool allow_uncompressed = false;
    std::span<const MatrixShape> shapes = {};  // the tensors' shapes, where given
  };
  // considered: where given, the options weighed and their predicted seconds (the timeline's).
  Choice auto_choice(const AutoQuery& q, bool with_pending = false,
                     std::vector<detail::Option>* considered = nullptr) const;

  // ---- The call protocol (communicator.cpp) ----
  // One allreduce: `abandoned` set means this rank cannot take part and only tells the others;
  // `device` set means a call on device tensors (in and out are then its host staging). Its
  // steps: docs/algorithms.md, "The call protocol".
  void call(std::span<const float> in, std::span<float> out, const Codec* codec, ErrorFeedback* ef,
            const AllreduceOptions& opt, const Error* abandoned, std::uint64_t extra_signature,
            const detail::DeviceCall* device = nullptr, std::span<const MatrixShape> shapes = {});

  // ---- allreduce_buckets' two kinds of call (bucketing.cpp) ----
  // One bucket: its tensors (their residuals, and what the algorithms keep beside them) fused
  // into the workspace (on the device for device tensors), one call, everything copied back.
  void reduce_bucket(std::span<const std::span<float>> tensors,
                     std::span<const std::size_t> members, const Codec& codec,
                     std::span<ErrorFeedback* const> efs, const AllreduceOptions& opt,
                     std::uint64_t sig, std::span<const MatrixShape> shapes,
                     const detail::OnDevice* device);
  // allreduce_buckets, with shapes (shaped) or without: the plan, then each bucket, then the
  // small tensors. `bad_views` set: the views could not be taken (every rank throws it).
  void buckets(std::span<const std::span<float>> tensors, std::span<const MatrixShape> shapes,
               bool shaped, const Codec& codec, std::span<ErrorFeedback* const> efs,
               const BucketOptions& options, const detail::OnDevice* device = nullptr,
               const std::string& bad_views = {});
  // allreduce_buckets' TensorView forms: the views as spans of their addresses, then buckets().
  void view_buckets(std::span<const TensorView<float>> tensors, std::span<const MatrixShape> shapes,
                    bool shaped, const Codec& codec, std::span<ErrorFeedback* const> efs,
                    const BucketOptions& options);
  // The small tensors: one more bucket, summed uncompressed.
  void reduce_small(std::span<const std::span<float>> tensors, std::span<const std::size_t> small,
                    AllreduceOptions opt, std::uint64_t sig, const detail::OnDevice* device);
  // The fused bucket of len elements where the call will read it: `in_place` (the tensors' own
  // memory, where they lie in one run) when not null, else the workspace's host vector, or
  // DeviceStage's kFused, for device tensors; device calls also get their host staging.
  float* fused_for(std::size_t len, const detail::OnDevice* device, float* in_place);
  // Copies a tensor's bytes between its memory and the fused bucket's.
  static void move_bytes(void* dst, const void* src, std::size_t bytes,
                         const detail::OnDevice* device);

  struct Call;  // one call's state through the steps
  static void check_arguments(const Call& c, std::span<const float> in, std::span<float> out);
  Algorithm resolve_algorithm(const Codec& codec, const AllreduceOptions& opt, std::size_t n) const;
  static void make_job(Call& c, std::span<const float> in, std::span<float> out);
  static bool expect(Call& c);
  static void prepare(Call& c, std::span<const float> in, std::span<float> out);
  static detail::Agreement agree(Call& c);
  static Algorithm decide(Call& c, const detail::Agreement& all);
  static void run(Call& c, Algorithm alg);
  static void record(Call& c, Algorithm alg);
  // The call's span on a timeline (gcomp/timeline.hpp): what it ran and auto's choice, or that it
  // failed (alg null).
  static void trace(Call& c, const Algorithm* alg);
};

}  // namespace gcomp
