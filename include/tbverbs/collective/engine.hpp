/// @file collective/engine.hpp
/// `collective::Engine`: the one progress loop every call of the collectives layer runs on. A
/// schedule (collective/algorithms.hpp) says, per link, how many messages go each way and, per
/// message, where its bytes are, where they go and when a send may start; the engine checks that
/// every rank made the same call, posts the receives ahead as credits, posts the sends when the
/// credits and the data allow, polls, hands each arrival to the schedule, and bounds every wait.
///
/// ## Wires
/// Every link a call uses carries its messages ("wires") in order, numbered from 0:
/// - wire 0, the **head**, begins with the **call header**: the call's identity
///   (collective/call.hpp, 64 bytes). Where the schedule's message 0 is ready when the call
///   starts and fits beside the header in one message, it rides in the head after the header;
/// - on the two ring links of cable 0, the **agreement wave** (see below), a 4-byte wire per hop;
/// - the schedule's messages (from message 0, when it did not ride in the head); where one way
///   has fewer wires, 4-byte placeholders pad it to the other's count.
/// The head receive of the next call is posted as soon as this call's last receive is, so a call
/// starts without any exchange: the head goes out at once, and a peer that finished first may
/// send its next head early (it waits, counted, for the next call).
///
/// ## Agreement before any user write
/// A rank compares each peer's header with its own call before it uses a byte of that link: ranks
/// that made different calls fail with ErrorKind::call_mismatch naming both calls. No user buffer
/// is written before the call has *agreed*: every header this rank received matches, and, for the
/// schedules that write user memory as data arrives (`writes_early()`: the ring and the broadcast
/// chain) on 4 ranks or more, the agreement wave went round: a rank sends wave wire 1 toward one
/// neighbour once it verified the other neighbour's header, and wave wire k once wave wire k - 1
/// arrived from the other side, so wave wire k from the left proves ranks r-1 ... r-1-k made this
/// call; (n-2)/2 wires each way cover the ring. With 2 or 3 ranks every rank is a neighbour and
/// the headers suffice; the latency and mesh algorithms write user memory only when every rank's
/// vector is in (each forwarded only after its link's header matched). Until then, arrivals wait
/// in their slots and receives are posted into slots, never into user memory.
///
/// ## Credits, in band
/// No send may meet an empty receive queue: on Apple's driver that stops the direction for good
/// under one reading of the field reports (docs/field-reports.md row 17) and is held by
/// credit-based flow control under another; on RC it is an RNR error. So:
/// - before sending wire w, a rank has posted its receives for the peer's wires up to w + window;
/// - a rank sends wire w >= 1 only after the peer's header matched and the peer's wire
///   w - window arrived (which proves the peer's receives for it);
/// - message j (j >= 1) of a link lands in receive slot j mod slots, and its receive is posted only
///   once message j - slots there was consumed.
///
/// Apple's driver pairs a send with a receive of the same number of 4 KiB frames (TN3205), so the
/// head receive must be posted with the frame count of a head nobody has chosen yet: both ends
/// guess the head of the previous call on the link (the common case: a backend repeats the same
/// call); when either way's head differs, both ends send a header alone padded to the guessed
/// frames (a "dummy" head), and message 0 follows it. Every head begins with the header, so ranks
/// that made different calls always read each other's: the mismatch is named, never a
/// frame-count error.
///
/// ## Where messages land
/// A receive goes straight to its place when that place is registered on the link's device and
/// the call has agreed (the scratch memory always is); otherwise it lands in a receive slot and is
/// copied to its place when delivered, as does a message in a head slot. A send from user memory
/// that is not registered is first copied into one of the link's send slots (staged memory). With
/// RDMA WRITE the sender writes into the peer's scratch memory at the place the peer's receive
/// would have used (its gather area, receive slot or head slot: user memory is never written
/// remotely), and a zero-length receive is the credit, completed with the wire number as
/// the immediate. A head is written into the peer's head slot.
#pragma once

#include "call.hpp"
#include "network.hpp"

#include <cstring>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// Where one message lives on a rank.
struct Place {
  /// Which memory: `none` (an empty message: a 4-byte placeholder travels), `slot` (any receive
  /// slot of the link: the schedule reads it from where it landed), `scratch` (the gather area),
  /// or the operation's `input`, `output` or `work` buffer.
  enum class Buffer : std::uint8_t { none, slot, scratch, input, output, work };
  Buffer buffer = Buffer::none; ///< Which memory (see Buffer).
  std::size_t offset = 0; ///< Bytes into that memory.
  std::size_t length = 0; ///< Bytes of the message (0: empty).
};

/// The user memory of one operation and where it is registered. `input`, `output` and `work` may
/// be empty; a registration covers its whole buffer on one device, `offset` being where the buffer
/// starts in it (registrations are page-aligned).
struct OpMemory {
  static constexpr std::size_t max_ports = 32; ///< Devices a communicator may use.
  /// One buffer.
  struct Buffer {
    std::byte* data = nullptr; ///< Its first byte (nullptr: unused).
    std::size_t bytes = 0;     ///< Its length.
    const MemoryRegionSet* reg[max_ports] = {}; ///< Per port (Network::ports order), or nullptr: staged.
    std::size_t offset[max_ports] = {};         ///< The buffer's start in that registration.
  };
  Buffer input;  ///< The call's input (empty for recv and barrier).
  Buffer output; ///< The call's output (the input again when in place).
  Buffer work;   ///< reduce_scatter's partial sums (the communicator's own memory).
};

