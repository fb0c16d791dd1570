// The all_sum algorithms of the ring (ring.hpp sets it up), and the one pipelined engine they share.
//
// Both algorithms are schedules of messages on the ring's two directions: R (rightwards: sent to
// the right neighbour, received from the left one) and L (leftwards). A schedule has `steps` steps
// of `m` messages per direction; message j = step x m + piece. What a step sends is what the
// previous step received (the same piece), so the engine sends message j once message j - m of the
// same direction has arrived, and a schedule only says where each message lives and what to do when
// one arrives.
//
// The ring (bandwidth-optimal): the buffer is cut into `size` chunks; each chunk is cut in two
// halves that travel the ring in opposite directions, so both directions of every cable are busy
// at once. Reduce-scatter (size - 1 steps) then all-gather (size - 1 steps). In direction R rank r
// sends chunk (r - s) and receives chunk (r - s - 1) at reduce-scatter step s; direction L mirrors
// it. A piece received during reduce-scatter lands in a scratch slot and is added into the output
// at once (overlapping the next pieces' transfer); during all-gather pieces land straight in the
// output (registered memory) or in a scratch slot and are copied out (staged memory). Each rank
// moves 2(n - 1)/n of the buffer over each direction of each of its cables: 2(n-1) hops of latency.
//
// The latency algorithm (for small sums): every rank's whole vector travels floor(n/2) hops in both
// directions, each rank forwarding what it received; after floor(n/2) steps every rank holds every
// vector (with even n the antipodal one arrives from both sides and is counted once) and sums them
// locally in ring-position order, so every rank computes bitwise the same result, as the ring's
// all-gather guarantees. floor(n/2) hops of latency (the ring's diameter) instead of 2(n - 1), for
// n/2 times the ring's bytes per cable. Received vectors land in the scratch buffer's gather area,
// each at its own place, so a forward is sent from where its data arrived.
//
// The mesh (a fully connected job: every pair of ranks cabled, common for 2 to 4 Macs): every rank
// sends its vector to every other rank over their own cable, one hop, and sums the n vectors in
// rank order. Each cable direction carries one vector: one hop of latency for the whole buffer per
// cable, where the ring carries (n-1)/n of it over 2(n-1) hops. It runs on the ring's links to the
// neighbours and one more link per other rank; with 3 ranks or fewer every rank is a neighbour and
// the latency algorithm is already one hop (--algorithm mesh runs it). Messages travel as SEND/RECV.
//
// Credits without extra messages: on every cable both directions carry the same sequence of
// messages (the same step and piece numbers), so message j from the peer proves that the peer had
// posted its receives for my messages up to j + window before it sent it. A rank therefore sends its
// message j only after receiving the peer's message j - window, and posts its receives for the
// peer's messages up to j + window before sending its message j. Dependencies always point to
// smaller message numbers, so the schedule cannot deadlock, and no send ever meets an empty receive
// queue (which kills the direction on Apple's driver under one reading, and is held by credit-based
// flow control under another: every algorithm is correct under both).
#pragma once

#include "ring.hpp"

namespace ring {

/// Where one message lives on a rank: a buffer, the offset and length in it (length 0: an empty
/// piece, sent as the placeholder), and for a staged send the bytes to copy into the send slot.
struct Place {
  enum Buffer { scratch, input, output } where = scratch;
  std::size_t off = 0, len = 0;
  const std::byte* copy_from = nullptr;
};

/// The ring's schedule (see the top of this file).
struct RingSchedule {
  const Ring& ring;
  std::size_t count;
  DType t;
  bool in_place;
  std::byte *src, *dst;
  std::size_t es, pe, m, steps, T;
  int n, r;

