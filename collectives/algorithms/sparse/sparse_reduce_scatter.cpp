// sparse_reduce_scatter: a sparse allreduce whose bytes per rank do not grow with P, after
// Ok-Topk (Li and Hoefler, PPoPP 2022). The result is the sum over ranks at the k indices of
// largest |sum| (k: the most entries any rank sent, the codec's k for top-k), not the sum over
// the union of the ranks' selections: a global top-k.
//
//   1. Regions: the index range is cut into P regions, region j owned by rank j, balanced by
//      where the ranks' selections fell in this tensor's previous call (its owners report the
//      quartiles of what they received; equal regions on a first call). Every rank derives the
//      same boundaries from the same gathered data, and the agreement checks that they do.
//   2. Sparse reduce-scatter: each rank sends the entries of region j to rank j (all-to-all);
//      owner j sums its P pieces in rank order (sparse merges; dense past SparCML's byte rule).
//   3. Global re-selection by a shared threshold: owner j keeps the entries of its region with
//      |sum| >= theta, at most its cap (1.5 x 1.1 k / P + 16) of them, the largest. theta is the
//      previous call's estimate, set to keep about 1.1 k entries; on a first call (or after the
//      ranks' estimates differed) the owners' histograms of |sum| (1/8 octave bins) are summed
//      in one allreduce and theta is the edge of the bin where 1.1 k is reached. The cap bounds
//      what a theta set on the previous call can cost when the sums have grown since: with
//      error feedback the residuals, and with them the sums, grow over a job's first tens of
//      calls, and the selected entries' sums lie in a narrow band, so a theta one call behind
//      would keep every entry received (up to about 3.5 k at 4 ranks) on each of those calls.
//   4. Allgather of the kept entries (with each owner's quartiles, the |sum| of the last entry
//      it kept where its cap cut, and a histogram of what it held back just below theta). Every
//      rank then holds the same K entries and keeps the k largest (|sum|, then the lower
//      index). That is the global top-k of the sums when K >= k and the k-th largest beats
//      every cut; otherwise a second allgather brings every entry the owners held back down to
//      the k-th largest gathered (or, where fewer than k came because the sums shrank since
//      theta was set, down to where their histograms reach 1.1 k), after which it is. So the
//      result is exactly the global top-k, every call. The next theta is the 1.1 k-th largest
//      |sum| gathered (its level), lowered by the level's ratio to the previous call's where it
//      shrank (at most halved): a call short of k costs a second allgather, one over it at most
//      the caps.
//
// Error feedback: each rank's residual takes back its own contribution at every index that was
// not kept (where the result is zero), so the sum of the results and of all residuals is the sum
// of the inputs. Without error feedback the contributions at dropped indices are lost, as with
// any sparsifier.
//
// Schedule: 1 all-to-all (each rank sends its k entries outside its own region, (P-1)/P k
// entries, and 8 bytes per peer), 1 allgatherv (each rank sends its kept entries, about 1.1 k /
// P, and 104 bytes of report, to P-1 ranks), and on a first call one allreduce of 16 KiB. Bytes
// per rank: about 2.1 k (P-1)/P entries + 112 (P-1) bytes, for any P; while the sums grow, at
// most about 2.4 k (P-1)/P entries (the caps).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "algorithm_table.hpp"
#include "device_backend.hpp"
#include "fnv.hpp"
#include "gcomp/error.hpp"
#include "model_terms.hpp"
#include "sparse_vector.hpp"