/// Per link, what the engine has delivered to the schedule, for send_ready().
struct Progress {
  std::span<const std::size_t> received; ///< Per link: the peer's messages delivered (received()).
};

/// The progress loop (see the top of this file). One per communicator; not thread-safe.
class Engine {
public:
  /// Drives `net`'s links; keeps per-link state sized once, so a call allocates nothing.
  explicit Engine(Network& net)
      : net_(net), ops_(net.links().size()), delivered_(net.links().size()), sleepers_(net.links().size()) {
    for (std::size_t i = 0; i < net.links().size(); ++i) sleepers_[i] = &net.links()[i];
  }

  /// Runs one call, `call` being this rank's identity of it: `plan` provides, per link i,
  /// `sends(i)`, `recvs(i)`, `send_place(i, j)`, `recv_place(i, j)`, `send_ready(i, j, progress)`,
  /// `head_ready(i, sending)` (message 0 of that way is ready when the sender's call starts),
  /// `received(i, j, data)`, `peer_place(i, j)` (RDMA WRITE: where the peer wants message j),
  /// `start()`, `finish()`, `writes_early()` and `describe(i, j, sending)` (for errors). Every rank
  /// of the links runs the same call. Errors: `call_mismatch` when a peer made another call (a
  /// header that differs, or one on a link this call does not use where the peer's call does);
  /// the links' (a failed work completion or post), the side channel's (a lost or aborting peer),
  /// `timeout` after the configuration's timeout without progress, `port_not_active` when a device
  /// reports a failure event (a port down, a QP or CQ error, the device lost:
  /// Context::wait_async_event); `where` then names the step and the rank waited for.
  template <class Schedule>
  [[nodiscard]] Result<void> run(Schedule& plan, const OpMemory& mem, const CallIdentity& call, std::string& where);

private:
  // What wire w of one way of a link is in this call (see "Wires").
  enum class Role : std::uint8_t { header, header_message, wave, message, pad };
  struct Wire {
    Role role;
    std::size_t index; // message j, or wave hop k (from 1)
  };

  // How one way of a link lays out its wires: message 0 in the head, or after the head and the wave.
  struct Layout {
    bool in_head = false;
    std::size_t wave = 0;
    std::size_t wires = 0; // this way's own wires (the link pads both ways to the larger count)
    std::size_t first() const noexcept { return in_head ? 0 : 1 + wave; } // message 0's wire
    Wire wire(std::size_t w) const noexcept {
      if (w >= wires) return {Role::pad, 0};
      if (w == 0) return in_head ? Wire{Role::header_message, 0} : Wire{Role::header, 0};
      if (w <= wave) return {Role::wave, w};
      return {Role::message, w - first()};
    }
  };

  // One link's part of one call.
  struct LinkOp {
    bool part = false;                 // the call uses this link
    std::size_t sends = 0, recvs = 0;  // the schedule's messages each way
    bool dummy = false;                // the heads are headers padded to the guessed frames
    Layout out, in;                    // this rank's sends, and the peer's
    std::size_t wires = 0;             // wires each way
    std::size_t sent = 0, send_done = 0, posted = 0, received = 0, consumed = 0;
    std::size_t messages_consumed = 0; // messages received and consumed: frees their receive slots
    std::size_t direct_from = SIZE_MAX;// wires posted from here on may land in user memory
    bool header_ok = false;            // the peer's header matched
    bool next_posted = false;          // the next call's head receive is posted
    std::uint32_t first_out = 1, first_in = 1; // frames of the head each way, had no dummy been sent

    // Wave wires that have arrived (wires 1 .. wave).
    std::size_t wave_received() const noexcept { return received > 1 ? std::min(received - 1, in.wave) : 0; }
    bool done() const noexcept {
      return !part || (received == wires && consumed == wires && send_done == wires && next_posted);
    }
  };

  // wr_id of a receive: bit 62 set for a head (posted during the previous call), bit 61 its slot's
  // parity; a data receive's is its wire. Send ids: bit 40 set, the wire below.
  static constexpr std::uint64_t kind_head = std::uint64_t{1} << 62, parity_bit = std::uint64_t{1} << 61,
                                 send_bit = std::uint64_t{1} << 40;
  static constexpr std::size_t placeholder_bytes = 4;
  static std::uint32_t frames(std::size_t len) noexcept { return frames_of(len == 0 ? placeholder_bytes : len); }

  template <class Schedule> class Pass;

  // A device's failure event since the last look (a port down, a QP or CQ error, the device
  // gone), as an error naming the device and port; success when there is none or the library
  // has no async events.
  Result<void> dead_port();

  Network& net_;
  std::vector<LinkOp> ops_;
  std::vector<std::size_t> delivered_;
  std::vector<Link*> sleepers_;
};

