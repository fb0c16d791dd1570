/// @file collective/network.hpp
/// `collective::Network`: what a communicator is made of on one rank: its devices (one `Port`
/// each: context, protection domain, GID selection, the registered scratch memory), its links to
/// the ring neighbours (one per cable, both sides) and to the other ranks of a fully connected job,
/// and the scratch memory's layout. Made once by Network::create, used by the engine
/// (collective/engine.hpp) for every collective.
///
/// Set-up, in order (each a named step with its own error context, see Network::create):
/// open the devices and select their GIDs; check that both ends of every hop list the same number
/// of cables; choose the transport (SEND/RECV, or RDMA WRITE with immediate where every port is RC);
/// check the whole resource budget of every device; register the scratch memory; connect and
/// verify every link (tbverbs::connect_links); agree on one message size ring-wide (a link that
/// stepped down to one frame makes every link use one frame); exchange the scratch memory's
/// advertisements (WRITE transport); and post every link's first "head" receive, the in-band
/// credit the first collective starts on (collective/engine.hpp, "Credits").
#pragma once

#include "../budget.hpp"
#include "../explain.hpp"
#include "../link.hpp"
#include "../memory_advertisement.hpp"
#include "../side_channel.hpp"
#include "../tbverbs.hpp"
#include "../wire.hpp"
#include "cabling.hpp"
#include "call.hpp"
#include "settings.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

