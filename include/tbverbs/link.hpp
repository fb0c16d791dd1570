/// @file link.hpp
/// `Link`: one queue pair connected to a peer rank through the side channel and verified before
/// use: endpoint exchange, a "receives posted" barrier before any send, a full-size warm-up in
/// both directions confirmed over the side channel, and on failure a fresh QP and CQ with a new
/// PSN on both sides (a bounded number of attempts).
///
/// Optional, like side_channel.hpp: the core umbrella header does not include it. Uses only what
/// Apple's Thunderbolt driver allows (UC, SEND/RECV, equal frame counts on both sides, depths in
/// 4 KiB frames, one registered warm-up buffer per link, freed once the link is verified).
#pragma once

#include "budget.hpp"
#include "explain.hpp"
#include "link_offer.hpp"
#include "measured_profile.hpp"
#include "memory_region_set.hpp"
#include "message_size.hpp"
#include "side_channel.hpp"
#include "tbverbs.hpp"


#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// What one link is made of: the peer, an identifier both ends agree on, and the local objects.
/// The context, protection domain and recipe must outlive the connect call; the Link keeps its
/// own references to what it needs afterwards.
struct LinkSpec {
  int peer = -1;              ///< The peer's side-channel rank.
  std::uint32_t id = 0;       ///< Same number on both ends (e.g. the cable's index in a ring).
  const Context* context = nullptr;       ///< Device the QP lives on.
  const ProtectionDomain* pd = nullptr;   ///< PD of the QP (and of the data buffers it will use).
  std::optional<QpRecipe> recipe;         ///< Recipe of the QP: GID selection, type, depths.
};

/// Bounds and sizes of link set-up.
struct LinkOptions {
  /// The largest message the link is to carry, and so the size of its warm-up message, so that a
  /// direction that passes small messages but drops large ones is caught (ds4 saw 64 B pass and
  /// 16 KiB drop). Lowered to largest_message_guess() and to what the peer can take; the warm-up
  /// then confirms it or steps down to one frame (Link::max_message_bytes() says which).
  std::size_t warmup_bytes = 64 * 1024;
  /// How many warm-ups in which a direction delivered nothing a link may have before it is given
  /// up (each with a fresh QP). Rounds that only show messages above one frame are not delivered
  /// (macOS 26.2) are counted apart: after two, the link steps down to one-frame messages.
  int attempts = 3;
  /// How long one warm-up attempt waits for the peer's message (ds4: 20 x 100 ms).
  std::chrono::milliseconds warmup_wait{2000};
  /// How long, once the peer's one-frame probe arrived and this side's sends completed, a warm-up
  /// waits for the peer's full-size message before it ends the round as size-limited, instead of
  /// waiting out warmup_wait: both are sent back to back on one QP, so the full one follows the
  /// probe within its wire time unless the driver does not deliver it (macOS 26.2, ds4). Doubled in
  /// each later size-limited round, plus the message's time at 100 MB/s; since two size-limited
  /// rounds step the link down to one frame, a slow peer must miss it twice to cause one
  /// (on macOS 26.2 a start cost 4.1 s in two whole rounds without it). Zero: wait out warmup_wait.
  std::chrono::milliseconds size_limit_grace{250};
  /// Bound of every side-channel exchange during set-up.
  std::chrono::milliseconds timeout{30000};
  /// How often a completion wait probes the side channel for a dead peer.
  std::chrono::milliseconds liveness_interval{20};
  /// Negotiate each link's recipe with its peer before any QP exists (link_offer.hpp): both ends
  /// send a LinkOffer and the link uses what both can do (RC where both offer it, else UC; the
  /// operations both execute; frame pairing when either counts frames). The spec's recipe is this
  /// end's preference. False: each end uses its recipe as given (both must then agree).
  bool negotiate = true;
  /// Completion-queue entries; 0 means link_cq_entries() of the recipe's send and receive depths (budget.hpp).
  int cq_entries = 0;
  /// Called after each failed warm-up attempt that will be retried (for progress output); may be
  /// empty. The last failure is the returned error instead.
  std::function<void(std::uint32_t id, int attempt, const std::string& why)> on_retry;
};

class Link;

/// Point-to-point link messages over a SideChannel, matched by type, link id and attempt.
///
/// Two links to the same peer (a two-rank ring has two cables between the same ranks) share one
/// ordered side-channel connection, so messages for one link can arrive while another is being
/// waited for; they are kept until asked for. Messages from an older attempt of a link are
/// dropped. Not thread-safe.
class LinkMailbox {
public:
  /// What a link message carries.
  enum class Type : std::uint16_t {
    endpoint = 1,   ///< A serialized Endpoint.
    posted = 2,     ///< "My receives are posted" for one attempt or epoch.
    result = 3,     ///< The warm-up outcome as seen by the sender (1 byte: 1 = received).
    offer = 4,      ///< A serialized LinkOffer (before the first QP).
  };

  /// Wraps `channel`, which must outlive the mailbox.
  explicit LinkMailbox(SideChannel& channel) noexcept : sc_(&channel) {}

  /// The side channel.
  SideChannel& channel() const noexcept { return *sc_; }

  /// Sends one message to `peer`. Errors: the side channel's (peer_lost, timeout, ...).
  [[nodiscard]] Result<void> send(int peer, Type type, std::uint32_t id, std::uint32_t attempt,
                                  std::span<const std::byte> payload, SideChannelDeadline deadline) {
    std::vector<std::byte> m(header_bytes + payload.size());
    detail::put_be<std::uint32_t>(m.data(), magic);
    detail::put_be<std::uint16_t>(m.data() + 4, version);
    detail::put_be<std::uint16_t>(m.data() + 6, static_cast<std::uint16_t>(type));
    detail::put_be<std::uint32_t>(m.data() + 8, id);
    detail::put_be<std::uint32_t>(m.data() + 12, attempt);
    if (!payload.empty()) std::memcpy(m.data() + header_bytes, payload.data(), payload.size());
    return sc_->send_to(peer, m, deadline);
  }

