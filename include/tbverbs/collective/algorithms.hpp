/// @file collective/algorithms.hpp
/// The collectives' algorithms, as schedules the engine runs (collective/engine.hpp): per link,
/// how many messages go each way, and per message where it is, where it goes, when it may leave
/// and what to do when it arrives.
///
/// **The ring's two directions.** R is sent to the right neighbour and received from the left
/// one, L the other way. Message J of a direction travels on cable J mod k of its hop (k cables),
/// so every listed cable carries traffic, both ways. The links of one cable carry the same number
/// of messages each way (the engine's credits need it).
///
/// **RingSchedule** (bandwidth-optimal; all_reduce, reduce_scatter, all_gather): the vector is cut
/// into `size` chunks, each into two halves that travel in opposite directions, so both directions
/// of every cable are busy at once. Reduce-scatter takes size - 1 steps: at step s, direction R
/// sends chunk (r - s - 1) and receives chunk (r - s - 2), adding it to this rank's own part and
/// forwarding the sum the step after; after the last step chunk r is complete here (direction L
/// mirrors it, with + for -). All-gather then takes size - 1 steps passing complete chunks on
/// (at step s, R sends chunk r - s). all_reduce is both phases; reduce_scatter the first alone
/// (chunk r is rank r's output: the chunks of reduce_scatter and all_gather are the ranks'
/// blocks), all_gather the second alone. Each rank sends 2 (size - 1) / size of the vector in all,
/// half of it each way: (size - 1) / size over each direction of each cable, in 2 (size - 1)
/// hops of latency.
///
/// **LatencySchedule** (small vectors; all_reduce, all_gather): every rank's whole vector travels
/// floor(size/2) hops both ways, each rank forwarding what it received, into the scratch memory's
/// gather area; then each rank combines (or, all_gather, places) all vectors in ring-position
/// order, so every rank computes bitwise the same result. floor(size/2) hops instead of 2 (size - 1).
///
/// **MeshSchedule** (a fully connected job; all_reduce, all_gather, reduce_scatter, all_to_all):
/// every rank sends its vector (reduce_scatter and all_to_all: each peer's block of it) straight to
/// every other rank over their own cable, one hop, and combines (all_to_all: places) what it
/// gathered in rank order.
///
/// **ChainSchedule** (broadcast): the root's buffer is cut in two halves that travel the ring in
/// opposite directions, each rank forwarding each piece as soon as it arrived: size - 1 hops, half
/// the buffer per cable direction.
///
/// **PairSchedule** (send/recv between ring neighbours or mesh-cabled ranks): the pieces go one
/// way over one link; the engine's placeholders come back as credits.
///
/// Every schedule is a plain value made for one call: no allocation, no virtual calls.
#pragma once

#include "engine.hpp"
#include "types.hpp"

#include <algorithm>
#include <cstring>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// One call as the schedules see it.
struct OpShape {
  Collective kind = Collective::all_reduce; ///< The collective.
  DType type = DType::f32;                  ///< The element type.
  ReduceOp op = ReduceOp::sum;              ///< The reduction (all_reduce, reduce_scatter).
  /// Elements of the whole vector: all_reduce's input; reduce_scatter's input (size x the output);
  /// all_gather's output (size x the input); broadcast's and send/recv's buffer.
  std::size_t count = 0;
  bool in_place = false; ///< all_reduce: the output is the input.
  int root = 0;          ///< broadcast: the root's rank.
  int peer = -1;         ///< send/recv: the other rank.
  std::size_t link = 0;  ///< send/recv: the link to it.
};

/// The ring's directions over a Network's links (see the top of this file).
struct Directions {
  const Network& net;      ///< The links.
  std::size_t first[2];    ///< Per side (left, right): the index of its first link.
  std::size_t k[2];        ///< Per side (left, right): its cables.