  RingSchedule(const Ring& R, std::size_t count_, DType t_, bool in_place_)
      : ring(R), count(count_), t(t_), in_place(in_place_), src(R.in_.data()),
        dst(in_place_ ? R.in_.data() : R.out_.data()), es(dtype_size(t_)), n(R.cfg_.size), r(R.pos_) {
    pe = std::max<std::size_t>(1, R.cfg_.message_bytes / es);  // elements per message
    const std::size_t max_chunk = (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
    const std::size_t max_half = (max_chunk + 1) / 2;
    m = std::max<std::size_t>(1, (max_half + pe - 1) / pe);  // messages per half-chunk
    steps = 2 * static_cast<std::size_t>(n - 1);
    T = steps * m;
  }
  void start() const {}
  bool reduce_scatter(std::size_t step) const { return step < static_cast<std::size_t>(n - 1); }
  std::string phase(std::size_t step) const {
    return reduce_scatter(step) ? "reduce-scatter step " + std::to_string(step)
                                : "all-gather step " + std::to_string(step - static_cast<std::size_t>(n - 1));
  }
  int mod(long long x) const { return static_cast<int>(((x % n) + n) % n); }
  std::size_t chunk_begin(int c) const { return count * static_cast<std::size_t>(c) / static_cast<std::size_t>(n); }
  int chunk_of(int d, std::size_t step, bool sending) const {
    const long long s = static_cast<long long>(step);
    const bool rs = reduce_scatter(step);
    const long long sp = s - (n - 1);
    if (d == 0) return sending ? (rs ? mod(r - s) : mod(r + 1 - sp)) : (rs ? mod(r - s - 1) : mod(r - sp));
    return sending ? (rs ? mod(r + s) : mod(r - 1 + sp)) : (rs ? mod(r + s + 1) : mod(r + sp));
  }
  // Element range [b, e) of message j in direction d, as sent or as received.
  std::pair<std::size_t, std::size_t> range(int d, std::size_t j, bool sending) const {
    const int c = chunk_of(d, j / m, sending);
    const std::size_t cb = chunk_begin(c), ce = chunk_begin(c + 1);
    const std::size_t mid = cb + (ce - cb + 1) / 2;
    const std::size_t hb = d == 0 ? cb : mid, he = d == 0 ? mid : ce;
    const std::size_t k = j % m;
    return {std::min(he, hb + k * pe), std::min(he, hb + (k + 1) * pe)};
  }
  std::size_t recv_slot(int d, std::size_t j) const {
    return (static_cast<std::size_t>(d) * ring.slots_ + j % ring.slots_) * ring.slot_bytes_;
  }
  Place user(std::size_t b, std::size_t e, bool input) const {
    return {(input || in_place) ? Place::input : Place::output, b * es, (e - b) * es, nullptr};
  }
  // Where a receiving rank (staged or not) wants message j of direction d: this rank's receive
  // (`sending` false), or its peer's receive of what this rank sends (`sending` true, the same
  // elements: RDMA WRITE aims there).
  Place recv(int d, std::size_t j, bool staged, bool sending = false) const {
    const auto [b, e] = range(d, j, sending);
    if (b == e) return {};
    if (reduce_scatter(j / m) || staged) return {Place::scratch, recv_slot(d, j), (e - b) * es, nullptr};
    return user(b, e, false);
  }
  Place send(int d, std::size_t j) const {
    const auto [b, e] = range(d, j, true);
    if (b == e) return {};
    // Step 0 sends this rank's own input; later steps send what was reduced or gathered.
    const bool from_input = j < m && !in_place;
    if (ring.staged_)
      return {Place::scratch, ring.send_slots_off_ + (static_cast<std::size_t>(d) * ring.slots_ + j % ring.slots_) * ring.slot_bytes_,
              (e - b) * es, (from_input ? src : dst) + b * es};
    return user(b, e, from_input);
  }
  void received(int d, std::size_t j) const {
    const auto [b, e] = range(d, j, false);
    if (b == e) return;
    const std::byte* slot = ring.scratch_.data() + recv_slot(d, j);
    if (reduce_scatter(j / m)) add(t, dst + b * es, src + b * es, slot, e - b);
    else if (ring.staged_) std::memcpy(dst + b * es, slot, (e - b) * es);
  }
  // Every chunk of the output was written by an all-gather receive, except this rank's fully
  // reduced halves, which its last reductions wrote.
  void finish() const {}
};

/// The latency algorithm's schedule (see the top of this file).
struct LatencySchedule {
  const Ring& ring;
  std::size_t count;
  DType t;
  std::byte *src, *dst;
  std::size_t es, pe, m, steps, T;
  int n, pos;

