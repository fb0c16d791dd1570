// A ring all_sum on tbverbs: the collective backend this example is about. This file sets the ring
// up (devices, links, buffers); algorithms.hpp holds the all_sum algorithms that run on it.
//
// Every rank has links to its right neighbour (rank + 1) and to its left one (rank - 1), one per
// cable (usually Thunderbolt ports; a device file may list several cables per neighbour). The
// algorithms send messages of at most `message_bytes` in both directions of the ring at once, up to
// `window` messages per direction in flight, with receives posted ahead as credits. Message j of a
// direction travels on cable j mod k of its hop (k cables): every listed cable carries traffic, in
// both directions.
//
// Memory within Apple's limits (max_mr_size 16,384,000 bytes, about 100 regions per device):
// registered mode registers the user buffers as region sets (tbverbs::MemoryRegionSet: regions of at most
// max_mr_size overlapping by one message, so no message spans two); staged mode registers only bounded
// scratch slots and copies through them. `automatic` takes registered while the regions fit the
// device's budget, staged beyond; the regions a job needs are counted before anything is made.
//
// Transport (RC only): messages travel as SEND/RECV, or as RDMA WRITE with immediate (NCCL
// net_ib's schedule) straight into the place the receive would have put them: the peer's scratch
// slot, or its output range in the all-gather of registered memory. The receiver then posts
// zero-length receives as the credits (each WRITE_WITH_IMM consumes one and completes it with the
// message number as the immediate), so the window, the credits and the numbering are unchanged.
// The peers exchange their regions' addresses and rkeys over the side channel at set-up. Apple's
// driver (UC) accepts RDMA WRITE but does not execute it: there the ring always sends.
#pragma once

#include <tbverbs/budget.hpp>
#include <tbverbs/explain.hpp>
#include <tbverbs/link.hpp>
#include <tbverbs/side_channel.hpp>
#include <tbverbs/tbverbs.hpp>
#include <tbverbs/wire.hpp>

#include "dtype.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ring {

using tbverbs::Error;
using tbverbs::ErrorKind;
using tbverbs::Result;
using tbverbs::Step;
using tbverbs::fail;

/// How the ring's buffers are registered (see the top of this file).
enum class Memory { automatic, registered, staged };

/// How messages travel (see the top of this file): `automatic` takes the one measured faster on
/// the emulator where RDMA WRITE with immediate is possible (RC), SEND/RECV elsewhere.
enum class Transport { automatic, send, write };

/// What `Transport::automatic` was chosen from: `ring_all_sum --local 4 --profile rdma-core-rc --size
/// 64M --iters 10`, Release build, busbw in GB/s, median of 10 interleaved runs of each on one
/// session (2026-12). The emulator moves a SEND and an RDMA WRITE with the same copy, so the two
/// tie within the runs' spread (also at 2 ranks and at 4 KiB: docs/collective-backend.md,
/// "Transport"); WRITE is not faster there, so automatic keeps SEND/RECV.
struct TransportMeasurement {
  double send_gbps, write_gbps;
  bool write_faster() const { return write_gbps > send_gbps; }
};
inline constexpr TransportMeasurement measured_on_emulator{2.43, 2.42};

/// Which all_sum algorithm runs (algorithms.hpp): `automatic` takes the one-hop mesh on a fully
/// connected job, else the latency-optimal one, up to the measured crossover, and the
/// bandwidth-optimal ring above it.
enum class Algorithm { automatic, ring, latency, mesh };
inline const char* algorithm_name(Algorithm a) {
  switch (a) {
  case Algorithm::automatic: return "auto";
  case Algorithm::ring: return "ring";
  case Algorithm::latency: return "latency";
  case Algorithm::mesh: return "mesh";
  }
  return "?";
}

/// The latency algorithm's largest sum, and the most scratch its gather area takes (see allocate()).
inline constexpr std::size_t kLatencyMaxBytes = std::size_t{1} << 20;
inline constexpr std::size_t kGatherMaxBytes = std::size_t{16} << 20;
/// The latency algorithm's largest sum on a ring of n ranks: its gather area holds 1 + 2 floor(n/2)
/// vectors, at most kLatencyMaxBytes each and kGatherMaxBytes in all, whole 4 KiB frames.
inline std::size_t latency_cap(int n) {
  const std::size_t vectors = 1 + 2 * static_cast<std::size_t>(n / 2);
  return std::max<std::size_t>(4096, std::min(kLatencyMaxBytes, kGatherMaxBytes / vectors) / 4096 * 4096);
}

