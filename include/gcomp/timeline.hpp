// A timeline of a process's gcomp calls as Chrome trace events (the JSON that Perfetto and
// chrome://tracing open): per call its encode, agreement, wire and decode, and what auto chose
// with its predicted and measured seconds (docs/timeline.md). Off by default; GCOMP_TIMELINE=FILE
// turns it on for any program (C++, C, Python, the interposer) when its first Communicator is
// made, and gcomp.torch's timeline=FILE through open(). Each rank writes its own file (path_for),
// held in a buffer of at most kBufferBytes, written out when full and at exit (or close()); the
// ranks' files are merged into one by scripts/timeline. Events are on one clock, CLOCK_MONOTONIC
// (now(); Python's time.monotonic()), written as wall-clock microseconds so that ranks on other
// hosts line up as well as their clocks do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gcomp::timeline {

// The most bytes of events held before they are written to the file.
inline constexpr std::size_t kBufferBytes = std::size_t{1} << 20;

// Whether a timeline is being written (one relaxed load: what a call costs with it off).
bool on() noexcept;

// rank's file for FILE: FILE without a trailing ".json", then ".RANK.json"
// ("run.json" -> "run.3.json").
std::string path_for(std::string_view file, int rank);

// Starts writing this process's events to path_for(file, rank) (created or truncated), rank the
// events' process. Throws gcomp::Error(invalid_argument) if the file cannot be made; a second
// open of the same file does nothing, of another throws invalid_argument.
void open(std::string_view file, int rank);

// GCOMP_TIMELINE=FILE: open(FILE, rank) unless a timeline is on; nothing without it. Called by
// every Communicator's constructor.
void open_from_environment(int rank);

// Writes what is held and the closing bracket; the timeline is off after it. Also at exit.
void close();

// Stops recording (on() false) without closing the file, and starts again: a window of a job on
// its timeline (the steps after the warm-up), or a benchmark of what recording costs.
void pause() noexcept;
void resume() noexcept;

// The file being written ("" when off).
std::string path();

// Seconds on the events' clock (CLOCK_MONOTONIC).
double now() noexcept;

// A complete event on the calling thread from start to end (now()'s seconds): name, category
// and args, the members of a JSON object already formatted ("\"n\":4,\"codec\":\"none\"") or
// empty. Nothing when off. Spans on one thread must nest: each one inside the last one still
// open, or after it.
void span(std::string_view name, std::string_view category, double start, double end,
          std::string_view args = {});

// An asynchronous event (one that may end on another thread, or overlap others): phase 'b'
// (begins) or 'e' (ends), matched by category and id. Nothing when off.
void async(char phase, std::string_view name, std::string_view category, std::uint64_t id,
           double t, std::string_view args = {});

// Names the calling thread's track (a metadata event). Nothing when off.
void thread_name(std::string_view name);

// A string as a JSON string literal, quotes included.
std::string quoted(std::string_view s);

// Events written (to the file or the buffer) since open.
std::uint64_t events();

}  // namespace gcomp::timeline