  /// The directions over `n`'s left and right links.
  explicit Directions(const Network& n) noexcept
      : net(n), first{n.first(Side::left), n.first(Side::right)}, k{n.count(Side::left), n.count(Side::right)} {}
  /// The side direction d is sent on (R: right) and received from (R: left).
  static int send_side(int d) noexcept { return d == 0 ? 1 : 0; }
  static int recv_side(int d) noexcept { return d == 0 ? 0 : 1; } ///< See send_side().
  /// Messages of a T-message direction on cable c of a k-cable side.
  static std::size_t on_cable(std::size_t T, std::size_t c, std::size_t k) noexcept { return T > c ? (T - c - 1) / k + 1 : 0; }
  /// Link i's side (0 left, 1 right, -1 mesh) and cable.
  int side_of(std::size_t i) const noexcept {
    const Side s = net.state(i).side;
    return s == Side::left ? 0 : s == Side::right ? 1 : -1;
  }
  /// The direction link i sends (R on the right cables) and receives (R on the left ones).
  int sends_dir(std::size_t i) const noexcept { return side_of(i) == 1 ? 0 : 1; }
  int recvs_dir(std::size_t i) const noexcept { return side_of(i) == 0 ? 0 : 1; } ///< See sends_dir().
  /// Direction message J of link i's j-th message, sent or received.
  std::size_t message(std::size_t i, std::size_t j) const noexcept {
    const int s = side_of(i);
    if (s < 0) return j; // a mesh link carries its peer's messages alone, in order
    return j * k[s] + net.state(i).cable;
  }
  /// Messages link i sends (receives) of a direction of T messages.
  std::size_t count(std::size_t i, std::size_t T) const noexcept {
    const int s = side_of(i);
    return s < 0 ? 0 : on_cable(T, net.state(i).cable, k[s]);
  }
  /// How many of direction d's first messages have all arrived (T at most).
  std::size_t received_prefix(int d, std::size_t T, const Progress& p) const noexcept {
    const int s = recv_side(d);
    std::size_t prefix = T;
    for (std::size_t c = 0; c < k[s]; ++c) prefix = std::min(prefix, c + k[s] * p.received[first[s] + c]);
    return prefix;
  }
};

/// The ring (see the top of this file): all_reduce, reduce_scatter or all_gather.
struct RingSchedule {
  /// @cond SCHEDULE_STATE
  const Network& net;
  Directions dirs;
  OpShape shape;
  const OpMemory& mem;
  std::size_t es, pe, M, T;
  int n, r;
  Place::Buffer src, dst;

  /// @endcond