/// How the ring is set up.
struct Config {
  int rank = 0;
  int size = 1;
  // The ring order: order[p] is the rank at position p (empty: 0, 1, ..., size - 1). The left
  // neighbour is the rank before this one in it, the right neighbour the rank after it; topology
  // discovery makes an order that follows the cables when they do not follow the rank numbers.
  std::vector<int> order;
  std::vector<std::string> left_devices;   // one device per cable to the left neighbour, in the cables' agreed order
  std::vector<std::string> right_devices;  // one device per cable to the right neighbour
  // A fully connected job (the mesh all_sum): per rank, the device toward each rank that is not a
  // ring neighbour ("" for this rank and the neighbours). Empty, or any "" left: no mesh.
  std::vector<std::string> mesh_devices;
  std::size_t message_bytes = 256 * 1024;  // largest message (a whole number of 4 KiB frames)
  int window = 8;                          // messages in flight per direction
  Memory memory = Memory::automatic;
  Transport transport = Transport::automatic;
  Algorithm algorithm = Algorithm::automatic;
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds gid_wait{1000};  // how long to wait for an IPv4-mapped GID to appear
  std::function<void(const std::string&)> log;  // progress lines
};

/// Where the peer of a link wants its messages written (RDMA WRITE transport): the address, plan
/// and rkeys of each buffer's regions on the peer's device, as exchanged at set-up.
struct RemoteRegions {
  std::uint64_t addr = 0, size = 0;
  tbverbs::RegionPlan plan;
  std::vector<std::uint32_t> rkeys;  // one per region of `plan`
  /// The peer's address and the rkey of its region that holds [offset, offset + length).
  Result<tbverbs::RemoteBuffer> at(std::size_t offset, std::size_t length) const {
    const auto k = plan.region_of(size, offset, length);
    if (!k || *k >= rkeys.size())
      return fail(Error::make(Step::make_sge, ErrorKind::invalid_argument,
                              "range " + std::to_string(offset) + "+" + std::to_string(length) +
                                  " outside the peer's registered regions"));
    return tbverbs::RemoteBuffer{addr + offset, rkeys[*k]};
  }
};
struct PeerTargets {
  bool staged = false;              // the peer stages its memory: all-gather messages go to its scratch too
  std::size_t slots = 0, slot_bytes = 0;  // the peer's scratch layout
  RemoteRegions scratch, in, out;
};

/// One device as the ring uses it, with its registrations of the ring's buffers.
struct Port {
  std::string name;
  std::optional<tbverbs::Context> context;
  std::optional<tbverbs::ProtectionDomain> pd;
  std::optional<tbverbs::GidSelection> gid;
  tbverbs::DeviceAttributes device;
  int links = 0;       // links on this device
  int ring_links = 0;  // of which the ring's (the others are mesh links: scratch only, no user buffers)
  std::optional<tbverbs::MemoryRegionSet> in, out, scratch;
};

/// A page-aligned buffer of the ring.
struct Buffer {
  std::optional<tbverbs::AlignedBuffer> memory;
  std::byte* data() const { return memory->data(); }
  std::size_t size() const { return memory->size(); }
};

/// The ring: devices, links, buffers, and the all_sum.
class Ring {
public:
  /// Opens the devices, selects GIDs, registers the buffers (for sums of up to `max_bytes`),
  /// then connects and verifies every link.
  static Result<std::unique_ptr<Ring>> create(const tbverbs::Library& lib, tbverbs::SideChannel& sc,
                                              const Config& cfg, std::size_t max_bytes) {
    auto r = std::unique_ptr<Ring>(new Ring(sc, cfg));
    if (auto s = r->open_ports(lib); !s) return fail(s.error());
    if (auto s = r->check_cables(); !s) return fail(s.error());
    if (auto s = r->choose_transport(); !s) return fail(s.error());
    if (auto s = r->allocate(max_bytes); !s) return fail(s.error());
    if (auto s = r->connect(); !s) return fail(s.error());
    if (auto s = r->exchange_targets(); !s) return fail(s.error());
    return r;
  }

  /// The input and output buffers (in-place runs use `input()` for both).
  Buffer& input() { return in_; }
  Buffer& output() { return out_; }
  const Config& config() const { return cfg_; }
  /// True when the buffers are staged (copied through registered scratch slots).
  bool staged() const { return staged_; }
  /// True when messages travel as RDMA WRITE with immediate (else SEND/RECV).
  bool writes() const { return write_; }
  /// "Receives posted" with the peers the all_sum sends to (tbverbs::receives_posted on their
  /// links): the two neighbours, or every rank for the mesh all_sum. What all_sum's
  /// `before_start` needs between back-to-back all_sums. A global barrier works too, but costs two
  /// hops through rank 0.
  Result<void> neighbours_posted() {
    ++epoch_;
    const auto links = std::span(links_).first(mesh_active_ ? links_.size() : first_[2]);
    return tbverbs::receives_posted(mailbox_, links, epoch_, std::chrono::steady_clock::now() + cfg_.timeout);
  }
  /// True when every pair of ranks is cabled (the mesh all_sum can run): 4 ranks or more, with a
  /// link to each rank that is not a neighbour.
  bool fully_connected() const {
    return cfg_.size >= 4 && cables_[2].size() == static_cast<std::size_t>(cfg_.size - 3);
  }
  /// One line per link: its side, cable, device and how many messages it carried each way since
  /// set-up (every listed cable must carry traffic).
  std::vector<std::string> traffic() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < links_.size(); ++i)
      out.push_back(std::string(side_name(refs_[i].side)) + " cable " + std::to_string(refs_[i].cable) +
                    " (" + refs_[i].port->name + ", link " + std::to_string(links_[i].id()) + "): " +
                    std::to_string(sent_[i]) + " messages sent, " + std::to_string(received_[i]) + " received");
    return out;
  }
  /// The phase the last failure happened in ("reduce-scatter step 2 ...").
  const std::string& where() const { return where_; }

  /// Sums `count` elements of `t` over all ranks: from input() into output(), or in place in
  /// input(), with the algorithm choose() names for its size. Every rank calls it with the same
  /// arguments. `before_start` runs after this rank's receives are posted and must not return
  /// before both neighbours have posted theirs: a barrier of every rank, or neighbours_posted().
  Result<void> all_sum(std::size_t count, DType t, bool in_place, const std::function<Result<void>()>& before_start);
  /// The algorithm all_sum runs for a sum of `bytes` per rank (never `automatic`).
  Algorithm choose(std::size_t bytes) const;
  /// The largest sum the latency algorithm can take (its gather area in the scratch buffer).
  std::size_t latency_max_bytes() const { return latency_max_; }
  /// One line saying how choose() decides (the set-up lines print it).
  std::string algorithm_rule() const;

