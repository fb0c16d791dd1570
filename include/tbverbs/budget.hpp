/// @file budget.hpp
/// Resource budgets: what a job needs on one device (queue pairs, completion queues, protection
/// domains, memory regions, frames per queue, registered bytes), checked against what the device
/// allows (Apple's 10 usable QPs, 11 PDs and CQs, about 100 MRs of at most max_mr_size) before
/// anything is created, so a job that cannot fit fails at once with every shortfall listed
/// instead of with EBUSY at the 11th create_qp or NULL at the 101st reg_mr.
#pragma once

#include "config.hpp"
#include "context.hpp"
#include "device.hpp"
#include "error.hpp"
#include "memory_region_set.hpp"
#include "message_size.hpp"
#include "result.hpp"
#include "types.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// The completion-queue entries of a link whose QP has these send and receive depths: every
/// outstanding send and every posted receive, plus a margin (docs/field-reports.md row 6: an
/// overrun loses completions). Link::connect_links sizes its CQs with it; JobNeeds counts it
/// against max_cqe.
constexpr std::uint32_t link_cq_entries(std::uint32_t send_depth, std::uint32_t recv_depth) noexcept {
  return send_depth + recv_depth + 16;
}

/// What one device allows a job, from its caps (0 = no limit known).
struct DeviceLimits {
  std::string device;              ///< Device name (for the error).
  Platform platform = Platform::any; ///< Provider family.
  int qps = 0;                     ///< Usable queue pairs (usable_qps(): 10 on Apple whatever max_qp says).
  int cqs = 0;                     ///< Completion queues (max_cq: 11 on Apple).
  int cq_entries = 0;              ///< Entries per completion queue (max_cqe).
  int pds = 0;                     ///< Protection domains (max_pd: 11 on Apple, leaked ones count).
  int mrs = 0;                     ///< Memory regions (max_mr: 100 on Apple).
  std::uint64_t max_mr_bytes = 0;  ///< Largest region (max_mr_size: 16,384,000 on Apple).
  std::uint32_t max_depth = 0;     ///< Deepest queue: 4 KiB frames on Apple (at most 4095), else WRs.
  bool frames = false;             ///< Depths count 4 KiB frames (Apple), not work requests.
  int mrs_in_use = 0;              ///< Regions this process already holds on the device.
  int qps_in_use = 0;              ///< Queue pairs this process already holds on the device.

  /// The limits of an open device: its caps (ibv_query_device, with max_pd read from the raw
  /// attributes) and what this process already holds on it. Errors: query_device's.
  [[nodiscard]] static Result<DeviceLimits> of(const Context& ctx) {
    abi::ibv_device_attr a{};
    if (const int rc = ctx.info()->api->query_device(ctx.native_handle(), &a); rc != 0) {
      Error e = Error::from_return(Step::query_device, rc);
      return fail(ctx.info()->stamp(e));
    }
    auto attrs = ctx.query_device();
    if (!attrs) return fail(attrs.error());
    DeviceLimits l = from(*attrs, a.max_pd, ctx.platform(), ctx.name());
    l.mrs_in_use = ctx.info()->memory_regions.load();
    l.qps_in_use = ctx.info()->queue_pairs.load();
    return l;
  }
  /// The limits of a device with `attrs` and `max_pd` on `platform` (pure; for tests and tools).
  static DeviceLimits from(const DeviceAttributes& attrs, int max_pd, Platform platform, std::string_view name) {
    DeviceLimits l;
    l.device = std::string(name);
    l.platform = platform;
    l.qps = usable_qps(attrs, platform);
    l.cqs = attrs.max_cq;
    l.cq_entries = attrs.max_cqe;
    l.pds = max_pd;
    l.mrs = attrs.max_mr;
    l.max_mr_bytes = attrs.max_mr_size;
    l.frames = platform == Platform::apple;
    const std::uint32_t wr = attrs.max_qp_wr > 0 ? static_cast<std::uint32_t>(attrs.max_qp_wr) : 0;
    l.max_depth = l.frames ? (wr != 0 ? std::min(wr, max_depth_frames) : max_depth_frames) : wr;
    return l;
  }
};

