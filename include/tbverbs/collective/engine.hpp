/// @file collective/engine.hpp
/// `collective::Engine`: the one progress loop every collective runs on. A schedule
/// (collective/algorithms.hpp) says, per link, how many messages go each way and, per message,
/// where its bytes are, where they go and when a send may start; the engine posts the receives
/// ahead as credits, posts the sends when the credits and the data allow, polls, hands each
/// arrival to the schedule, and bounds every wait.
///
/// ## Credits, in band
/// No send may meet an empty receive queue: on Apple's driver that stops the direction for good
/// under one reading of the field reports (docs/field-reports.md row 17) and is held by
/// credit-based flow control under another; on RC it is an RNR error. Every link is therefore a
/// pair of message streams of equal length per collective, and:
/// - before sending its message w of a collective, a rank has posted its receives for the peer's
///   messages up to w + window (so the peer's message w proves that);
/// - a rank sends its message w >= 1 only after receiving the peer's message w - window (and at
///   least its message 0);
/// - message 0 of every collective (the "head") is received into one of two head slots by a
///   receive posted during the previous collective (or at set-up), before the rank's last message
///   of it; so a collective starts without any exchange.
/// Where a schedule moves more messages one way than the other (broadcast, send/recv), the engine
/// pads the other way with 4-byte placeholders: they are the credits. The side channel is used at
/// set-up and on failure only.
///
/// Apple's driver pairs a send with a receive of the same number of 4 KiB frames (TN3205), so the
/// head receive must be posted with the frame count of a message nobody has chosen yet: both ends
/// guess the first message of the previous collective on the link (the common case: a backend
/// repeats the same call). When either way's first message differs from the guess, both ends
/// first exchange a dummy head of the guessed size, and the collective's messages follow it.
///
/// ## Where messages land
/// A receive goes straight to its place when that place is registered on the link's device (the
/// scratch memory always is; user memory when the registration cache has it); otherwise it lands
/// in one of the link's receive slots and is copied to its place on arrival, as does a message
/// that arrived in a head slot. A send from user memory that is not registered is first copied
/// into one of the link's send slots (staged memory). With RDMA WRITE the sender writes into the
/// peer's scratch memory at the place the peer's receive would have used (its gather area, or its
/// receive slot for the message: user memory is never written remotely), and a zero-length
/// receive is the credit, completed with the message number as the immediate.
#pragma once

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
  Buffer work;   ///< reduce_scatter's partial sums.
};

/// Per link, what the engine has delivered to the schedule and completed, for send_ready().
struct Progress {
  std::span<const std::size_t> received; ///< Per link: the peer's messages delivered (received()).
};

/// The progress loop (see the top of this file). One per communicator; not thread-safe.
class Engine {
public:
  /// Drives `net`'s links; keeps per-link state sized once, so a collective allocates nothing.
  explicit Engine(Network& net)
      : net_(net), ops_(net.links().size()), delivered_(net.links().size()), sleepers_(net.links().size()) {
    for (std::size_t i = 0; i < net.links().size(); ++i) sleepers_[i] = &net.links()[i];
  }