private:
  Ring(tbverbs::SideChannel& sc, Config cfg) : sc_(sc), mailbox_(sc), cfg_(std::move(cfg)) {
    const int n = cfg_.size;
    if (cfg_.order.size() != static_cast<std::size_t>(n)) {
      cfg_.order.clear();
      for (int i = 0; i < n; ++i) cfg_.order.push_back(i);
    }
    for (int i = 0; i < n; ++i)
      if (cfg_.order[static_cast<std::size_t>(i)] == cfg_.rank) pos_ = i;
    left_ = cfg_.order[static_cast<std::size_t>((pos_ + n - 1) % n)];
    right_ = cfg_.order[static_cast<std::size_t>((pos_ + 1) % n)];
  }

  Result<void> open_ports(const tbverbs::Library& lib);
  Result<void> check_cables();
  Result<void> choose_transport();
  Result<void> allocate(std::size_t max_bytes);
  Result<void> connect();
  Result<void> exchange_targets();

  // The engine every algorithm runs on (algorithms.hpp), and the algorithms' schedules.
  template <class Schedule> Result<void> pipeline(Schedule& plan, const std::function<Result<void>()>& before_start);
  Result<void> mesh_all_sum(std::size_t count, DType t, bool in_place, const std::function<Result<void>()>& before_start);
  // An idle engine's sleep: waits (at most 10 ms) on the links' CQs, so an idle rank gives its
  // core to the ranks that have work (the emulator runs them all on one host), and hands a batch
  // to on_batch(index of the link in `sleepers`, count). True when a batch arrived.
  template <class Describe, class OnBatch>
  Result<bool> sleep_on_links(std::span<tbverbs::Link* const> sleepers, std::span<tbverbs::WorkCompletion> wc,
                              const Describe& describe_wait, const OnBatch& on_batch);
  // An engine's watch over its own progress, updated once per round of its loop: counts idle
  // rounds (after 16 the engine sleeps on its links), probes the peers every 20 ms (a dead or
  // aborting rank is reported at once), and gives up after cfg_.timeout without progress.
  struct Watch {
    std::chrono::steady_clock::time_point last_progress = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point last_check = last_progress;
    unsigned idle = 0;
  };
  template <class Describe> Result<void> watch(Watch& w, bool progress, const Describe& describe_wait);
  friend struct RingSchedule;
  friend struct LatencySchedule;

  // Where link i of the flat list sits: its side (0 left, 1 right, 2 mesh: a link to a rank that
  // is not a neighbour), its cable index on that side, and its device.
  static const char* side_name(int side) { return side == 0 ? "left" : side == 1 ? "right" : "mesh"; }
  struct LinkRef {
    int side = 0;
    std::size_t cable = 0;
    Port* port = nullptr;
  };

  tbverbs::SideChannel& sc_;
  tbverbs::LinkMailbox mailbox_;
  Config cfg_;
  std::vector<std::unique_ptr<Port>> ports_;  // one per distinct device
  std::vector<Port*> cables_[3];              // per side, the device of each cable
  std::vector<int> mesh_peer_;                // the rank each mesh cable (side 2) leads to
  std::vector<tbverbs::Link> links_;          // every link: the left cables', the right ones', the mesh ones
  std::vector<LinkRef> refs_;                 // parallel to links_
  std::vector<std::uint64_t> sent_, received_; // messages per link, parallel to links_
  std::size_t first_[3] = {0, 0, 0};          // index in links_ of each side's first link
  bool mesh_active_ = false;                  // the all_sum under way is the mesh one (all peers)
  Buffer in_, out_, scratch_;
  bool staged_ = false;
  bool write_ = false;               // RDMA WRITE with immediate instead of SEND/RECV
  std::vector<PeerTargets> peer_;    // write_: per link, where its peer wants our messages
  std::size_t slot_bytes_ = 0;  // bytes of one scratch slot (the largest message at set-up)
  std::size_t slots_ = 0;       // scratch slots per direction (2 x window)
  // Scratch layout: receive slots (both directions), the latency algorithm's gather area (its own
  // vector and floor(n/2) received ones per direction, latency_max_ bytes each), in staged mode the
  // send slots, and one page for the placeholder of empty messages. Receive slots and gather area
  // are at the same offsets on every rank (RDMA WRITE aims at them); the send slots are local.
  std::size_t gather_off_ = 0, latency_max_ = 0, send_slots_off_ = 0, placeholder_off_ = 0;
  std::uint32_t epoch_ = 0;
  std::string where_;
  int pos_ = 0;              // this rank's position in the ring order
  int left_ = 0, right_ = 0; // the neighbours' ranks
};

