// Adam, AdamW and the halves of 1-bit and 0/1 Adam's steps (include/gcomp/adam.hpp) on 1-D
// float32 arrays: numpy arrays or contiguous torch CPU tensors, or CUDA arrays (torch CUDA
// tensors, gcomp.DeviceArray, anything with DLPack or __cuda_array_interface__), one call's all
// in one memory, changed in place with the GIL released; on CUDA arrays the library's kernel runs
// on the call's stream= (queued, not waited for). And gcomp.AdamSchedule
// (include/gcomp/compressed_adam.hpp). gcomp.torch runs its parameters' stages through them.
#include "gcomp/adam.hpp"

#include <string>

#include "binding.hpp"
#include "gcomp/compressed_adam.hpp"

namespace gcomp::python {

namespace {

gcomp::AdamSettings settings_of(double beta1, double beta2, double eps, double weight_decay,
                                bool decoupled) {
  return {.beta1 = beta1,
          .beta2 = beta2,
          .eps = eps,
          .weight_decay = weight_decay,
          .decoupled = decoupled};
}

void adam_step(py::handle param, py::handle grad, py::handle exp_avg, py::handle exp_avg_sq,
               double lr, py::handle step, double beta1, double beta2, double eps,
               double weight_decay, bool decoupled, py::handle variance_steps, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(param, "param", Elem::float32, true, &st);
  const Held g(grad, "grad", Elem::float32, false, &st);
  const Held m(exp_avg, "exp_avg", Elem::float32, true, &st);
  const Held v(exp_avg_sq, "exp_avg_sq", Elem::float32, true, &st);
  const std::uint64_t t = to_count(step, "step");
  const std::uint64_t tv =
      variance_steps.is_none() ? 0 : to_count(variance_steps, "variance_steps");
  const auto s = settings_of(beta1, beta2, eps, weight_decay, decoupled);
  const DeviceScope scope(same_memory({&p, &g, &m, &v}, st));
  py::gil_scoped_release nogil;
  gcomp::adam_step(p.float_view(), g.float_view(), m.float_view(), v.float_view(), s, lr, t, tv);
}

void adam_sync_momentum(py::handle param, py::handle anchor, py::handle exp_avg_sq, py::handle out,
                        double lr_sum, double decay, py::handle variance_steps, double beta2,
                        double eps, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(param, "param", Elem::float32, false, &st);
  const Held a(anchor, "anchor", Elem::float32, false, &st);
  const Held v(exp_avg_sq, "exp_avg_sq", Elem::float32, false, &st);
  const Held o(out, "out", Elem::float32, true, &st);
  const std::uint64_t tv = to_count(variance_steps, "variance_steps");
  const auto s = settings_of(0.9, beta2, eps, 0.0, false);
  const DeviceScope scope(same_memory({&p, &a, &v, &o}, st));
  py::gil_scoped_release nogil;
  gcomp::adam_sync_momentum(p.float_view(), a.float_view(), v.float_view(), o.float_view(), s,
                            lr_sum, decay, tv);
}

void adam_sync_update(py::handle param, py::handle anchor, py::handle momentum, py::handle exp_avg,
                      py::handle exp_avg_sq, double lr_sum, double decay, py::handle step,
                      py::handle variance_steps, double beta1, double beta2, double eps,
                      py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(param, "param", Elem::float32, true, &st);
  const Held a(anchor, "anchor", Elem::float32, true, &st);
  const Held u(momentum, "momentum", Elem::float32, false, &st);
  const Held m(exp_avg, "exp_avg", Elem::float32, true, &st);
  const Held v(exp_avg_sq, "exp_avg_sq", Elem::float32, false, &st);
  const std::uint64_t t = to_count(step, "step");
  const std::uint64_t tv = to_count(variance_steps, "variance_steps");
  const auto s = settings_of(beta1, beta2, eps, 0.0, false);
  const DeviceScope scope(same_memory({&p, &a, &u, &m, &v}, st));
  py::gil_scoped_release nogil;
  gcomp::adam_sync_update(p.float_view(), a.float_view(), u.float_view(), m.float_view(),
                          v.float_view(), s, lr_sum, decay, t, tv);
}

std::string schedule_repr(const gcomp::AdamSchedule& s) {
  return "gcomp.AdamSchedule(warmup_steps=" + std::to_string(s.warmup_steps) +
         ", refreshes_per_interval=" + std::to_string(s.refreshes_per_interval) +
         ", freeze_step=" + std::to_string(s.freeze_step) +
         ", max_local_steps=" + std::to_string(s.max_local_steps) +
         ", local_double_every=" + std::to_string(s.local_double_every) + ")";
}

gcomp::AdamSchedule checked(gcomp::AdamSchedule s) {
  s.check();
  return s;
}

void adam_local_momentum(py::handle param, py::handle grad, py::handle exp_avg, py::handle out,
                         double beta1, double weight_decay, bool decoupled, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(param, "param", Elem::float32, false, &st);
  const Held g(grad, "grad", Elem::float32, false, &st);
  const Held m(exp_avg, "exp_avg", Elem::float32, false, &st);
  const Held o(out, "out", Elem::float32, true, &st);
  const auto s = settings_of(beta1, 0.999, 1e-8, weight_decay, decoupled);
  const DeviceScope scope(same_memory({&p, &g, &m, &o}, st));
  py::gil_scoped_release nogil;
  gcomp::adam_local_momentum(p.float_view(), g.float_view(), m.float_view(), o.float_view(), s);
}

void adam_frozen_update(py::handle param, py::handle momentum, py::handle exp_avg,
                        py::handle exp_avg_sq, double lr, py::handle step,
                        py::handle variance_steps, double beta1, double beta2, double eps,
                        double weight_decay, bool decoupled, py::handle stream) {
  const CallStream st = to_stream(stream);
  const Held p(param, "param", Elem::float32, true, &st);
  const Held u(momentum, "momentum", Elem::float32, false, &st);
  const Held m(exp_avg, "exp_avg", Elem::float32, true, &st);
  const Held v(exp_avg_sq, "exp_avg_sq", Elem::float32, false, &st);
  const std::uint64_t t = to_count(step, "step");
  const std::uint64_t tv = to_count(variance_steps, "variance_steps");
  const auto s = settings_of(beta1, beta2, eps, weight_decay, decoupled);
  const DeviceScope scope(same_memory({&p, &u, &m, &v}, st));
  py::gil_scoped_release nogil;
  gcomp::adam_frozen_update(p.float_view(), u.float_view(), m.float_view(), v.float_view(), s, lr,
                            t, tv);
}

// The adam_ functions.
void bind_adam_functions(py::module_& m) {
  m.def("adam_step", &adam_step, py::arg("param"), py::arg("grad"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::kw_only(), py::arg("lr"), py::arg("step"),
        py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
        py::arg("weight_decay") = 0.0, py::arg("decoupled") = false,
        py::arg("variance_steps") = py::none(), py::arg("stream") = py::none(),
        "adam_step(param, grad, exp_avg, exp_avg_sq, *, lr, step, beta1=0.9, beta2=0.999,\n"
        "          eps=1e-8, weight_decay=0.0, decoupled=False, variance_steps=None,\n"
        "          stream=None) -> None\n\n"
        "One step of exact Adam (AdamW's weight decay when decoupled), torch.optim's formula,\n"
        "in place on param and the moments; step counts from 1. 1-D float32 arrays of one size,\n"
        "all host memory or all CUDA memory (then the library's kernel, queued on stream: a\n"
        "cudaStream_t as an int, or a torch.cuda.Stream; None: the default stream);\n"
        "gcomp.Error(\"invalid_argument\") naming a bad value. The other adam_ functions take\n"
        "arrays and stream= alike.\n"
        "variance_steps (None: step): the variance's updates, this one included, where it has\n"
        "had fewer than the momentum (0/1 Adam's refresh): its own bias correction, and the\n"
        "step bounded as adam_frozen_update bounds it.");
  m.def("adam_local_momentum", &adam_local_momentum, py::arg("param"), py::arg("grad"),
        py::arg("exp_avg"), py::arg("out"), py::kw_only(), py::arg("beta1") = 0.9,
        py::arg("weight_decay") = 0.0, py::arg("decoupled") = false, py::arg("stream") = py::none(),
        "adam_local_momentum(param, grad, exp_avg, out, *, beta1=0.9, weight_decay=0.0,\n"
        "                    decoupled=False, stream=None) -> None\n\n"
        "1-bit Adam's compressed stage, before the collective: out = beta1 exp_avg + (1 - beta1)\n"
        "g, g = grad (+ weight_decay param for Adam's L2 decay), this rank's momentum to send.\n"
        "out may be grad; exp_avg is not changed.");
  m.def("adam_frozen_update", &adam_frozen_update, py::arg("param"), py::arg("momentum"),
        py::arg("exp_avg"), py::arg("exp_avg_sq"), py::kw_only(), py::arg("lr"), py::arg("step"),
        py::arg("variance_steps"), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
        py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.0, py::arg("decoupled") = false,
        py::arg("stream") = py::none(),
        "adam_frozen_update(param, momentum, exp_avg, exp_avg_sq, *, lr, step, variance_steps,\n"
        "                   beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,\n"
        "                   decoupled=False, stream=None) -> None\n\n"
        "1-bit Adam's compressed stage, after the collective: exp_avg = momentum (the ranks'\n"
        "average) and param moves with the variance as frozen, whose bias correction is that\n"
        "of its variance_steps updates (1 <= variance_steps <= step).");
  m.def("adam_sync_momentum", &adam_sync_momentum, py::arg("param"), py::arg("anchor"),
        py::arg("exp_avg_sq"), py::arg("out"), py::kw_only(), py::arg("lr_sum"), py::arg("decay"),
        py::arg("variance_steps"), py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
        py::arg("stream") = py::none(),
        "adam_sync_momentum(param, anchor, exp_avg_sq, out, *, lr_sum, decay, variance_steps,\n"
        "                   beta2=0.999, eps=1e-8, stream=None) -> None\n\n"
        "0/1 Adam's synchronization after local steps, before the collective: out = (decay\n"
        "anchor - param) * (sqrt(v^) + eps) / lr_sum, this rank's way since the anchor (the\n"
        "parameters the last synchronization left) as a momentum. lr_sum: the steps' learning\n"
        "rates summed (> 0); decay: their AdamW factors 1 - lr wd multiplied (1 for Adam).");
  m.def(
      "adam_sync_update", &adam_sync_update, py::arg("param"), py::arg("anchor"),
      py::arg("momentum"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::kw_only(),
      py::arg("lr_sum"), py::arg("decay"), py::arg("step"), py::arg("variance_steps"),
      py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
      py::arg("stream") = py::none(),
      "adam_sync_update(param, anchor, momentum, exp_avg, exp_avg_sq, *, lr_sum, decay, step,\n"
      "                 variance_steps, beta1=0.9, beta2=0.999, eps=1e-8, stream=None) -> None\n\n"
      "After the collective (momentum: the ranks' average of adam_sync_momentum's out):\n"
      "param = anchor = decay anchor - lr_sum * momentum / (sqrt(v^) + eps) within exact\n"
      "Adam's bound, exp_avg = momentum * (1 - beta1^step); the same on every rank.");
}

// AdamSchedule: which steps refresh the variance and which synchronize.
void bind_adam_schedule(py::module_& m) {
  py::class_<gcomp::AdamSchedule>(
      m, "AdamSchedule",
      "AdamSchedule(warmup_steps=1, refreshes_per_interval=0, freeze_step=0,\n"
      "             max_local_steps=1, local_double_every=1)\n\n"
      "Which steps of 1-bit or 0/1 Adam refresh the variance (an exact step on the float32\n"
      "average) and which synchronize the ranks, by the step alone (1 for the first):\n"
      "steps 1..warmup_steps exact; then a refresh every 2nd step for refreshes_per_interval\n"
      "refreshes, every 4th for as many, ... until freeze_step (0/1 Adam's kappa and\n"
      "var_freeze_step; 0 refreshes: the variance frozen, 1-bit Adam); after\n"
      "max(warmup_steps, freeze_step), with max_local_steps > 1, local steps: the ranks step\n"
      "on their own momenta and synchronize every step for local_double_every steps, every\n"
      "2nd for as many, ... at most every max_local_steps-th. one_bit(W) and zero_one(...)\n"
      "make the two schedules; gcomp.torch takes one as variance=.")
      .def(py::init([](std::uint64_t warmup_steps, std::uint64_t refreshes_per_interval,
                       std::uint64_t freeze_step, std::uint64_t max_local_steps,
                       std::uint64_t local_double_every) {
             return checked({.warmup_steps = warmup_steps,
                             .refreshes_per_interval = refreshes_per_interval,
                             .freeze_step = freeze_step,
                             .max_local_steps = max_local_steps,
                             .local_double_every = local_double_every});
           }),
           py::kw_only(), py::arg("warmup_steps") = 1, py::arg("refreshes_per_interval") = 0,
           py::arg("freeze_step") = 0, py::arg("max_local_steps") = 1,
           py::arg("local_double_every") = 1)
      .def_static(
          "one_bit",
          [](std::uint64_t warmup_steps) {
            return checked(gcomp::AdamSchedule::one_bit(warmup_steps));
          },
          py::arg("warmup_steps"),
          "one_bit(warmup_steps) -> AdamSchedule: 1-bit Adam's, warmup_steps exact steps and\n"
          "the variance frozen after them.")
      .def_static(
          "zero_one",
          [](std::uint64_t freeze_step, std::uint64_t kappa, std::uint64_t max_local_steps,
             std::uint64_t local_double_every) {
            return checked(gcomp::AdamSchedule::zero_one(freeze_step, kappa, max_local_steps,
                                                         local_double_every));
          },
          py::arg("freeze_step"), py::arg("kappa") = 16, py::arg("max_local_steps") = 16,
          py::arg("local_double_every") = 32,
          "zero_one(freeze_step, kappa=16, max_local_steps=16, local_double_every=32)\n"
          "-> AdamSchedule: 0/1 Adam's, kappa exact steps, then kappa refreshes at each\n"
          "doubling interval until freeze_step, then local steps.")
      .def_readonly("warmup_steps", &gcomp::AdamSchedule::warmup_steps)
      .def_readonly("refreshes_per_interval", &gcomp::AdamSchedule::refreshes_per_interval)
      .def_readonly("freeze_step", &gcomp::AdamSchedule::freeze_step)
      .def_readonly("max_local_steps", &gcomp::AdamSchedule::max_local_steps)
      .def_readonly("local_double_every", &gcomp::AdamSchedule::local_double_every)
      .def("frozen_after", &gcomp::AdamSchedule::frozen_after,
           "max(warmup_steps, freeze_step): the last step that may refresh the variance.")
      .def("variance_steps", &gcomp::AdamSchedule::variance_steps, py::arg("step"),
           "The refreshes among steps 1..step.")
      .def("refreshes", &gcomp::AdamSchedule::refreshes, py::arg("step"))
      .def("local", &gcomp::AdamSchedule::local, py::arg("step"),
           "Whether the ranks step on their own at this step.")
      .def("synchronizes", &gcomp::AdamSchedule::synchronizes, py::arg("step"),
           "Whether the ranks are synchronized after this step.")
      .def(
          "as_dict",
          [](const gcomp::AdamSchedule& s) {
            py::dict d;
            d["warmup_steps"] = s.warmup_steps;
            d["refreshes_per_interval"] = s.refreshes_per_interval;
            d["freeze_step"] = s.freeze_step;
            d["max_local_steps"] = s.max_local_steps;
            d["local_double_every"] = s.local_double_every;
            return d;
          },
          "The five fields as a dict (AdamSchedule(**d) makes it again).")
      .def("__eq__",
           [](const gcomp::AdamSchedule& a, const gcomp::AdamSchedule& b) {
             return a.warmup_steps == b.warmup_steps &&
                    a.refreshes_per_interval == b.refreshes_per_interval &&
                    a.freeze_step == b.freeze_step && a.max_local_steps == b.max_local_steps &&
                    a.local_double_every == b.local_double_every;
           })
      .def("__repr__", &schedule_repr);
}

}  // namespace

void bind_adam(py::module_& m) {
  bind_adam_functions(m);
  bind_adam_schedule(m);
}

}  // namespace gcomp::python