  /// The schedule of one call (`s`) on `nw`'s links.
  RingSchedule(const Network& nw, const OpShape& s, const OpMemory& m)
      : net(nw), dirs(nw), shape(s), mem(m), es(dtype_size(s.type)), n(nw.size()), r(nw.position()) {
    pe = std::max<std::size_t>(1, nw.config().message_bytes / es);
    std::size_t max_chunk = 0;
    for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, chunk_end(c) - chunk_begin(c));
    M = std::max<std::size_t>(1, ((max_chunk + 1) / 2 + pe - 1) / pe);
    T = static_cast<std::size_t>(steps()) * M;
    switch (s.kind) {
    case Collective::reduce_scatter:
      src = Place::Buffer::input;
      dst = Place::Buffer::work;
      break;
    case Collective::all_gather:
      src = Place::Buffer::input; // this rank's block leaves from the input; the output is written after agreement
      dst = Place::Buffer::output;
      break;
    default:
      src = s.in_place ? Place::Buffer::output : Place::Buffer::input;
      dst = Place::Buffer::output;
    }
  }
  /// Ring steps of the call: 2(n-1) for all_reduce, n-1 for reduce_scatter and all_gather.
  int steps() const noexcept { return shape.kind == Collective::all_reduce ? 2 * (n - 1) : n - 1; }
  /// True at a reduce-scatter step.
  bool rs(std::size_t step) const noexcept {
    return shape.kind == Collective::reduce_scatter || (shape.kind == Collective::all_reduce && step < static_cast<std::size_t>(n - 1));
  }
  /// x modulo the ranks, never negative.
  int mod(long long x) const noexcept { return static_cast<int>(((x % n) + n) % n); }
  /// Chunk c (a ring position) of the vector: all_reduce cuts it evenly; reduce_scatter and
  /// all_gather chunks are the blocks of the ranks at those positions.
  std::size_t chunk_begin(int c) const noexcept {
    const std::size_t N = static_cast<std::size_t>(n);
    if (shape.kind == Collective::all_reduce) return shape.count * static_cast<std::size_t>(c) / N;
    return static_cast<std::size_t>(net.rank_at(c)) * (shape.count / N);
  }
  /// The end of chunk c (see chunk_begin()).
  std::size_t chunk_end(int c) const noexcept {
    const std::size_t N = static_cast<std::size_t>(n);
    if (shape.kind == Collective::all_reduce) return shape.count * static_cast<std::size_t>(c + 1) / N;
    return chunk_begin(c) + shape.count / N;
  }
  /// The chunk direction d sends (receives) at `step`, for the rank at position `at`.
  int chunk_of(int d, std::size_t step, bool sending, int at) const noexcept {
    const long long s = static_cast<long long>(rs(step) ? step : step - (shape.kind == Collective::all_reduce ? n - 1 : 0));
    const int sign = d == 0 ? -1 : 1;
    if (rs(step)) return mod(at + sign * (s + (sending ? 1 : 2)));
    return mod(at + sign * (s + (sending ? 0 : 1)));
  }
  /// Element range of direction-d message J, as sent by this rank (or received here).
  std::pair<std::size_t, std::size_t> range(int d, std::size_t J, bool sending) const noexcept {
    const int c = chunk_of(d, J / M, sending, r);
    const std::size_t cb = chunk_begin(c), ce = chunk_end(c), mid = cb + (ce - cb + 1) / 2;
    const std::size_t hb = d == 0 ? cb : mid, he = d == 0 ? mid : ce, k = J % M;
    return {std::min(he, hb + k * pe), std::min(he, hb + (k + 1) * pe)};
  }
  /// Messages this rank sends on link i in this call (Engine::run's schedule interface).
  std::size_t sends(std::size_t i) const noexcept { return dirs.count(i, T); }
  /// Messages this rank receives on link i in this call.
  std::size_t recvs(std::size_t i) const noexcept { return dirs.count(i, T); }
  /// Where message j sent on link i is read from.
  Place send_place(std::size_t i, std::size_t j) const noexcept {
    const int d = dirs.sends_dir(i);
    const std::size_t J = dirs.message(i, j);
    const auto [b, e] = range(d, J, true);
    if (b == e) return {};
    if (J >= M) return {dst, b * es, (e - b) * es};
    // Step 0 sends this rank's own data: reduce-scatter its input, all_gather its block (the input)
    if (shape.kind == Collective::all_gather) return {Place::Buffer::input, (b - chunk_begin(r)) * es, (e - b) * es};
    return {rs(0) ? src : dst, b * es, (e - b) * es};
  }
  /// Where message j received on link i goes.
  Place recv_place(std::size_t i, std::size_t j) const noexcept {
    const int d = dirs.recvs_dir(i);
    const std::size_t J = dirs.message(i, j);
    const auto [b, e] = range(d, J, false);
    if (b == e) return {};
    if (rs(J / M)) return {Place::Buffer::slot, 0, (e - b) * es};
    return {dst, b * es, (e - b) * es};
  }
  /// Where the peer wants message j of link i written (the WRITE transport).
  Place peer_place(std::size_t, std::size_t) const noexcept { return {Place::Buffer::slot, 0, 0}; }
  /// Whether message j of link i may be sent now, given what has arrived (`p`).
  bool send_ready(std::size_t i, std::size_t j, const Progress& p) const noexcept {
    const int d = dirs.sends_dir(i);
    const std::size_t J = dirs.message(i, j);
    return J < M || dirs.received_prefix(d, T, p) >= J - M + 1; // what the previous step received
  }
  /// Message j of link i arrived at `data`: combine or copy it where it belongs.
  Result<void> received(std::size_t i, std::size_t j, const std::byte* data) noexcept {
    const int d = dirs.recvs_dir(i);
    const std::size_t J = dirs.message(i, j);
    if (data == nullptr || !rs(J / M)) return {};
    const auto [b, e] = range(d, J, false);
    const std::byte* mine = (src == Place::Buffer::input ? mem.input.data : mem.output.data) + b * es;
    std::byte* into;
    if (shape.kind == Collective::reduce_scatter && J / M == static_cast<std::size_t>(n - 2))
      into = mem.output.data + (b - chunk_begin(r)) * es; // the last step: this rank's block, complete
    else
      into = (dst == Place::Buffer::work ? mem.work.data : mem.output.data) + b * es;
    reduce(shape.op, shape.type, into, mine, data, e - b);
    return {};
  }
  /// Called once before the first message of the call (nothing: no user memory is written
  /// before the ranks agreed on the call).
  void start() noexcept {}
  /// Called once after the last message of the call arrived: all_gather's own block into the
  /// output (reduce_scatter's last step wrote its block already).
  void finish() noexcept {
    if (shape.kind != Collective::all_gather) return;
    std::byte* own = mem.output.data + chunk_begin(r) * es;
    if (own != mem.input.data) std::memcpy(own, mem.input.data, (chunk_end(r) - chunk_begin(r)) * es);
  }
  /// True: arrivals are combined into (or copied to) user memory as they come (the engine holds
  /// them until every rank agreed on the call).
  static constexpr bool writes_early() noexcept { return true; }
  /// True: message 0 of every link is a rank's own data (step 0), there when the call starts.
  static constexpr bool head_ready(std::size_t, bool) noexcept { return true; }
  /// Message j of link i in words, for error details.
  std::string describe(std::size_t i, std::size_t j, bool sending) const {
    const std::size_t J = dirs.message(i, j);
    const std::size_t step = J / M;
    const std::string dir = (sending ? dirs.sends_dir(i) : dirs.recvs_dir(i)) == 0 ? "rightward" : "leftward";
    if (step >= static_cast<std::size_t>(steps())) return dir + " credit";
    if (rs(step)) return "reduce-scatter step " + std::to_string(step) + ", " + dir;
    const std::size_t ag = shape.kind == Collective::all_reduce ? step - static_cast<std::size_t>(n - 1) : step;
    return "all-gather step " + std::to_string(ag) + ", " + dir;
  }
};