inline void say(const Config& c, const std::string& s) {
  if (c.log) c.log(s);
}

inline Result<void> Ring::open_ports(const tbverbs::Library& lib) {
  std::vector<std::string> mesh_names;
  for (std::size_t p = 0; p < cfg_.mesh_devices.size(); ++p)
    if (!cfg_.mesh_devices[p].empty() && static_cast<int>(p) != cfg_.rank && static_cast<int>(p) != left_ &&
        static_cast<int>(p) != right_) {
      mesh_names.push_back(cfg_.mesh_devices[p]);
      mesh_peer_.push_back(static_cast<int>(p));
    }
  for (int s = 0; s < 3; ++s) {
    const auto& names = s == 0 ? cfg_.left_devices : s == 1 ? cfg_.right_devices : mesh_names;
    for (const std::string& name : names) {
      Port* found = nullptr;
      for (auto& p : ports_)
        if (p->name == name) found = p.get();
      if (found == nullptr) {
        auto p = std::make_unique<Port>();
        p->name = name;
        where_ = "opening device " + name;
        auto ctx = tbverbs::Context::open(lib, name);
        if (!ctx) return fail(ctx.error());
        p->context.emplace(std::move(*ctx));
        where_ = "checking port 1 of " + name;
        if (auto port = p->context->require_active_port(1); !port) return fail(port.error());
        auto dev = p->context->query_device();
        if (!dev) return fail(dev.error());
        p->device = *dev;
        // The IPv4-mapped GID appears only once the interface has an address, and may arrive late
        // (APIPA): re-read the table until it is there or the bound passes.
        where_ = "selecting the GID of " + name;
        const auto until = std::chrono::steady_clock::now() + cfg_.gid_wait;
        for (;;) {
          auto table = p->context->gid_table(1);
          if (!table) return fail(table.error());
          auto sel = table->select();
          if (sel) {
            p->gid.emplace(*sel);
            break;
          }
          if (!sel.error().is(ErrorKind::no_ipv4_gid) || std::chrono::steady_clock::now() >= until)
            return fail(sel.error());
          ::usleep(50 * 1000);
        }
        found = p.get();
        ports_.push_back(std::move(p));
      }
      ++found->links;
      if (s < 2) ++found->ring_links;
      cables_[s].push_back(found);
    }
  }
  for (int s = 0; s < 3; ++s) {
    for (std::size_t c = 0; c < cables_[s].size(); ++c) {
      const int peer = s == 0 ? left_ : s == 1 ? right_ : mesh_peer_[c];
      const auto& g = *cables_[s][c]->gid;
      say(cfg_, std::string(side_name(s)) + " cable " + std::to_string(c) + " to rank " + std::to_string(peer) + ": " +
                    cables_[s][c]->name + " port " + std::to_string(g.port()) + " " + g.describe() + " (" +
                    std::string(g.reason()) + ")");
    }
  }
  return {};
}

// Both ends of a hop must list the same number of cables (entry k on both is one cable): checked
// once over the side channel, so a mismatched device file is named instead of timing out.
inline Result<void> Ring::check_cables() {
  where_ = "checking the device file's cables against the neighbours'";
  tbverbs::WireWriter mine;
  mine.put<std::uint32_t>(static_cast<std::uint32_t>(cables_[0].size()))
      .put<std::uint32_t>(static_cast<std::uint32_t>(cables_[1].size()));
  auto all = sc_.all_gather(mine.data());
  if (!all) return fail(all.error());
  const int r = cfg_.rank, right = right_;
  const auto& theirs = (*all)[static_cast<std::size_t>(right)];
  if (theirs.size() != 8) return fail(Error::make(Step::configure, ErrorKind::bad_frame, "malformed cable count"));
  const auto their_left = tbverbs::WireReader(theirs).get<std::uint32_t>();
  if (their_left != cables_[1].size())
    return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                            "the device file lists " + std::to_string(cables_[1].size()) + " cable(s) from rank " +
                                std::to_string(r) + " to rank " + std::to_string(right) + " but rank " +
                                std::to_string(right) + " lists " + std::to_string(their_left) +
                                " toward rank " + std::to_string(r) +
                                " (entry k on both ranks must be the same cable)"));
  return {};
}