namespace gcomp::detail {

// What the algorithm remembers of a tensor between calls (a TensorState, algorithm_table.hpp):
// the region boundaries balanced by where the ranks' selections fell last time, and the global
// threshold estimate (with the level it came from). Every rank derives it from the same gathered
// data, so every rank holds the same.
struct SparseRegions final : TensorState {
  std::vector<std::uint64_t> bound;  // P + 1 boundaries; empty: P equal regions
  double threshold = 0;              // keep |sum| >= threshold; 0: unknown (found this call)
  double level = 0;                  // the previous call's 1.1 k-th largest |sum|; 0: unknown
  std::uint64_t signature() const override;  // a hash of the three (0 when all are unset)
  void forget() override {
    bound.clear();
    threshold = 0;
    level = 0;
  }
};

namespace {

constexpr int kQuartiles = 3;  // the points owners report between their region's ends
constexpr int kBelow = 16;     // half-octave bins of |sum| just below theta
constexpr double kAim = 1.1;   // theta aims at kAim * k kept entries
constexpr double kCap = 1.5;   // an owner keeps at most kCap * kAim * k / P + kCapSlack
constexpr std::uint64_t kCapSlack = 16;
constexpr int kHistShift = 20;  // first-call histogram bin: the float bits of |sum| >> 20
constexpr std::size_t kHistBins = std::size_t{1} << (31 - kHistShift);

// What each owner reports beside its kept entries.
struct Report {
  std::uint64_t received;            // entries it received (with multiplicity)
  std::uint64_t points[kQuartiles];  // the indices at 1/4, 2/4, 3/4 of them
  std::uint32_t below[kBelow];       // |sum| in [theta 2^-(i+1)/2, theta 2^-i/2), not kept
  float cut;                         // where the cap cut: the |sum| of the last entry kept
  std::uint32_t capped;              // 1 where the cap cut, else 0 (and cut is 0)
};
static_assert(sizeof(Report) == 104);

[[noreturn]] void bad_report(const std::string& why) {
  throw Error(Status::bad_payload, "bad sparse_reduce_scatter report from a peer: " + why);
}

// The boundaries whose regions hold equal shares of the received entries, from the owners'
// reports: a piecewise-linear count over [0, n) through each region's ends and quartiles.
std::vector<std::uint64_t> balanced_bounds(const std::vector<std::uint64_t>& old,
                                           const std::vector<Report>& reports, std::uint64_t n) {
  const std::size_t p = reports.size();
  std::vector<double> x, y;  // the count's knots: position, entries before it
  x.reserve(p * (kQuartiles + 2));
  y.reserve(x.capacity());
  double total = 0;
  for (std::size_t j = 0; j < p; ++j) {
    const double m = static_cast<double>(reports[j].received);
    x.push_back(static_cast<double>(old[j]));
    y.push_back(total);
    for (int q = 0; q < kQuartiles; ++q) {
      x.push_back(static_cast<double>(reports[j].points[q]));
      y.push_back(total + m * (q + 1) / (kQuartiles + 1));
    }
    total += m;
  }
  x.push_back(static_cast<double>(n));
  y.push_back(total);
  if (total <= 0) return even_bounds(n, p);
  std::vector<std::uint64_t> b(p + 1);
  b[0] = 0;
  b[p] = n;
  std::size_t k = 1;
  for (std::size_t j = 1; j < p; ++j) {
    const double want = total * static_cast<double>(j) / static_cast<double>(p);
    while (k + 1 < y.size() && y[k] < want) ++k;
    const double dy = y[k] - y[k - 1];
    const double at = dy > 0 ? x[k - 1] + (x[k] - x[k - 1]) * (want - y[k - 1]) / dy : x[k];
    b[j] = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(std::llround(at)), b[j - 1], n);
  }
  return b;
}

// |v|'s bin in the first-call histogram, and a bin's lower edge.
std::size_t hist_bin(float v) { return std::bit_cast<std::uint32_t>(std::fabs(v)) >> kHistShift; }
double bin_edge(std::size_t bin) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bin << kHistShift));
}

template <class F>
void for_each_entry(const SparseVector& s, F&& f) {
  if (s.full) {
    for (std::uint64_t i = 0; i < s.n; ++i) f(i, s.val[i]);
  } else {
    for (std::size_t j = 0; j < s.idx.size(); ++j) f(s.idx[j], s.val[j]);
  }
}

// A gathered entry, ordered by |sum| descending, then index ascending: a strict total order, so
// every rank cuts the same k.
struct Ranked {
  float mag;
  std::uint64_t idx;
  bool operator<(const Ranked& o) const { return mag > o.mag || (mag == o.mag && idx < o.idx); }
};

}  // namespace