/// The latency algorithm (see the top of this file): all_reduce or all_gather of small vectors.
struct LatencySchedule {
  /// @cond SCHEDULE_STATE
  const Network& net;
  Directions dirs;
  OpShape shape;
  const OpMemory& mem;
  std::size_t es, pe, M, T, hops, bytes;
  int n, pos;

  /// @endcond

  /// The schedule of one call (`s`) on `nw`'s links.
  LatencySchedule(const Network& nw, const OpShape& s, const OpMemory& m)
      : net(nw), dirs(nw), shape(s), mem(m), es(dtype_size(s.type)), n(nw.size()), pos(nw.position()) {
    pe = std::max<std::size_t>(1, nw.config().message_bytes / es);
    const std::size_t elems = vector_elements();
    bytes = elems * es;
    M = std::max<std::size_t>(1, (elems + pe - 1) / pe);
    hops = static_cast<std::size_t>(n / 2);
    T = hops * M;
  }
  /// Elements of one rank's vector: all_reduce's whole vector, all_gather's block.
  std::size_t vector_elements() const noexcept {
    return shape.kind == Collective::all_gather ? shape.count / static_cast<std::size_t>(n) : shape.count;
  }
  /// The gather area's vectors: this rank's (0), then the one received at hop h of direction d.
  std::size_t own() const noexcept { return 0; }
  /// See own().
  std::size_t area(int d, std::size_t h) const noexcept { return (1 + static_cast<std::size_t>(d) * hops + h) * net.layout().vector_bytes; }
  /// The elements, or the place, of one message of the split (see the top of this file).
  std::pair<std::size_t, std::size_t> piece(std::size_t J) const noexcept {
    const std::size_t b = (J % M) * pe;
    return {b, std::min(vector_elements(), b + pe)};
  }
  /// Messages this rank sends on link i in this call (Engine::run's schedule interface).
  std::size_t sends(std::size_t i) const noexcept { return dirs.count(i, T); }
  /// Messages this rank receives on link i in this call.
  std::size_t recvs(std::size_t i) const noexcept { return dirs.count(i, T); }
  /// Where message j sent on link i is read from.
  Place send_place(std::size_t i, std::size_t j) const noexcept {
    const std::size_t J = dirs.message(i, j), h = J / M;
    const auto [b, e] = piece(J);
    if (b == e) return {};
    return {Place::Buffer::scratch, (h == 0 ? own() : area(dirs.sends_dir(i), h - 1)) + b * es, (e - b) * es};
  }
  /// Where message j received on link i goes.
  Place recv_place(std::size_t i, std::size_t j) const noexcept {
    const std::size_t J = dirs.message(i, j);
    const auto [b, e] = piece(J);
    if (b == e) return {};
    return {Place::Buffer::scratch, area(dirs.recvs_dir(i), J / M) + b * es, (e - b) * es};
  }
  // The peer receives direction-d message J at the same hop of the same direction.
  /// Where the peer wants message j of link i written (the WRITE transport).
  Place peer_place(std::size_t i, std::size_t j) const noexcept {
    const std::size_t J = dirs.message(i, j);
    const auto [b, e] = piece(J);
    return {Place::Buffer::scratch, area(dirs.sends_dir(i), J / M) + b * es, (e - b) * es};
  }
  /// Whether message j of link i may be sent now, given what has arrived (`p`).
  bool send_ready(std::size_t i, std::size_t j, const Progress& p) const noexcept {
    const std::size_t J = dirs.message(i, j);
    return J < M || dirs.received_prefix(dirs.sends_dir(i), T, p) >= J - M + 1;
  }
  /// Message j of link i arrived at `data`: combine or copy it where it belongs.
  Result<void> received(std::size_t, std::size_t, const std::byte*) noexcept { return {}; }
  /// Called once before the first message of the call.
  void start() noexcept { std::memcpy(net.scratch() + net.layout().gather(0), mem.input.data, bytes); }
  /// The vector of the rank at ring position p, in the gather area.
  const std::byte* vector_at(int p) const noexcept {
    const std::byte* g = net.scratch() + net.layout().gather(0);
    if (p == pos) return g + own();
    const int right_of = ((pos - p) % n + n) % n; // hops from position p rightwards to here
    if (static_cast<std::size_t>(right_of) <= hops) return g + area(0, static_cast<std::size_t>(right_of - 1));
    return g + area(1, static_cast<std::size_t>(n - right_of - 1));
  }
  /// False: the user's output is written in finish() only, from every rank's vector.
  static constexpr bool writes_early() noexcept { return false; }
  /// True: message 0 is the sender's own vector.
  static constexpr bool head_ready(std::size_t, bool) noexcept { return true; }
  /// Called once after the last message of the call arrived (the last reduction or copy).
  void finish() noexcept {
    if (shape.kind == Collective::all_gather) {
      for (int p = 0; p < n; ++p)
        std::memcpy(mem.output.data + static_cast<std::size_t>(net.rank_at(p)) * bytes, vector_at(p), bytes);
      return;
    }
    const std::size_t e = vector_elements();
    reduce(shape.op, shape.type, mem.output.data, vector_at(0), vector_at(1), e);
    for (int p = 2; p < n; ++p) reduce(shape.op, shape.type, mem.output.data, mem.output.data, vector_at(p), e);
  }
  /// Message j of link i in words, for error details.
  std::string describe(std::size_t i, std::size_t j, bool sending) const {
    const std::size_t J = dirs.message(i, j);
    const std::string dir = (sending ? dirs.sends_dir(i) : dirs.recvs_dir(i)) == 0 ? "rightward" : "leftward";
    if (J >= T) return dir + " credit";
    return "latency hop " + std::to_string(J / M) + ", " + dir;
  }
};