TBVERBS_NAMESPACE_BEGIN
namespace collective {

/// How a Network is made.
struct NetworkConfig {
  int rank = 0;                              ///< This rank.
  int size = 1;                              ///< Ranks in the job.
  Cabling cabling;                           ///< The devices toward each peer.
  std::size_t message_bytes = 256 * 1024;    ///< Largest message (whole 4 KiB frames).
  int window = 8;                            ///< Messages in flight per direction of the ring.
  Transport transport = Transport::automatic; ///< SEND/RECV or RDMA WRITE with immediate (auto: by device).
  std::chrono::milliseconds timeout{30000};  ///< Bound of every set-up step and of no progress.
  std::chrono::milliseconds gid_wait{1000};  ///< How long to wait for an IPv4-mapped GID to appear.
  /// Bytes of the gather area each vector of the latency and mesh algorithms may take (their
  /// largest all_reduce): 1 MiB, and 16 MiB for all vectors together.
  std::size_t latency_max_bytes = std::size_t{1} << 20;
  std::function<void(const std::string&)> log;  ///< Set-up lines ("left cable 0 to rank 3: ..."); may be empty.
};

/// One device as the communicator uses it.
struct Port {
  std::string name;                          ///< The device's name.
  std::optional<Context> context;            ///< Its context.
  std::optional<ProtectionDomain> pd;        ///< The PD of its links and of every registration.
  std::optional<GidSelection> gid;           ///< The GID its links advertise (port 1).
  DeviceAttributes device;                   ///< Its attributes (max_mr, max_mr_size, ...).
  int links = 0;                             ///< Links on this device.
  std::optional<MemoryRegionSet> scratch;    ///< The scratch memory, registered on this device.
};

/// Which neighbour a link leads to: the left one, the right one, or (a fully connected job) a
/// rank that is not a ring neighbour.
enum class Side : std::uint8_t { left = 0, right = 1, mesh = 2 };

/// The scratch memory's layout, the same on every rank (RDMA WRITE aims at it): per link,
/// `slots` receive slots, as many send slots (staged memory) and two head slots, each `slot_bytes`;
/// then the gather area of the latency and mesh algorithms; then one page for placeholders (the
/// 4-byte messages of empty pieces, credits and the agreement wave).
struct ScratchLayout {
  std::size_t slot_bytes = 0;    ///< One message.
  std::size_t slots = 0;         ///< Receive (and send) slots per link: 2 x the link's window.
  std::size_t links = 0;         ///< Links.
  std::size_t gather_vectors = 0;///< Vectors the gather area holds.
  std::size_t vector_bytes = 0;  ///< Bytes of each.
  /// Offset of link i's receive slot s.
  std::size_t recv_slot(std::size_t i, std::size_t s) const noexcept { return (i * per_link() + s) * slot_bytes; }
  /// Offset of link i's send slot s.
  std::size_t send_slot(std::size_t i, std::size_t s) const noexcept { return (i * per_link() + slots + s) * slot_bytes; }
  /// Offset of link i's head slot h (0 or 1).
  std::size_t head_slot(std::size_t i, unsigned h) const noexcept { return (i * per_link() + 2 * slots + h) * slot_bytes; }
  /// Offset of the gather area's vector v.
  std::size_t gather(std::size_t v) const noexcept { return links * per_link() * slot_bytes + v * vector_bytes; }
  /// Offset of the placeholder page.
  std::size_t placeholder() const noexcept { return gather(gather_vectors); }
  /// Bytes of the whole scratch memory.
  std::size_t bytes() const noexcept { return placeholder() + frame_bytes; }
  /// Slots of one link: receive, send and head.
  std::size_t per_link() const noexcept { return 2 * slots + 2; }
};

/// What one link is in the communicator: where it leads and the in-band credit state that
/// outlives each collective (collective/engine.hpp, "Credits").
struct LinkState {
  Side side = Side::left;        ///< Which neighbour.
  std::size_t cable = 0;         ///< Its index among that side's cables (the mesh: among the mesh links).
  int peer = 0;                  ///< The peer's rank.
  Port* port = nullptr;          ///< The local device.
  std::size_t port_index = 0;    ///< Its index in Network::ports().
  std::uint32_t window = 1;      ///< Messages in flight on this link.
  // Frames of the next collective's first message each way, as both ends guess them (the first
  // message of the previous collective on this link): the head receive is posted with that many
  // frames (Apple pairs a send and a receive by their frame counts).
  std::uint32_t head_frames_in = 1;  ///< Frames of the next head this rank receives (see above).
  std::uint32_t head_frames_out = 1; ///< Frames of the next head this rank sends (see above).
  /// Which of the link's two head slots the next call's head (its call header first) lands in.
  unsigned parity = 0;
  bool early_head = false;       ///< The next call's head arrived during an earlier call.
  std::uint32_t early_bytes = 0; ///< Its length.
  std::uint64_t messages_sent = 0;     ///< Messages sent since set-up (traffic lines).
  std::uint64_t messages_received = 0; ///< Messages received since set-up (traffic lines).
  /// RDMA WRITE transport: where the peer's scratch is (its address, plan, rkeys on the peer's
  /// device) and where its slots for this link start in it.
  std::optional<MemoryAdvertisement> peer_scratch;
  std::size_t peer_link_index = 0; ///< This link's index among the peer's links (its slots in peer_scratch).
};

/// The devices, links and scratch memory of one rank's communicator (see the top of this file).
class Network {
public:
  /// Opens the devices, selects GIDs, checks the budget, registers the scratch memory, connects
  /// and verifies every link, and primes every link's credits. Every rank calls it with matching
  /// configurations (the same size, message size, window and transport). Errors: the failing
  /// step's, with where() naming it.
  [[nodiscard]] static Result<std::unique_ptr<Network>> create(const Library& lib, SideChannel& sc, NetworkConfig cfg,
                                                               std::string& where) {
    auto net = std::unique_ptr<Network>(new Network(sc, std::move(cfg)));
    auto step = [&](const char* what, auto&& f) -> Result<void> {
      where = what;
      return f();
    };
    if (auto s = step("opening the devices", [&] { return net->open_ports(lib); }); !s) return fail(s.error());
    if (auto s = step("checking the device file's cables against the neighbours'", [&] { return net->check_cables(); }); !s)
      return fail(s.error());
    if (auto s = step("choosing the transport", [&] { return net->choose_transport(); }); !s) return fail(s.error());
    if (auto s = step("checking the resource budget and registering the scratch memory", [&] { return net->allocate(); }); !s)
      return fail(s.error());
    if (auto s = step("connecting the links (endpoint exchange, warm-up)", [&] { return net->connect(); }); !s)
      return fail(s.error());
    if (auto s = step("agreeing on the message size", [&] { return net->agree_message_size(); }); !s)
      return fail(s.error());
    if (auto s = step("exchanging the scratch memory's addresses and rkeys for RDMA WRITE",
                      [&] { return net->exchange_advertisements(); });
        !s)
      return fail(s.error());
    if (auto s = step("posting the first credits", [&] { return net->prime(); }); !s) return fail(s.error());
    where.clear();
    return net;
  }