std::uint64_t SparseRegions::signature() const {
  if (bound.empty() && threshold == 0 && level == 0) return 0;
  Fnv h;
  for (std::uint64_t b : bound) h.add(b);
  h.add(std::bit_cast<std::uint64_t>(threshold)).add(std::bit_cast<std::uint64_t>(level));
  return h.h | 1;
}

namespace {

// The buffers a call works in (the workspace's, workspace.hpp).
struct Buffers {
  SparseVector mine;   // this rank's payload as a sparse vector
  SparseVector acc;    // the owner's sum over its region
  SparseVector kept;   // the owner's entries to send (first, then second allgather)
  SparseVector piece;  // one owner's gathered entries
  std::vector<std::uint64_t> positions;  // the indices the owner received (its quartiles)
  std::vector<std::uint64_t> hist, hist_sum;
  std::vector<Ranked> above;       // the owner's entries above theta, where its cap cuts
  std::vector<Ranked> ranked;      // every gathered entry
  std::vector<std::byte> entries;  // the owner's kept entries, serialized
  std::vector<std::byte> payload;  // this owner's bytes for an allgather
  Gathered all;
};

// One call, as its phases see it.
struct Call {
  Job& job;
  Buffers& buf;
  SparseRegions& regions;
  std::uint64_t n = 0, p = 0, k = 0, aim = 0;
  std::size_t me = 0;
  std::vector<std::uint64_t> bound;  // the regions: owner j holds [bound[j], bound[j + 1])
  std::uint64_t lo = 0, len = 0;     // this rank's region
  Report report{};                   // what this owner reports beside its entries
  double theta = 0;                  // the owners keep |sum| >= theta
  Ranked cut{0, 0};                  // where this owner's cap cut (report.capped)
  std::vector<Report> reports;       // every owner's
  bool sent_all = false;             // every nonzero sum was gathered
  double next_theta = 0, level = 0;  // for the next call