/// The shape of a job on one device: its links (one QP and one CQ each, as connect_links makes
/// them), the largest message and the messages in flight per direction, and the buffers it
/// registers (each served in ranges of up to `message_bytes`, as a MemoryRegionSet).
struct JobShape {
  int links = 0;                       ///< Queue pairs on this device (one per cable end).
  std::size_t message_bytes = 0;       ///< Largest message (and each link's warm-up size).
  int window = 1;                      ///< Messages in flight per direction; 2 x window receives posted ahead.
  std::vector<std::size_t> buffers;    ///< Bytes of every buffer registered on this device.
  bool warmup_regions = true;          ///< Count one warm-up region per link (connect_links registers one).
  int extra_messages = 0;              ///< Messages a queue holds beyond 2 x window + 1 (the collectives' second head).
  /// One-frame (one-WR) messages a queue holds beyond those (the collectives' call headers and
  /// agreement wave).
  int extra_control = 0;
};

/// What a job needs on one device.
struct JobNeeds {
  int qps = 0;                      ///< Queue pairs.
  int cqs = 0;                      ///< Completion queues.
  std::uint32_t cq_entries = 0;     ///< Entries of each link's CQ (link_cq_entries of the depth).
  int pds = 0;                      ///< Protection domains.
  int mrs = 0;                      ///< Memory regions.
  std::uint32_t depth = 0;          ///< Deepest queue asked for (frames on Apple, else WRs).
  std::uint64_t registered_bytes = 0; ///< Bytes registered.

  /// The needs of `shape` on a device with `limits`: one PD; per link a QP, a CQ and (when
  /// counted) a warm-up region; regions per buffer as RegionPlan::make splits it within
  /// max_mr_size; a depth of 2 x window messages plus one and the extra ones (in frames on Apple), and CQs of
  /// link_cq_entries(depth, depth).
  /// Errors: RegionPlan::make's (`capacity`, a message too large for a region).
  [[nodiscard]] static Result<JobNeeds> of(const JobShape& shape, const DeviceLimits& limits) {
    JobNeeds n;
    n.qps = shape.links;
    n.cqs = shape.links;
    n.pds = shape.links > 0 || !shape.buffers.empty() ? 1 : 0;
    const std::uint32_t per = limits.frames ? frames_of(shape.message_bytes) : 1;
    n.depth = per * (2 * static_cast<std::uint32_t>(std::max(1, shape.window)) + 1 +
                     static_cast<std::uint32_t>(std::max(0, shape.extra_messages))) +
              static_cast<std::uint32_t>(std::max(0, shape.extra_control));
    n.cq_entries = shape.links > 0 ? link_cq_entries(n.depth, n.depth) : 0;
    if (shape.warmup_regions) {
      n.mrs += shape.links;
      n.registered_bytes += static_cast<std::uint64_t>(shape.links) * (2 * shape.message_bytes + frame_bytes);
    }
    for (std::size_t b : shape.buffers) {
      if (b == 0) continue;
      auto plan = RegionPlan::make(b, limits.max_mr_bytes, std::max<std::size_t>(shape.message_bytes, 1));
      if (!plan) return fail(plan.error());
      n.mrs += static_cast<int>(plan->count);
      n.registered_bytes += b;
    }
    return n;
  }
};

/// One resource a job needs more of than a device allows.
struct Shortfall {
  std::string what;        ///< "QPs", "MRs", "frames per queue", ...
  std::uint64_t need = 0;  ///< What the job needs.
  std::uint64_t allows = 0; ///< What the device allows (less what is already in use).
  std::string why;         ///< The limit's source, and what to change.
  /// "QPs: needs 12, the device allows 10 (...)".
  std::string to_string() const {
    return what + ": needs " + std::to_string(need) + ", the device allows " + std::to_string(allows) +
           (why.empty() ? "" : " (" + why + ")");
  }
};