  /// Receives the message of `type` for link `id` and `attempt` from `peer`, keeping others
  /// for later. Errors: the side channel's, or bad_frame for a message that is not a link message.
  [[nodiscard]] Result<std::vector<std::byte>> recv(int peer, Type type, std::uint32_t id, std::uint32_t attempt,
                                                    SideChannelDeadline deadline) {
    auto& q = stash_[peer];
    for (auto it = q.begin(); it != q.end();) {
      if (it->type == type && it->id == id && it->attempt < attempt) {
        it = q.erase(it); // stale: from an attempt both sides have given up
        continue;
      }
      if (it->type == type && it->id == id && it->attempt == attempt) {
        auto payload = std::move(it->payload);
        q.erase(it);
        return payload;
      }
      ++it;
    }
    for (;;) {
      auto raw = sc_->recv_from(peer, deadline);
      if (!raw) return fail(raw.error());
      if (raw->size() < header_bytes || detail::get_be<std::uint32_t>(raw->data()) != magic)
        return fail(Error::make(Step::link_warmup, ErrorKind::bad_frame,
                                "rank " + std::to_string(peer) + " sent a message that is not a tbverbs link message "
                                "(another protocol on the same side channel)"));
      if (const auto theirs = detail::get_be<std::uint16_t>(raw->data() + 4); theirs != version)
        return fail(Error::make(Step::link_warmup, ErrorKind::bad_frame,
                                "rank " + std::to_string(peer) + " speaks link protocol version " + std::to_string(theirs) +
                                    ", this build " + std::to_string(version) +
                                    ": every rank must run the same tbverbs release"));
      Msg msg;
      msg.type = static_cast<Type>(detail::get_be<std::uint16_t>(raw->data() + 6));
      msg.id = detail::get_be<std::uint32_t>(raw->data() + 8);
      msg.attempt = detail::get_be<std::uint32_t>(raw->data() + 12);
      msg.payload.assign(raw->begin() + header_bytes, raw->end());
      if (msg.type == type && msg.id == id) {
        if (msg.attempt == attempt) return std::move(msg.payload);
        if (msg.attempt < attempt) continue; // stale
      }
      q.push_back(std::move(msg));
    }
  }

private:
  static constexpr std::uint32_t magic = 0x54424c4bu; // "TBLK"
  // 2: endpoint messages carry the warm-up size. 3: a LinkOffer precedes the first endpoint (an
  // older peer is named at once instead of timing out while this side waits for its offer).
  static constexpr std::uint16_t version = 3;
  static constexpr std::size_t header_bytes = 16;
  struct Msg {
    Type type{};
    std::uint32_t id = 0;
    std::uint32_t attempt = 0;
    std::vector<std::byte> payload;
  };
  SideChannel* sc_;
  std::map<int, std::deque<Msg>> stash_;
};

/// Waits for completions on `cq` until `deadline`, probing the side channel for `peer` (or every
/// peer when `peer` is negative) every `interval`, so a dead peer is reported as peer_lost
/// instead of a silent wait (UC raises no error on peer death: docs/field-reports.md row 21).
/// Returns how many completions were written to `out` (at least one). Errors: the CQ's
/// (wc_error, ...), the side channel's (peer_lost, an abort from another rank), or `timeout` at
/// `step` naming `what` we were waiting for.
[[nodiscard]] inline Result<std::size_t> wait_with_liveness(CompletionQueue& cq, std::span<WorkCompletion> out,
                                                            SideChannel& sc, int peer, SideChannelDeadline deadline,
                                                            Step step, std::string_view what,
                                                            std::chrono::milliseconds interval =
                                                                std::chrono::milliseconds(20)) {
  using clock = std::chrono::steady_clock;
  for (;;) {
    const auto now = clock::now();
    const auto slice = std::min<clock::time_point>(deadline, now + interval);
    auto r = cq.wait(out, slice);
    if (r) return r;
    if (!r.error().is(ErrorKind::timeout) || r.error().step != Step::wait_cq) return fail(r.error());
    auto alive = peer >= 0 ? sc.check_peer(peer) : sc.check_peers();
    if (!alive) return fail(alive.error());
    if (clock::now() >= deadline) {
      Error e = r.error();
      e.step = step;
      e.with_detail("no completion before the deadline while waiting for " + std::string(what) +
                    "; the peer's side channel is still open, so it is alive but stuck, stopped or dropping");
      return fail(e);
    }
  }
}

/// Connects every link of `specs` (to one or several peers) and verifies each with a full-size
/// warm-up in both directions. The peers must call it at the same time with the matching specs
/// (same `id`s); the order of `specs` does not matter. Returns the links in `specs` order.
///
/// First, before any QP exists, each link's warm-up buffer is registered (a MemoryRegionSet within
/// the device's max_mr_size, with access rights the driver accepts). Then each link's recipe is
/// negotiated with its peer (LinkOptions::negotiate, link_offer.hpp: RC where both ends run it,
/// else UC; Link::agreement() says which and why). Then, each round: create a CQ
/// and a QP (fresh PSN), exchange endpoints and the warm-up size each side can take (the smaller
/// is used), connect (RTR, RTS), post the receives, exchange "receives posted", send a one-frame
/// probe and a full-size tagged message, wait (bounded, watching the side channel) for the peer's,
/// check their bytes, and exchange the outcomes. A link whose full-size message went through both
/// ways is kept. Otherwise it is destroyed and recreated on both sides; when only the probes went
/// through, twice, the next round warms up with one-frame messages only (macOS 26.2).
/// In explain mode (explain.hpp: TBVERBS_EXPLAIN=1) every link's warm-up region layout and every
/// INIT/RTR/RTS attribute of each round's QP is printed with the rule that chose it. The CQs wait
/// as measured_cq_wait() says: polling on Apple unless tbverbs-probe measured working completion
/// channels (TBVERBS_PROFILE).
/// After `options.attempts` rounds in which a direction delivered nothing: `timeout` at
/// Step::link_warmup naming the link, the peer rank and the direction that failed (or
/// `peer_lost` when the peer's side channel closed). Errors of the verbs steps (create_qp,
/// modify_qp_rtr, reg_mr, ...) are returned as they are, with their diagnosis.
[[nodiscard]] inline Result<std::vector<Link>> connect_links(LinkMailbox& mailbox, std::span<const LinkSpec> specs,
                                                             const LinkOptions& options = {});