  Call(Job& j, Buffers& b, SparseRegions& m) : job(j), buf(b), regions(m) {}
  // An entry this owner sent in the first allgather: above theta and not past its cut.
  bool sent_first(std::uint64_t i, double m) const {
    return m >= theta && (!report.capped || !(cut < Ranked{static_cast<float>(m), i}));
  }
};

// 1. The regions: the remembered boundaries where they fit this tensor, else equal ones.
void regions(Call& c) {
  c.n = c.job.buf.out.size();
  c.p = static_cast<std::uint64_t>(c.job.call.size);
  c.me = static_cast<std::size_t>(c.job.call.rank);
  const std::vector<std::uint64_t>& old = c.regions.bound;
  c.bound = old.size() == c.p + 1 && old[c.p] == c.n ? old : even_bounds(c.n, c.p);
  c.k = std::min<std::uint64_t>(c.job.agreed_sent, c.n);
  c.aim = static_cast<std::uint64_t>(std::ceil(kAim * static_cast<double>(c.k)));
  c.lo = c.bound[c.me];
  c.len = c.bound[c.me + 1] - c.bound[c.me];
}

// 2. The all-to-all of the regions' entries and the owner's sum; what it received, for the
// report (the positions' quartiles, unless some part came dense).
void reduce_scatter(Call& c) {
  Buffers& b = c.buf;
  b.positions.clear();
  bool any_dense = false;
  reduce_own_region(c.job, c.bound, b.mine, b.acc, [&](const SparseVector& got) {
    c.report.received += got.entries();
    if (got.full) {
      any_dense = true;
    } else if (!any_dense) {
      b.positions.insert(b.positions.end(), got.idx.begin(), got.idx.end());
    }
  });
  const auto timed = c.job.meter.decoding();
  for (int q = 0; q < kQuartiles; ++q) {
    std::uint64_t at = c.lo + c.len * static_cast<std::uint64_t>(q + 1) / (kQuartiles + 1);
    if (!any_dense && !b.positions.empty()) {
      const auto nth = b.positions.begin() +
                       static_cast<std::ptrdiff_t>(
                           b.positions.size() * static_cast<std::size_t>(q + 1) / (kQuartiles + 1));
      std::nth_element(b.positions.begin(), nth, b.positions.end());
      at = c.lo + *nth;
    }
    c.report.points[q] = at;
  }
}

// 3a. The threshold: the remembered one, or the edge of the summed histograms' bin where aim
// is reached.
void threshold(Call& c) {
  c.theta = c.regions.threshold;
  if (c.theta > 0) return;
  Buffers& b = c.buf;
  {
    const auto timed = c.job.meter.decoding();
    b.hist.assign(kHistBins, 0);
    for_each_entry(b.acc, [&](std::uint64_t, float v) {
      if (v != 0 && std::isfinite(v)) ++b.hist[hist_bin(v)];
    });
    b.hist_sum.resize(kHistBins);
  }
  {
    const auto timed = c.job.meter.communicating();
    c.job.call.net->allreduce(b.hist.data(), b.hist_sum.data(), kHistBins, Reduction::sum_uint64);
    const std::uint64_t volume = 2 * (c.p - 1) * 8 * kHistBins / c.p;
    c.job.meter.traffic.sent += volume;
    c.job.meter.traffic.received += volume;
  }
  c.theta = std::numeric_limits<float>::denorm_min();  // fewer than aim in all: keep every one
  std::uint64_t above = 0;
  for (std::size_t bin = kHistBins; bin-- > 0;) {
    above += b.hist_sum[bin];
    if (above >= c.aim) {
      c.theta = std::max<double>(bin_edge(bin), std::numeric_limits<float>::denorm_min());
      break;
    }
  }
}

// 3b. The owner's kept entries (at most its cap of them, the largest, and any non-finite sum,
// on which every rank throws), the histogram of what it held back just below theta, and its
// bytes for the allgather: the report, then the entries.
void reselect(Call& c) {
  Buffers& b = c.buf;
  const auto timed = c.job.meter.decoding();
  const auto cap =
      static_cast<std::uint64_t>(kCap * static_cast<double>(c.aim) / static_cast<double>(c.p)) +
      kCapSlack;
  SparseVector& kept = b.kept;
  kept.n = c.len;
  kept.full = false;
  kept.idx.clear();
  kept.val.clear();
  double edge[kBelow + 1];  // below[i] counts |sum| in [edge[i + 1], edge[i])
  for (int i = 0; i <= kBelow; ++i) edge[i] = c.theta * std::exp2(-i / 2.0);
  std::size_t nonfinite = 0;
  for_each_entry(b.acc, [&](std::uint64_t i, float v) {
    if (v == 0) return;
    const double m = std::fabs(static_cast<double>(v));
    if (m >= c.theta || !std::isfinite(v)) {
      kept.idx.push_back(i);
      kept.val.push_back(v);
      nonfinite += !std::isfinite(v);
    } else if (m >= edge[kBelow]) {
      int bin = 0;
      while (m < edge[bin + 1]) ++bin;
      ++c.report.below[bin];
    }
  });
  // Past the cap: only the cap largest, cut where the cap-th lies (the kept entries stay in
  // index order).
  if (kept.idx.size() - nonfinite > cap) {
    b.above.clear();
    for (std::size_t e = 0; e < kept.idx.size(); ++e) {
      if (std::isfinite(kept.val[e])) b.above.push_back({std::fabs(kept.val[e]), kept.idx[e]});
    }
    std::nth_element(b.above.begin(), b.above.begin() + static_cast<std::ptrdiff_t>(cap - 1),
                     b.above.end());
    c.cut = b.above[cap - 1];
    c.report.cut = c.cut.mag;
    c.report.capped = 1;
    std::size_t to = 0;
    for (std::size_t e = 0; e < kept.idx.size(); ++e) {
      const float v = kept.val[e];
      if (!std::isfinite(v) || !(c.cut < Ranked{std::fabs(v), kept.idx[e]})) {
        kept.idx[to] = kept.idx[e];
        kept.val[to++] = v;
      }
    }
    kept.idx.resize(to);
    kept.val.resize(to);
  }
  std::vector<std::byte>& mine = c.buf.payload;
  serialize(kept, b.entries, half_values(c.job));
  mine.resize(sizeof(Report) + b.entries.size());
  std::memcpy(mine.data(), &c.report, sizeof(Report));
  std::memcpy(mine.data() + sizeof(Report), b.entries.data(), b.entries.size());
}

// Owner j's gathered entries into the result and the ranking (entries beyond the k-th are
// zeroed at the end).
void take(Call& c, std::span<const std::byte> bytes, std::uint64_t j) {
  SparseVector& piece = c.buf.piece;
  deserialize(bytes, c.bound[j + 1] - c.bound[j], piece);
  if (piece.full) bad_report("dense kept entries");
  for (std::size_t e = 0; e < piece.idx.size(); ++e) {
    const float v = piece.val[e];
    const std::uint64_t i = c.bound[j] + piece.idx[e];
    if (!std::isfinite(v)) {  // every rank holds the same entries: every rank throws
      throw Error(Status::nonfinite, "the sum over ranks is not finite at element " +
                                         std::to_string(i) +
                                         " (the ranks' finite contributions overflow float32; "
                                         "sparse_reduce_scatter)");
    }
    c.buf.ranked.push_back({std::fabs(v), i});
    c.job.buf.out[i] = v;
  }
}

// 4a. The allgather of every owner's report and kept entries (each report checked).
void gather_first(Call& c) {
  c.job.call.net->allgatherv_bytes(c.buf.payload, c.buf.all, c.job.meter.traffic);
  const auto timed = c.job.meter.decoding();
  c.reports.assign(c.p, Report{});
  c.buf.ranked.clear();
  std::fill(c.job.buf.out.begin(), c.job.buf.out.end(), 0.0f);
  for (std::uint64_t j = 0; j < c.p; ++j) {
    const auto got = c.buf.all.of(static_cast<int>(j));
    if (got.size() < sizeof(Report)) bad_report("shorter than its header");
    std::memcpy(&c.reports[j], got.data(), sizeof(Report));
    const Report& r = c.reports[j];
    for (std::uint64_t point : r.points) {
      if (point < c.bound[j] || point > c.bound[j + 1]) bad_report("a point outside its region");
    }
    if (r.capped > 1 || !std::isfinite(r.cut) || r.cut < 0 || (r.capped == 0 && r.cut != 0)) {
      bad_report("a bad cut");
    }
    take(c, got.subspan(sizeof(Report)), j);
  }
}

// 4b. A second allgather where the first did not settle the global top-k. Every rank sees the
// same reports and entries and takes the same branch.
// - Fewer than k came (the sums shrank since theta was set): what the owners held back, down
//   to where their histograms of it reach 1.1 k (or all of it, beyond their 8 octaves).
// - A cap cut at or above the k-th largest gathered: what the owners held back down to that
//   k-th largest, so that nothing left out can beat it.
// After it the k largest gathered are the k largest sums. Returns whether the k largest
// already come first in the ranking.
bool gather_second(Call& c) {
  std::vector<Ranked>& ranked = c.buf.ranked;
  bool any_capped = false;
  float max_cut = 0;
  for (const Report& r : c.reports) {
    any_capped = any_capped || r.capped != 0;
    max_cut = std::max(max_cut, r.cut);
  }
  c.sent_all = c.theta <= std::numeric_limits<float>::denorm_min() && !any_capped;
  bool second = false, too_few = false, top_k_first = false;
  double lower = 0;
  {
    const auto timed = c.job.meter.decoding();
    if (ranked.size() < c.k && !c.sent_all) {
      second = too_few = true;
      lower = std::numeric_limits<float>::denorm_min();
      std::uint64_t count = ranked.size();
      for (int b = 0; b < kBelow; ++b) {
        for (const Report& r : c.reports) count += r.below[b];
        if (count >= c.aim) {
          lower = c.theta * std::exp2(-(b + 1) / 2.0);
          break;
        }
      }
      c.sent_all = lower <= std::numeric_limits<float>::denorm_min();
    } else if (any_capped && c.k > 0 && ranked.size() >= c.k) {
      std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(c.k - 1),
                       ranked.end());
      if (!(ranked[c.k - 1].mag > max_cut)) {
        second = true;
        lower = ranked[c.k - 1].mag;
      } else {
        top_k_first = true;
      }
    }
    if (!second) return top_k_first;
    SparseVector& kept = c.buf.kept;
    kept.idx.clear();
    kept.val.clear();
    for_each_entry(c.buf.acc, [&](std::uint64_t i, float v) {
      const double m = std::fabs(static_cast<double>(v));
      if (v != 0 && std::isfinite(v) && m >= lower && !c.sent_first(i, m)) {
        kept.idx.push_back(i);
        kept.val.push_back(v);
      }
    });
    serialize(kept, c.buf.payload, half_values(c.job));
  }
  c.job.call.net->allgatherv_bytes(c.buf.payload, c.buf.all, c.job.meter.traffic);
  const auto timed = c.job.meter.decoding();
  for (std::uint64_t j = 0; j < c.p; ++j) take(c, c.buf.all.of(static_cast<int>(j)), j);
  if (too_few) {
    c.theta = lower;
    for (Report& r : c.reports) std::fill(std::begin(r.below), std::end(r.below), 0u);
  }
  return top_k_first;
}

