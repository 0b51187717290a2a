// The second half of a data-parallel SGD step (train.hpp describes the whole): once every rank
// holds its local gradients in its parameters' grad, they are exchanged through gcomp (codec,
// error feedback on the velocity or on the gradient, or DGC), momentum is applied, and the values
// move. Separate from the training loop so that the update rules can be tested on gradients a
// test chooses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/compressed_adam.hpp"
#include "layers.hpp"
#include "train.hpp"

namespace gcomp::train {

// "dgc:ratio=R[,clip=C]" parsed; anything else is not DGC (on = false). Throws Error naming the
// spec for a malformed DGC spec.
struct Dgc {
  bool on = false;
  double ratio = 0.001;
  double clip = 0;
};
Dgc parse_dgc(const std::string& spec);

class Optimizer {
 public:
  // The state (velocities, error-feedback memories, DGC accumulations) of params, all zero.
  // The params must outlive the Optimizer.
  Optimizer(const Config& c, std::vector<Param*> params);

  // One step, collective over comm: the params' grad (consumed) averaged over ranks as the
  // configuration says, then values -= lr * step. compress: false in warm-up epochs (float32,
  // dense); dgc_density: the fraction DGC sends this epoch (dgc_ratio()); step_index seeds the
  // codec's draws. Adds the bytes sent and the seconds spent to stats.
  void step(Communicator& comm, double lr, bool compress, double dgc_density,
            std::uint64_t step_index, EpochRecord& stats);

  // 0/1 Adam's local steps: averages the ranks' parameters now (CompressedAdam::synchronize),
  // collective, so that every rank evaluates the same model; nothing where they agree.
  void synchronize(Communicator& comm, EpochRecord& stats);

 private:
  void dgc_step(Communicator& comm, double lr, double density, const AllreduceOptions& opt,
                EpochRecord& stats);
  void adam_step(Communicator& comm, double lr, const BucketOptions& bucket, EpochRecord& stats);
  void momentum_update(std::size_t i, float lr);

  Config c_;
  Dgc dgc_;
  std::vector<Param*> params_;
  std::vector<std::vector<float>> velocity_;
  std::vector<ErrorFeedback> memories_;
  std::vector<ErrorFeedback*> efs_;
  // DGC: each large tensor's error feedback, where its velocities accumulate (empty for the
  // tensors below dense_below, which go dense).
  std::vector<ErrorFeedback> dgc_memories_;
  std::vector<std::span<float>> grads_;
  std::vector<MatrixShape> shapes_;  // the parameters' (for the low-rank codecs)
  Codec none_;
  Codec codec_;
  bool velocity_ef_;
  BucketOptions bucket_;
  // adam, adamw: 1-bit Adam, made at the first step (its algorithm depends on the ranks).
  std::optional<CompressedAdam> adam_;
};

}  // namespace gcomp::train