// ---------------------------------------------------------------------------------------------

inline Result<void> Engine::dead_port() {
  for (const auto& p : net_.ports()) {
    if (!p->context) continue;
    for (;;) {
      auto ev = p->context->wait_async_event(std::chrono::steady_clock::time_point{}); // look, never wait
      if (!ev) break; // nothing pending, or no async events from this library
      if (!ev->is_failure()) continue;
      return fail(Error::make(Step::collective, ErrorKind::port_not_active,
                              ev->describe() + (ev->type() == AsyncEventType::port_error
                                                    ? " (the port left ACTIVE: a cable pulled, or the other end down)"
                                                    : " (reported by the device: its links cannot go on)"))
                      .on(p->name, ev->port())
                      .from(p->context->platform()));
    }
  }
  return {};
}

/// One call's progress (see the top of this file): the steps of Engine::run as member functions
/// over the call's state. Made on the stack for one call; allocates nothing.
template <class Schedule> class Engine::Pass {
public:
  Pass(Engine& e, Schedule& plan, const OpMemory& mem, const CallIdentity& call, std::string& where)
      : e_(e), net_(e.net_), plan_(plan), mem_(mem), call_(call), where_(where), L_(net_.layout()),
        write_(net_.writes()), pairing_(net_.frame_pairing()), slots_(L_.slots) {}

  Result<void> run();

private:
  // ---- set-up
  void plan_links();
  void plan_link(std::size_t i, std::size_t wave);
  Result<void> take_early_arrival();

  // ---- places and lengths
  const OpMemory::Buffer* buffer_of(Place::Buffer b) const noexcept;
  std::byte* pointer(const Place& p) const noexcept;
  std::size_t landing(std::size_t i, std::size_t w) const;
  std::size_t expected_len(std::size_t i, std::size_t w) const;

  // ---- posting
  Result<void> post_receives(std::size_t i, bool& progress);
  Result<void> post_recv(std::size_t i, std::size_t w);
  Result<void> post_next(std::size_t i);
  Result<void> post_sends(std::size_t i, bool& progress);
  bool may_send(std::size_t i, std::size_t w) const;
  Result<void> post_send(std::size_t i, std::size_t w);
  Result<abi::ibv_sge> send_sge(std::size_t i, std::size_t w, std::size_t& peer_at);
  Result<abi::ibv_sge> head_sge(std::size_t i);

  // ---- arrivals
  Result<void> handle(std::size_t i, std::span<const WorkCompletion> wcs);
  Result<void> arrived(std::size_t i, std::size_t w, std::size_t bytes);
  Result<void> check_header(std::size_t i);
  Result<void> early_head(std::size_t i, unsigned parity);
  Result<void> deliver(std::size_t i);
  Result<void> deliver_message(std::size_t i, std::size_t w, std::size_t j);
  void update_agreement();

  // ---- the loop
  Result<void> turn(bool& progress);
  Result<void> poll_all(bool& progress);
  Result<void> nap(bool& progress);
  Result<void> watch();
  Result<void> leaving_peer();
  void end();
  std::string describe_wait() const;
  std::string describe_wire(std::size_t i, std::size_t w, bool sending) const;
  Result<void> failed(Result<void> r, const std::string& where) {
    if (!r && where_.empty()) where_ = where;
    return r;
  }

  LinkOp& op(std::size_t i) noexcept { return e_.ops_[i]; }
  const LinkOp& op(std::size_t i) const noexcept { return e_.ops_[i]; }
  LinkState& state(std::size_t i) noexcept { return net_.state(i); }
  const LinkState& state(std::size_t i) const noexcept { return net_.state(i); }
  std::size_t links() const noexcept { return net_.links().size(); }

  Engine& e_;
  Network& net_;
  Schedule& plan_;
  const OpMemory& mem_;
  const CallIdentity& call_;
  std::string& where_;
  const ScratchLayout& L_;
  const bool write_, pairing_;
  const std::size_t slots_;
  bool agreed_ = false;
  std::size_t cable0_[2] = {SIZE_MAX, SIZE_MAX}; // the wave's links (left, right), when it runs
};

template <class Schedule> inline Result<void> Engine::Pass<Schedule>::run() {
  plan_links();
  plan_.start();
  if (auto r = take_early_arrival(); !r) return r;
  update_agreement();
  using clock = std::chrono::steady_clock;
  const auto timeout = net_.config().timeout;
  auto last_progress = clock::now(), last_check = last_progress;
  unsigned idle = 0;
  for (;;) {
    bool progress = false;
    if (auto r = turn(progress); !r) return r;
    bool done = true;
    for (std::size_t i = 0; i < links(); ++i) done = done && op(i).done();
    if (done) break;
    if (idle > 16)
      if (auto r = nap(progress); !r) return r;
    const auto now = clock::now();
    if (progress) {
      last_progress = now;
      idle = 0;
    } else {
      ++idle;
    }
    if (now - last_check > std::chrono::milliseconds(20) || net_.channel().abort_requested()) {
      last_check = now;
      if (auto r = watch(); !r) return r;
    }
    if (now - last_progress > timeout) {
      where_ = "waiting for " + describe_wait();
      return fail(Error::make(Step::collective, ErrorKind::timeout, "no progress for " + std::to_string(timeout.count()) + " ms"));
    }
  }
  end();
  plan_.finish();
  return {};
}