  /// This rank.
  int rank() const noexcept { return cfg_.rank; }
  /// Ranks in the job.
  int size() const noexcept { return cfg_.size; }
  /// This rank's position in the ring order.
  int position() const noexcept { return pos_; }
  /// The rank at ring position p (mod size).
  int rank_at(int p) const noexcept {
    const int n = cfg_.size;
    return cfg_.cabling.order[static_cast<std::size_t>(((p % n) + n) % n)];
  }
  /// The left and right neighbours' ranks.
  int left() const noexcept { return left_; }
  int right() const noexcept { return right_; } ///< See left().
  /// The largest window whose receives stay within apple_max_posted_requests per queue on Apple:
  /// 2 x window slots, three heads and the agreement wave.
  std::uint32_t apple_window_cap() const noexcept {
    const std::uint32_t fixed = 3 + static_cast<std::uint32_t>(wave_hops());
    return apple_max_posted_requests > fixed + 2 ? (apple_max_posted_requests - fixed) / 2 : 1;
  }
  /// Hops of the agreement wave (collective/engine.hpp): (size - 2) / 2 from 4 ranks on, else 0.
  std::size_t wave_hops() const noexcept { return cfg_.size >= 4 ? static_cast<std::size_t>((cfg_.size - 2) / 2) : 0; }
  /// The configuration (message size and window after any step-down).
  const NetworkConfig& config() const noexcept { return cfg_; }
  /// True when messages travel as RDMA WRITE with immediate.
  bool writes() const noexcept { return write_; }
  /// True when a send and its receive must span the same number of 4 KiB frames (Apple).
  bool frame_pairing() const noexcept { return frame_pairing_; }
  /// Every link: the left cables', the right cables', then the mesh links.
  std::span<Link> links() noexcept { return links_; }
  /// Link i's state (parallel to links()).
  LinkState& state(std::size_t i) noexcept { return states_[i]; }
  const LinkState& state(std::size_t i) const noexcept { return states_[i]; } ///< See state().
  /// Index in links() of a side's first link, and that side's number of links.
  std::size_t first(Side s) const noexcept { return first_[static_cast<int>(s)]; }
  std::size_t count(Side s) const noexcept { return count_[static_cast<int>(s)]; } ///< See first().
  /// The link toward a rank that is not a neighbour (a fully connected job), or nullopt.
  std::optional<std::size_t> mesh_link(int peer) const noexcept {
    for (std::size_t c = 0; c < count(Side::mesh); ++c)
      if (states_[first(Side::mesh) + c].peer == peer) return first(Side::mesh) + c;
    return std::nullopt;
  }
  /// True when every pair of ranks is cabled: 4 ranks or more, with a link to every rank that is
  /// not a neighbour (the mesh algorithms run).
  bool fully_connected() const noexcept {
    return cfg_.size >= 4 && count(Side::mesh) == static_cast<std::size_t>(cfg_.size - 3);
  }
  /// The devices.
  std::span<const std::unique_ptr<Port>> ports() const noexcept { return ports_; }
  /// The scratch memory and its layout.
  std::byte* scratch() const noexcept { return scratch_->data(); }
  const ScratchLayout& layout() const noexcept { return layout_; } ///< See scratch().
  /// The side channel.
  SideChannel& channel() const noexcept { return sc_; }
  /// One line per link: side, cable, device, and the messages it carried each way since set-up.
  std::vector<std::string> traffic() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < links_.size(); ++i) {
      const LinkState& s = states_[i];
      out.push_back(std::string(side_name(s.side)) + " cable " + std::to_string(s.cable) + " (" + s.port->name +
                    ", link " + std::to_string(links_[i].id()) + "): " + std::to_string(s.messages_sent) +
                    " messages sent, " + std::to_string(s.messages_received) + " received");
    }
    return out;
  }
  /// "left", "right", "mesh".
  static const char* side_name(Side s) noexcept { return s == Side::left ? "left" : s == Side::right ? "right" : "mesh"; }
  /// Says a set-up line through the configuration's log.
  void say(const std::string& line) const {
    if (cfg_.log) cfg_.log(line);
  }

private:
  Network(SideChannel& sc, NetworkConfig cfg) : sc_(sc), mailbox_(sc), cfg_(std::move(cfg)) {
    const int n = cfg_.size;
    if (cfg_.cabling.order.size() != static_cast<std::size_t>(n)) {
      cfg_.cabling.order.clear();
      for (int i = 0; i < n; ++i) cfg_.cabling.order.push_back(i);
    }
    for (int i = 0; i < n; ++i)
      if (cfg_.cabling.order[static_cast<std::size_t>(i)] == cfg_.rank) pos_ = i;
    left_ = rank_at(pos_ - 1);
    right_ = rank_at(pos_ + 1);
  }

  Result<Port*> open_port(const Library& lib, const std::string& name);
  Result<void> open_ports(const Library& lib);
  Result<void> check_cables();
  Result<void> choose_transport();
  Result<void> allocate();
  Result<void> connect();
  Result<void> agree_message_size();
  Result<void> exchange_advertisements();
  Result<void> prime();

  SideChannel& sc_;
  LinkMailbox mailbox_;
  NetworkConfig cfg_;
  std::vector<std::unique_ptr<Port>> ports_;
  std::vector<Link> links_;
  std::vector<LinkState> states_;  // parallel to links_
  std::size_t first_[3] = {0, 0, 0}, count_[3] = {0, 0, 0};
  std::optional<AlignedBuffer> scratch_;
  ScratchLayout layout_;
  bool write_ = false, frame_pairing_ = false;
  int pos_ = 0, left_ = 0, right_ = 0;
};