// 4c. The cut to the k largest, the next call's threshold, the residual's return and the
// state of the regions.
void cut_and_remember(Call& c, bool top_k_first) {
  const auto timed = c.job.meter.decoding();
  std::vector<Ranked>& ranked = c.buf.ranked;
  const std::uint64_t k = c.k, aim = c.aim;
  const std::uint64_t gathered = ranked.size();
  if (gathered > k && !top_k_first) {
    std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k), ranked.end());
  }
  // The next threshold: the 1.1 k-th largest gathered (sought among those after the k-th);
  // else from the held-back histograms; else (everything was sent, fewer than 1.1 k in all)
  // keep everything next time too.
  if (aim > 0 && gathered >= aim) {
    std::nth_element(ranked.begin() + static_cast<std::ptrdiff_t>(std::min(k, aim - 1)),
                     ranked.begin() + static_cast<std::ptrdiff_t>(aim - 1), ranked.end());
    c.level = ranked[aim - 1].mag;
    // Sums that shrink from call to call (a decaying learning rate inside what is summed, a
    // converging model) would leave the next call short of k under this call's level, and a
    // short call costs a second allgather; so theta follows a shrinking level down by its last
    // ratio (at most halving it). Too low a theta costs at most the owners' caps.
    const double ratio = c.regions.level > 0 ? c.level / c.regions.level : 1.0;
    c.next_theta = c.level * std::clamp(ratio, 0.5, 1.0);
  } else if (c.sent_all) {
    c.next_theta = std::numeric_limits<float>::denorm_min();
  } else {
    std::uint64_t count = gathered;
    for (int b = 0; b < kBelow && c.next_theta == 0; ++b) {
      for (const Report& r : c.reports) count += r.below[b];
      if (count >= aim) c.next_theta = c.theta * std::exp2(-(b + 1) / 2.0);
    }
  }
  if (gathered > k) {
    for (std::size_t e = k; e < ranked.size(); ++e) c.job.buf.out[ranked[e].idx] = 0.0f;
  }
  // Error feedback: this rank's own contribution returns where nothing was kept.
  if (c.job.buf.ef) {
    for_each_entry(c.buf.mine, [&](std::uint64_t i, float v) {
      if (c.job.buf.out[i] == 0.0f) c.job.buf.ef_next[i] += v;
    });
  }
  // The next call's regions and threshold, the same on every rank.
  c.regions.bound = balanced_bounds(c.bound, c.reports, c.n);
  c.regions.threshold = c.next_theta > 0 && std::isfinite(c.next_theta) ? c.next_theta : 0.0;
  c.regions.level = c.level > 0 && std::isfinite(c.level) ? c.level : 0.0;
}