// Which links the call uses and each one's wires. A collective uses cable 0 toward both ring
// neighbours even where its schedule moves nothing there (their headers are what the call agrees
// on), and every link its schedule moves messages on; send and recv only the latter.
template <class Schedule> inline void Engine::Pass<Schedule>::plan_links() {
  const bool collective = !call_.point_to_point();
  const std::size_t hops = plan_.writes_early() && collective ? net_.wave_hops() : 0;
  if (collective && net_.count(Side::left) > 0 && net_.count(Side::right) > 0) {
    cable0_[0] = net_.first(Side::left);
    cable0_[1] = net_.first(Side::right);
  }
  for (std::size_t i = 0; i < links(); ++i) {
    e_.delivered_[i] = 0;
    const bool ring0 = i == cable0_[0] || i == cable0_[1];
    const std::size_t s = plan_.sends(i), r = plan_.recvs(i);
    if (!ring0 && s == 0 && r == 0) {
      op(i) = LinkOp{};
      continue;
    }
    plan_link(i, ring0 ? hops : 0);
  }
  if (hops == 0) cable0_[0] = cable0_[1] = SIZE_MAX;
}

// Link i's layouts: message 0 rides in the head (after the header) when its sender has it when
// the call starts and both fit one message, the head is a dummy when either way's head differs in
// frames from the guess both ends posted with (Apple pairs frames), and the wave comes first.
template <class Schedule> inline void Engine::Pass<Schedule>::plan_link(std::size_t i, std::size_t wave) {
  LinkOp& o = op(i);
  const LinkState& s = state(i);
  o = LinkOp{};
  o.part = true;
  o.sends = plan_.sends(i);
  o.recvs = plan_.recvs(i);
  const std::size_t messages = std::max<std::size_t>({o.sends, o.recvs, 1});
  auto riding = [&](bool sending, std::size_t count) -> std::size_t { // message 0's bytes in the head, or SIZE_MAX
    if (wave > 0) return SIZE_MAX; // the wave goes first: a head never waits for data
    if (count == 0) return 0;      // a placeholder: the header alone stands for it
    const std::size_t len = sending ? plan_.send_place(i, 0).length : plan_.recv_place(i, 0).length;
    return plan_.head_ready(i, sending) && call_header_bytes + len <= L_.slot_bytes ? len : SIZE_MAX;
  };
  const std::size_t ride_out = riding(true, o.sends), ride_in = riding(false, o.recvs);
  o.first_out = frames(call_header_bytes + (ride_out == SIZE_MAX ? 0 : ride_out));
  o.first_in = frames(call_header_bytes + (ride_in == SIZE_MAX ? 0 : ride_in));
  o.dummy = pairing_ && !write_ && (o.first_out != s.head_frames_out || o.first_in != s.head_frames_in);
  o.out.in_head = !o.dummy && ride_out != SIZE_MAX;
  o.in.in_head = !o.dummy && ride_in != SIZE_MAX;
  o.out.wave = o.in.wave = wave;
  o.out.wires = o.out.first() + messages;
  o.in.wires = o.in.first() + messages;
  o.wires = std::max(o.out.wires, o.in.wires);
  o.posted = 1; // the head, posted during the previous call or at set-up
}

// A head that a peer sent before this call began is its wire 0.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::take_early_arrival() {
  for (std::size_t i = 0; i < links(); ++i) {
    LinkState& s = state(i);
    if (!op(i).part || !s.early_head) continue;
    s.early_head = false;
    if (auto r = arrived(i, 0, s.early_bytes); !r) return failed(r, describe_wire(i, 0, false));
  }
  return {};
}

template <class Schedule>
inline const OpMemory::Buffer* Engine::Pass<Schedule>::buffer_of(Place::Buffer b) const noexcept {
  switch (b) {
  case Place::Buffer::input: return &mem_.input;
  case Place::Buffer::output: return &mem_.output;
  case Place::Buffer::work: return &mem_.work;
  default: return nullptr;
  }
}

template <class Schedule> inline std::byte* Engine::Pass<Schedule>::pointer(const Place& p) const noexcept {
  if (p.buffer == Place::Buffer::scratch) return net_.scratch() + L_.gather(0) + p.offset;
  const auto* b = buffer_of(p.buffer);
  return b != nullptr ? b->data + p.offset : nullptr;
}