/// The mesh (see the top of this file): all_reduce, all_gather, reduce_scatter or all_to_all on a
/// fully connected job.
struct MeshSchedule {
  /// @cond SCHEDULE_STATE
  const Network& net;
  OpShape shape;
  const OpMemory& mem;
  std::size_t es, pe, M, bytes;
  int n, me;

  /// @endcond

  /// The schedule of one call (`s`) on `nw`'s links.
  MeshSchedule(const Network& nw, const OpShape& s, const OpMemory& m)
      : net(nw), shape(s), mem(m), es(dtype_size(s.type)), n(nw.size()), me(nw.rank()) {
    pe = std::max<std::size_t>(1, nw.config().message_bytes / es);
    const std::size_t elems = shape.kind == Collective::all_reduce ? shape.count : shape.count / static_cast<std::size_t>(n);
    bytes = elems * es;
    M = std::max<std::size_t>(1, (elems + pe - 1) / pe);
  }
  /// The peer of link i when it is the link the mesh uses toward that peer (the first cable to
  /// each neighbour, the mesh link to every other rank), else -1.
  int peer_of(std::size_t i) const noexcept {
    const LinkState& s = net.state(i);
    if (s.side == Side::mesh || s.cable == 0) return s.peer;
    return -1;
  }
  /// The gather area's place of rank q's vector at rank `at`: `at`'s own first, then the others.
  std::size_t slot_of(int q, int at) const noexcept {
    return static_cast<std::size_t>(q == at ? 0 : 1 + (q < at ? q : q - 1)) * net.layout().vector_bytes;
  }
  /// The elements, or the place, of one message of the split (see the top of this file).
  std::pair<std::size_t, std::size_t> piece(std::size_t j) const noexcept {
    const std::size_t b = j * pe;
    return {b * es, (std::min(bytes / es, b + pe) - b) * es};
  }
  /// Messages this rank sends on link i in this call (Engine::run's schedule interface).
  std::size_t sends(std::size_t i) const noexcept { return peer_of(i) >= 0 ? M : 0; }
  /// Messages this rank receives on link i in this call.
  std::size_t recvs(std::size_t i) const noexcept { return peer_of(i) >= 0 ? M : 0; }
  /// Where message j sent on link i is read from.
  Place send_place(std::size_t i, std::size_t j) const noexcept {
    const auto [off, len] = piece(j);
    if (len == 0) return {};
    if (shape.kind == Collective::reduce_scatter || shape.kind == Collective::all_to_all) // the peer's block of this rank's input
      return {Place::Buffer::input, static_cast<std::size_t>(peer_of(i)) * bytes + off, len};
    return {Place::Buffer::scratch, slot_of(me, me) + off, len};
  }
  /// Where message j received on link i goes.
  Place recv_place(std::size_t i, std::size_t j) const noexcept {
    const auto [off, len] = piece(j);
    if (len == 0) return {};
    return {Place::Buffer::scratch, slot_of(peer_of(i), me) + off, len};
  }
  /// Where the peer wants message j of link i written (the WRITE transport).
  Place peer_place(std::size_t i, std::size_t j) const noexcept {
    const auto [off, len] = piece(j);
    return {Place::Buffer::scratch, slot_of(me, peer_of(i)) + off, len};
  }
  /// Whether message j of link i may be sent now, given what has arrived (`p`).
  bool send_ready(std::size_t, std::size_t, const Progress&) const noexcept { return true; }
  /// Message j of link i arrived at `data`: combine or copy it where it belongs.
  Result<void> received(std::size_t, std::size_t, const std::byte*) noexcept { return {}; }
  /// Called once before the first message of the call.
  void start() noexcept {
    std::byte* g = net.scratch() + net.layout().gather(0);
    const bool blocks = shape.kind == Collective::reduce_scatter || shape.kind == Collective::all_to_all;
    const std::byte* own = blocks ? mem.input.data + static_cast<std::size_t>(me) * bytes : mem.input.data;
    std::memcpy(g + slot_of(me, me), own, bytes);
  }
  /// False: the user's output is written in finish() only, from every rank's vector.
  static constexpr bool writes_early() noexcept { return false; }
  /// True: message 0 is the sender's own vector.
  static constexpr bool head_ready(std::size_t, bool) noexcept { return true; }
  /// Called once after the last message of the call arrived (the last reduction or copy).
  void finish() noexcept {
    const std::byte* g = net.scratch() + net.layout().gather(0);
    if (shape.kind == Collective::all_gather || shape.kind == Collective::all_to_all) { // block q: what rank q sent
      for (int q = 0; q < n; ++q) std::memcpy(mem.output.data + static_cast<std::size_t>(q) * bytes, g + slot_of(q, me), bytes);
      return;
    }
    const std::size_t e = bytes / es;
    reduce(shape.op, shape.type, mem.output.data, g + slot_of(0, me), g + slot_of(1, me), e);
    for (int q = 2; q < n; ++q) reduce(shape.op, shape.type, mem.output.data, mem.output.data, g + slot_of(q, me), e);
  }
  /// Message j of link i in words, for error details.
  std::string describe(std::size_t i, std::size_t j, bool) const {
    return (j >= M ? std::string("credit") : "mesh piece " + std::to_string(j)) + " of rank " + std::to_string(net.state(i).peer);
  }
};

