/// @file explain.hpp
/// Explain mode: every INIT, RTR and RTS attribute of a queue pair with its value and the rule
/// that chose it (which rule selected the GID, why UC, the MTU negotiation, the capacities asked
/// and granted, the memory-region layout), one line each, for teaching and for bug reports.
///
/// On when `TBVERBS_EXPLAIN=1` (or set_explain(true), what `--explain` in the ring and pingpong
/// does). The lines are built from the recipe's own pure attribute builders
/// (QpRecipe::init_transition, rtr_transition, rts_transition), so they show exactly what
/// `ibv_modify_qp` is given. connect_links() (link.hpp) explains every link it connects; code
/// that connects by hand calls explain_queue_pair() itself. Nothing here runs on the data path.
#pragma once

#include "config.hpp"
#include "endpoint.hpp"
#include "memory_region_set.hpp"
#include "recipe.hpp"
#include "types.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// Where explain lines go: a function taking one line (without a newline).
using ExplainSink = std::function<void(std::string_view line)>;

namespace detail {
struct ExplainState {
  std::atomic<int> forced{-1}; // -1: follow TBVERBS_EXPLAIN; 0/1: set_explain()
  std::mutex mutex;
  ExplainSink sink;
};
inline ExplainState& explain_state() {
  static ExplainState s;
  return s;
}
inline std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}
inline std::string access_names(unsigned flags) {
  if (flags == 0) return "none";
  std::string s;
  const std::pair<unsigned, const char*> names[] = {{1, "LOCAL_WRITE"}, {2, "REMOTE_WRITE"}, {4, "REMOTE_READ"},
                                                     {8, "REMOTE_ATOMIC"}};
  for (const auto& [bit, name] : names)
    if ((flags & bit) != 0) s += (s.empty() ? "" : "|") + std::string(name);
  return s;
}
} // namespace detail

/// The names of the `ibv_access_flags` bits set in `flags` ("LOCAL_WRITE|REMOTE_WRITE"; "none").
inline std::string access_flag_names(unsigned flags) { return detail::access_names(flags); }

/// True when explain mode is on: set_explain() if it was called, else `TBVERBS_EXPLAIN` set to
/// anything but empty or "0".
inline bool explain_enabled() noexcept {
  const int f = detail::explain_state().forced.load(std::memory_order_relaxed);
  if (f >= 0) return f != 0;
  const char* e = std::getenv("TBVERBS_EXPLAIN");
  return e != nullptr && *e != '\0' && std::string_view(e) != "0";
}

/// Turns explain mode on or off for this process, whatever `TBVERBS_EXPLAIN` says.
inline void set_explain(bool on) noexcept { detail::explain_state().forced.store(on ? 1 : 0); }

/// Sends explain lines to `sink` (an empty function restores the default: stderr, each line
/// prefixed with "tbverbs: explain: "). Thread-safe.
inline void set_explain_sink(ExplainSink sink) {
  auto& s = detail::explain_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sink = std::move(sink);
}

/// Emits one explain line when explain mode is on.
inline void explain(std::string_view line) {
  if (!explain_enabled()) return;
  auto& s = detail::explain_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.sink) {
    s.sink(line);
  } else {
    std::fprintf(stderr, "tbverbs: explain: %.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(stderr);
  }
}