  /// Runs one collective: `plan` provides, per link i, `sends(i)`, `recvs(i)`, `send_place(i, j)`,
  /// `recv_place(i, j)`, `send_ready(i, j, progress)`, `received(i, j, data)`, `peer_place(i, j)`
  /// (RDMA WRITE: where the peer wants message j), `start()`, `finish()` and
  /// `describe(i, j, sending)` (for errors). Every rank of the links runs the same collective.
  /// Errors: the links' (a failed work completion or post), the side channel's (a lost or aborting
  /// peer), `timeout` after the configuration's timeout without progress, `result_mismatch` for a
  /// message of the wrong length (ranks that called different collectives or sizes),
  /// `port_not_active` when a device reports a failure event (a port down, a QP or CQ error, the
  /// device lost: Context::wait_async_event); `where` then names the step and the rank waited for.
  template <class Schedule>
  [[nodiscard]] Result<void> run(Schedule& plan, const OpMemory& mem, std::string& where);

private:
  // A device's failure event since the last look (a port down, a QP or CQ error, the device
  // gone), as an error naming the device and port; success when there is none or the library
  // has no async events. Checked with the peers' liveness (every 20 ms of a wait): a pulled cable
  // ends the collective at once, naming the port, instead of after the no-progress timeout.
  Result<void> dead_port() {
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

  // One link's part of one collective: its message counts and wire counters. Wire w is message
  // w - dummy of the schedule (wire 0 is the dummy head when there is one); wires beyond a side's
  // messages are placeholders.
  struct LinkOp {
    std::size_t sends = 0, recvs = 0;  // the schedule's messages each way
    std::size_t wires = 0;             // wires each way (equal: placeholders pad the shorter way)
    bool dummy = false;
    std::size_t sent = 0, send_done = 0, posted = 0, received = 0;
    bool next_head = false;            // the next collective's head receive is posted
    std::uint32_t first_out = 1, first_in = 1;  // frames of this collective's first message each way
  };

  static constexpr std::size_t placeholder_bytes = 4;
  static std::uint32_t frames(std::size_t len) noexcept { return frames_of(len == 0 ? placeholder_bytes : len); }

  Network& net_;
  std::vector<LinkOp> ops_;
  std::vector<std::size_t> delivered_;
  std::vector<Link*> sleepers_;
};

// ---------------------------------------------------------------------------------------------

template <class Schedule>
inline Result<void> Engine::run(Schedule& plan, const OpMemory& mem, std::string& where) {
  using clock = std::chrono::steady_clock;
  const ScratchLayout& L = net_.layout();
  const std::size_t nl = net_.links().size();
  std::byte* const scratch = net_.scratch();
  const bool write = net_.writes(), pairing = net_.frame_pairing();
  const std::size_t slots = L.slots;

  auto port_index = [&](std::size_t i) -> std::size_t { return net_.state(i).port_index; };
  auto buffer_of = [&](Place::Buffer b) -> const OpMemory::Buffer* {
    switch (b) {
    case Place::Buffer::input: return &mem.input;
    case Place::Buffer::output: return &mem.output;
    case Place::Buffer::work: return &mem.work;
    default: return nullptr;
    }
  };
  auto pointer = [&](const Place& p) -> std::byte* {
    if (p.buffer == Place::Buffer::scratch) return scratch + L.gather(0) + p.offset;
    const auto* b = buffer_of(p.buffer);
    return b != nullptr ? b->data + p.offset : nullptr;
  };

  // 1. Each link's message counts, whether a dummy head goes first, and its wires.
  for (std::size_t i = 0; i < nl; ++i) {
    LinkOp& o = ops_[i];
    LinkState& s = net_.state(i);
    o = LinkOp{};
    o.sends = plan.sends(i);
    o.recvs = plan.recvs(i);
    const std::size_t real = std::max(o.sends, o.recvs);
    delivered_[i] = 0;
    if (real == 0) continue;
    o.first_out = frames(o.sends > 0 ? plan.send_place(i, 0).length : 0);
    o.first_in = frames(o.recvs > 0 ? plan.recv_place(i, 0).length : 0);
    o.dummy = pairing && !write && (o.first_out != s.head_frames_out || o.first_in != s.head_frames_in);
    o.wires = real + (o.dummy ? 1 : 0);
    o.posted = 1; // the head, posted during the previous collective or at set-up
  }

  // Where wire w of link i lands here: a head slot, the placeholder page, the place, or a slot.
  auto landing = [&](std::size_t i, std::size_t w, unsigned head) -> std::size_t /* scratch offset, or SIZE_MAX: place */ {
    const LinkOp& o = ops_[i];
    if (w == 0) return L.head_slot(i, head);
    const std::size_t j = w - (o.dummy ? 1 : 0);
    if (j >= o.recvs) return L.placeholder();
    const Place p = plan.recv_place(i, j);
    if (p.length == 0) return L.placeholder();
    if (p.buffer == Place::Buffer::scratch) return L.gather(0) + p.offset;
    if (p.buffer == Place::Buffer::slot || write) return L.recv_slot(i, w % slots);
    const auto* b = buffer_of(p.buffer);
    const std::size_t port = port_index(i);
    return b != nullptr && b->reg[port] != nullptr ? SIZE_MAX : L.recv_slot(i, w % slots);
  };
  auto expected_len = [&](std::size_t i, std::size_t w) -> std::size_t {
    const LinkOp& o = ops_[i];
    if (w == 0 && o.dummy) return SIZE_MAX; // a dummy head: any length of its frames
    const std::size_t j = w - (o.dummy ? 1 : 0);
    if (j >= o.recvs) return placeholder_bytes;
    const std::size_t len = plan.recv_place(i, j).length;
    return len == 0 ? placeholder_bytes : len;
  };

  auto post_recv = [&](std::size_t i, std::size_t w) -> Result<void> {
    Link& l = net_.links()[i];
    if (write) {
      const RecvWr wr(w);
      return l.qp().post(wr);
    }
    const std::size_t at = landing(i, w, 0);
    const std::size_t len = expected_len(i, w);
    const MemoryRegionSet& scr = *net_.state(i).port->scratch;
    if (at != SIZE_MAX) {
      auto sge = scr.sge(at, len);
      if (!sge) return fail(sge.error());
      return l.qp().recv(w, *sge);
    }
    const std::size_t j = w - (ops_[i].dummy ? 1 : 0);
    const Place p = plan.recv_place(i, j);
    const auto* b = buffer_of(p.buffer);
    const std::size_t port = port_index(i);
    auto sge = b->reg[port]->sge(b->offset[port] + p.offset, p.length);
    if (!sge) return fail(sge.error());
    return l.qp().recv(w, *sge);
  };
  auto post_next_head = [&](std::size_t i) -> Result<void> {
    LinkState& s = net_.state(i);
    const LinkOp& o = ops_[i];
    const std::uint64_t id = (std::uint64_t{1} << 62) | (std::uint64_t{s.head_slot ^ 1u} << 61);
    Link& l = net_.links()[i];
    if (write) {
      const RecvWr wr(id);
      return l.qp().post(wr);
    }
    // The guess for the next collective: this one's first message from the peer.
    auto sge = s.port->scratch->sge(L.head_slot(i, s.head_slot ^ 1u),
                                    pairing ? std::size_t{o.first_in} * frame_bytes : L.slot_bytes);
    if (!sge) return fail(sge.error());
    return l.qp().recv(id, *sge);
  };

  auto post_send = [&](std::size_t i, std::size_t w) -> Result<void> {
    const LinkOp& o = ops_[i];
    LinkState& s = net_.state(i);
    Link& l = net_.links()[i];
    const MemoryRegionSet& scr = *s.port->scratch;
    const std::uint64_t id = (std::uint64_t{1} << 40) | w;
    std::optional<abi::ibv_sge> sge;
    std::size_t peer_at = L.placeholder(); // RDMA WRITE: where in the peer's scratch
    const std::size_t j = w - (o.dummy ? 1 : 0);
    if (w == 0 && o.dummy) {
      // A dummy head of the frames the peer's head receive was posted with.
      auto e = scr.sge(L.send_slot(i, 0), std::size_t{s.head_frames_out} * frame_bytes);
      if (!e) return fail(e.error());
      sge = *e;
    } else if (j >= o.sends || plan.send_place(i, j).length == 0) {
      auto e = scr.sge(L.placeholder(), placeholder_bytes);
      if (!e) return fail(e.error());
      sge = *e;
      if (w == 0) peer_at = L.head_slot(s.peer_link_index, s.head_slot);
    } else {
      const Place p = plan.send_place(i, j);
      const std::size_t port = port_index(i);
      const auto* b = buffer_of(p.buffer);
      if (p.buffer == Place::Buffer::scratch) {
        auto e = scr.sge(L.gather(0) + p.offset, p.length);
        if (!e) return fail(e.error());
        sge = *e;
      } else if (b != nullptr && b->reg[port] != nullptr) {
        auto e = b->reg[port]->sge(b->offset[port] + p.offset, p.length);
        if (!e) return fail(e.error());
        sge = *e;
      } else { // staged: through the link's send slot for this wire
        const std::size_t slot = L.send_slot(i, w % slots);
        std::memcpy(scratch + slot, pointer(p), p.length);
        auto e = scr.sge(slot, p.length);
        if (!e) return fail(e.error());
        sge = *e;
      }
      if (write) {
        if (w == 0) {
          peer_at = L.head_slot(s.peer_link_index, s.head_slot);
        } else {
          const Place q = plan.peer_place(i, j);
          peer_at = q.buffer == Place::Buffer::scratch ? L.gather(0) + q.offset : L.recv_slot(s.peer_link_index, w % slots);
        }
      }
    }
    if (!write) return l.qp().send(id, *sge);
    auto to = s.peer_scratch->at(peer_at, sge->length);
    if (!to) return fail(to.error());
    const auto wr = SendWr::rdma_write_with_imm(id, *sge, *to, static_cast<std::uint32_t>(w));
    return l.qp().post(wr);
  };

  // An arrival on link i: wire `w`, `bytes` long (RDMA WRITE: the immediate says which).
  auto arrived = [&](std::size_t i, std::size_t w, std::size_t bytes) -> Result<void> {
    LinkOp& o = ops_[i];
    LinkState& s = net_.state(i);
    const std::size_t want = expected_len(i, w);
    const bool dummy_head = w == 0 && o.dummy;
    if (!write && want != SIZE_MAX && bytes != want)
      return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                              "message " + std::to_string(w) + " from rank " + std::to_string(s.peer) + " carried " +
                                  std::to_string(bytes) + " bytes, expected " + std::to_string(want) +
                                  " (did every rank call the same collective with the same sizes?)"));
    ++o.received;
    ++s.messages_received;
    if (dummy_head) return {};
    const std::size_t j = w - (o.dummy ? 1 : 0);
    if (j >= o.recvs) return {};
    const Place p = plan.recv_place(i, j);
    if (p.length == 0) {
      ++delivered_[i];
      return plan.received(i, j, nullptr);
    }
    const std::size_t at = landing(i, w, s.head_slot);
    const std::byte* data = at == SIZE_MAX ? pointer(p) : scratch + at;
    if (p.buffer != Place::Buffer::slot && p.buffer != Place::Buffer::none && at != SIZE_MAX) {
      std::byte* to = pointer(p);
      if (to != data) std::memcpy(to, data, p.length);
      data = to;
    }
    ++delivered_[i];
    return plan.received(i, j, data);
  };

  auto handle = [&](std::size_t i, std::span<const WorkCompletion> wcs) -> Result<void> {
    LinkOp& o = ops_[i];
    LinkState& s = net_.state(i);
    for (const WorkCompletion& wc : wcs) {
      if (!wc.is_recv()) {
        ++o.send_done;
        continue;
      }
      const std::uint64_t id = wc.wr_id();
      const bool head = (id >> 62) & 1u;
      if (head && !(o.received == 0 && o.wires > 0)) {
        // The next collective's head, sent by a peer that finished this one first.
        s.early_head = true;
        s.early_bytes = wc.byte_len();
        continue;
      }
      const std::size_t w = head ? 0 : static_cast<std::size_t>(write ? wc.imm() : id & 0xffffffffu);
      if (w != o.received || (write && wc.has_imm() && !head && wc.imm() != o.received))
        return fail(Error::make(Step::collective, ErrorKind::result_mismatch,
                                "messages from rank " + std::to_string(s.peer) + " out of order: got " +
                                    std::to_string(w) + ", expected " + std::to_string(o.received)));
      if (auto r = arrived(i, w, wc.byte_len()); !r) return r;
    }
    return {};
  };

  plan.start();
  // A head that arrived during the previous collective is this one's message 0.
  for (std::size_t i = 0; i < nl; ++i) {
    LinkState& s = net_.state(i);
    if (!s.early_head) continue;
    // A link this call does not use (send/recv use one link; a broadcast piece may leave one
    // way empty): the head is the peer's next call on it, which finished this one first (or
    // never took part: send/recv pair per link, not job-wide). It waits for that call here.
    if (ops_[i].wires == 0) continue;
    s.early_head = false;
    if (auto r = arrived(i, 0, s.early_bytes); !r) {
      where = plan.describe(i, 0, false);
      return r;
    }
  }

  auto describe_wait = [&]() {
    std::string w;
    for (std::size_t i = 0; i < nl && w.size() < 200; ++i) {
      const LinkOp& o = ops_[i];
      if (o.received < o.wires)
        w += std::string(w.empty() ? "" : ", ") + "message " + std::to_string(o.received) + "/" +
             std::to_string(o.wires) + " from rank " + std::to_string(net_.state(i).peer) + " (" +
             plan.describe(i, o.received > 0 ? o.received - (o.dummy ? 1 : 0) : 0, false) + ")";
      else if (o.send_done < o.wires)
        w += std::string(w.empty() ? "" : ", ") + "the completion of message " + std::to_string(o.send_done) +
             " to rank " + std::to_string(net_.state(i).peer);
    }
    return w;
  };

  WorkCompletion wc[32];
  const auto timeout = net_.config().timeout;
  auto last_progress = clock::now(), last_check = last_progress;
  unsigned idle = 0;
  for (;;) {
    bool progress = false, done = true;
    // Posts first, polls after: an empty poll may nap in the provider (the emulator sleeps until
    // its next completion is due), so what can be sent is sent before it.
    for (std::size_t i = 0; i < nl; ++i) {
      LinkOp& o = ops_[i];
      if (o.wires == 0) continue;
      const std::size_t W = net_.state(i).window;
      Link& l = net_.links()[i];
      // Receives: up to the slots free again (a slot is reused by wire w + slots).
      while (o.posted < o.wires && o.posted < o.received + slots) {
        if (auto r = post_recv(i, o.posted); !r) {
          where = "posting the receive of message " + std::to_string(o.posted) + " from rank " +
                  std::to_string(net_.state(i).peer) + " on link " + std::to_string(l.id());
          return r;
        }
        ++o.posted;
        progress = true;
      }
      if (o.posted == o.wires && !o.next_head) {
        if (auto r = post_next_head(i); !r) {
          where = "posting the next collective's head receive on link " + std::to_string(l.id());
          return r;
        }
        o.next_head = true;
      }
      // Sends: the credit, our receives ahead, queue room and free send slots, and the data.
      while (o.sent < o.wires) {
        const std::size_t w = o.sent;
        if (w >= 1 && (o.received == 0 || w >= o.received + W)) break;
        if (o.posted < std::min(w + W + 1, o.wires)) break;
        if (o.sent - o.send_done >= slots) break;
        const std::size_t j = w - (o.dummy ? 1 : 0);
        if (!(w == 0 && o.dummy) && j < o.sends && !plan.send_ready(i, j, Progress{delivered_})) break;
        if (auto r = post_send(i, w); !r) {
          where = "posting message " + std::to_string(w) + " to rank " + std::to_string(net_.state(i).peer) +
                  " on link " + std::to_string(l.id()) + " (" + plan.describe(i, j, true) + ")";
          return r;
        }
        ++o.sent;
        ++net_.state(i).messages_sent;
        progress = true;
      }
    }
    if (idle > 16) { // nothing happened for a while: sleep on the CQs (at most 10 ms)
      std::size_t which = 0;
      const std::size_t n = std::min<std::size_t>(nl, 16);
      auto got = wait_any(std::span<Link* const>(sleepers_.data(), n), wc, which, clock::now() + std::chrono::milliseconds(10));
      if (!got) {
        where = "waiting for " + describe_wait();
        return fail(got.error());
      }
      if (*got > 0) {
        if (auto h = handle(which, std::span<const WorkCompletion>(wc, *got)); !h) {
          where = describe_wait();
          return h;
        }
        progress = true;
      }
    }
    for (std::size_t i = 0; i < nl; ++i) {
      LinkOp& o = ops_[i];
      auto got = net_.links()[i].cq().poll(wc);
      if (!got) {
        where = "polling the completions of link " + std::to_string(net_.links()[i].id()) + " while waiting for " +
                describe_wait();
        return fail(got.error());
      }
      if (*got > 0) {
        if (auto h = handle(i, std::span<const WorkCompletion>(wc, *got)); !h) {
          where = describe_wait();
          return h;
        }
        progress = true;
      }
      done = done && o.received == o.wires && o.send_done == o.wires && (o.wires == 0 || o.next_head);
    }
    if (done) break;
    const auto now = clock::now();
    if (progress) {
      last_progress = now;
      idle = 0;
    } else {
      ++idle;
    }
    if (now - last_check > std::chrono::milliseconds(20)) {
      last_check = now;
      if (auto alive = net_.channel().check_peers(); !alive) {
        where = "waiting for " + describe_wait();
        return fail(alive.error());
      }
      if (auto port = dead_port(); !port) {
        where = "waiting for " + describe_wait();
        return fail(port.error());
      }
    }
    if (now - last_progress > timeout) {
      where = "waiting for " + describe_wait();
      return fail(Error::make(Step::collective, ErrorKind::timeout,
                              "no progress for " + std::to_string(timeout.count()) + " ms"));
    }
  }
  // The next collective's guesses: this one's first messages; its head lands in the other slot.
  for (std::size_t i = 0; i < nl; ++i) {
    const LinkOp& o = ops_[i];
    if (o.wires == 0) continue;
    LinkState& s = net_.state(i);
    s.head_frames_out = o.first_out;
    s.head_frames_in = o.first_in;
    s.head_slot ^= 1u;
  }
  plan.finish();
  return {};
}

} // namespace collective
TBVERBS_NAMESPACE_END