// RDMA WRITE with immediate needs it on every port of the ring (the QP the platform's recipe makes
// must execute it: RC on rdma-core; Apple's UC accepts a WRITE and drops it). Agreed ring-wide over
// the side channel before anything is registered, since write targets need REMOTE_WRITE.
inline Result<void> Ring::choose_transport() {
  where_ = "choosing the transport";
  std::string why_not;
  for (const auto& p : ports_) {
    const auto platform = p->context->platform();
    const auto recipe = tbverbs::QpRecipe::for_platform(platform, *p->gid);
    if (recipe.type() != tbverbs::QpType::rc ||
        !tbverbs::contains(tbverbs::send_ops_for(recipe.type(), platform, true), tbverbs::SendOp::rdma_write_with_imm))
      why_not = platform == tbverbs::Platform::apple
                    ? "Apple's Thunderbolt driver is UC and executes SEND only (RDMA WRITE is accepted but not executed)"
                    : p->name + " does not use RC";
  }
  std::byte mine[1] = {std::byte{why_not.empty() ? std::uint8_t{1} : std::uint8_t{0}}};
  auto all = sc_.all_gather(mine);
  if (!all) return fail(all.error());
  bool everyone = why_not.empty();
  for (std::size_t q = 0; q < all->size(); ++q)
    if ((*all)[q].size() != 1 || (*all)[q][0] != std::byte{1}) {
      everyone = false;
      if (why_not.empty()) why_not = "rank " + std::to_string(q) + " cannot RDMA WRITE";
    }
  const auto& m = measured_on_emulator;
  char figures[64];  // the chosen one's busbw first
  std::snprintf(figures, sizeof figures, "%.2f vs %.2f GB/s", m.write_faster() ? m.write_gbps : m.send_gbps,
                m.write_faster() ? m.send_gbps : m.write_gbps);
  std::string line;
  switch (cfg_.transport) {
  case Transport::send:
    write_ = false;
    line = "SEND/RECV (--transport send)";
    break;
  case Transport::write:
    write_ = everyone;
    line = everyone ? "RDMA WRITE with immediate (--transport write)"
                    : "SEND/RECV (--transport write asked, but " + why_not + ")";
    break;
  case Transport::automatic:
    write_ = everyone && m.write_faster();
    line = !everyone ? "SEND/RECV (" + why_not + ")"
           : write_  ? "RDMA WRITE with immediate (measured faster on the emulator: " + std::string(figures) + ")"
                     : "SEND/RECV (RDMA WRITE with immediate measured no faster on the emulator: " +
                           std::string(figures) + ")";
    break;
  }
  say(cfg_, "transport: " + line);
  return {};
}