/// Waits until the CQ of one of `links` has completions, or `deadline` passes. A backend with
/// several links calls it when a round of polling found nothing, so an idle rank gives its core
/// to the others instead of spinning (the emulator runs every rank on one host).
///
/// When every CQ has a working completion channel (rdma-core by default): arms each, polls each
/// once (a completion that landed before arming raises no event), then sleeps on all the
/// channels' descriptors at once, in slices of at most 10 ms. Otherwise (always on Apple by
/// default: TN3205, "the caller must poll") it polls every CQ in turn with the same backoff as
/// CompletionQueue::wait (detail::PollBackoff: spin, sched_yield, sleeps growing to about 1 ms,
/// never past the deadline). A CQ whose channel cannot be armed or read falls back to polling
/// (CompletionQueue::fall_back_to_polling, noted once per process) instead of failing the wait.
/// Returns how many completions were written to `out` (0 when the deadline passed) and sets
/// `which` to the index of their link. Errors: the CQs' (wc_error, poll_cq); invalid_argument
/// for an empty span or more than 16 links.
[[nodiscard]] inline Result<std::size_t> wait_any(std::span<Link* const> links, std::span<WorkCompletion> out,
                                                  std::size_t& which, SideChannelDeadline deadline);

namespace detail {
class LinkSetup; // connect_links()'s steps
} // namespace detail

/// A connected, verified queue pair to one peer rank, with its own completion queue.
///
/// After connect_links() nothing is posted on it and its CQ is empty. Post receives, then call
/// receives_posted() (both sides) before the first send: what a send that meets an empty receive
/// queue does on Apple's driver is contested (held by credit-based flow control per TN3205 and
/// llama.cpp; the direction killed for good per ds4, docs/field-reports.md row 17), so code that
/// works under every reading never lets it happen. Send no message above max_message_bytes().
/// Move-only.
class Link {
public:
  /// The peer's rank.
  int peer() const noexcept { return peer_; }
  /// The identifier both ends agreed on.
  std::uint32_t id() const noexcept { return id_; }
  /// How many warm-up rounds the link took (1 = the first QP worked).
  int attempts() const noexcept { return attempts_; }
  /// The largest message the warm-up confirmed in both directions: LinkOptions::warmup_bytes, or
  /// less (the peer's limit, largest_message_guess(), or one 4 KiB frame after a step-down). Send
  /// no message longer than this on the link.
  std::size_t max_message_bytes() const noexcept { return max_message_; }
  /// The connected queue pair.
  QueuePair& qp() noexcept { return *qp_; }
  /// The link's completion queue (sends and receives).
  CompletionQueue& cq() noexcept { return *cq_; }
  /// The device name of the local end.
  std::string_view device() const noexcept { return device_.view(); }
  /// The GID selection the local end advertised (port, index, value, reason).
  const GidSelection& gid() const noexcept { return gid_; }
  /// The recipe both ends agreed on for this link: transport, operations, frame pairing, and why.
  const LinkAgreement& agreement() const noexcept { return agreement_; }

  /// "Receives posted" barrier with the peer: tells it that this side's receives for the coming
  /// sends are posted and waits until the peer says the same. `epoch` numbers successive
  /// barriers on the same link (start at 1). Errors: the side channel's.
  ///
  /// With several links (a ring), call receives_posted(LinkMailbox&, std::span<Link>, ...)
  /// instead: one link after the other, each rank would wait for its left neighbour before
  /// answering its right one, around the whole ring.
  [[nodiscard]] Result<void> receives_posted(LinkMailbox& mailbox, std::uint32_t epoch, SideChannelDeadline deadline) {
    const std::uint32_t tag = 0x80000000u | epoch;
    if (auto s = mailbox.send(peer_, LinkMailbox::Type::posted, id_, tag, {}, deadline); !s) return fail(s.error());
    auto r = mailbox.recv(peer_, LinkMailbox::Type::posted, id_, tag, deadline);
    if (!r) return fail(r.error());
    return {};
  }

private:
  friend class detail::LinkSetup;
  Link(int peer, std::uint32_t id, GidSelection gid) : peer_(peer), id_(id), gid_(std::move(gid)) {}

  int peer_ = -1;
  std::uint32_t id_ = 0;
  int attempts_ = 0;
  std::size_t max_message_ = 0;
  GidSelection gid_;
  LinkAgreement agreement_;
  detail::FixedString<64> device_;
  std::optional<CompletionQueue> cq_;
  std::optional<QueuePair> qp_; // declared after cq_: destroyed first (it also keeps the CQ alive)
};