// ---------------------------------------------------------------------------------------------

inline Result<Port*> Network::open_port(const Library& lib, const std::string& name) {
  for (auto& p : ports_)
    if (p->name == name) return p.get();
  auto p = std::make_unique<Port>();
  p->name = name;
  auto ctx = Context::open(lib, name);
  if (!ctx) return fail(ctx.error());
  p->context.emplace(std::move(*ctx));
  if (auto port = p->context->require_active_port(1); !port) return fail(port.error());
  auto dev = p->context->query_device();
  if (!dev) return fail(dev.error());
  p->device = *dev;
  // The IPv4-mapped GID appears only once the interface has an address, and may arrive late
  // (APIPA, docs/field-reports.md section 3): re-read the table until it is there or the bound passes.
  const auto until = std::chrono::steady_clock::now() + cfg_.gid_wait;
  for (;;) {
    auto table = p->context->gid_table(1);
    if (!table) return fail(table.error());
    auto sel = table->select();
    if (sel) {
      p->gid.emplace(*sel);
      break;
    }
    if (!sel.error().is(ErrorKind::no_ipv4_gid) || std::chrono::steady_clock::now() >= until) return fail(sel.error());
    ::usleep(50 * 1000);
  }
  ports_.push_back(std::move(p));
  return ports_.back().get();
}

inline Result<void> Network::open_ports(const Library& lib) {
  const Cabling& c = cfg_.cabling;
  auto add = [&](Side side, std::size_t cable, const std::string& device, int peer) -> Result<void> {
    auto p = open_port(lib, device);
    if (!p) return fail(p.error());
    ++(*p)->links;
    LinkState s;
    s.side = side;
    s.cable = cable;
    s.peer = peer;
    s.port = *p;
    for (std::size_t k = 0; k < ports_.size(); ++k)
      if (ports_[k].get() == *p) s.port_index = k;
    states_.push_back(s);
    const auto& g = *(*p)->gid;
    say(std::string(side_name(side)) + " cable " + std::to_string(cable) + " to rank " + std::to_string(peer) + ": " +
        device + " port " + std::to_string(g.port()) + " " + g.describe() + " (" + std::string(g.reason()) + ")");
    return {};
  };
  if (cfg_.size > 1 && (c.left.empty() || c.right.empty()))
    return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                            "rank " + std::to_string(cfg_.rank) + " has no device toward rank " +
                                std::to_string(c.left.empty() ? left_ : right_)));
  first_[0] = states_.size();
  for (std::size_t k = 0; k < c.left.size(); ++k)
    if (auto s = add(Side::left, k, c.left[k], left_); !s) return s;
  first_[1] = states_.size();
  for (std::size_t k = 0; k < c.right.size(); ++k)
    if (auto s = add(Side::right, k, c.right[k], right_); !s) return s;
  first_[2] = states_.size();
  for (std::size_t p = 0; p < c.mesh.size(); ++p)
    if (!c.mesh[p].empty() && static_cast<int>(p) != cfg_.rank && static_cast<int>(p) != left_ &&
        static_cast<int>(p) != right_)
      if (auto s = add(Side::mesh, states_.size() - first_[2], c.mesh[p], static_cast<int>(p)); !s) return s;
  for (int s = 0; s < 3; ++s) count_[s] = (s < 2 ? first_[s + 1] : states_.size()) - first_[s];
  return {};
}

// Both ends of a hop must list the same number of cables (entry k on both is one cable): checked
// once over the side channel, so a mismatched device file is named instead of timing out.
inline Result<void> Network::check_cables() {
  if (cfg_.size < 2) return {};
  WireWriter w;
  w.put<std::uint32_t>(static_cast<std::uint32_t>(count(Side::left)));
  w.put<std::uint32_t>(static_cast<std::uint32_t>(count(Side::right)));
  auto all = sc_.all_gather(w.data());
  if (!all) return fail(all.error());
  WireReader r((*all)[static_cast<std::size_t>(right_)]);
  const auto their_left = r.get<std::uint32_t>();
  if (!r.ok()) return fail(Error::make(Step::configure, ErrorKind::bad_frame, "malformed cable count"));
  if (their_left != count(Side::right))
    return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                            "the device file lists " + std::to_string(count(Side::right)) + " cable(s) from rank " +
                                std::to_string(cfg_.rank) + " to rank " + std::to_string(right_) + " but rank " +
                                std::to_string(right_) + " lists " + std::to_string(their_left) + " toward rank " +
                                std::to_string(cfg_.rank) + " (entry k on both ranks must be the same cable)"));
  return {};
}