  LatencySchedule(const Ring& R, std::size_t count_, DType t_, bool in_place)
      : ring(R), count(count_), t(t_), src(R.in_.data()), dst(in_place ? R.in_.data() : R.out_.data()),
        es(dtype_size(t_)), n(R.cfg_.size), pos(R.pos_) {
    pe = std::max<std::size_t>(1, R.cfg_.message_bytes / es);
    m = (count + pe - 1) / pe;
    steps = static_cast<std::size_t>(n / 2);
    T = steps * m;
  }
  // The gather area: this rank's vector, then the vector received at step h of direction d (the one
  // from ring position pos - h - 1 for R, pos + h + 1 for L).
  std::size_t own() const { return ring.gather_off_; }
  std::size_t area(int d, std::size_t h) const {
    return ring.gather_off_ + (1 + static_cast<std::size_t>(d) * steps + h) * ring.latency_max_;
  }
  std::string phase(std::size_t step) const { return "latency step " + std::to_string(step); }
  std::pair<std::size_t, std::size_t> piece(std::size_t j) const {
    const std::size_t b = (j % m) * pe;
    return {b, std::min(count, b + pe)};
  }
  // Sends come from the gather area (no staging): this rank's vector is copied there first.
  void start() const { std::memcpy(ring.scratch_.data() + own(), src, count * es); }
  Place recv(int d, std::size_t j, bool, bool = false) const {
    const auto [b, e] = piece(j);
    return {Place::scratch, area(d, j / m) + b * es, (e - b) * es, nullptr};
  }
  Place send(int d, std::size_t j) const {
    const auto [b, e] = piece(j);
    const std::size_t h = j / m;
    return {Place::scratch, (h == 0 ? own() : area(d, h - 1)) + b * es, (e - b) * es, nullptr};
  }
  void received(int, std::size_t) const {}
  // Every vector is here: sum them in ring-position order (the same order on every rank).
  void finish() const {
    const std::byte* base = ring.scratch_.data();
    auto vector_at = [&](int p) {
      if (p == pos) return base + own();
      const int right_of = ((pos - p) % n + n) % n;  // hops from position p rightwards to here
      if (static_cast<std::size_t>(right_of) <= steps) return base + area(0, static_cast<std::size_t>(right_of - 1));
      return base + area(1, static_cast<std::size_t>(n - right_of - 1));
    };
    add(t, dst, vector_at(0), vector_at(1), count);
    for (int p = 2; p < n; ++p) add(t, dst, dst, vector_at(p), count);
  }
};

// The crossover of Algorithm::automatic: the latency algorithm at or below these bytes per rank,
// the ring above. Measured with bench/all_sum/crossover.sh (Release, 2026-12-01, a 2-core machine
// shared with other builds, load average about 4) on the paced emulator at B = 0.25 GB/s, L = 150 us
// (Thunderbolt 5's 9.4 GB/s and 4 us slowed 37.6x: the same bandwidth-delay product, 37.6 KB, which
// is what places the crossover), time of the latency algorithm over the ring's, 20 iterations:
//
//   bytes per rank   4K    16K   32K   64K   128K  256K  512K  1M
//   2 ranks          0.80  0.81  0.90  1.17  1.08  1.40  1.36  1.40
//   3 ranks          0.94  0.79  0.64  0.84  0.98  0.85  1.00  1.05
//   4 ranks          0.61  0.66  0.73  0.84  1.08  1.41  1.61  1.93   (another run: 0.98 at 128K)
//   8 ranks          0.54  0.68  0.74  0.98  1.47  1.45  1.88  2.48
//
// The link model predicts the same places: the ring costs 2(n-1) hops of L and sends (n-1)/n of
// the buffer per cable direction, the latency algorithm floor(n/2) hops and floor(n/2) buffers,
// so it wins below L B (2(n-1) - h) / (h - (n-1)/n), h = floor(n/2): 2 L B at 2 ranks (75 KB on
// Thunderbolt 5), 9 L B at 3 (every rank is a neighbour: one hop), 3.2 L B at 4 and 8 (120 KB).
// Unpaced (the CPUs and the emulator's wake-ups are the limit) the same runs cross at 128K, 256K,
// 64K and 512K for 2, 3, 4 and 8 ranks, noisily; the table keeps the paced figures, rounded down.
inline std::size_t latency_crossover_bytes(int n) {
  if (n == 2) return 32 * 1024;
  if (n == 3) return 256 * 1024;
  return 64 * 1024;
}

// The mesh's crossover on a fully connected job (MESH=1 bench/all_sum/crossover.sh, the same
// machine, link and day as latency_crossover_bytes(); load average about 6): the mesh's time over
// the ring's,
//
//   bytes per rank   4K    16K   64K   128K  256K  512K  1M
//   4 ranks          0.23  0.24  0.30  0.56  0.79  1.11  1.17
//   5 ranks          0.30  0.20  0.43  0.43  0.36  0.56  0.98
//   8 ranks          0.52  0.39  0.48  0.60  0.88  1.16  1.87
//
// The model: one hop and one vector per cable direction against the ring's 2(n-1) hops and
// (n-1)/n of a vector, so the mesh wins below (2n - 3) n L B; measured lower (the sending CPU
// copies n - 1 vectors: the emulator's sender does the transfer), so the table keeps 256 KiB.
inline std::size_t mesh_crossover_bytes(int) { return 256 * 1024; }

inline Algorithm Ring::choose(std::size_t bytes) const {
  if (cfg_.algorithm == Algorithm::mesh && cfg_.size <= 3) return Algorithm::latency;  // one hop already
  if (cfg_.algorithm != Algorithm::automatic) return cfg_.algorithm;
  if (fully_connected() && bytes <= std::min(latency_max_, mesh_crossover_bytes(cfg_.size))) return Algorithm::mesh;
  return bytes <= std::min(latency_max_, latency_crossover_bytes(cfg_.size)) ? Algorithm::latency : Algorithm::ring;
}

inline std::string Ring::algorithm_rule() const {
  if (cfg_.algorithm == Algorithm::mesh && cfg_.size <= 3)
    return "latency (--algorithm mesh: with 3 ranks or fewer every rank is a neighbour, one hop)";
  if (cfg_.algorithm != Algorithm::automatic)
    return std::string(algorithm_name(cfg_.algorithm)) + " (--algorithm " + algorithm_name(cfg_.algorithm) + ")";
  if (fully_connected())
    return "auto: mesh (every pair cabled: one hop) up to " +
           std::to_string(std::min(latency_cap(cfg_.size), mesh_crossover_bytes(cfg_.size))) +
           " bytes per rank, ring (reduce-scatter + all-gather, both directions) above (the crossover measured on "
           "the paced emulator: algorithms.hpp)";
  return "auto: latency (floor(n/2) hops each way) up to " +
         std::to_string(std::min(latency_cap(cfg_.size), latency_crossover_bytes(cfg_.size))) +
         " bytes per rank, ring (reduce-scatter + all-gather, both directions) above (the crossover measured on "
         "the paced emulator: algorithms.hpp)";
}

inline Result<void> Ring::all_sum(std::size_t count, DType t, bool in_place,
                                  const std::function<Result<void>()>& before_start) {
  const std::size_t bytes = count * dtype_size(t);
  if (bytes > in_.size())
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            std::to_string(bytes) + " bytes exceed the ring's buffers of " + std::to_string(in_.size())));
  const Algorithm a = choose(bytes);
  mesh_active_ = a == Algorithm::mesh;
  if ((a == Algorithm::latency || a == Algorithm::mesh) && bytes > latency_max_)
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            std::string("the ") + algorithm_name(a) + " algorithm takes sums of up to " +
                                std::to_string(latency_max_) + " bytes per rank (its gather area), not " +
                                std::to_string(bytes)));
  switch (a) {
  case Algorithm::mesh: return mesh_all_sum(count, t, in_place, before_start);
  case Algorithm::latency: {
    LatencySchedule plan(*this, count, t, in_place);
    return pipeline(plan, before_start);
  }
  default: {
    RingSchedule plan(*this, count, t, in_place);
    return pipeline(plan, before_start);
  }
  }
}

