// Data-parallel minibatch SGD with momentum through gcomp's collectives. Every rank holds the
// whole model; each step, the global batch (ranks x local batch samples of a shuffled epoch
// order shared by all ranks) is split so that rank r takes its r-th slice; the local gradients
// are averaged over ranks by Communicator::allreduce_buckets with the chosen codec and per-tensor
// error feedback, and every rank applies the same update, so the replicas stay identical. With
// periodic averaging (Config::period > 1) the ranks step on their own instead and their models
// are averaged every period steps (and at each epoch's end, before the evaluation).
//
// DGC (Lin et al., ICLR 2018) lives here because it needs the optimizer's momentum: the local
// gradient is clipped to clip / sqrt(ranks) in norm, momentum is corrected (u = m u + g,
// v = v + u), the top entries of v are sent (the rest stay in v), u and v are zeroed where sent
// (momentum factor masking), and the sparsity warms up over the first epochs: 75%, 93.75%,
// 98.4375%, 99.6%, then the target.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gcomp/communicator.hpp"
#include "gcomp/compressed_adam.hpp"
#include "idx.hpp"
#include "model.hpp"

namespace gcomp::train {

struct Config {
  std::string model = "mlp";
  std::string codec = "none";  // any gcomp codec spec, or dgc:ratio=R[,clip=C]
  bool error_feedback = true;
  int epochs = 10;
  std::size_t batch = 32;  // per rank; the global batch is ranks x batch
  double lr = 0.05;
  std::string schedule = "cosine";  // lr * (1 + cos(pi t / T)) / 2 over the T steps; or constant
  double momentum = 0.9;
  double weight_decay = 0;  // SGD's and Adam's L2 term, AdamW's decoupled decay
  // sgd (momentum SGD, the default), adam or adamw: 1-bit Adam through gcomp::CompressedAdam,
  // warmup_steps exact steps (the gradients averaged uncompressed), then the variance frozen and
  // each rank's momentum sent through the codec with error feedback.
  std::string optimizer = "sgd";
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::uint64_t warmup_steps = 0;  // adam, adamw: at least 1 (or 0 with zero_one)
  // adam, adamw: 0/1 Adam's schedule in place of the warm-up, "FREEZE[,KAPPA[,H[,DOUBLE]]]":
  // gcomp::AdamSchedule::zero_one(FREEZE, KAPPA, H, DOUBLE) (defaults 16, 16, 32). Empty: 1-bit
  // Adam after warmup_steps.
  std::string zero_one;
  int warmup_epochs = 0;          // epochs without compression first
  std::size_t dense_below = 1024; // smaller tensors (biases) are summed uncompressed
  std::size_t bucket_bytes = 25u << 20;
  std::size_t subset = 0;         // train on the first N samples only (0: all)
  std::size_t test_subset = 0;    // evaluate on the first N test samples only (0: all)
  unsigned seed = 1;
  // With error feedback: what each rank compresses. true (the default): its momentum velocity
  // m_r = mu m_r + g_r, the step being the average of what was sent (EF-SGD with momentum; a
  // residual released late is not amplified by momentum a second time). false: its gradient, the
  // average then feeding one global momentum. Without compression the two agree up to rounding
  // (the sum of momenta against the momentum of the sum; tests/mpi/trainer_test.cpp bounds it).
  bool ef_on_velocity = true;
  // With error feedback on the velocity: true compresses lr m_r (the update, as EF-SGD writes
  // it: a residual released late carries the learning rate of the steps it came from, not the
  // later, decayed one), the step being minus the average sent. Without compression the same
  // training up to rounding. `--ef-on update`.
  bool ef_scaled_by_lr = false;
  // The allreduce algorithm; none (the default): Algorithm::fewest_bytes, each call the one that
  // sends the fewest bytes for the codec by the library's byte models. Algorithm::automatic lets
  // gcomp choose by time.
  std::optional<Algorithm> algorithm;
  // Periodic model averaging (local SGD; post-local SGD with period_from; DiLoCo's outer step
  // with outer_lr and outer_momentum). Steps are counted from 0 over the run. Steps before
  // period_from are synchronized as above; from period_from on each rank takes momentum SGD
  // steps on its own gradients, sending nothing, and after every period-th local step the ranks
  // average their models: each parameter's change since the last average (its anchor) goes
  // through the codec with error feedback of its own, then anchor -= outer_lr * d (d the
  // average, or with outer_momentum Nesterov's avg + mu b, b = mu b + avg) and every rank takes
  // the anchor. period 1 (the default): every step synchronized.
  std::uint64_t period = 1;
  std::uint64_t period_from = 0;
  double outer_lr = 1.0;
  double outer_momentum = 0.0;
  // What each rank's momentum velocity does at an average: local (kept), reset (zeroed) or
  // average (its change since its own anchor averaged through the same collective).
  std::string momentum_at_average = "local";
  // Streaming averages (with period > 1; docs/python.md, "Streaming", the same rule): the
  // parameters cut into `fragments` (1 to period) of about equal elements, in their order,
  // between rows; fragment f averaged after the local steps f period / fragments, + period, ...
  // Each average merged overlap_steps (0 to period - 1) steps after it starts, its collective
  // on a thread of its own meanwhile: the fragment's values become the averaged ones on every
  // rank, and what this rank moved them in those steps goes into the fragment's next change.
  // overlap_steps >= 2 paces each average: sent in up to overlap_steps parts of about equal
  // elements, part j after the j-th step from its start (docs/python.md, "Pacing").
  std::uint64_t fragments = 1;
  std::uint64_t overlap_steps = 0;
};

struct EpochRecord {
  int epoch = 0;
  double train_loss = 0;
  double test_accuracy = 0;         // in [0, 1]
  double bytes_sent_per_rank = 0;   // cumulative, mean over ranks
  double dense_bytes_per_rank = 0;  // cumulative: what a float32 ring allreduce would send
  double compute_seconds = 0;       // cumulative, this rank
  double encode_seconds = 0;
  double comm_seconds = 0;
  double decode_seconds = 0;
  double wall_seconds = 0;          // cumulative, training only (not evaluation)
  double sparsity = 0;              // DGC: the fraction not sent this epoch
  std::uint64_t averages = 0;       // cumulative: periodic model averages (Config::period)
};

struct History {
  std::size_t parameters = 0;
  int ranks = 1;
  std::vector<EpochRecord> epochs;
};

// Checks a configuration (codec spec, DGC spec, numbers); throws gcomp::Error(invalid_argument).
void validate(const Config& c);

// The schedule of c's Adam (adam, adamw): zero_one's, or 1-bit Adam's after warmup_steps.
// Throws Error(invalid_argument) for a bad zero_one.
AdamSchedule adam_schedule(const Config& c);

// Trains model (built by the caller with Config::model and seed, identical on every rank) on
// train, evaluating on test after every epoch; on_epoch is called on every rank with each
// finished record, on_step with (step, steps per epoch). Collective over comm. Throws
// gcomp::Error on every rank if any rank's step fails.
History run(const Config& c, const Dataset& train, const Dataset& test, Communicator& comm,
            Model& model, const std::function<void(const EpochRecord&)>& on_epoch = {},
            const std::function<void(std::size_t, std::size_t)>& on_step = {});

// A warning for settings that train but are known to go wrong (error feedback with a QSGD whose
// variance bound min(d / s^2, sqrt(d) / s) is >= 1), or "" when there is none.
std::string feedback_warning(const Config& c);

// The learning rate of step (0-based) of total_steps under c.schedule.
double learning_rate(const Config& c, std::uint64_t step, std::uint64_t total_steps);

// The order in which epoch `epoch` (0-based) visits the first n_train samples: a shuffle seeded
// by c.seed and the epoch, the same on every rank.
std::vector<std::size_t> epoch_order(const Config& c, std::size_t n_train, int epoch);

// The samples rank `rank` of `ranks` trains on in step `step` of an epoch with that order: its
// slice, the rank-th of `ranks`, of the step's global batch of ranks x c.batch samples.
std::span<const std::size_t> local_batch(const Config& c, std::span<const std::size_t> order,
                                         std::size_t step, int rank, int ranks);

// The DGC sparsity warm-up: the fraction of entries sent in epoch e (0-based) for target ratio.
double dgc_ratio(int epoch, double target);

}  // namespace gcomp::train