inline Result<void> Ring::allocate(std::size_t max_bytes) {
  where_ = "registering buffers";
  const std::size_t frames = tbverbs::frames_of(cfg_.message_bytes);
  // Depths in 4 KiB frames: 2 x window messages may be posted ahead per direction, and the
  // driver takes at most 4095 frames per queue, so large messages mean a smaller window.
  const int fit = static_cast<int>((tbverbs::max_depth_frames - frames) / (2 * frames));
  if (fit < 1)
    return fail(Error::make(Step::configure, ErrorKind::capacity,
                            "messages of " + std::to_string(cfg_.message_bytes) +
                                " bytes are too large for a window of one within 4095 frames"));
  if (cfg_.window > fit) {
    say(cfg_, "window lowered from " + std::to_string(cfg_.window) + " to " + std::to_string(fit) +
                  " messages: " + std::to_string(frames) + " frames each, 4095 frames per queue");
    cfg_.window = fit;
  }
  slot_bytes_ = cfg_.message_bytes;
  slots_ = 2 * static_cast<std::size_t>(cfg_.window);

  auto alloc = [](Buffer& b, std::size_t bytes) -> Result<void> {
    auto m = tbverbs::AlignedBuffer::allocate(bytes);
    if (!m) return fail(m.error());
    b.memory.emplace(std::move(*m));
    return {};
  };
  if (auto s = alloc(in_, max_bytes); !s) return s;
  if (auto s = alloc(out_, max_bytes); !s) return s;
  // Scratch (the layout is described at slots_): per direction `slots_` receive slots of one
  // message, the gather area, in staged mode as many send slots per direction, one page for the
  // placeholder. The gather area holds 1 + 2 floor(n/2) vectors of the latency algorithm's largest
  // sum: at most 1 MiB each and 16 MiB in all, so that it stays a few regions at any ring size
  // (that algorithm only wins for small sums: algorithms.hpp).
  const std::size_t vectors = 1 + 2 * static_cast<std::size_t>(cfg_.size / 2);
  latency_max_ = std::min(latency_cap(cfg_.size),
                          (max_bytes + tbverbs::frame_bytes - 1) / tbverbs::frame_bytes * tbverbs::frame_bytes);
  gather_off_ = 2 * slots_ * slot_bytes_;
  send_slots_off_ = gather_off_ + vectors * latency_max_;
  auto scratch_bytes = [&](bool staged) { return send_slots_off_ + (staged ? 2 * slots_ * slot_bytes_ : 0) + 4096; };

  // The regions each mode needs on each device, counted before anything is registered, against
  // the device's max_mr less what is registered already and one region per link's warm-up.
  auto regions = [&](const Port& p, bool staged) -> Result<std::size_t> {
    std::size_t total = 0;
    const bool user = !staged && p.ring_links > 0;  // mesh-only devices move scratch only
    const std::size_t sizes[3] = {user ? in_.size() : 0, user ? out_.size() : 0, scratch_bytes(staged)};
    for (std::size_t b : sizes) {
      if (b == 0) continue;
      auto plan = tbverbs::RegionPlan::make(b, p.device.max_mr_size, slot_bytes_);
      if (!plan) return fail(plan.error());
      total += plan->count;
    }
    return total;
  };
  auto budget = [&](const Port& p) -> std::size_t {
    if (p.device.max_mr <= 0) return SIZE_MAX;
    const long room = static_cast<long>(p.device.max_mr) - p.context->info()->memory_regions.load() - p.links;
    return room > 0 ? static_cast<std::size_t>(room) : 0;
  };
  bool fits_registered = true;
  std::string tally;
  for (auto& p : ports_) {
    auto need = regions(*p, false);
    if (!need) return fail(need.error());
    if (*need > budget(*p)) fits_registered = false;
    tally += (tally.empty() ? "" : ", ") + p->name + ": " + std::to_string(*need) + " of " + std::to_string(budget(*p));
  }
  // (Registered memory that does not fit is refused by the budget check below, with every shortfall.)
  if (cfg_.memory == Memory::registered && !fits_registered)
    say(cfg_, "registered memory needs more regions than the devices allow (" + tally + "); staged memory would fit");
  staged_ = cfg_.memory == Memory::staged || (cfg_.memory == Memory::automatic && !fits_registered);
  // The whole budget of every device (QPs, CQs, PDs, MRs, frames per queue), checked before the
  // first PD, region or queue pair exists; the error lists every shortfall.
  for (auto& p : ports_) {
    tbverbs::JobShape shape;
    shape.links = p->links;
    shape.message_bytes = slot_bytes_;
    shape.window = cfg_.window;
    if (!staged_ && p->ring_links > 0) shape.buffers = {in_.size(), out_.size()};
    shape.buffers.push_back(scratch_bytes(staged_));
    auto limits = tbverbs::DeviceLimits::of(*p->context);
    if (!limits) return fail(limits.error());
    auto needs = tbverbs::JobNeeds::of(shape, *limits);
    if (!needs) return fail(needs.error());
    where_ = "checking the resource budget of " + p->name;
    if (auto fits = tbverbs::check_budget(*needs, *limits); !fits) return fail(fits.error());
    tbverbs::explain(p->name + ": budget " + tbverbs::budget_summary(*needs, *limits));
  }
  where_ = "registering buffers";
  for (auto& p : ports_) {
    auto pd = p->context->alloc_pd();
    if (!pd) {
      where_ = "allocating the protection domain of " + p->name;
      return fail(pd.error());
    }
    p->pd.emplace(std::move(*pd));
  }
  if (auto s = alloc(scratch_, scratch_bytes(staged_)); !s) return s;
  placeholder_off_ = scratch_.size() - 4096;  // its last page, as the peers find it (RDMA WRITE)
  for (auto& p : ports_) {
    auto need = regions(*p, staged_);
    if (!need) return fail(need.error());
    if (*need > budget(*p))
      return fail(Error::make(Step::reg_mr, ErrorKind::capacity,
                              p->name + ": the scratch slots alone need " + std::to_string(*need) +
                                  " memory regions, more than the " + std::to_string(budget(*p)) +
                                  " the device has room for; use smaller messages or a smaller window"));
    auto reg = [&](std::optional<tbverbs::MemoryRegionSet>& into, Buffer& b) -> Result<void> {
      auto set = tbverbs::MemoryRegionSet::reg(*p->pd, b.memory->bytes(), p->device.max_mr_size, slot_bytes_,
                                                write_ ? std::optional(tbverbs::Access::local_write |
                                                                       tbverbs::Access::remote_write)
                                                       : std::nullopt);
      if (!set) return fail(set.error());
      into.emplace(std::move(*set));
      return {};
    };
    const auto t0 = std::chrono::steady_clock::now();
    if (!staged_ && p->ring_links > 0) {
      if (auto s = reg(p->in, in_); !s) return s;
      if (auto s = reg(p->out, out_); !s) return s;
    }
    if (auto s = reg(p->scratch, scratch_); !s) return s;
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    say(cfg_, p->name + ": " + std::to_string(*need) + " memory region(s) (" +
                  (staged_ ? "staged through scratch slots" : "user buffers registered") + ") in " +
                  std::to_string(us.count()) + " us");
    if (tbverbs::explain_enabled()) {
      if (p->in) tbverbs::explain(p->name + ": MR " + tbverbs::explain_memory(*p->in, "input buffer", p->device.max_mr_size));
      if (p->out) tbverbs::explain(p->name + ": MR " + tbverbs::explain_memory(*p->out, "output buffer", p->device.max_mr_size));
      tbverbs::explain(p->name + ": MR " +
                       tbverbs::explain_memory(*p->scratch,
                                               staged_ ? "scratch (receive and send slots: staged memory)"
                                                       : "scratch (receive slots of the reduce-scatter)",
                                               p->device.max_mr_size));
    }
  }
  return {};
}