// RDMA WRITE with immediate needs it on every port of the job (the QP the platform's recipe makes
// must execute it: RC on rdma-core; Apple's UC accepts a WRITE and drops it). Agreed job-wide over
// the side channel before anything is registered, since write targets need REMOTE_WRITE. Frame
// pairing too: a job with one Apple port pairs every send with an equal-frame receive on every
// link (a Linux rank facing a Mac must, and one layout for all keeps the ranks' windows equal).
inline Result<void> Network::choose_transport() {
  std::string why_not;
  bool apple_here = false;
  for (const auto& p : ports_) {
    const auto platform = p->context->platform();
    if (platform == Platform::apple) apple_here = true;
    const auto recipe = QpRecipe::for_platform(platform, *p->gid);
    if (recipe.type() != QpType::rc || !contains(send_ops_for(recipe.type(), platform, true, recipe.access()), SendOp::rdma_write_with_imm))
      why_not = platform == Platform::apple
                    ? "Apple's Thunderbolt driver is UC and executes SEND only (RDMA WRITE is accepted but not executed)"
                    : p->name + " does not use RC";
  }
  // Bit 0: every port here can RDMA WRITE; bit 1: a port here is Apple's (frames).
  const std::byte mine[1] = {std::byte{static_cast<std::uint8_t>((why_not.empty() ? 1u : 0u) | (apple_here ? 2u : 0u))}};
  auto all = sc_.all_gather(mine);
  if (!all) return fail(all.error());
  bool everyone = why_not.empty();
  for (std::size_t q = 0; q < all->size(); ++q) {
    const auto bits = (*all)[q].size() == 1 ? static_cast<unsigned>((*all)[q][0]) : 0u;
    if ((bits & 2u) != 0) frame_pairing_ = true;
    if ((bits & 1u) == 0) {
      everyone = false;
      if (why_not.empty()) why_not = "rank " + std::to_string(q) + " cannot RDMA WRITE";
    }
  }
  std::string line;
  switch (cfg_.transport) {
  case Transport::send:
    line = "SEND/RECV (asked for)";
    break;
  case Transport::write:
    write_ = everyone;
    line = everyone ? "RDMA WRITE with immediate (asked for)" : "SEND/RECV (RDMA WRITE asked for, but " + why_not + ")";
    break;
  case Transport::automatic:
    line = everyone ? "SEND/RECV (RDMA WRITE with immediate measured no faster on the emulator: docs/collective-backend.md 6b)"
                    : "SEND/RECV (" + why_not + ")";
    break;
  }
  say("transport: " + line);
  return {};
}