// Where wire w of link i lands here (a scratch offset), or SIZE_MAX: straight into its place.
// A message in the head is at the head slot's offset call_header_bytes.
template <class Schedule> inline std::size_t Engine::Pass<Schedule>::landing(std::size_t i, std::size_t w) const {
  const LinkOp& o = op(i);
  const LinkState& s = state(i);
  const Wire x = o.in.wire(w);
  if (x.role == Role::header) return L_.head_slot(i, s.parity);
  if (x.role == Role::header_message) return L_.head_slot(i, s.parity) + call_header_bytes;
  if (x.role != Role::message || x.index >= o.recvs) return L_.placeholder();
  const Place p = plan_.recv_place(i, x.index);
  if (p.length == 0) return L_.placeholder();
  if (p.buffer == Place::Buffer::scratch) return L_.gather(0) + p.offset;
  const std::size_t slot = L_.recv_slot(i, x.index % slots_);
  if (p.buffer == Place::Buffer::slot || write_ || w < o.direct_from) return slot;
  const auto* b = buffer_of(p.buffer);
  return b != nullptr && b->reg[s.port_index] != nullptr ? SIZE_MAX : slot;
}

// Bytes wire w of link i must carry (SIZE_MAX: any, a dummy head).
template <class Schedule> inline std::size_t Engine::Pass<Schedule>::expected_len(std::size_t i, std::size_t w) const {
  const LinkOp& o = op(i);
  const Wire x = o.in.wire(w);
  if (x.role == Role::header) return o.dummy ? SIZE_MAX : call_header_bytes;
  const std::size_t j_len = x.index < o.recvs && x.role != Role::wave && x.role != Role::pad ? plan_.recv_place(i, x.index).length : 0;
  if (x.role == Role::header_message) return call_header_bytes + j_len;
  return j_len == 0 ? placeholder_bytes : j_len;
}

// Receives up to what the slots allow: message j (j >= 1) reuses the slot of message j - slots.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::post_receives(std::size_t i, bool& progress) {
  LinkOp& o = op(i);
  while (o.posted < o.wires) {
    const Wire x = o.in.wire(o.posted);
    if (x.role == Role::message && x.index >= 1 && x.index >= o.messages_consumed + slots_) break;
    if (auto r = post_recv(i, o.posted); !r) return failed(r, "posting the receive of " + describe_wire(i, o.posted, false));
    ++o.posted;
    progress = true;
  }
  if (o.posted == o.wires && !o.next_posted) {
    if (auto r = post_next(i); !r) return failed(r, "posting the next call's head receive on link " + std::to_string(net_.links()[i].id()));
    o.next_posted = true;
  }
  return {};
}

template <class Schedule> inline Result<void> Engine::Pass<Schedule>::post_recv(std::size_t i, std::size_t w) {
  Link& l = net_.links()[i];
  if (write_) return l.qp().post(RecvWr(w));
  const std::size_t at = landing(i, w);
  if (at != SIZE_MAX) {
    auto sge = state(i).port->scratch->sge(at, expected_len(i, w));
    if (!sge) return fail(sge.error());
    return l.qp().recv(w, *sge);
  }
  const Place p = plan_.recv_place(i, op(i).in.wire(w).index);
  const auto* b = buffer_of(p.buffer);
  const std::size_t port = state(i).port_index;
  auto sge = b->reg[port]->sge(b->offset[port] + p.offset, p.length);
  if (!sge) return fail(sge.error());
  return l.qp().recv(w, *sge);
}

// The next call's head receive (the frames of this call's head from the peer, had it sent no
// dummy: the guess) in the other parity's head slot.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::post_next(std::size_t i) {
  const LinkState& s = state(i);
  const unsigned next = s.parity ^ 1u;
  const std::uint64_t id = kind_head | (next != 0 ? parity_bit : 0);
  Link& l = net_.links()[i];
  if (write_) return l.qp().post(RecvWr(id));
  auto head = s.port->scratch->sge(L_.head_slot(i, next), pairing_ ? std::size_t{op(i).first_in} * frame_bytes : L_.slot_bytes);
  if (!head) return fail(head.error());
  return l.qp().recv(id, *head);
}

template <class Schedule> inline Result<void> Engine::Pass<Schedule>::post_sends(std::size_t i, bool& progress) {
  LinkOp& o = op(i);
  while (o.sent < o.wires && may_send(i, o.sent)) {
    if (auto r = post_send(i, o.sent); !r) return failed(r, "posting " + describe_wire(i, o.sent, true));
    ++o.sent;
    ++state(i).messages_sent;
    progress = true;
  }
  return {};
}

// Wire w may go when the peer is known to have posted its receive (the credits), our receives
// are posted ahead of it, a send slot is free, and its content is there: the wave's condition, or
// the schedule's (send_ready).
template <class Schedule> inline bool Engine::Pass<Schedule>::may_send(std::size_t i, std::size_t w) const {
  const LinkOp& o = op(i);
  const std::size_t W = state(i).window;
  if (w >= 1 && (!o.header_ok || w >= o.received + W)) return false;
  if (o.posted < std::min(w + W + 1, o.wires)) return false;
  if (o.sent - o.send_done >= slots_) return false;
  const Wire x = o.out.wire(w);
  if (x.role == Role::wave) {
    const std::size_t other = i == cable0_[0] ? cable0_[1] : cable0_[0];
    return x.index == 1 ? op(other).header_ok : op(other).wave_received() >= x.index - 1;
  }
  if ((x.role == Role::message || x.role == Role::header_message) && x.index < o.sends)
    return plan_.send_ready(i, x.index, Progress{e_.delivered_});
  return true;
}