inline Result<std::size_t> wait_any(std::span<Link* const> links, std::span<WorkCompletion> out, std::size_t& which,
                                    SideChannelDeadline deadline) {
  CompletionQueue* cqs[16];
  if (links.empty() || links.size() > std::size(cqs))
    return fail(Error::make(Step::wait_cq, ErrorKind::invalid_argument, "wait_any takes 1 to 16 links"));
  for (std::size_t i = 0; i < links.size(); ++i) cqs[i] = &links[i]->cq();
  return CompletionQueue::wait_any(std::span<CompletionQueue* const>(cqs, links.size()), out, which, deadline);
}

/// wait_any over the links as connect_links() returned them (a span of Link, the type
/// receives_posted() takes too); `which` indexes `links`. Allocates nothing.
[[nodiscard]] inline Result<std::size_t> wait_any(std::span<Link> links, std::span<WorkCompletion> out,
                                                  std::size_t& which, SideChannelDeadline deadline) {
  Link* pointers[16];
  if (links.size() > std::size(pointers))
    return fail(Error::make(Step::wait_cq, ErrorKind::invalid_argument, "wait_any takes 1 to 16 links"));
  for (std::size_t i = 0; i < links.size(); ++i) pointers[i] = &links[i];
  return wait_any(std::span<Link* const>(pointers, links.size()), out, which, deadline);
}

namespace detail {
/// The barrier of receives_posted() over any range of links (`at(i)` gives the i-th Link).
template <class At>
Result<void> receives_posted_on(LinkMailbox& mailbox, std::size_t count, At at, std::uint32_t epoch,
                                SideChannelDeadline deadline) {
  const std::uint32_t tag = 0x80000000u | epoch;
  auto named = [](Error e, const Link& l) {
    std::string d = "link " + std::to_string(l.id()) + " to rank " + std::to_string(l.peer());
    if (!e.detail.empty()) d += ": " + std::string(e.detail.view());
    return e.with_detail(d);
  };
  for (std::size_t i = 0; i < count; ++i)
    if (auto s = mailbox.send(at(i).peer(), LinkMailbox::Type::posted, at(i).id(), tag, {}, deadline); !s)
      return fail(named(s.error(), at(i)));
  for (std::size_t i = 0; i < count; ++i)
    if (auto r = mailbox.recv(at(i).peer(), LinkMailbox::Type::posted, at(i).id(), tag, deadline); !r)
      return fail(named(r.error(), at(i)));
  return {};
}
} // namespace detail

/// "Receives posted" barrier on every link of `links` at once: tells each peer, then waits for
/// each peer's word (sending all before waiting for any, so a ring cannot wait on itself).
/// `epoch` numbers successive barriers (start at 1, the same on both ends). Errors: the side
/// channel's (peer_lost, timeout, an abort), naming the link.
[[nodiscard]] inline Result<void> receives_posted(LinkMailbox& mailbox, std::span<Link> links, std::uint32_t epoch,
                                                  SideChannelDeadline deadline) {
  return detail::receives_posted_on(mailbox, links.size(), [&](std::size_t i) -> const Link& { return links[i]; },
                                    epoch, deadline);
}
/// The same barrier over links held by pointer (the span type wait_any() takes).
[[nodiscard]] inline Result<void> receives_posted(LinkMailbox& mailbox, std::span<Link* const> links,
                                                  std::uint32_t epoch, SideChannelDeadline deadline) {
  return detail::receives_posted_on(mailbox, links.size(), [&](std::size_t i) -> const Link& { return *links[i]; },
                                    epoch, deadline);
}

namespace detail {
/// The warm-up payload: 32-bit words that depend on the link, the attempt and the sender, so a
/// stale or misrouted message is not mistaken for the expected one.
inline std::uint32_t warmup_word(std::size_t i, std::uint32_t id, std::uint32_t attempt, int sender) noexcept {
  std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u;
  x ^= id * 0x9e3779b9u ^ (attempt + 1) * 0x85ebca6bu ^ static_cast<std::uint32_t>(sender + 1) * 0xc2b2ae35u;
  return x ^ (x >> 15);
}
} // namespace detail

namespace detail {
/// connect_links() as named steps: the checks and registrations before any QP, then rounds of
/// fresh QPs, endpoints, receives, the barrier, the tagged warm-up messages and the outcomes,
/// until every link went through both ways or one gave up.
///
/// Warm-up messages of one link: a one-frame probe and, when the link is to carry more, a
/// full-size message. wr_ids: receives 1 (probe) and 3 (full), sends 2 (probe) and 4 (full).
/// Buffer of a link: [send: full | receive: probe frame | receive: full].
class LinkSetup {
public:
  using clock = std::chrono::steady_clock;

  LinkSetup(LinkMailbox& mailbox, std::span<const LinkSpec> specs, const LinkOptions& options)
      : mailbox_(mailbox), sc_(mailbox.channel()), specs_(specs), options_(options), me_(sc_.rank()),
        st_(specs.size()) {}