inline Result<void> Network::allocate() {
  // Depths in 4 KiB frames on Apple: a link posts at most 2 x its window receives ahead plus two
  // heads, each up to one message, and the driver takes at most 4095 frames per queue, so large
  // messages mean a smaller window.
  const std::size_t frames = frames_of(cfg_.message_bytes);
  const std::size_t k_max = std::max<std::size_t>({1, count(Side::left), count(Side::right)});
  std::uint32_t window = static_cast<std::uint32_t>((static_cast<std::size_t>(std::max(1, cfg_.window)) + k_max - 1) / k_max);
  if (frame_pairing_) {
    // Three heads of a message each, the wave a frame per hop; and the requests per queue
    // (apple_max_posted_requests).
    const std::size_t room = max_depth_frames - wave_hops();
    std::size_t fit = room / frames >= 3 ? (room / frames - 3) / 2 : 0;
    fit = std::min<std::size_t>(fit, apple_window_cap());
    if (fit < 1)
      return fail(Error::make(Step::configure, ErrorKind::capacity,
                              "messages of " + std::to_string(cfg_.message_bytes) +
                                  " bytes are too large for a window of one within 4095 frames"));
    if (window > fit) {
      say("window lowered from " + std::to_string(window) + " to " + std::to_string(fit) + " messages per link: " +
          std::to_string(frames) + " frames each, 4095 frames and " +
          std::to_string(apple_max_posted_requests) + " requests per queue");
      window = static_cast<std::uint32_t>(fit);
    }
  }
  for (auto& s : states_) s.window = window;
  layout_.slot_bytes = cfg_.message_bytes;
  layout_.slots = 2 * static_cast<std::size_t>(window);
  layout_.links = states_.size();
  // The gather area: the latency algorithm's own vector and 2 floor(n/2) received ones, or the
  // mesh's n; vectors of at most latency_max_bytes, 16 MiB in all, whole frames.
  const std::size_t n = static_cast<std::size_t>(cfg_.size);
  layout_.gather_vectors = std::max<std::size_t>(1 + 2 * (n / 2), n);
  const std::size_t cap = std::min(cfg_.latency_max_bytes, (std::size_t{16} << 20) / layout_.gather_vectors);
  layout_.vector_bytes = std::max<std::size_t>(frame_bytes, cap / frame_bytes * frame_bytes);

  // The whole budget of every device (QPs, CQs, PDs, MRs, frames per queue), checked before the
  // first PD, region or queue pair exists; the error lists every shortfall.
  for (auto& p : ports_) {
    JobShape shape;
    shape.links = p->links;
    shape.message_bytes = layout_.slot_bytes;
    shape.window = static_cast<int>(window);
    shape.extra_messages = 2;  // the two heads beyond JobNeeds' one, and a dummy head
    shape.extra_control = static_cast<int>(wave_hops()); // the agreement wave
    shape.buffers.push_back(layout_.bytes());
    auto limits = DeviceLimits::of(*p->context);
    if (!limits) return fail(limits.error());
    auto needs = JobNeeds::of(shape, *limits);
    if (!needs) return fail(needs.error());
    if (auto fits = check_budget(*needs, *limits); !fits) return fail(fits.error());
    explain(p->name + ": budget " + budget_summary(*needs, *limits));
  }
  auto buf = AlignedBuffer::allocate(layout_.bytes());
  if (!buf) return fail(buf.error());
  scratch_.emplace(std::move(*buf));
  for (auto& p : ports_) {
    auto pd = p->context->alloc_pd();
    if (!pd) return fail(pd.error());
    p->pd.emplace(std::move(*pd));
    const auto t0 = std::chrono::steady_clock::now();
    auto set = MemoryRegionSet::reg(*p->pd, scratch_->bytes(), p->device.max_mr_size, layout_.slot_bytes,
                                    write_ ? std::optional(Access::local_write | Access::remote_write) : std::nullopt);
    if (!set) return fail(set.error());
    p->scratch.emplace(std::move(*set));
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    say(p->name + ": scratch memory of " + std::to_string(layout_.bytes()) + " bytes in " +
        std::to_string(p->scratch->plan().count) + " region(s), registered in " + std::to_string(us.count()) + " us");
    if (explain_enabled())
      explain(p->name + ": MR " +
              explain_memory(*p->scratch, "scratch (receive, send and head slots per link; gather area)",
                             p->device.max_mr_size));
  }
  return {};
}