/// The broadcast chain (see the top of this file).
struct ChainSchedule {
  /// @cond SCHEDULE_STATE
  const Network& net;
  Directions dirs;
  OpShape shape;
  std::size_t es, pe, mid, M[2], dist[2];
  int n;

  /// @endcond

  /// The schedule of one call (`s`) on `nw`'s links.
  ChainSchedule(const Network& nw, const OpShape& s) : net(nw), dirs(nw), shape(s), es(dtype_size(s.type)), n(nw.size()) {
    pe = std::max<std::size_t>(1, nw.config().message_bytes / es);
    mid = (s.count + 1) / 2;
    int root_pos = 0;
    for (int p = 0; p < n; ++p)
      if (nw.rank_at(p) == s.root) root_pos = p;
    const int pos = nw.position();
    dist[0] = static_cast<std::size_t>(((pos - root_pos) % n + n) % n);
    dist[1] = static_cast<std::size_t>(((root_pos - pos) % n + n) % n);
    const std::size_t half[2] = {mid, s.count - mid};
    for (int d = 0; d < 2; ++d) M[d] = (half[d] + pe - 1) / pe;
  }
  /// The elements, or the place, of one message of the split (see the top of this file).
  std::pair<std::size_t, std::size_t> piece(int d, std::size_t J) const noexcept {
    const std::size_t hb = d == 0 ? 0 : mid, he = d == 0 ? mid : shape.count;
    return {std::min(he, hb + J * pe), std::min(he, hb + (J + 1) * pe)};
  }
  /// Messages this rank sends on link i in this call (Engine::run's schedule interface).
  std::size_t sends(std::size_t i) const noexcept {
    const int d = dirs.sends_dir(i);
    return dist[d] + 1 < static_cast<std::size_t>(n) ? dirs.count(i, M[d]) : 0;
  }
  /// Messages this rank receives on link i in this call.
  std::size_t recvs(std::size_t i) const noexcept {
    const int d = dirs.recvs_dir(i);
    return dist[d] > 0 ? dirs.count(i, M[d]) : 0;
  }
  /// Where message j sent on link i is read from.
  Place send_place(std::size_t i, std::size_t j) const noexcept {
    const int d = dirs.sends_dir(i);
    const auto [b, e] = piece(d, dirs.message(i, j));
    if (b == e) return {};
    return {Place::Buffer::output, b * es, (e - b) * es};
  }
  /// Where message j received on link i goes.
  Place recv_place(std::size_t i, std::size_t j) const noexcept {
    const int d = dirs.recvs_dir(i);
    const auto [b, e] = piece(d, dirs.message(i, j));
    if (b == e) return {};
    return {Place::Buffer::output, b * es, (e - b) * es};
  }
  /// Where the peer wants message j of link i written (the WRITE transport).
  Place peer_place(std::size_t, std::size_t) const noexcept { return {Place::Buffer::slot, 0, 0}; }
  /// Whether message j of link i may be sent now, given what has arrived (`p`).
  bool send_ready(std::size_t i, std::size_t j, const Progress& p) const noexcept {
    const int d = dirs.sends_dir(i);
    return dist[d] == 0 || dirs.received_prefix(d, M[d], p) > dirs.message(i, j);
  }
  /// Message j of link i arrived at `data`: combine or copy it where it belongs.
  Result<void> received(std::size_t, std::size_t, const std::byte*) noexcept { return {}; }
  /// Called once before the first message of the call.
  void start() noexcept {}
  /// Called once after the last message of the call arrived (the last reduction or copy).
  void finish() noexcept {}
  /// True: pieces go straight into the receivers' buffers.
  static constexpr bool writes_early() noexcept { return true; }
  /// Whether the sender of link i's message 0 (this rank, or the peer) is the root: anyone else
  /// forwards what it receives, so its first piece is not there when the call starts.
  bool head_ready(std::size_t i, bool sending) const noexcept {
    return sending ? dist[dirs.sends_dir(i)] == 0 : dist[dirs.recvs_dir(i)] == 1;
  }
  /// Message j of link i in words, for error details.
  std::string describe(std::size_t i, std::size_t j, bool sending) const {
    const int d = sending ? dirs.sends_dir(i) : dirs.recvs_dir(i);
    const std::size_t J = dirs.message(i, j);
    return J >= M[d] ? std::string("broadcast credit") : "broadcast piece " + std::to_string(J) + (d == 0 ? ", rightward" : ", leftward");
  }
};