void run_sparse_reduce_scatter(Job& job) {
  SparseRegions fresh;  // where the Communicator keeps no state of the tensor
  Call c(job, job.ws.get<Buffers>(), job.state ? static_cast<SparseRegions&>(*job.state) : fresh);
  regions(c);
  reduce_scatter(c);
  threshold(c);
  reselect(c);
  gather_first(c);
  const bool top_k_first = gather_second(c);
  cut_and_remember(c, top_k_first);
  finish_average(job);
}

// Device tensors: the owners' merges run on the host, as sparse_split's, and so does the return
// of this rank's unkept entries into its residual: a device residual (the device encode's new
// one) comes to the host for it and goes back, n floats each way (the one device path where more
// than payloads cross), and the result goes to the device.
void run_sparse_reduce_scatter_device(Job& job) {
  const std::size_t n = job.buf.out.size();
  std::vector<float>* e = nullptr;
  if (job.buf.ef) {
    e = &job.ws.residual;
    e->resize(n);
    job.buf.dev->copy(e->data(), job.buf.d_e_new, 4 * n, job.buf.stream);
    job.buf.ef_next = *e;
  }
  run_sparse_reduce_scatter(job);
  const auto timed = job.meter.decoding();
  job.buf.dev->copy(job.buf.d_out, job.buf.out.data(), 4 * n, job.buf.stream);
  if (e) job.buf.dev->copy(job.buf.d_e_new, e->data(), 4 * n, job.buf.stream);
}

}  // namespace