inline Result<void> Network::connect() {
  const std::uint32_t frames = frames_of(cfg_.message_bytes);
  // Per link: the window's slots of receives, two heads and a message 0 behind a dummy head, and
  // the agreement wave: counted in frames on Apple (at most 4095), else in work requests (at most
  // the device's max_qp_wr; asking the frame count there too leaves room to widen the window if
  // the messages shrink).
  const std::uint32_t want = frames * static_cast<std::uint32_t>(layout_.slots + 3) + static_cast<std::uint32_t>(wave_hops());
  auto depth_on = [&](const Port& p) {
    if (p.context->platform() == Platform::apple) return std::min(max_depth_frames, want);
    const auto wr = p.device.max_qp_wr > 0 ? static_cast<std::uint32_t>(p.device.max_qp_wr) : want;
    return std::min(wr, want);
  };
  const int n = cfg_.size;
  std::vector<LinkSpec> specs;
  for (std::size_t i = 0; i < states_.size(); ++i) {
    const LinkState& s = states_[i];
    LinkSpec spec;
    spec.peer = s.peer;
    // The cable's identity, the same on both ends: the ring position at the hop's left end and
    // the cable's place in both ranks' lists; mesh links above them, from the two ranks.
    if (s.side == Side::mesh)
      spec.id = 4096u + static_cast<std::uint32_t>(std::min(cfg_.rank, s.peer)) * 64u +
                static_cast<std::uint32_t>(std::max(cfg_.rank, s.peer));
    else
      spec.id = static_cast<std::uint32_t>(s.side == Side::left ? (pos_ + n - 1) % n : pos_) * 64u +
                static_cast<std::uint32_t>(s.cable);
    spec.context = &*s.port->context;
    spec.pd = &*s.port->pd;
    spec.recipe.emplace(QpRecipe::for_platform(s.port->context->platform(), *s.port->gid));
    const std::uint32_t depth = depth_on(*s.port);
    spec.recipe->capacities({depth, depth, 1, 1, 0});
    specs.push_back(std::move(spec));
  }
  LinkOptions opt;
  opt.warmup_bytes = cfg_.message_bytes;
  opt.timeout = cfg_.timeout;
  opt.on_retry = [&](std::uint32_t id, int attempt, const std::string& why) {
    say("link " + std::to_string(id) + ": warm-up round " + std::to_string(attempt) + " failed (" + why +
        "); recreating the QP and CQ with a new PSN");
  };
  auto links = connect_links(mailbox_, specs, opt);
  if (!links) return fail(links.error());
  links_ = std::move(*links);
  for (std::size_t i = 0; i < links_.size(); ++i) {
    const LinkAgreement& a = links_[i].agreement();
    say(std::string(side_name(states_[i].side)) + " link " + std::to_string(links_[i].id()) + " to rank " +
        std::to_string(links_[i].peer()) + ": recipe " + (a.type == QpType::rc ? "RC" : "UC") + " on " +
        std::string(links_[i].device()) + ": " + a.why);
    say(std::string(side_name(states_[i].side)) + " link " + std::to_string(links_[i].id()) + " to rank " +
        std::to_string(links_[i].peer()) + " verified (messages of up to " +
        std::to_string(links_[i].max_message_bytes()) + " bytes both ways, round " +
        std::to_string(links_[i].attempts()) + ")");
  }
  return {};
}

// Every link carries messages of the smallest size any link of the job confirmed: the hops of a
// rank are joined by the algorithms' message numbering. Smaller messages cut the slots into more
// (the same bytes) and widen the window to what the granted depth and the slots allow.
inline Result<void> Network::agree_message_size() {
  std::size_t confirmed = cfg_.message_bytes;
  for (auto& l : links_) confirmed = std::min(confirmed, l.max_message_bytes());
  // The window the granted depths take if the messages shrink: (2 x window + 3) messages per
  // queue, of f frames each where the QP counts frames (Apple), one request each elsewhere.
  // Every rank computes its own (a Mac's 4095 frames, a Linux host's max_qp_wr requests) and the
  // job takes the smallest, so both ends of every link post the same window.
  // Besides those, the agreement wave (one frame or request per hop), and on Apple at most
  // apple_max_posted_requests requests per queue, whatever the frames allow.
  const std::uint32_t control = static_cast<std::uint32_t>(wave_hops());
  auto window_by_depth = [&](std::size_t bytes) {
    const std::uint32_t f = frames_of(std::max(frame_bytes, bytes / frame_bytes * frame_bytes));
    std::uint64_t w = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t i = 0; i < links_.size(); ++i) {
      const auto& caps = links_[i].qp().capacities();
      const std::uint32_t granted = std::min(caps.max_send_wr, caps.max_recv_wr);
      const bool in_frames = states_[i].port->context->platform() == Platform::apple;
      const std::uint32_t per = in_frames ? f : 1;
      w = std::min<std::uint64_t>(w, granted > 3 * per + control ? (granted - 3 * per - control) / (2 * per) : 1);
      if (in_frames) w = std::min<std::uint64_t>(w, apple_window_cap());
    }
    return w;
  };
  WireWriter w;
  w.put<std::uint64_t>(confirmed);
  auto all = sc_.all_gather(w.data());
  if (!all) return fail(all.error());
  for (const auto& v : *all) {
    WireReader r(v);
    const auto theirs = r.get<std::uint64_t>();
    if (r.ok()) confirmed = std::min<std::size_t>(confirmed, static_cast<std::size_t>(theirs));
  }
  confirmed = std::max(frame_bytes, confirmed / frame_bytes * frame_bytes);
  if (confirmed >= cfg_.message_bytes) return {};
  // The same bytes per link, cut into more, smaller slots (a link's part is 2 x slots + 2 heads),
  // as many as every rank's granted depths take.
  WireWriter wd;
  wd.put<std::uint64_t>(window_by_depth(confirmed));
  auto depths = sc_.all_gather(wd.data());
  if (!depths) return fail(depths.error());
  std::uint64_t by_depth_all = std::numeric_limits<std::uint64_t>::max();
  for (const auto& v : *depths) {
    WireReader r(v);
    const auto theirs = r.get<std::uint64_t>();
    if (!r.ok()) return fail(Error::make(Step::configure, ErrorKind::bad_frame, "malformed window agreement"));
    by_depth_all = std::min(by_depth_all, theirs);
  }
  const std::size_t by_depth = static_cast<std::size_t>(std::max<std::uint64_t>(1, by_depth_all));
  const std::size_t per_link_bytes = layout_.per_link() * layout_.slot_bytes;
  const std::size_t by_slots = (per_link_bytes / confirmed - 2) / 4;
  const std::size_t window = std::max<std::size_t>(1, std::min(by_depth, by_slots));
  say("messages of " + std::to_string(confirmed) + " bytes (asked " + std::to_string(cfg_.message_bytes) +
      "), window " + std::to_string(window) + " per link");
  cfg_.message_bytes = confirmed;
  layout_.slot_bytes = confirmed;  // every rank computes the same layout from the same figures
  layout_.slots = 2 * window;
  for (auto& s : states_) s.window = static_cast<std::uint32_t>(window);
  return {};
}