/// send or recv over one link (see the top of this file).
struct PairSchedule {
  /// @cond SCHEDULE_STATE
  OpShape shape;
  std::size_t es, pe, M;

  /// @endcond

  /// The schedule of one call (`s`) on `nw`'s links.
  explicit PairSchedule(const Network& nw, const OpShape& s) : shape(s), es(dtype_size(s.type)) {
    pe = std::max<std::size_t>(1, nw.config().message_bytes / es);
    M = std::max<std::size_t>(1, (s.count + pe - 1) / pe);
  }
  /// Whether link i is the link to the peer.
  bool mine(std::size_t i) const noexcept { return i == shape.link; }
  /// Messages this rank sends on link i in this call (Engine::run's schedule interface).
  std::size_t sends(std::size_t i) const noexcept { return mine(i) && shape.kind == Collective::send ? M : 0; }
  /// Messages this rank receives on link i in this call.
  std::size_t recvs(std::size_t i) const noexcept { return mine(i) && shape.kind == Collective::recv ? M : 0; }
  /// The elements, or the place, of one message of the split (see the top of this file).
  Place piece(Place::Buffer b, std::size_t j) const noexcept {
    const std::size_t lo = j * pe, hi = std::min(shape.count, lo + pe);
    if (lo >= hi) return {};
    return {b, lo * es, (hi - lo) * es};
  }
  /// Where message j sent on link i is read from.
  Place send_place(std::size_t, std::size_t j) const noexcept { return piece(Place::Buffer::input, j); }
  /// Where message j received on link i goes.
  Place recv_place(std::size_t, std::size_t j) const noexcept { return piece(Place::Buffer::output, j); }
  /// Where the peer wants message j of link i written (the WRITE transport).
  Place peer_place(std::size_t, std::size_t) const noexcept { return {Place::Buffer::slot, 0, 0}; }
  /// Whether message j of link i may be sent now, given what has arrived (`p`).
  bool send_ready(std::size_t, std::size_t, const Progress&) const noexcept { return true; }
  /// Message j of link i arrived at `data`: combine or copy it where it belongs.
  Result<void> received(std::size_t, std::size_t, const std::byte*) noexcept { return {}; }
  /// Called once before the first message of the call.
  void start() noexcept {}
  /// Called once after the last message of the call arrived (the last reduction or copy).
  void finish() noexcept {}
  /// False: two ranks, whose headers are the whole agreement (the wave is for collectives).
  static constexpr bool writes_early() noexcept { return false; }
  /// True: the sender's buffer is there when the call starts.
  static constexpr bool head_ready(std::size_t, bool) noexcept { return true; }
  /// Message j of link i in words, for error details.
  std::string describe(std::size_t, std::size_t j, bool) const {
    return (j >= M ? std::string("credit") : "piece " + std::to_string(j)) + " of " +
           std::string(collective_name(shape.kind)) + " with rank " + std::to_string(shape.peer);
  }
};