// The head: the call header, then message 0 when it rides along, or padding to the guessed
// frames (a dummy head), composed in the link's send slot 0.
template <class Schedule> inline Result<abi::ibv_sge> Engine::Pass<Schedule>::head_sge(std::size_t i) {
  const LinkOp& o = op(i);
  const LinkState& s = state(i);
  std::byte* slot = net_.scratch() + L_.send_slot(i, 0);
  encode(call_, std::span<std::byte, call_header_bytes>(slot, call_header_bytes));
  std::size_t len = call_header_bytes;
  if (o.out.in_head && o.sends > 0) {
    const Place p = plan_.send_place(i, 0);
    if (p.length > 0) std::memcpy(slot + call_header_bytes, pointer(p), p.length);
    len += p.length;
  } else if (o.dummy && s.head_frames_out > 1) {
    len = std::size_t{s.head_frames_out} * frame_bytes;
  }
  return s.port->scratch->sge(L_.send_slot(i, 0), len);
}

// The bytes of wire w and, for RDMA WRITE, where they go in the peer's scratch memory.
template <class Schedule>
inline Result<abi::ibv_sge> Engine::Pass<Schedule>::send_sge(std::size_t i, std::size_t w, std::size_t& peer_at) {
  const LinkOp& o = op(i);
  const LinkState& s = state(i);
  const MemoryRegionSet& scr = *s.port->scratch;
  const Wire x = o.out.wire(w);
  peer_at = L_.placeholder();
  if (x.role == Role::header || x.role == Role::header_message) {
    peer_at = L_.head_slot(s.peer_link_index, s.parity);
    return head_sge(i);
  }
  if (x.role != Role::message || x.index >= o.sends || plan_.send_place(i, x.index).length == 0)
    return scr.sge(L_.placeholder(), placeholder_bytes);
  const Place p = plan_.send_place(i, x.index);
  if (write_) {
    const Place q = plan_.peer_place(i, x.index);
    peer_at = q.buffer == Place::Buffer::scratch ? L_.gather(0) + q.offset : L_.recv_slot(s.peer_link_index, x.index % slots_);
  }
  if (p.buffer == Place::Buffer::scratch) return scr.sge(L_.gather(0) + p.offset, p.length);
  const auto* b = buffer_of(p.buffer);
  if (b != nullptr && b->reg[s.port_index] != nullptr) return b->reg[s.port_index]->sge(b->offset[s.port_index] + p.offset, p.length);
  const std::size_t slot = L_.send_slot(i, w % slots_); // staged: through a send slot
  std::memcpy(net_.scratch() + slot, pointer(p), p.length);
  return scr.sge(slot, p.length);
}

template <class Schedule> inline Result<void> Engine::Pass<Schedule>::post_send(std::size_t i, std::size_t w) {
  std::size_t peer_at = 0;
  auto sge = send_sge(i, w, peer_at);
  if (!sge) return fail(sge.error());
  Link& l = net_.links()[i];
  const std::uint64_t id = send_bit | w;
  if (!write_) return l.qp().send(id, *sge);
  auto to = state(i).peer_scratch->at(peer_at, sge->length);
  if (!to) return fail(to.error());
  return l.qp().post(SendWr::rdma_write_with_imm(id, *sge, *to, static_cast<std::uint32_t>(w)));
}

template <class Schedule>
inline Result<void> Engine::Pass<Schedule>::handle(std::size_t i, std::span<const WorkCompletion> wcs) {
  LinkOp& o = op(i);
  LinkState& s = state(i);
  for (const WorkCompletion& wc : wcs) {
    if (!wc.is_recv()) {
      ++o.send_done;
      continue;
    }
    const std::uint64_t id = wc.wr_id();
    const bool head = (id & kind_head) != 0;
    if (head && (!o.part || ((id & parity_bit) != 0) != (s.parity != 0))) {
      // The next call's head, sent by a peer that finished this call first (or whose next call
      // uses a link this one does not).
      if (auto r = early_head(i, (id & parity_bit) != 0 ? 1u : 0u); !r) return r;
      s.early_head = true;
      s.early_bytes = wc.byte_len();
      continue;
    }
    const std::size_t w = head ? 0 : static_cast<std::size_t>(write_ ? wc.imm() : id & 0xffffffffu);
    if (w != o.received || (write_ && wc.has_imm() && !head && wc.imm() != o.received))
      return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                              "messages from rank " + std::to_string(s.peer) + " out of order: got wire " +
                                  std::to_string(w) + ", expected " + std::to_string(o.received)));
    if (auto r = arrived(i, w, wc.byte_len()); !r) return r;
  }
  return {};
}