// RDMA WRITE transport: every rank publishes its scratch memory's advertisement on each device
// (address, region plan, rkeys) and, per link id, where that link's slots start; each rank keeps,
// per link, its peer's entry for the same link id.
inline Result<void> Network::exchange_advertisements() {
  if (!write_) return {};
  WireWriter w;
  w.put<std::uint32_t>(static_cast<std::uint32_t>(links_.size()));
  for (std::size_t i = 0; i < links_.size(); ++i) {
    const auto ad = MemoryAdvertisement::of(*states_[i].port->scratch).serialize();
    w.put<std::uint32_t>(links_[i].id()).put<std::uint32_t>(static_cast<std::uint32_t>(i));
    w.put<std::uint32_t>(static_cast<std::uint32_t>(ad.size())).bytes(ad);
  }
  auto all = sc_.all_gather(w.data());
  if (!all) return fail(all.error());
  for (std::size_t i = 0; i < links_.size(); ++i) {
    WireReader r((*all)[static_cast<std::size_t>(links_[i].peer())]);
    const auto entries = r.get<std::uint32_t>();
    bool found = false;
    for (std::uint32_t e = 0; r.ok() && e < entries && !found; ++e) {
      const auto id = r.get<std::uint32_t>();
      const auto index = r.get<std::uint32_t>();
      const auto len = r.get<std::uint32_t>();
      const auto bytes = r.bytes(len);
      if (!r.ok() || id != links_[i].id()) continue;
      auto ad = MemoryAdvertisement::parse(bytes);
      if (!ad) return fail(ad.error());
      if (ad->length != scratch_->size())
        return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                                "rank " + std::to_string(links_[i].peer()) + " has a scratch memory of " +
                                    std::to_string(ad->length) + " bytes, this rank " + std::to_string(scratch_->size()) +
                                    " (different message sizes or windows)"));
      states_[i].peer_scratch = std::move(*ad);
      states_[i].peer_link_index = index;
      found = true;
    }
    if (!found)
      return fail(Error::make(Step::configure, ErrorKind::bad_frame,
                              "rank " + std::to_string(links_[i].peer()) + " sent no advertisement for link " +
                                  std::to_string(links_[i].id())));
  }
  say("RDMA WRITE targets exchanged (scratch memory: addresses and rkeys)");
  return {};
}

// Every link's first head receive (one frame, in head slot 0; a zero-length credit for RDMA
// WRITE: collective/engine.hpp, "Wires"), then "receives posted" over the side channel: the last
// step of set-up, and the last time the collectives use it except on a failure (and close()'s
// barrier).
inline Result<void> Network::prime() {
  constexpr std::uint64_t head_id = std::uint64_t{1} << 62;
  for (std::size_t i = 0; i < links_.size(); ++i) {
    LinkState& s = states_[i];
    if (write_) {
      if (auto r = links_[i].qp().post(RecvWr(head_id)); !r) return fail(r.error());
      continue;
    }
    auto head = s.port->scratch->sge(layout_.head_slot(i, 0), frame_pairing_ ? frame_bytes : layout_.slot_bytes);
    if (!head) return fail(head.error());
    if (auto r = links_[i].qp().recv(head_id, *head); !r) return fail(r.error());
  }
  return receives_posted(mailbox_, links_, 1, std::chrono::steady_clock::now() + cfg_.timeout);
}

} // namespace collective
TBVERBS_NAMESPACE_END