inline Result<void> Ring::connect() {
  const int n = cfg_.size, r = pos_;  // positions in the ring order: the same on both ends of a hop
  const int left = left_, right = right_;
  const int left_pos = (r + n - 1) % n;
  const std::uint32_t frames = tbverbs::frames_of(cfg_.message_bytes);
  const std::uint32_t depth =
      std::min<std::uint32_t>(tbverbs::max_depth_frames, frames * 2 * static_cast<std::uint32_t>(cfg_.window) + frames);
  std::vector<tbverbs::LinkSpec> specs;
  for (int s = 0; s < 2; ++s) {
    first_[s] = specs.size();
    for (std::size_t c = 0; c < cables_[s].size(); ++c) {
      Port& p = *cables_[s][c];
      tbverbs::LinkSpec spec;
      spec.peer = s == 0 ? left : right;
      // The cable's identity, the same on both ends: the rank at the hop's left end, and the
      // cable's position in both ranks' lists.
      spec.id = static_cast<std::uint32_t>(s == 0 ? left_pos : r) * 64u + static_cast<std::uint32_t>(c);
      spec.context = &*p.context;
      spec.pd = &*p.pd;
      spec.recipe.emplace(tbverbs::QpRecipe::for_platform(p.context->platform(), *p.gid));
      spec.recipe->capacities({depth, depth, 1, 1, 0});
      specs.push_back(std::move(spec));
      refs_.push_back({s, c, &p});
    }
  }
  // Mesh links: ids above the ring's (positions x 64 + cable < 4096), from the two ranks.
  first_[2] = specs.size();
  for (std::size_t c = 0; c < cables_[2].size(); ++c) {
    Port& p = *cables_[2][c];
    tbverbs::LinkSpec spec;
    spec.peer = mesh_peer_[c];
    spec.id = 4096u + static_cast<std::uint32_t>(std::min(cfg_.rank, spec.peer)) * 64u +
              static_cast<std::uint32_t>(std::max(cfg_.rank, spec.peer));
    spec.context = &*p.context;
    spec.pd = &*p.pd;
    spec.recipe.emplace(tbverbs::QpRecipe::for_platform(p.context->platform(), *p.gid));
    spec.recipe->capacities({depth, depth, 1, 1, 0});
    specs.push_back(std::move(spec));
    refs_.push_back({2, c, &p});
  }
  tbverbs::LinkOptions opt;
  opt.warmup_bytes = cfg_.message_bytes;
  opt.timeout = cfg_.timeout;
  opt.on_retry = [&](std::uint32_t id, int attempt, const std::string& why) {
    say(cfg_, "link " + std::to_string(id) + ": warm-up round " + std::to_string(attempt) + " failed (" + why +
                  "); recreating the QP and CQ with a new PSN");
  };
  where_ = "connecting the links (endpoint exchange, warm-up)";
  auto links = tbverbs::connect_links(mailbox_, specs, opt);
  if (!links) return fail(links.error());
  links_ = std::move(*links);
  sent_.assign(links_.size(), 0);
  received_.assign(links_.size(), 0);
  // Every link carries messages of the smallest size any link confirmed: both ends of a hop
  // confirmed the same, and the two hops of a rank are joined by the messages' numbering.
  std::size_t confirmed = cfg_.message_bytes;
  std::uint32_t granted = tbverbs::max_depth_frames;
  for (std::size_t i = 0; i < links_.size(); ++i) {
    const tbverbs::Link& l = links_[i];
    say(cfg_, std::string(side_name(refs_[i].side)) + " link " + std::to_string(l.id()) + " to rank " +
                  std::to_string(l.peer()) + " verified (messages of up to " + std::to_string(l.max_message_bytes()) +
                  " bytes both ways, round " + std::to_string(l.attempts()) + ")");
    confirmed = std::min(confirmed, l.max_message_bytes());
    const auto& caps = links_[i].qp().capacities();
    granted = std::min({granted, caps.max_send_wr, caps.max_recv_wr});
  }
  // The neighbours must agree on the message size: take the smallest over the whole ring.
  tbverbs::WireWriter mine;
  mine.put<std::uint64_t>(confirmed);
  auto all = sc_.all_gather(mine.data());
  if (!all) return fail(all.error());
  for (const auto& v : *all)
    if (v.size() == 8) confirmed = std::min<std::size_t>(confirmed, tbverbs::WireReader(v).get<std::uint64_t>());
  confirmed = std::max(tbverbs::frame_bytes, confirmed / tbverbs::frame_bytes * tbverbs::frame_bytes);
  if (confirmed < cfg_.message_bytes) {
    // Smaller messages: cut the scratch into more slots (same bytes) and widen the window to
    // what the granted depth and the slots allow.
    const std::uint32_t f = tbverbs::frames_of(confirmed);
    const std::size_t by_depth = granted > f ? (granted - f) / (2 * f) : 1;
    const std::size_t by_slots = slots_ * slot_bytes_ / confirmed / 2;
    const std::size_t w = std::max<std::size_t>(1, std::min(by_depth, by_slots));
    say(cfg_, "messages of " + std::to_string(confirmed) + " bytes (asked " + std::to_string(cfg_.message_bytes) +
                  "), window " + std::to_string(w));
    cfg_.message_bytes = confirmed;
    cfg_.window = static_cast<int>(w);
    slots_ = 2 * w;
    slot_bytes_ = confirmed;
  }
  return {};
}