template <class Describe, class OnBatch>
inline Result<bool> Ring::sleep_on_links(std::span<tbverbs::Link* const> sleepers, std::span<tbverbs::WorkCompletion> wc,
                                         const Describe& describe_wait, const OnBatch& on_batch) {
  std::size_t which = 0;
  auto got = tbverbs::wait_any(sleepers, wc, which, std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
  if (!got) {
    where_ = "waiting for completions of " + describe_wait();
    return fail(got.error());
  }
  if (*got == 0) return false;
  if (auto h = on_batch(which, *got); !h) return fail(h.error());
  return true;
}

template <class Describe>
inline Result<void> Ring::watch(Watch& w, bool progress, const Describe& describe_wait) {
  const auto now = std::chrono::steady_clock::now();
  if (progress) {
    w.last_progress = now;
    w.idle = 0;
  } else {
    ++w.idle;
  }
  if (now - w.last_check > std::chrono::milliseconds(20)) {
    w.last_check = now;
    if (auto alive = sc_.check_peers(); !alive) {
      where_ = "the all_sum, waiting for " + describe_wait();
      return fail(alive.error());
    }
  }
  if (now - w.last_progress > cfg_.timeout) {
    where_ = "the all_sum";
    return fail(Error::make(Step::collective, ErrorKind::timeout,
                            "no progress for " + std::to_string(cfg_.timeout.count()) + " ms waiting for " +
                                describe_wait()));
  }
  return {};
}

template <class Schedule>
inline Result<void> Ring::pipeline(Schedule& plan, const std::function<Result<void>()>& before_start) {
  const std::size_t W = static_cast<std::size_t>(cfg_.window);
  const std::size_t S = slots_;  // receives posted ahead per direction
  const std::size_t m = plan.m, T = plan.T;
  plan.start();

  // Direction d is received on side d's cables (R arrives from the left) and sent on side 1 - d's;
  // message j uses cable j mod k of that side. Per cable, messages complete in order, so each
  // direction keeps, per cable, the next message it expects; the lowest over the cables is the
  // prefix of messages all received (or, for sends, all completed).
  const std::size_t k[2] = {cables_[0].size(), cables_[1].size()};
  auto link_of = [&](int side, std::size_t j) -> std::size_t { return first_[side] + j % k[side]; };
  constexpr std::size_t max_cables = 64;
  std::size_t posted[2] = {0, 0}, sent[2] = {0, 0};
  std::size_t recv_next[2][max_cables], send_next[2][max_cables];
  for (int d = 0; d < 2; ++d) {
    for (std::size_t c = 0; c < k[d]; ++c) recv_next[d][c] = c;
    for (std::size_t c = 0; c < k[1 - d]; ++c) send_next[d][c] = c;
  }
  auto prefix = [&](const std::size_t (&next)[max_cables], std::size_t cables) {
    std::size_t p = T;
    for (std::size_t c = 0; c < cables; ++c) p = std::min(p, next[c]);
    return p;
  };
  std::size_t received[2] = {0, 0}, send_done[2] = {0, 0};  // the prefixes

  // An empty piece (fewer elements than ranks, or uneven halves) still travels, so that both
  // directions of a cable keep the same message numbering, but as a 4-byte placeholder in the
  // scratch buffer's last page: whether Apple's driver accepts zero-length work requests is
  // not documented. Both sides know the piece is empty, so the frame counts still match.
  constexpr std::size_t placeholder = 4;
  auto local = [&](Port& p, Place::Buffer b) -> tbverbs::MemoryRegionSet& {
    return b == Place::scratch ? *p.scratch : b == Place::input ? *p.in : *p.out;
  };

  auto post_recv = [&](int d) -> Result<void> {
    const std::size_t j = posted[d];
    const std::size_t li = link_of(d, j);
    if (write_) {
      // The credit only: the peer's RDMA WRITE with immediate puts the data in place and
      // consumes this zero-length receive.
      const tbverbs::abi::ibv_sge none{};
      tbverbs::RecvWr wr(j, none);
      wr.sges({});
      if (auto q = links_[li].qp().post(wr); !q) return fail(q.error());
      ++posted[d];
      return {};
    }
    Port& p = *refs_[li].port;
    const Place at = plan.recv(d, j, staged_);
    auto sge = at.len == 0 ? p.scratch->sge(placeholder_off_, placeholder) : local(p, at.where).sge(at.off, at.len);
    if (!sge) return fail(sge.error());
    if (auto q = links_[li].qp().recv(j, *sge); !q) return fail(q.error());
    ++posted[d];
    return {};
  };
  auto post_send = [&](int d) -> Result<void> {
    const std::size_t j = sent[d];
    const std::size_t li = link_of(1 - d, j);
    Port& p = *refs_[li].port;
    const Place from = plan.send(d, j);
    if (from.copy_from != nullptr) std::memcpy(scratch_.data() + from.off, from.copy_from, from.len);
    auto sge = from.len == 0 ? p.scratch->sge(placeholder_off_, placeholder) : local(p, from.where).sge(from.off, from.len);
    if (!sge) return fail(sge.error());
    if (write_) {
      // Into the exact place the peer's receive would have put it (see post_recv), the message
      // number as the immediate.
      const PeerTargets& pt = peer_[li];
      const Place at = plan.recv(d, j, pt.staged, true);
      const RemoteRegions& regions = at.where == Place::scratch ? pt.scratch : at.where == Place::input ? pt.in : pt.out;
      auto to = at.len == 0 ? pt.scratch.at(pt.scratch.size - 4096, placeholder) : regions.at(at.off, at.len);
      if (!to) return fail(to.error());
      const auto wr = tbverbs::SendWr::rdma_write_with_imm((std::uint64_t{1} << 40) | j, *sge, *to,
                                                           static_cast<std::uint32_t>(j));
      if (auto q = links_[li].qp().post(wr); !q) return fail(q.error());
    } else if (auto q = links_[li].qp().send((std::uint64_t{1} << 40) | j, *sge); !q) {
      return fail(q.error());
    }
    ++sent[d];
    ++sent_[li];
    return {};
  };
  auto on_recv = [&](int d, std::size_t cable, const tbverbs::WorkCompletion& wc) -> Result<void> {
    const std::size_t j = recv_next[d][cable];
    if (wc.wr_id() != j)
      return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                              "receive completions out of order: got message " + std::to_string(wc.wr_id()) +
                                  ", expected " + std::to_string(j)));
    if (write_ && (!wc.has_imm() || wc.imm() != static_cast<std::uint32_t>(j)))
      return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                              "RDMA WRITE with immediate out of order: " +
                                  (wc.has_imm() ? "immediate " + std::to_string(wc.imm()) : std::string("no immediate")) +
                                  ", expected message " + std::to_string(j)));
    const Place at = plan.recv(d, j, staged_);
    const std::size_t want = at.len > 0 ? at.len : placeholder;
    if (wc.byte_len() != want)
      return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                              "message " + std::to_string(j) + " carried " + std::to_string(wc.byte_len()) +
                                  " bytes, expected " + std::to_string(want)));
    plan.received(d, j);
    recv_next[d][cable] += k[d];
    received[d] = prefix(recv_next[d], k[d]);
    return {};
  };

  // 1. Receives posted ahead (the credits), then the caller's barrier: no rank sends before
  //    every rank has posted.
  for (int d = 0; d < 2; ++d)
    while (posted[d] < std::min(T, S))
      if (auto p = post_recv(d); !p) {
        where_ = "posting the first receives";
        return p;
      }
  if (auto b = before_start(); !b) {
    where_ = "the barrier before the all_sum";
    return b;
  }

  auto describe_wait = [&]() {
    std::string w;
    for (int d = 0; d < 2; ++d) {
      if (received[d] < T) {
        const int from = d == 0 ? left_ : right_;
        w += std::string(w.empty() ? "" : ", ") + "message " + std::to_string(received[d]) + "/" +
             std::to_string(T) + " from rank " + std::to_string(from) + " (" + plan.phase(received[d] / m) + ")";
      }
    }
    return w;
  };

  // 2. The progress loop: completions in, receives re-posted, sends out; never blocks for
  //    longer than a slice, probes the side channel for dead or aborting ranks.
  tbverbs::WorkCompletion wc[32];
  Watch watchdog;
  constexpr std::size_t max_wait = 16;  // links wait_any sleeps on at once
  tbverbs::Link* sleepers[max_wait];
  const std::size_t ring_links = first_[2];  // the mesh links carry nothing here
  const std::size_t nsleep = std::min(ring_links, max_wait);
  for (std::size_t i = 0; i < nsleep; ++i) sleepers[i] = &links_[i];
  auto handle = [&](std::size_t li, std::size_t got) -> Result<void> {
    const int side = refs_[li].side;
    const std::size_t cable = refs_[li].cable;
    for (std::size_t q = 0; q < got; ++q) {
      if (wc[q].is_recv()) {
        // Receives on the left cables are direction R, on the right ones direction L.
        if (auto p = on_recv(side, cable, wc[q]); !p) {
          where_ = "reducing a received message";
          return p;
        }
        ++received_[li];
      } else {
        const int d = 1 - side;  // sends on the left cables are direction L
        send_next[d][cable] += k[side];
        send_done[d] = prefix(send_next[d], k[side]);
      }
    }
    return {};
  };
  for (;;) {
    bool progress = false;
    // Posts first, polls after: an empty poll may nap in the provider (the emulator sleeps until
    // its next completion is due), so what can be sent is sent before it (at the start of an
    // all_sum that nap delayed the first sends by a whole link latency).
    for (int d = 0; d < 2; ++d) {
      const int o = 1 - d;  // the other direction shares the links: its receives are our credits
      // Receives: up to S ahead of what was consumed (scratch slots free again).
      while (posted[d] < T && posted[d] < received[d] + S) {
        if (auto p = post_recv(d); !p) {
          where_ = "posting receives";
          return p;
        }
        progress = true;
      }
      // Sends: data ready, credit from the peer, our receives for the peer ahead, queue room
      // (and, staged, the send slot free again).
      while (sent[d] < T) {
        const std::size_t j = sent[d];
        if (j >= m && received[d] < j - m + 1) break;           // data of the previous step
        if (j >= W && received[o] < j - W + 1) break;           // credit: peer posted for j
        if (posted[o] < std::min(T, j + W + 1)) break;          // our receives ahead of our send
        if (sent[d] - send_done[d] >= S) break;                 // send queue room, send slot free
        if (auto p = post_send(d); !p) {
          where_ = "posting sends";
          return p;
        }
        progress = true;
      }
    }
    if (watchdog.idle > 16) {  // nothing happened for a while
      auto slept = sleep_on_links(std::span(sleepers, nsleep), wc, describe_wait, handle);
      if (!slept) return fail(slept.error());
      progress = progress || *slept;
    }
    for (std::size_t li = 0; li < ring_links; ++li) {
      auto got = links_[li].cq().poll(wc);
      if (!got) {
        where_ = "polling the CQ of link " + std::to_string(links_[li].id()) + " while waiting for " + describe_wait();
        return fail(got.error());
      }
      if (auto h = handle(li, *got); !h) return h;
      if (*got > 0) progress = true;
    }
    if (received[0] == T && received[1] == T && send_done[0] == T && send_done[1] == T) break;
    if (auto w = watch(watchdog, progress, describe_wait); !w) return w;
  }
  plan.finish();
  return {};
}