// Wire w of link i arrived with `bytes`: its length checked (a head's header is read and
// compared); its content waits for deliver().
template <class Schedule>
inline Result<void> Engine::Pass<Schedule>::arrived(std::size_t i, std::size_t w, std::size_t bytes) {
  LinkOp& o = op(i);
  LinkState& s = state(i);
  if (w == 0) { // the header first: a peer in another call sends another head
    if (!write_ && bytes < call_header_bytes)
      return fail(Error::make(Step::collective, ErrorKind::bad_frame,
                              "rank " + std::to_string(s.peer) + " sent a head of " + std::to_string(bytes) +
                                  " bytes, shorter than a call header (a rank of another tbverbs release?)"));
    if (auto r = check_header(i); !r) return r;
  }
  const std::size_t want = expected_len(i, w);
  if (!write_ && want != SIZE_MAX && bytes != want)
    return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                            describe_wire(i, w, false) + " from rank " + std::to_string(s.peer) + " carried " +
                                std::to_string(bytes) + " bytes, expected " + std::to_string(want) +
                                " although both ranks made the same call"));
  ++o.received;
  ++s.messages_received;
  return {};
}

template <class Schedule> inline Result<void> Engine::Pass<Schedule>::check_header(std::size_t i) {
  const LinkState& s = state(i);
  const std::byte* at = net_.scratch() + L_.head_slot(i, s.parity);
  const auto theirs = decode_call(std::span<const std::byte>(at, call_header_bytes));
  if (!theirs || theirs->rank != s.peer)
    return fail(Error::make(Step::collective, ErrorKind::bad_frame,
                            "rank " + std::to_string(s.peer) + "'s call header is unreadable (a rank of another tbverbs release?)"));
  if (!same_call(call_, *theirs)) return fail(mismatch_error(call_, *theirs));
  op(i).header_ok = true;
  return {};
}

// The head of a later call (a peer that finished this one first, or whose next call uses a link
// this one does not): during a collective it must come from a call the peer made after this
// collective; one made before it (or in its place) means the peer will not make this call.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::early_head(std::size_t i, unsigned parity) {
  if (call_.point_to_point()) return {};
  const std::byte* at = net_.scratch() + L_.head_slot(i, parity);
  const auto theirs = decode_call(std::span<const std::byte>(at, call_header_bytes));
  if (!theirs) return {}; // read again, and refused, when its call comes
  if (theirs->collective_seq > call_.collective_seq) return {};
  where_ = "rank " + std::to_string(state(i).peer) + "'s call header on link " + std::to_string(net_.links()[i].id()) +
           ", which this call does not use";
  return fail(mismatch_error(call_, *theirs));
}

// Hands link i's arrivals to the schedule in wire order, as far as the call's agreement allows.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::deliver(std::size_t i) {
  LinkOp& o = op(i);
  while (o.consumed < o.received) {
    const std::size_t w = o.consumed;
    const Wire x = o.in.wire(w);
    if (x.role == Role::message || x.role == Role::header_message) {
      if (!agreed_) return {};
      if (auto r = deliver_message(i, w, x.index); !r) return failed(r, describe_wire(i, w, false));
      ++o.messages_consumed;
    }
    ++o.consumed;
  }
  return {};
}

template <class Schedule>
inline Result<void> Engine::Pass<Schedule>::deliver_message(std::size_t i, std::size_t w, std::size_t j) {
  if (j >= op(i).recvs) return {};
  const Place p = plan_.recv_place(i, j);
  ++e_.delivered_[i];
  if (p.length == 0) return plan_.received(i, j, nullptr);
  const std::size_t at = landing(i, w);
  const std::byte* data = at == SIZE_MAX ? pointer(p) : net_.scratch() + at;
  if (p.buffer != Place::Buffer::slot && p.buffer != Place::Buffer::none && at != SIZE_MAX) {
    std::byte* to = pointer(p);
    if (to != data) std::memcpy(to, data, p.length);
    data = to;
  }
  return plan_.received(i, j, data);
}

// The call has agreed once every header matched and, where the wave runs, it came round both ways.
template <class Schedule> inline void Engine::Pass<Schedule>::update_agreement() {
  if (agreed_) return;
  for (std::size_t i = 0; i < links(); ++i)
    if (op(i).part && !op(i).header_ok) return;
  if (cable0_[0] != SIZE_MAX)
    for (std::size_t i : cable0_)
      if (op(i).wave_received() < op(i).in.wave) return;
  agreed_ = true;
  for (std::size_t i = 0; i < links(); ++i) op(i).direct_from = op(i).posted;
}

// One turn of the loop: posts first, polls after (an empty poll may nap in the provider: the
// emulator sleeps until its next completion is due, so what can be sent is sent before it).
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::turn(bool& progress) {
  for (std::size_t i = 0; i < links(); ++i) {
    if (!op(i).part) continue;
    if (auto r = post_receives(i, progress); !r) return r;
    if (auto r = post_sends(i, progress); !r) return r;
  }
  if (auto r = poll_all(progress); !r) return r;
  update_agreement();
  for (std::size_t i = 0; i < links(); ++i)
    if (op(i).part)
      if (auto r = deliver(i); !r) return r;
  return {};
}