/// A call that moves no element (a count of 0): only the call headers travel, so the ranks still
/// agree on it (a rank's empty all_reduce against another's broadcast is a mismatch like any).
struct EmptySchedule {
  /// @cond SCHEDULE_STATE
  /// @endcond
  std::size_t sends(std::size_t) const noexcept { return 0; }  ///< None.
  std::size_t recvs(std::size_t) const noexcept { return 0; }  ///< None.
  Place send_place(std::size_t, std::size_t) const noexcept { return {}; } ///< Never asked.
  Place recv_place(std::size_t, std::size_t) const noexcept { return {}; } ///< Never asked.
  Place peer_place(std::size_t, std::size_t) const noexcept { return {}; } ///< Never asked.
  bool send_ready(std::size_t, std::size_t, const Progress&) const noexcept { return true; } ///< Always.
  Result<void> received(std::size_t, std::size_t, const std::byte*) noexcept { return {}; }  ///< Nothing.
  void start() noexcept {}  ///< Nothing.
  void finish() noexcept {} ///< Nothing.
  static constexpr bool writes_early() noexcept { return false; } ///< Nothing is written.
  static constexpr bool head_ready(std::size_t, bool) noexcept { return true; } ///< Nothing to wait for.
  std::string describe(std::size_t, std::size_t, bool) const { return "credit"; } ///< Placeholders only.
};

} // namespace collective
TBVERBS_NAMESPACE_END
