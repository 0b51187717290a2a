// How every transport waits (gcomp::WaitPolicy; the Communicator resolves automatic): spin
// blocks (MPI_Wait spins on its own core without the cost of a system call); yield polls and
// yields the CPU between polls (where ranks outnumber the cores: on an oversubscribed node a
// spinning rank would steal the timeslice the rank it waits for needs, 8 ms per barrier at 4
// ranks on 2 cores against 15 us yielding); sleep polls for 20 us, then sleeps between polls,
// longer as the wait grows (beside compute on the same cores). The engines' own waits are in mpi/ and gloo/.
#pragma once

#include "gcomp/collective_types.hpp"
#include "transport.hpp"

namespace gcomp::detail {

// set_wait_mode takes spin, yield or sleep.
void set_wait_mode(WaitPolicy mode) noexcept;
// A Communicator found more ranks on its node than cores (the automatic policy then yields).
void note_oversubscribed() noexcept;
// Sets the wait mode from the policy (automatic: GCOMP_WAIT, else yield where oversubscribed,
// else spin). Throws Error(invalid_argument) for an unknown GCOMP_WAIT.
void apply_wait_policy();
WaitPolicy wait_mode() noexcept;
// Whether waits poll (yield or sleep) instead of blocking in the engine.
inline bool yielding() noexcept { return wait_mode() != WaitPolicy::spin; }

// One pause of poll_until: sched_yield, or (sleep) nothing for the first 20 us since start,
// then a nap of nap_nanoseconds(naps, the seconds since start) (naps counts them).
void pause_between_polls(int& naps, double start) noexcept;

// sleep's nap after naps naps and waited seconds of waiting: 10 us << naps, at most 100 us; in a
// long wait up to an eighth of the time waited, at most 1 ms (a wait for a rank a step behind,
// 30 ms, then polls some 50 times rather than 300, each poll an engine's progress on
// the cores the training computes on; the completion is seen at most waited / 8 late).
long nap_nanoseconds(int naps, double waited) noexcept;

// Calls done() until it returns true, between calls yielding or sleeping as the mode says.
template <class Done>
void poll_until(Done&& done) {
  int naps = 0;
  const double start = now();
  while (!done()) pause_between_polls(naps, start);
}

}  // namespace gcomp::detail