/// Every resource of `needs` that `limits` cannot supply (empty: the job fits). Limits of 0 are
/// unknown and never short. Regions and QPs already held by this process count against the caps.
inline std::vector<Shortfall> shortfalls(const JobNeeds& needs, const DeviceLimits& limits) {
  std::vector<Shortfall> out;
  const bool apple = limits.platform == Platform::apple;
  auto check = [&](const char* what, std::uint64_t need, long long cap, long long used, std::string why) {
    if (cap <= 0) return;
    const std::uint64_t room = cap > used ? static_cast<std::uint64_t>(cap - used) : 0;
    if (need > room) out.push_back({what, need, room, std::move(why)});
  };
  check("QPs", static_cast<std::uint64_t>(needs.qps), limits.qps, limits.qps_in_use,
        apple ? "10 usable UC QPs per device on Thunderbolt, TN3205; fewer cables or ranks per device"
              : "max_qp");
  check("CQs", static_cast<std::uint64_t>(needs.cqs), limits.cqs, 0, apple ? "max_cq 11 on Thunderbolt" : "max_cq");
  check("PDs", static_cast<std::uint64_t>(needs.pds), limits.pds, 0,
        apple ? "max_pd 11 on Thunderbolt; PDs leaked by orphaned processes count until a reboot" : "max_pd");
  check("MRs", static_cast<std::uint64_t>(needs.mrs), limits.mrs, limits.mrs_in_use,
        apple ? "about 100 regions per device on Thunderbolt, each at most max_mr_size; stage through scratch "
                "slots or register fewer, smaller buffers"
              : "max_mr");
  check(limits.frames ? "frames per queue" : "WRs per queue", needs.depth, limits.max_depth, 0,
        limits.frames ? "depths count 4 KiB frames, at most 4095 (TN3205); a smaller window or smaller messages"
                      : "max_qp_wr; a smaller window");
  check("CQ entries", needs.cq_entries, limits.cq_entries, 0,
        limits.frames ? "max_cqe; each link's CQ holds both queues' depths in frames: a smaller window or smaller messages"
                      : "max_cqe; a smaller window");
  return out;
}

/// Checks `needs` against `limits` before anything is created. Errors: `capacity` at
/// Step::configure on the device, listing every shortfall ("QPs: needs 12, allows 10; MRs: needs
/// 140, allows 100"; the error's detail holds 255 characters, so the sources are left to
/// shortfalls() and the docs).
[[nodiscard]] inline Result<void> check_budget(const JobNeeds& needs, const DeviceLimits& limits) {
  const auto s = shortfalls(needs, limits);
  if (s.empty()) return {};
  std::string d = "the job does not fit " + limits.device + ": ";
  for (std::size_t i = 0; i < s.size(); ++i)
    d += (i ? "; " : "") + s[i].what + ": needs " + std::to_string(s[i].need) + ", allows " + std::to_string(s[i].allows);
  Error e = Error::make(Step::configure, ErrorKind::capacity, d);
  return fail(e.on(limits.device).from(limits.platform));
}

/// One line of what a job uses of a device ("2 of 10 QPs, 2 of 11 CQs, 1 of 11 PDs, 5 of 100
/// MRs, 1023 of 4095 frames per queue, 134 MB registered"), for logs and the doctor.
inline std::string budget_summary(const JobNeeds& needs, const DeviceLimits& limits) {
  auto of = [](std::uint64_t n, long long cap, const char* what) {
    return std::to_string(n) + (cap > 0 ? " of " + std::to_string(cap) : std::string()) + " " + what;
  };
  return of(static_cast<std::uint64_t>(needs.qps), limits.qps, "QPs") + ", " +
         of(static_cast<std::uint64_t>(needs.cqs), limits.cqs, "CQs") + ", " +
         of(static_cast<std::uint64_t>(needs.pds), limits.pds, "PDs") + ", " +
         of(static_cast<std::uint64_t>(needs.mrs), limits.mrs, "MRs") + ", " +
         of(needs.depth, limits.max_depth, limits.frames ? "frames per queue" : "WRs per queue") + ", " +
         of(needs.cq_entries, limits.cq_entries, "CQ entries") + ", " +
         std::to_string(needs.registered_bytes) + " bytes registered";
}

TBVERBS_NAMESPACE_END