namespace {

// The all-to-all of the ranks' entries (as sparse_split), the owners' merges and selection, the
// allgatherv of about kAim k / P entries per owner, the cut to k, the residual's return.
double predict_sparse_reduce_scatter(const ModelInput& in) {
  const LocalTerms l = local_terms(in);
  const double n = in.n, p = in.ranks;
  const auto& c = in.compute;
  const double kept = std::min(kAim * in.sent, n) / p;
  const double entry = stream_entry_bytes(kept, n / p, in.value_bytes);
  return l.encode + predict_region_exchange(in) +
         t_allgatherv(in, sizeof(Report) + 8 + kept * entry) + kept * p * c.merge +
         (in.error_feedback ? in.sent * c.merge : 0.0) + l.write_out + l.average;
}

// The region exchange, then the kept entries (with the reports) to every rank.
double bytes_sparse_reduce_scatter(const ModelInput& in) {
  const double n = in.n, p = in.ranks;
  const double kept = std::min(kAim * in.sent, n) / p;
  const double entry = stream_entry_bytes(kept, n / p, in.value_bytes);
  return bytes_region_exchange(in) + (p - 1) * (sizeof(Report) + 16 + kept * entry);
}

// Auto weighs it only with error feedback: its result is the global top-k, not the sum over the
// union of the ranks' selections, and only error feedback keeps what it leaves out.
bool with_error_feedback(const ModelInput& in) {
  return for_sparse_codecs(in) && in.error_feedback;
}

}  // namespace

extern const AlgorithmRow kSparseReduceScatterRow = {
    .id = Algorithm::sparse_reduce_scatter,
    .name = "sparse_reduce_scatter",
    .description =
        "regions exchanged all-to-all, each owner keeps a global top-k of its region, "
        "the owners' selections gathered",
    .sparse_only = true,
    .candidate = with_error_feedback,
    .predict = predict_sparse_reduce_scatter,
    .bytes = bytes_sparse_reduce_scatter,
    .run = run_sparse_reduce_scatter,
    .run_device = run_sparse_reduce_scatter_device,
    .make_state = [] { return std::unique_ptr<TensorState>(new SparseRegions()); },
};

}  // namespace gcomp::detail
