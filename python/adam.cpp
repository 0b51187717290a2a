// Adam, AdamW and 1-bit Adam's two halves (include/gcomp/adam.hpp) on host arrays: 1-D float32
// numpy arrays or contiguous torch CPU tensors, changed in place with the GIL released.
// gcomp.torch runs its CPU parameters' compressed stage through them.
#include "gcomp/adam.hpp"

#include "binding.hpp"

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
               double weight_decay, bool decoupled) {
  const Held p(param, "param", Elem::float32, true);
  const Held g(grad, "grad", Elem::float32, false);
  const Held m(exp_avg, "exp_avg", Elem::float32, true);
  const Held v(exp_avg_sq, "exp_avg_sq", Elem::float32, true);
  const std::uint64_t t = to_count(step, "step");
  const auto s = settings_of(beta1, beta2, eps, weight_decay, decoupled);
  py::gil_scoped_release nogil;
  gcomp::adam_step(p.floats(), g.floats(), m.floats(), v.floats(), s, lr, t);
}

void adam_local_momentum(py::handle param, py::handle grad, py::handle exp_avg, py::handle out,
                         double beta1, double weight_decay, bool decoupled) {
  const Held p(param, "param", Elem::float32, false);
  const Held g(grad, "grad", Elem::float32, false);
  const Held m(exp_avg, "exp_avg", Elem::float32, false);
  const Held o(out, "out", Elem::float32, true);
  const auto s = settings_of(beta1, 0.999, 1e-8, weight_decay, decoupled);
  py::gil_scoped_release nogil;
  gcomp::adam_local_momentum(p.floats(), g.floats(), m.floats(), o.floats(), s);
}

void adam_frozen_update(py::handle param, py::handle momentum, py::handle exp_avg,
                        py::handle exp_avg_sq, double lr, py::handle step,
                        py::handle variance_steps, double beta1, double beta2, double eps,
                        double weight_decay, bool decoupled) {
  const Held p(param, "param", Elem::float32, true);
  const Held u(momentum, "momentum", Elem::float32, false);
  const Held m(exp_avg, "exp_avg", Elem::float32, true);
  const Held v(exp_avg_sq, "exp_avg_sq", Elem::float32, false);
  const std::uint64_t t = to_count(step, "step");
  const std::uint64_t tv = to_count(variance_steps, "variance_steps");
  const auto s = settings_of(beta1, beta2, eps, weight_decay, decoupled);
  py::gil_scoped_release nogil;
  gcomp::adam_frozen_update(p.floats(), u.floats(), m.floats(), v.floats(), s, lr, t, tv);
}

}  // namespace

void bind_adam(py::module_& m) {
  m.def("adam_step", &adam_step, py::arg("param"), py::arg("grad"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::kw_only(), py::arg("lr"), py::arg("step"),
        py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8,
        py::arg("weight_decay") = 0.0, py::arg("decoupled") = false,
        "adam_step(param, grad, exp_avg, exp_avg_sq, *, lr, step, beta1=0.9, beta2=0.999,\n"
        "          eps=1e-8, weight_decay=0.0, decoupled=False) -> None\n\n"
        "One step of exact Adam (AdamW's weight decay when decoupled), torch.optim's formula,\n"
        "in place on param and the moments; step counts from 1. 1-D float32 arrays or torch CPU\n"
        "tensors of one size; gcomp.Error(\"invalid_argument\") naming a bad value.");
  m.def("adam_local_momentum", &adam_local_momentum, py::arg("param"), py::arg("grad"),
        py::arg("exp_avg"), py::arg("out"), py::kw_only(), py::arg("beta1") = 0.9,
        py::arg("weight_decay") = 0.0, py::arg("decoupled") = false,
        "adam_local_momentum(param, grad, exp_avg, out, *, beta1=0.9, weight_decay=0.0,\n"
        "                    decoupled=False) -> None\n\n"
        "1-bit Adam's compressed stage, before the collective: out = beta1 exp_avg + (1 - beta1)\n"
        "g, g = grad (+ weight_decay param for Adam's L2 decay), this rank's momentum to send.\n"
        "out may be grad; exp_avg is not changed.");
  m.def("adam_frozen_update", &adam_frozen_update, py::arg("param"), py::arg("momentum"),
        py::arg("exp_avg"), py::arg("exp_avg_sq"), py::kw_only(), py::arg("lr"), py::arg("step"),
        py::arg("variance_steps"), py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
        py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.0, py::arg("decoupled") = false,
        "adam_frozen_update(param, momentum, exp_avg, exp_avg_sq, *, lr, step, variance_steps,\n"
        "                   beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,\n"
        "                   decoupled=False) -> None\n\n"
        "1-bit Adam's compressed stage, after the collective: exp_avg = momentum (the ranks'\n"
        "average) and param moves with the variance as frozen, whose bias correction is that\n"
        "of its variance_steps updates (1 <= variance_steps <= step).");
}

}  // namespace gcomp::python
