// A rank that does not come to a call (Communicator::set_stall_seconds): the agreement's wait,
// watched. Every call starts with the agreement (agreement.hpp), a small allreduce that no rank
// leaves until all have come, so a rank that is late, stuck or gone shows there. This file holds
// the MPI transport's watch; what every transport's watch shares (the limits, the messages) is
// in ../stall_report.hpp, the Gloo transport's watch in ../gloo/.
//
// MPI:
// While a rank waits at the agreement it polls the request and, every millisecond, its own
// duplicate communicator for questions. Past half the first limit (the stall or the timeout
// seconds, whichever is sooner) it asks every other rank "where are you?" (a query holding its
// call number); a rank waiting at an agreement answers with the number of the call it waits at,
// and a rank elsewhere (computing, stuck outside gcomp) does not answer until it next waits at
// one, when the asker, if still waiting, learns it has come. Past the stall seconds it prints
// once, to stderr, which call it waits at and where each absent rank is; past the timeout it
// throws Error(timeout) saying the same. Nothing is sent while calls go on in time: the cost in
// a normal call is an MPI_Test loop in place of one blocking MPI_Allreduce, one MPI_Iprobe a
// millisecond, and one when the agreement completes (which drops questions and answers that
// came too late to matter).
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "gcomp/error.hpp"
#include "stall_report.hpp"
#include "transport.hpp"

namespace gcomp::detail {

class StallWatch {
 public:
  StallWatch() = default;
  ~StallWatch();  // frees the duplicate (unless MPI is finalized)
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // Collective over comm: the duplicate the questions and answers travel on.
  void init(MPI_Comm comm);

  // Waits until `request` (this rank's agreement of call number `call`) completes, answering
  // other ranks' questions meanwhile, reporting and timing out as `limits` say. describe()
  // names the call for the messages (asked only when one is written). Throws Error(timeout); the
  // request is then still active and the caller must keep it and its buffers.
  void wait(MPI_Request& request, std::uint64_t call, const WaitLimits& limits,
            const std::function<std::string()>& describe);

 private:
  using Message = std::array<std::uint64_t, 2>;
  // Receives one message that has arrived into m (its source and tag in st); false when none.
  bool receive(Message& m, MPI_Status& st);
  // Receives what has arrived: answers each question with `call`, and records the answers to
  // this rank's question about `call` in where_ (other answers are stale: dropped).
  void serve(std::uint64_t call);
  void send(int to, int tag, std::uint64_t a, std::uint64_t b);
  // Receives and drops what has arrived: once every rank has come, questions about a call and
  // their answers are stale (so none is left unreceived when MPI is finalized).
  void drop();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::int64_t> where_;  // per rank: the call it answered it waits at, or -1
  std::deque<Message> out_;          // the buffers of sends in flight, with their requests
  std::deque<MPI_Request> sends_;
};

}  // namespace gcomp::detail