  /// Checks of the specs, and every registration, before any QP exists: all anchors register
  /// before the QP transitions (TN3205's sample before creating the QP), and Anemll's `Bad
  /// address` on post_recv was fixed partly by registering earlier (docs/field-reports.md 4b).
  Result<void> check_and_register() {
    if (options_.attempts <= 0)
      return fail(Error::make(Step::link_warmup, ErrorKind::invalid_argument, "no attempts allowed"));
    for (std::size_t i = 0; i < st_.size(); ++i) {
      const LinkSpec& s = specs_[i];
      if (s.context == nullptr || s.pd == nullptr || !s.recipe || s.peer < 0 || s.peer == me_ || s.peer >= sc_.size())
        return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                                name(i) + ": a LinkSpec needs a context, a PD, a recipe and another rank as peer"));
      for (std::size_t j = 0; j < i; ++j)
        if (specs_[j].peer == s.peer && specs_[j].id == s.id)
          return fail(Error::make(Step::configure, ErrorKind::invalid_argument, name(i) + " is listed twice"));
      auto dev = s.context->query_device();
      if (!dev) return fail(with_link(dev.error(), i));
      auto port = s.context->query_port(s.recipe->gid().port());
      if (!port) return fail(with_link(port.error(), i));
      State& st = st_[i];
      st.port = *port;
      const std::size_t wanted = std::max<std::size_t>(options_.warmup_bytes & ~std::size_t{3}, 4);
      auto guess = largest_message_guess(s.context->platform(), *port, *dev, wanted);
      if (!guess) return fail(with_link(guess.error(), i));
      st.capacity = guess->bytes;
      st.recipe.emplace(*s.recipe);
      st.offer = LinkOffer::of(*s.context, *s.recipe, *dev, st.capacity);
      if (auto fits = check_depths(i); !fits) return fits;
      auto b = AlignedBuffer::allocate(2 * st.capacity + frame_bytes);
      if (!b) return fail(with_link(b.error(), i));
      st.buffer.emplace(std::move(*b));
      auto mr = MemoryRegionSet::reg(*s.pd, st.buffer->bytes(), dev->max_mr_size, st.capacity);
      if (!mr) return fail(with_link(mr.error(), i));
      st.mr.emplace(std::move(*mr));
      if (explain_enabled())
        explain(name(i) + ": MR warm-up buffer for messages of up to " + std::to_string(st.capacity) + " bytes (" +
                std::string(guess->reason) + "): " + explain_memory(*st.mr, "send and receive slots", dev->max_mr_size));
    }
    return {};
  }

  /// Each link's recipe from both ends' offers (LinkOptions::negotiate; without it, this end's
  /// recipe as given): offers are sent on every link before any is waited for, so a ring cannot
  /// wait on itself.
  Result<void> negotiate() {
    const auto deadline = clock::now() + options_.timeout;
    if (options_.negotiate)
      for (std::size_t i = 0; i < st_.size(); ++i) {
        const auto wire = st_[i].offer.serialize();
        if (auto r = mailbox_.send(specs_[i].peer, LinkMailbox::Type::offer, specs_[i].id, 0, wire, deadline); !r)
          return fail(channel_error(r.error(), i));
      }
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      LinkOffer theirs = s.offer;
      if (options_.negotiate) {
        auto raw = mailbox_.recv(specs_[i].peer, LinkMailbox::Type::offer, specs_[i].id, 0, deadline);
        if (!raw) return fail(channel_error(raw.error(), i));
        auto parsed = LinkOffer::parse(*raw);
        if (!parsed) return fail(with_link(parsed.error(), i));
        theirs = *parsed;
      }
      auto a = agree(s.offer, theirs);
      if (!a) return fail(with_link(a.error(), i).on(specs_[i].context->name(), s.recipe->gid().port(), s.recipe->gid().index()));
      if (!options_.negotiate) a->why = "not negotiated: this end's recipe as given";
      s.agreement = std::move(*a);
      s.recipe.emplace(agreed_recipe(*s.recipe, s.agreement));
      if (explain_enabled())
        explain(name(i) + ": recipe " + s.agreement.summary() + " (" + s.agreement.why + ")");
    }
    return {};
  }

  /// Starts round `round` (0 first): its side-channel deadline.
  void begin_round(std::uint32_t round) {
    round_ = round;
    setup_deadline_ = clock::now() + options_.timeout;
  }

  /// 1. A fresh CQ and QP (new QPN, new PSN) for every link not yet verified; old ones first.
  Result<void> fresh_queue_pairs() {
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      if (s.done) continue;
      s.prepared.reset();
      s.link.reset();
      for (int k = 0; k < 2; ++k) s.got_send[k] = s.got_recv[k] = s.recv_ok[k] = false;
      s.probe_at = {};
      const LinkSpec& sp = specs_[i];
      const QpCapacities& c = s.recipe->requested_capacities();
      const int entries = options_.cq_entries > 0 ? options_.cq_entries
                                                  : static_cast<int>(link_cq_entries(c.max_send_wr, c.max_recv_wr));
      // Apple: polling, unless tbverbs-probe measured channels that work (TBVERBS_PROFILE).
      auto cq = sp.context->create_cq(entries, measured_cq_wait(sp.context->platform()));
      if (!cq) return fail(with_link(cq.error(), i));
      auto prep = s.recipe->prepare(*sp.pd, *cq);
      if (!prep) return fail(with_link(prep.error(), i));
      s.link.emplace(Link(sp.peer, sp.id, s.recipe->gid()));
      s.link->agreement_ = s.agreement;
      s.link->device_.assign(sp.context->name());
      s.link->cq_.emplace(std::move(*cq));
      s.prepared.emplace(std::move(*prep));
    }
    return {};
  }

  /// 2. Endpoints both ways, each with the largest warm-up message its side can take this round;
  ///    both sides then use the smaller (a send must fit the peer's receive). Then connect, and
  /// 3. post the receives for the peer's warm-up messages: the probe first, as it is sent first.
  Result<void> connect_and_post_receives() {
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      if (s.done) continue;
      const auto wire = s.prepared->endpoint().serialize();
      std::byte msg[Endpoint::wire_size + 8];
      std::memcpy(msg, wire.data(), wire.size());
      detail::put_be<std::uint64_t>(msg + Endpoint::wire_size, offered(s));
      if (auto r = mailbox_.send(specs_[i].peer, LinkMailbox::Type::endpoint, specs_[i].id, round_, msg, setup_deadline_);
          !r)
        return fail(channel_error(r.error(), i));
    }
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      if (s.done) continue;
      auto raw = mailbox_.recv(specs_[i].peer, LinkMailbox::Type::endpoint, specs_[i].id, round_, setup_deadline_);
      if (!raw) return fail(channel_error(raw.error(), i));
      if (raw->size() != Endpoint::wire_size + 8)
        return fail(with_link(Error::make(Step::parse_endpoint, ErrorKind::bad_frame,
                                          "link endpoint message of " + std::to_string(raw->size()) + " bytes"),
                              i));
      auto remote = Endpoint::parse(std::span<const std::byte>(*raw).first(Endpoint::wire_size));
      if (!remote) return fail(with_link(remote.error(), i));
      const auto theirs = detail::get_be<std::uint64_t>(raw->data() + Endpoint::wire_size);
      s.bytes = std::max<std::size_t>(static_cast<std::size_t>(std::min<std::uint64_t>(offered(s), theirs)), 4);
      if (explain_enabled())
        for (const auto& l : explain_queue_pair(*s.recipe, s.port, s.prepared->capacities(),
                                                s.prepared->endpoint(), *remote,
                                                name(i) + " (" + std::string(specs_[i].context->name()) + ", round " +
                                                    std::to_string(round_ + 1) + ")"))
          explain(l);
      auto qp = std::move(*s.prepared).connect(*remote);
      s.prepared.reset();
      if (!qp) return fail(with_link(qp.error(), i));
      s.link->qp_.emplace(std::move(*qp));
      std::memset(s.buffer->data() + s.capacity, 0, s.capacity + frame_bytes);
      for (int k = 0; k < (full(s) ? 2 : 1); ++k) {
        auto sge = k == 0 ? s.mr->sge(s.capacity, std::min(s.bytes, frame_bytes))
                          : s.mr->sge(s.capacity + frame_bytes, s.bytes);
        if (!sge) return fail(with_link(sge.error(), i));
        if (auto r = s.link->qp_->recv(k == 0 ? 1 : 3, *sge); !r) return fail(with_link(r.error(), i));
      }
    }
    return {};
  }

  /// 4. Receives-posted barrier: nobody sends before the peer's receives are there.
  Result<void> receives_posted_barrier() {
    for (std::size_t i = 0; i < st_.size(); ++i) {
      if (st_[i].done) continue;
      if (auto r = mailbox_.send(specs_[i].peer, LinkMailbox::Type::posted, specs_[i].id, round_, {}, setup_deadline_); !r)
        return fail(channel_error(r.error(), i));
    }
    for (std::size_t i = 0; i < st_.size(); ++i) {
      if (st_[i].done) continue;
      if (auto r = mailbox_.recv(specs_[i].peer, LinkMailbox::Type::posted, specs_[i].id, round_, setup_deadline_); !r)
        return fail(channel_error(r.error(), i));
    }
    return {};
  }

  /// 5. Tagged sends (probe, then full), then
  Result<void> send_warmups() {
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      if (s.done) continue;
      auto* words = reinterpret_cast<std::uint32_t*>(s.buffer->data());
      for (std::size_t k = 0; k < s.bytes / 4; ++k) words[k] = detail::warmup_word(k, specs_[i].id, round_, me_);
      for (int k = 0; k < (full(s) ? 2 : 1); ++k) {
        auto sge = s.mr->sge(0, k == 0 ? std::min(s.bytes, frame_bytes) : s.bytes);
        if (!sge) return fail(with_link(sge.error(), i));
        if (auto r = s.link->qp_->send(k == 0 ? 2 : 4, *sge); !r) return fail(with_link(r.error(), i));
      }
    }
    return {};
  }

  /// 6. one bounded wait for every link's completions (the links' waits overlap), probing the
  ///    peers' side channels meanwhile. Ends when every link completed or at options.warmup_wait.
  Result<void> wait_warmups() {
    const auto wait_deadline = clock::now() + options_.warmup_wait;
    for (;;) {
      bool pending = false, progress = false;
      const auto now = clock::now();
      for (std::size_t i = 0; i < st_.size(); ++i) {
        State& s = st_[i];
        if (s.done || settled(s, now)) continue;
        WorkCompletion wc[4];
        auto got = s.link->cq_->poll(wc);
        if (!got) return fail(with_link(got.error(), i));
        for (std::size_t k = 0; k < *got; ++k) {
          progress = true;
          note(s, wc[k]);
        }
        if (!settled(s, now)) pending = true;
      }
      if (!pending || clock::now() >= wait_deadline) return {};
      if (progress) continue;
      std::size_t sleeper = st_.size();
      for (std::size_t i = 0; i < st_.size(); ++i) {
        State& s = st_[i];
        if (s.done || settled(s, now)) continue;
        if (auto alive = sc_.check_peer(specs_[i].peer); !alive) return fail(channel_error(alive.error(), i));
        if (auto port = port_alive(i); !port) return port;
        if (sleeper == st_.size()) sleeper = i;
      }
      // Wait on one pending CQ for a slice; completions of the others are picked up next round.
      WorkCompletion wc[4];
      const auto slice = std::min(wait_deadline, clock::now() + options_.liveness_interval);
      auto got = st_[sleeper].link->cq_->wait(wc, slice);
      if (!got) {
        if (got.error().is(ErrorKind::timeout)) continue;
        return fail(with_link(got.error(), sleeper));
      }
      for (std::size_t k = 0; k < *got; ++k) note(st_[sleeper], wc[k]);
    }
  }

  /// 7. Checks the received bytes and tells each peer the outcome (bit 0: the probe arrived
  ///    intact, bit 1: the full-size message did): both sides decide the same from both outcomes.
  Result<void> send_outcomes() {
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      if (s.done) continue;
      for (int k = 0; k < (full(s) ? 2 : 1); ++k) {
        if (!s.got_recv[k] || !s.recv_ok[k]) continue;
        const auto* words =
            reinterpret_cast<const std::uint32_t*>(s.buffer->data() + s.capacity + (k == 0 ? 0 : frame_bytes));
        const std::size_t len = k == 0 ? std::min(s.bytes, frame_bytes) : s.bytes;
        for (std::size_t w = 0; w < len / 4; ++w)
          if (words[w] != detail::warmup_word(w, specs_[i].id, round_, specs_[i].peer)) {
            s.recv_ok[k] = false;
            break;
          }
      }
      if (!full(s)) s.recv_ok[1] = s.recv_ok[0], s.got_recv[1] = s.got_recv[0];
      const std::byte outcome{static_cast<unsigned char>(mine(s))};
      if (auto r = mailbox_.send(specs_[i].peer, LinkMailbox::Type::result, specs_[i].id, round_,
                                 std::span(&outcome, 1), setup_deadline_);
          !r)
        return fail(channel_error(r.error(), i));
    }
    return {};
  }

  /// 8. Reads the peers' outcomes and decides each link: kept when the full-size message went
  ///    through both ways; else counted against the link (a round in which only the probe went
  ///    through both ways counts apart: twice, and the link steps down to one-frame messages on a
  ///    fresh QP: macOS 26.2 delivers no message above one frame, ds4; one such round alone may be
  ///    ds4's flaky fresh QP instead). True when every link is kept; `timeout` at
  ///    Step::link_warmup naming the link and the direction after `attempts` dead rounds.
  Result<bool> decide() {
    bool all_done = true;
    for (std::size_t i = 0; i < st_.size(); ++i) {
      State& s = st_[i];
      if (s.done) continue;
      auto r = mailbox_.recv(specs_[i].peer, LinkMailbox::Type::result, specs_[i].id, round_, setup_deadline_);
      if (!r) return fail(channel_error(r.error(), i));
      const unsigned theirs = r->size() == 1 ? static_cast<unsigned>((*r)[0]) : 0u;
      const unsigned ours = mine(s);
      if ((ours & theirs & 2u) != 0) {
        s.done = true;
        s.link->attempts_ = static_cast<int>(round_) + 1;
        s.link->max_message_ = s.bytes;
        continue;
      }
      all_done = false;
      auto direction = [&](int from, int to, unsigned got) {
        return "rank " + std::to_string(from) + " -> rank " + std::to_string(to) +
               ((got & 1u) != 0 ? " delivered the one-frame probe but not the " + std::to_string(s.bytes) + "-byte message"
                                : " delivered nothing");
      };
      std::string why;
      if ((ours & 2u) == 0) why = direction(specs_[i].peer, me_, ours);
      if ((theirs & 2u) == 0) why += std::string(why.empty() ? "" : "; ") + direction(me_, specs_[i].peer, theirs);
      s.last_failure = why;
      if ((ours & theirs & 1u) != 0) ++s.size_limited; else ++s.dead;
      if (s.dead < options_.attempts && options_.on_retry)
        options_.on_retry(specs_[i].id, static_cast<int>(round_) + 1,
                          why + (s.size_limited == 2 && (ours & theirs & 1u) != 0
                                     ? "; stepping down to messages of one 4 KiB frame"
                                     : ""));
    }
    for (std::size_t i = 0; i < st_.size(); ++i) {
      const State& s = st_[i];
      if (s.done || s.dead < options_.attempts) continue;
      Error e = Error::make(Step::link_warmup, ErrorKind::timeout,
                            name(i) + ": warm-up failed " + std::to_string(options_.attempts) +
                                " times with a fresh QP each time (" + s.last_failure + ")");
      e.on(specs_[i].context->name(), s.recipe->gid().port(), s.recipe->gid().index())
          .from(specs_[i].context->platform());
      return fail(e);
    }
    return all_done;
  }

  /// The verified links, in specs order (after decide() said true).
  std::vector<Link> take_links() {
    std::vector<Link> out;
    out.reserve(st_.size());
    for (State& s : st_) out.push_back(std::move(*s.link));
    return out;
  }