// The mesh all_sum (see the top of this file): per peer one link, on which both ends send their
// vector in m pieces, with the ring's credits per link (piece j from the peer proves it posted its
// receives up to j + window). Piece j of peer p lands in p's place of the gather area.
inline Result<void> Ring::mesh_all_sum(std::size_t count, DType t, bool in_place,
                                       const std::function<Result<void>()>& before_start) {
  const int n = cfg_.size, me = cfg_.rank;
  if (!fully_connected())
    return fail(Error::make(Step::collective, ErrorKind::invalid_argument,
                            "the mesh all_sum needs a cable between every pair of ranks (4 ranks or more: a device "
                            "toward every rank in the device file, or discovered cables to every rank)"));
  const std::size_t es = dtype_size(t);
  const std::size_t W = static_cast<std::size_t>(cfg_.window), S = slots_;
  const std::size_t pe = std::max<std::size_t>(1, cfg_.message_bytes / es);
  const std::size_t T = (count + pe - 1) / pe;  // pieces per link and direction
  std::byte* const src = in_.data();
  std::byte* const dst = in_place ? in_.data() : out_.data();
  std::byte* const base = scratch_.data();
  // The gather area: this rank's vector first, then peer p's at place 1 + (p < me ? p : p - 1).
  auto area = [&](int p) { return gather_off_ + static_cast<std::size_t>(p == me ? 0 : 1 + (p < me ? p : p - 1)) * latency_max_; };

  // One link per peer: the ring's first cable to each neighbour, a mesh link to every other rank.
  struct Peer {
    std::size_t li = 0;
    int rank = 0;
    std::size_t posted = 0, sent = 0, received = 0, send_done = 0;
  };
  constexpr std::size_t max_peers = 63;
  Peer peers[max_peers];
  std::size_t np = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::size_t li = 0;
    if (p == left_) li = first_[0];
    else if (p == right_) li = first_[1];
    else
      for (std::size_t c = 0; c < mesh_peer_.size(); ++c)
        if (mesh_peer_[c] == p) li = first_[2] + c;
    peers[np++] = Peer{li, p, 0, 0, 0, 0};
  }
  auto piece = [&](std::size_t j) {
    const std::size_t b = j * pe;
    return std::pair<std::size_t, std::size_t>{b * es, (std::min(count, b + pe) - b) * es};
  };
  auto post_recv = [&](Peer& q) -> Result<void> {
    const auto [off, len] = piece(q.posted);
    auto sge = refs_[q.li].port->scratch->sge(area(q.rank) + off, len);
    if (!sge) return fail(sge.error());
    if (auto r = links_[q.li].qp().recv(q.posted, *sge); !r) return fail(r.error());
    ++q.posted;
    return {};
  };
  auto post_send = [&](Peer& q) -> Result<void> {
    const auto [off, len] = piece(q.sent);
    auto sge = refs_[q.li].port->scratch->sge(area(me) + off, len);
    if (!sge) return fail(sge.error());
    if (auto r = links_[q.li].qp().send((std::uint64_t{1} << 40) | q.sent, *sge); !r) return fail(r.error());
    ++q.sent;
    ++sent_[q.li];
    return {};
  };

  std::memcpy(base + area(me), src, count * es);
  for (std::size_t k = 0; k < np; ++k)
    while (peers[k].posted < std::min(T, S))
      if (auto p = post_recv(peers[k]); !p) {
        where_ = "posting the first receives of the mesh all_sum";
        return p;
      }
  if (auto b = before_start(); !b) {
    where_ = "the barrier before the all_sum";
    return b;
  }
  auto describe_wait = [&]() {
    std::string w;
    for (std::size_t k = 0; k < np; ++k)
      if (peers[k].received < T)
        w += std::string(w.empty() ? "" : ", ") + "piece " + std::to_string(peers[k].received) + "/" + std::to_string(T) +
             " from rank " + std::to_string(peers[k].rank) + " (mesh)";
    return w;
  };

  tbverbs::WorkCompletion wc[32];
  Watch watchdog;
  constexpr std::size_t max_wait = 16;
  tbverbs::Link* sleepers[max_wait];
  const std::size_t nsleep = std::min(np, max_wait);
  for (std::size_t k = 0; k < nsleep; ++k) sleepers[k] = &links_[peers[k].li];
  auto handle = [&](Peer& q, std::size_t got) -> Result<void> {
    for (std::size_t i = 0; i < got; ++i) {
      if (!wc[i].is_recv()) {
        ++q.send_done;
        continue;
      }
      const std::size_t j = q.received;
      const std::size_t want = piece(j).second;
      if (wc[i].wr_id() != j || wc[i].byte_len() != want)
        return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                                "mesh piece from rank " + std::to_string(q.rank) + ": got message " +
                                    std::to_string(wc[i].wr_id()) + " of " + std::to_string(wc[i].byte_len()) +
                                    " bytes, expected message " + std::to_string(j) + " of " + std::to_string(want)));
      ++q.received;
      ++received_[q.li];
    }
    return {};
  };
  for (;;) {
    bool progress = false;
    // Posts first, polls after (see the ring's engine: an empty poll may nap in the provider).
    for (std::size_t k = 0; k < np; ++k) {
      Peer& q = peers[k];
      while (q.posted < T && q.posted < q.received + S) {
        if (auto p = post_recv(q); !p) {
          where_ = "posting receives";
          return p;
        }
        progress = true;
      }
      while (q.sent < T) {
        const std::size_t j = q.sent;
        if (j >= W && q.received < j - W + 1) break;     // credit: the peer posted for j
        if (q.posted < std::min(T, j + W + 1)) break;    // our receives ahead of our send
        if (q.sent - q.send_done >= S) break;            // send queue room
        if (auto p = post_send(q); !p) {
          where_ = "posting sends";
          return p;
        }
        progress = true;
      }
    }
    if (watchdog.idle > 16) {
      auto slept = sleep_on_links(std::span(sleepers, nsleep), wc, describe_wait, [&](std::size_t which, std::size_t got) {
        auto h = handle(peers[which], got);
        if (!h) where_ = "receiving the mesh all_sum";
        return h;
      });
      if (!slept) return fail(slept.error());
      progress = progress || *slept;
    }
    bool done = true;
    for (std::size_t k = 0; k < np; ++k) {
      Peer& q = peers[k];
      auto got = links_[q.li].cq().poll(wc);
      if (!got) {
        where_ = "polling the CQ of link " + std::to_string(links_[q.li].id()) + " while waiting for " + describe_wait();
        return fail(got.error());
      }
      if (auto h = handle(q, *got); !h) {
        where_ = "receiving the mesh all_sum";
        return h;
      }
      if (*got > 0) progress = true;
      done = done && q.received == T && q.send_done == T;
    }
    if (done) break;
    if (auto w = watch(watchdog, progress, describe_wait); !w) return w;
  }
  // Every vector is here: sum them in rank order (the same order on every rank).
  add(t, dst, base + area(0), base + area(1), count);
  for (int p = 2; p < n; ++p) add(t, dst, dst, base + area(p), count);
  return {};
}

}  // namespace ring