template <class Schedule> inline Result<void> Engine::Pass<Schedule>::poll_all(bool& progress) {
  WorkCompletion wc[32];
  for (std::size_t i = 0; i < links(); ++i) {
    auto got = net_.links()[i].cq().poll(wc);
    if (!got)
      return failed(fail(got.error()), "polling the completions of link " + std::to_string(net_.links()[i].id()) +
                                           " while waiting for " + describe_wait());
    if (*got == 0) continue;
    if (auto h = handle(i, std::span<const WorkCompletion>(wc, *got)); !h) return failed(h, "waiting for " + describe_wait());
    progress = true;
  }
  return {};
}

// Nothing happened for a while: sleep on the CQs (at most 10 ms).
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::nap(bool& progress) {
  WorkCompletion wc[32];
  std::size_t which = 0;
  const std::size_t n = std::min<std::size_t>(links(), 16);
  auto got = wait_any(std::span<Link* const>(e_.sleepers_.data(), n), wc, which,
                      std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
  if (!got) return failed(fail(got.error()), "waiting for " + describe_wait());
  if (*got == 0) return {};
  if (auto h = handle(which, std::span<const WorkCompletion>(wc, *got)); !h) return failed(h, "waiting for " + describe_wait());
  progress = true;
  return {};
}

// Every 20 ms of a call: the peers alive and not aborting, no device failure event, no peer gone.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::watch() {
  if (auto alive = net_.channel().check_peers(); !alive) return failed(alive, "waiting for " + describe_wait());
  if (auto port = e_.dead_port(); !port) return failed(port, "waiting for " + describe_wait());
  return leaving_peer();
}

// A peer that closed its communicator will not make this call: a collective needs every rank, a
// send or recv its peer. Unless it made it before it left: then it finished its part (this rank
// only waits for its own completions) and closes after the others come to close.
template <class Schedule> inline Result<void> Engine::Pass<Schedule>::leaving_peer() {
  for (int r = 0; r < net_.size(); ++r) {
    if (r == net_.rank() || (call_.point_to_point() && r != call_.from && r != call_.to)) continue;
    if (auto note = net_.channel().leaving_note(r)) {
      const auto done = net_.channel().leaving_counts(r);
      const std::uint64_t made = !done                  ? 0
                                 : !call_.point_to_point() ? done->collectives
                                 : call_.to == r           ? done->received_from_peer // r's receives of this rank's sends
                                                           : done->sent_to_peer;
      if (made > (call_.point_to_point() ? call_.pair_seq : call_.collective_seq)) continue;
      where_ = "waiting for " + describe_wait();
      return fail(Error::make(Step::collective, ErrorKind::call_mismatch,
                              "the communicator is broken: rank " + std::to_string(r) + " closed it (" + *note +
                                  "), rank " + std::to_string(call_.rank) + " called " + describe(call_) + " as its " +
                                  position(call_)));
    }
  }
  return {};
}

// The next call's guesses: this call's heads; its head lands in the other parity's slot.
template <class Schedule> inline void Engine::Pass<Schedule>::end() {
  for (std::size_t i = 0; i < links(); ++i) {
    const LinkOp& o = op(i);
    if (!o.part) continue;
    LinkState& s = state(i);
    s.head_frames_out = o.first_out;
    s.head_frames_in = o.first_in;
    s.parity ^= 1u;
  }
}

template <class Schedule>
inline std::string Engine::Pass<Schedule>::describe_wire(std::size_t i, std::size_t w, bool sending) const {
  const Wire x = (sending ? op(i).out : op(i).in).wire(w);
  const std::string link = " (link " + std::to_string(net_.links()[i].id()) + ")";
  switch (x.role) {
  case Role::header: return "the call header" + link;
  case Role::header_message: return "the call header with message 0 (" + plan_.describe(i, 0, sending) + ")" + link;
  case Role::wave: return "agreement wave hop " + std::to_string(x.index) + link;
  case Role::pad: return "a placeholder" + link;
  case Role::message: break;
  }
  return "message " + std::to_string(x.index) + " (" + plan_.describe(i, x.index, sending) + ")" + link;
}

template <class Schedule> inline std::string Engine::Pass<Schedule>::describe_wait() const {
  std::string w;
  for (std::size_t i = 0; i < links() && w.size() < 200; ++i) {
    const LinkOp& o = op(i);
    if (!o.part) continue;
    const std::string peer = " from rank " + std::to_string(state(i).peer);
    if (o.received < o.wires)
      w += std::string(w.empty() ? "" : ", ") + describe_wire(i, o.received, false) + peer;
    else if (o.consumed < o.wires)
      w += std::string(w.empty() ? "" : ", ") + "the agreement of every rank before " + describe_wire(i, o.consumed, false);
    else if (o.send_done < o.wires)
      w += std::string(w.empty() ? "" : ", ") + "the completion of wire " + std::to_string(o.send_done) + " to rank " +
           std::to_string(state(i).peer);
  }
  return w.empty() ? "the call to be planned on its links" : w; // before plan_links(), or a call with no wire
}

template <class Schedule>
inline Result<void> Engine::run(Schedule& plan, const OpMemory& mem, const CallIdentity& call, std::string& where) {
  Pass<Schedule> pass(*this, plan, mem, call, where);
  return pass.run();
}

} // namespace collective
TBVERBS_NAMESPACE_END