// RDMA WRITE transport: every rank publishes, per link, where its peer must write (its scratch
// slots' layout and, with registered memory, its input and output buffers: address, region plan,
// rkeys), after registration and before the first all_sum; each rank keeps its peers' entries for
// the cables they share (my right cable c is the right neighbour's left cable c).
inline Result<void> Ring::exchange_targets() {
  if (!write_) return {};
  where_ = "exchanging the buffers' addresses and rkeys for RDMA WRITE";
  tbverbs::WireWriter mine;
  auto put64 = [&](std::uint64_t v) { mine.put<std::uint64_t>(v); };
  auto put_regions = [&](const std::optional<tbverbs::MemoryRegionSet>& r) {
    put64(r ? reinterpret_cast<std::uintptr_t>(r->data()) : 0);
    put64(r ? r->size() : 0);
    put64(r ? r->plan().region_bytes : 0);
    put64(r ? r->plan().stride : 0);
    put64(r ? r->plan().count : 0);
    put64(r ? r->plan().max_span : 0);
    if (r)
      for (const auto& mr : r->regions()) put64(mr.rkey());
  };
  for (std::size_t i = 0; i < first_[2]; ++i) {  // the ring's links (the mesh sends)
    const Port& p = *refs_[i].port;
    put64(static_cast<std::uint64_t>(refs_[i].side));
    put64(refs_[i].cable);
    put64(staged_ ? 1 : 0);
    put64(slots_);
    put64(slot_bytes_);
    put_regions(p.scratch);
    put_regions(p.in);
    put_regions(p.out);
  }
  auto all = sc_.all_gather(mine.data());
  if (!all) return fail(all.error());
  auto malformed = [] { return fail(Error::make(Step::configure, ErrorKind::bad_frame, "malformed RDMA WRITE targets")); };
  peer_.assign(links_.size(), PeerTargets{});
  for (std::size_t i = 0; i < first_[2]; ++i) {  // the ring's links (the mesh sends)
    const int side = refs_[i].side;
    const auto& theirs = (*all)[static_cast<std::size_t>(side == 0 ? left_ : right_)];
    tbverbs::WireReader in(theirs);
    bool found = false;
    auto get64 = [&]() -> std::uint64_t { return in.get<std::uint64_t>(); };
    auto get_regions = [&](RemoteRegions& r) {
      r.addr = get64();
      r.size = get64();
      r.plan.region_bytes = get64();
      r.plan.stride = get64();
      r.plan.count = get64();
      r.plan.max_span = get64();
      r.rkeys.clear();
      for (std::uint64_t k = 0; in.ok() && k < r.plan.count; ++k) r.rkeys.push_back(static_cast<std::uint32_t>(get64()));
    };
    while (in.ok() && in.remaining() > 0) {
      PeerTargets t;
      const auto their_side = get64();
      const auto their_cable = get64();
      t.staged = get64() != 0;
      t.slots = get64();
      t.slot_bytes = get64();
      get_regions(t.scratch);
      get_regions(t.in);
      get_regions(t.out);
      // The peer's entry for this cable: the other side of the same cable index.
      if (in.ok() && their_side == static_cast<std::uint64_t>(1 - side) && their_cable == refs_[i].cable) {
        peer_[i] = std::move(t);
        found = true;
        break;
      }
    }
    if (!in.ok() || !found) return malformed();
    if (peer_[i].slots != slots_ || peer_[i].slot_bytes != slot_bytes_)
      return fail(Error::make(Step::configure, ErrorKind::invalid_argument,
                              "rank " + std::to_string(links_[i].peer()) + " has " + std::to_string(peer_[i].slots) +
                                  " scratch slots of " + std::to_string(peer_[i].slot_bytes) + " bytes, this rank " +
                                  std::to_string(slots_) + " of " + std::to_string(slot_bytes_)));
  }
  say(cfg_, "RDMA WRITE targets exchanged with " +
                (left_ == right_ ? "rank " + std::to_string(left_)
                                 : "ranks " + std::to_string(left_) + " and " + std::to_string(right_)) +
                " (scratch slots" + (staged_ ? "" : ", input and output buffers") + ", addresses and rkeys)");
  return {};
}

}  // namespace ring