private:
  struct State {
    std::optional<Link> link;
    std::optional<PreparedQueuePair> prepared;
    std::optional<AlignedBuffer> buffer;   // declared before mr: outlives the regions on it
    std::optional<MemoryRegionSet> mr;     // registered before any QP of the link exists
    std::size_t capacity = 0;              // largest warm-up message the buffer holds
    PortAttributes port;                   // the local port (explain mode's MTU negotiation)
    std::optional<QpRecipe> recipe;        // the spec's, as negotiate() agreed with the peer
    LinkOffer offer;                       // what this end offered the peer
    LinkAgreement agreement;               // what both ends use
    std::size_t bytes = 0;                 // this round's warm-up size, agreed with the peer
    bool done = false;
    int dead = 0;                          // rounds in which a direction delivered nothing
    int size_limited = 0;                  // rounds in which only the one-frame probe got through
    bool got_send[2] = {}, got_recv[2] = {}, recv_ok[2] = {};
    clock::time_point probe_at{};          // when the peer's probe arrived this round
    std::string last_failure;
  };

  // Thunderbolt counts depths in 4 KiB frames: the recipe's must hold the warm-up messages.
  Result<void> check_depths(std::size_t i) const {
    if (specs_[i].context->platform() != Platform::apple) return {};
    const QpCapacities& c = st_[i].recipe->requested_capacities();
    if (c.max_send_wr > max_depth_frames || c.max_recv_wr > max_depth_frames)
      return fail(Error::make(Step::configure, ErrorKind::capacity,
                              name(i) + ": queue depths are counted in 4 KiB frames on Thunderbolt; at most " +
                                  std::to_string(max_depth_frames)));
    const std::size_t capacity = st_[i].capacity;
    const std::uint32_t need = frames_of(capacity) + (capacity > frame_bytes ? 1 : 0);
    if (need > c.max_send_wr || need > c.max_recv_wr)
      return fail(Error::make(Step::configure, ErrorKind::capacity,
                              name(i) + ": the warm-up messages span " + std::to_string(need) +
                                  " frames, more than the queue depth"));
    return {};
  }
  // The device's asynchronous events (Context::wait_async_event, looked at, never waited for): a
  // port that left ACTIVE under the link ends the set-up at once, naming the device and port,
  // instead of failing `attempts` warm-up rounds. A port error is confirmed
  // with ibv_query_port (an event queued before a port came back up is history, not a failure);
  // a device-fatal event needs no confirmation. Other events are left to the caller's code.
  Result<void> port_alive(std::size_t i) const {
    const LinkSpec& sp = specs_[i];
    const int port = st_[i].recipe->gid().port();
    for (;;) {
      auto ev = sp.context->wait_async_event(clock::time_point{});
      if (!ev) return {}; // nothing pending, or no async events from this library
      bool dead = ev->type() == AsyncEventType::device_fatal;
      if (ev->type() == AsyncEventType::port_error && ev->port() == port) {
        auto now = sp.context->query_port(port);
        dead = !now || now->state != PortState::active;
      }
      if (dead)
        return fail(Error::make(Step::link_warmup, ErrorKind::port_not_active,
                                name(i) + ": " + ev->describe() + " during the warm-up")
                        .on(sp.context->name(), port, st_[i].recipe->gid().index())
                        .from(sp.context->platform()));
    }
  }
  // The largest warm-up message this side takes this round: one frame after two size-limited rounds.
  static std::size_t offered(const State& s) noexcept { return s.size_limited >= 2 ? frame_bytes : s.capacity; }
  static bool full(const State& s) noexcept { return s.bytes > frame_bytes; }
  static bool complete(const State& s) noexcept {
    for (int k = 0; k < (full(s) ? 2 : 1); ++k)
      if (!s.got_send[k] || !s.got_recv[k]) return false;
    return true;
  }
  // Nothing more to wait for this round: complete, or the probe came and the full-size message did
  // not follow within LinkOptions::size_limit_grace (the round is size-limited; see decide()).
  bool settled(const State& s, clock::time_point now) const noexcept {
    if (complete(s)) return true;
    if (!full(s) || options_.size_limit_grace.count() <= 0 || !s.got_recv[0] || s.got_recv[1] || !s.got_send[0] ||
        !s.got_send[1])
      return false;
    const auto grace = options_.size_limit_grace * (1 << std::min(s.size_limited, 4)) +
                       std::chrono::microseconds(s.bytes / 100); // 100 MB/s: 100 bytes per microsecond
    return now - s.probe_at >= grace;
  }
  static void note(State& s, const WorkCompletion& wc) noexcept {
    const std::uint64_t id = wc.wr_id();
    if (id == 2 || id == 4) s.got_send[id == 4] = true;
    if (id == 1 || id == 3) {
      const int k = id == 3;
      if (k == 0) s.probe_at = clock::now();
      s.got_recv[k] = true;
      s.recv_ok[k] = wc.byte_len() == (k == 0 ? std::min(s.bytes, frame_bytes) : s.bytes);
    }
  }
  // This side's outcome bits for the link (see send_outcomes).
  static unsigned mine(const State& s) noexcept {
    return (s.got_recv[0] && s.recv_ok[0] ? 1u : 0u) | (s.got_recv[1] && s.recv_ok[1] ? 2u : 0u);
  }
  std::string name(std::size_t i) const {
    return "link " + std::to_string(specs_[i].id) + " to rank " + std::to_string(specs_[i].peer);
  }
  Error with_link(Error e, std::size_t i) const {
    std::string d = name(i);
    if (!e.detail.empty()) d += ": " + std::string(e.detail.view());
    return e.with_detail(d);
  }
  // A peer that died, went silent or gave up during set-up is reported at Step::link_warmup
  // (kind peer_lost, timeout or peer_aborted, as the side channel saw it), naming the link and the peer.
  Error channel_error(Error e, std::size_t i) const {
    if (e.is(ErrorKind::peer_lost) || e.is(ErrorKind::timeout) || e.is(ErrorKind::peer_aborted))
      e.step = Step::link_warmup;
    return with_link(e, i);
  }

  LinkMailbox& mailbox_;
  SideChannel& sc_;
  std::span<const LinkSpec> specs_;
  const LinkOptions& options_;
  int me_;
  std::vector<State> st_;
  std::uint32_t round_ = 0;
  clock::time_point setup_deadline_{};
};
} // namespace detail

inline Result<std::vector<Link>> connect_links(LinkMailbox& mailbox, std::span<const LinkSpec> specs,
                                               const LinkOptions& options) {
  detail::LinkSetup setup(mailbox, specs, options);
  if (auto r = setup.check_and_register(); !r) return fail(r.error());
  if (auto r = setup.negotiate(); !r) return fail(r.error());
  for (std::uint32_t round = 0;; ++round) {
    setup.begin_round(round);
    if (auto r = setup.fresh_queue_pairs(); !r) return fail(r.error());
    if (auto r = setup.connect_and_post_receives(); !r) return fail(r.error());
    if (auto r = setup.receives_posted_barrier(); !r) return fail(r.error());
    if (auto r = setup.send_warmups(); !r) return fail(r.error());
    if (auto r = setup.wait_warmups(); !r) return fail(r.error());
    if (auto r = setup.send_outcomes(); !r) return fail(r.error());
    auto done = setup.decide();
    if (!done) return fail(done.error());
    if (*done) return setup.take_links();
  }
}

TBVERBS_NAMESPACE_END