/// The explain lines of one queue pair connected from `recipe`: the QP type and capacities
/// (asked, and `granted` by the driver), then every attribute of INIT, RTR toward `remote` and
/// RTS with the `local` endpoint's PSN, each with the rule behind it. `port` is the local port's
/// attributes (for the MTU negotiation); `who` prefixes every line ("link 64 to rank 1").
/// Pure: builds strings only.
inline std::vector<std::string> explain_queue_pair(const QpRecipe& recipe, const PortAttributes& port,
                                                   const QpCapacities& granted, const Endpoint& local,
                                                   const Endpoint& remote, std::string_view who) {
  std::vector<std::string> out;
  const std::string p = who.empty() ? std::string() : std::string(who) + ": ";
  const bool uc = recipe.type() == QpType::uc;
  const bool tb = port.link_layer == LinkLayer::thunderbolt;
  auto line = [&](const std::string& s) { out.push_back(p + s); };
  line(std::string("create_qp qp_type=") + (uc ? "UC" : recipe.type() == QpType::rc ? "RC" : "UD") +
       (uc ? " (Apple's Thunderbolt driver offers UC only: RC fails at create with EOPNOTSUPP, TN3205)"
           : " (rdma-core NIC: reliable connection, retries and waits for receives)"));
  const QpCapacities& a = recipe.requested_capacities();
  auto cap = [&](const char* name, std::uint32_t asked, std::uint32_t got, const char* why) {
    line(std::string("create_qp cap.") + name + " asked " + std::to_string(asked) + ", granted " + std::to_string(got) +
         " (" + why + (asked != got ? "; the driver adjusted it, read back with ibv_query_qp" : "") + ")");
  };
  const char* depth_why = tb ? "4 KiB frames on Thunderbolt, at most 4095 (TN3205)" : "work requests";
  cap("max_send_wr", a.max_send_wr, granted.max_send_wr, depth_why);
  cap("max_recv_wr", a.max_recv_wr, granted.max_recv_wr, depth_why);
  cap("max_send_sge", a.max_send_sge, granted.max_send_sge, "one buffer per message; max_sge is 1 on Thunderbolt");
  cap("max_recv_sge", a.max_recv_sge, granted.max_recv_sge, "one buffer per message");
  cap("max_inline_data", a.max_inline_data, granted.max_inline_data,
      "inline data is undocumented on Apple's driver; JACCL and ds4 ask for 0");

  const QpTransition init = recipe.init_transition();
  line("INIT qp_state=INIT (RESET -> INIT)");
  line("INIT pkey_index=" + std::to_string(init.attr.pkey_index) + " (the default partition key)");
  line("INIT port_num=" + std::to_string(init.attr.port_num) + " (the port of the selected GID)");
  line("INIT qp_access_flags=" + detail::hex(init.attr.qp_access_flags) + " " +
       detail::access_names(init.attr.qp_access_flags) +
       (init.attr.qp_access_flags == 0
            ? " (SEND/RECV only, no remote rights: Apple's driver accepts RDMA WRITE but never executes it)"
            : " (remote rights of an RDMA WRITE/READ target)"));

  const auto rtr_built = recipe.rtr_transition(remote);
  if (!rtr_built) {
    // No transition to show: the recipe refuses it (a GID index above 255), as connect() would.
    line("RTR refused: " + std::string(rtr_built.error().detail.view()));
  } else {
    const QpTransition& rtr = *rtr_built;
    const auto& ah = rtr.attr.ah_attr;
    line("RTR qp_state=RTR (INIT -> RTR, toward the peer's endpoint)");
    line("RTR path_mtu=" + std::to_string(mtu_bytes(static_cast<Mtu>(rtr.attr.path_mtu))) + " (the smaller of local " +
         std::to_string(mtu_bytes(recipe.path_mtu())) + " and the peer's " + std::to_string(mtu_bytes(remote.mtu)) +
         "; port active MTU " + std::to_string(mtu_bytes(port.active_mtu)) +
         (tb ? "; 1024 is the recipe JACCL and ds4 use, the wire frame is 4 KiB either way)" : ")"));
    line("RTR dest_qp_num=" + detail::hex(rtr.attr.dest_qp_num) + " (the peer's QP number, from its endpoint)");
    line("RTR rq_psn=" + detail::hex(rtr.attr.rq_psn) +
         " (the peer's initial PSN, from its endpoint; fresh per process and attempt)");
    line("RTR ah_attr.is_global=" + std::to_string(ah.is_global) +
         (tb ? " (GRH always: Thunderbolt addresses the peer by GID, TN3205)" : " (GRH: RoCE addresses by GID)"));
    line("RTR ah_attr.grh.dgid=" + remote.gid.to_string() + " (the GID the peer advertised)");
    line("RTR ah_attr.grh.sgid_index=" + std::to_string(ah.grh.sgid_index) + " (GID[" +
         std::to_string(recipe.gid().index()) + "] " + recipe.gid().gid().to_string() + ", " +
         std::string(recipe.gid().reason()) + "; the advertised GID is the same entry)");
    line("RTR ah_attr.grh.hop_limit=" + std::to_string(ah.grh.hop_limit) +
         (ah.grh.hop_limit == 1 ? " (one cable, no router)" : " (routed RoCE)"));
    line("RTR ah_attr.dlid=" + std::to_string(ah.dlid) + " (the peer port's LID, from its endpoint)");
    line("RTR ah_attr.sl=" + std::to_string(ah.sl) + ", src_path_bits=" + std::to_string(ah.src_path_bits) +
         ", port_num=" + std::to_string(ah.port_num) + " (defaults; the selected GID's port)");
    if (recipe.type() == QpType::rc) {
      line("RTR max_dest_rd_atomic=" + std::to_string(rtr.attr.max_dest_rd_atomic) + " (RC: one outstanding read)");
      line("RTR min_rnr_timer=" + std::to_string(rtr.attr.min_rnr_timer) +
           " (RC: how long a sender waits for a receive to be posted)");
    }
  }

  const QpTransition rts = recipe.rts_transition(local.psn);
  line("RTS qp_state=RTS (RTR -> RTS)");
  line("RTS sq_psn=" + detail::hex(rts.attr.sq_psn) + " (this QP's initial PSN, the one its endpoint advertised)");
  if (recipe.type() == QpType::rc) {
    line("RTS timeout=" + std::to_string(rts.attr.timeout) + " retry_cnt=" + std::to_string(rts.attr.retry_cnt) +
         " (RC: about 67 ms per try, 7 tries)");
    line("RTS rnr_retry=" + std::to_string(rts.attr.rnr_retry) +
         " (RC: 7 = retry for ever when the peer has no receive posted; 0 fails on the first race, hellas#71)");
    line("RTS max_rd_atomic=" + std::to_string(rts.attr.max_rd_atomic));
  }
  return out;
}

/// The explain line of a memory-region layout: `what` ("warm-up buffer"), the buffer's size, the
/// regions it was split into (each within the device's max_mr_size, overlapping by the largest
/// message so no message spans two) and the access rights the driver took. Pure.
inline std::string explain_memory(const MemoryRegionSet& set, std::string_view what, std::uint64_t max_mr_size) {
  const RegionPlan& plan = set.plan();
  std::string s = std::string(what) + ": " + std::to_string(set.size()) + " bytes in " + std::to_string(plan.count) +
                  " region(s)";
  if (plan.count > 1)
    s += " starting every " + std::to_string(plan.stride) + " bytes, each message within one (messages up to " +
         std::to_string(plan.max_span) + " bytes)";
  s += "; max_mr_size " + std::to_string(max_mr_size);
  if (!set.regions().empty()) {
    const auto a = static_cast<unsigned>(set.regions().front().access());
    s += "; access " + detail::access_names(a) +
         (a == 1 ? " (TN3205's advice)"
                 : (a & static_cast<unsigned>(Access::remote_read)) != 0 ? " (local write refused: JACCL's and ds4's set)"
                                                                          : " (an RDMA WRITE target)");
  }
  return s;
}

TBVERBS_NAMESPACE_END
