/// @file recipe.hpp
/// `QpRecipe`: every choice of a queue pair's INIT/RTR/RTS transitions in one value, built
/// around one GidSelection; `PreparedQueuePair`: a created, unconnected QP and its Endpoint.
#pragma once

#include "completion_queue.hpp"
#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/chrono.hpp"
#include "detail/handle.hpp"
#include "endpoint.hpp"
#include "error.hpp"
#include "gid.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#include "result.hpp"
#include "types.hpp"

#include <unistd.h>
#if __has_include(<sys/random.h>)
#include <sys/random.h> // getentropy on macOS (glibc also declares it in unistd.h)
#endif

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// One `ibv_modify_qp` call: the attributes and the mask, as built by a recipe (inspectable).
struct QpTransition {
  abi::ibv_qp_attr attr{}; ///< The attributes.
  int mask = 0;            ///< The `ibv_qp_attr_mask` bits that are set.
};

/// Edits a transition just before its `ibv_modify_qp` (QpRecipe::on_transition): `step` is
/// Step::modify_qp_init, _rtr or _rts; `user` is the pointer given with the hook. Set attributes
/// and their mask bits the recipe has no setter for (rate limits, alternate paths, ECE).
using QpTransitionHook = void (*)(Step step, QpTransition& transition, void* user);

namespace detail {
/// A 24-bit PSN that differs per process and per call: a random per-process seed, the pid,
/// and a counter stepped by 0x1000 + 1 (so re-created QPs never reuse a recent PSN).
inline std::uint32_t fresh_psn() noexcept {
  static const std::uint32_t seed = [] {
    std::uint32_t s = static_cast<std::uint32_t>(::getpid()) * 2654435761u;
    // getentropy (POSIX 2024; glibc 2.25+, macOS 10.12+) instead of std::random_device: <random>
    // cost the umbrella header 15% of its compile time.
    std::uint32_t r = 0;
    if (::getentropy(&r, sizeof r) == 0)
      s ^= r;
    else
      s ^= static_cast<std::uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return s;
  }();
  static Atomic<std::uint32_t> counter{0};
  const std::uint32_t n = counter.fetch_add(1, Order::relaxed);
  return (seed + n * 0x1001u) & 0xffffffu;
}

/// Applies one transition of a QP made for `gid` (ContextInfo::modify_qp); a failure is the verb's
/// return value at `step`, stamped with the device, port and GID index.
inline Result<void> transition(const ContextInfo& info, abi::ibv_qp* qp, QpTransition t, Step step,
                               const GidSelection& gid) noexcept {
  if (const int rc = info.modify_qp(qp, t.attr, t.mask); rc != 0) {
    Error e = Error::from_return(step, rc);
    return fail(info.stamp(e, gid.port(), gid.index()));
  }
  return {};
}
} // namespace detail

/// Everything about a queue pair that both sides must agree on, and the GID it is built around.
///
/// A recipe can only be made from a GidSelection, and both the RTR `sgid_index` and the GID in
/// the advertised Endpoint are read from that one selection: they cannot disagree (JACCL's
/// hard-coded source GID index of one against a scanned GID is the failure this prevents).
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto recipe
/// \until prepared.error()
class QpRecipe {
public:
  /// Apple's RDMA over Thunderbolt, as the driver accepts it: UC, path MTU 1024, GRH always with
  /// hop limit 1, SEND/RECV only (RDMA WRITE is accepted by the driver but never executed),
  /// depths in 4 KiB frames (at most 4095; the driver may grant fewer).
  static QpRecipe thunderbolt(const GidSelection& gid) {
    QpRecipe r(gid);
    r.type_ = QpType::uc;
    r.mtu_ = Mtu::mtu1024;
    r.hop_limit_ = 1;
    r.caps_ = {256, 256, 1, 1, 0};
    r.allow_rdma_write_ = false;
    r.endpoint_caps_ = EndpointCaps::equal_frames;
    return r;
  }
  /// An rdma-core RoCE/InfiniBand NIC with reliable connections: RC, the port's active MTU (as
  /// the selection read it; 1024 when unknown; the path MTU is the smaller of both ends'),
  /// rnr_retry 7 so an early send waits for a receive instead of failing, retry_cnt 7,
  /// timeout 14 (~67 ms), RDMA WRITE allowed. Addressing follows the port: a GRH to the peer's
  /// GID on RoCE; on InfiniBand the peer's LID, with a GRH only when the subnet prefixes differ.
  static QpRecipe rdma_core_rc(const GidSelection& gid) {
    QpRecipe r(gid);
    r.type_ = QpType::rc;
    r.mtu_ = gid.port_facts().known ? gid.port_facts().active_mtu : Mtu::mtu1024;
    r.hop_limit_ = 64;
    r.caps_ = {256, 256, 1, 1, 0};
    r.allow_rdma_write_ = true;
    r.access_ = Access::local_write | Access::remote_write;
    r.endpoint_caps_ = EndpointCaps::rdma_write;
    return r;
  }
  /// The preset that fits `platform`: thunderbolt() for Apple, rdma_core_rc() otherwise.
  static QpRecipe for_platform(Platform platform, const GidSelection& gid) {
    return platform == Platform::apple ? thunderbolt(gid) : rdma_core_rc(gid);
  }

  /// Sets the transport type.
  QpRecipe& qp_type(QpType t) noexcept { type_ = t; return *this; }
  /// Sets the path MTU asked for: the endpoint advertises the smaller of it and the port's active
  /// MTU (a larger path MTU is refused at RTR, docs/field-reports.md row 16), and RTR uses the
  /// smaller of both ends'.
  QpRecipe& mtu(Mtu m) noexcept { mtu_ = m; return *this; }
  /// Sets the queue capacities to ask for.
  QpRecipe& capacities(const QpCapacities& c) noexcept { caps_ = c; return *this; }
  /// Sets the remote access rights of the QP (remote_write to be an RDMA WRITE target).
  QpRecipe& access(Access a) noexcept { access_ = a; return *this; }
  /// Uses a fixed initial PSN instead of a fresh one per QP (tests; masked to 24 bits).
  QpRecipe& fixed_psn(std::uint32_t psn) noexcept { psn_ = psn & 0xffffffu; return *this; }
  /// Sets the GRH hop limit.
  QpRecipe& hop_limit(std::uint8_t h) noexcept { hop_limit_ = h; return *this; }
  /// Sets the transport settings: traffic class, service level, flow label, pkey index, and for
  /// RC the timeout, retry counts, RNR timer and read/atomic depths (QpTransport's defaults are
  /// the presets' values).
  QpRecipe& transport(const QpTransport& t) noexcept { transport_ = t; return *this; }
  /// Calls `hook(step, transition, user)` on each transition just before its ibv_modify_qp, in
  /// prepare() (INIT), connect() (RTR, RTS) and QueuePair::reset() (INIT). Null removes it.
  QpRecipe& on_transition(QpTransitionHook hook, void* user = nullptr) noexcept {
    hook_ = hook;
    hook_user_ = user;
    return *this;
  }
  /// Allows or forbids rdma_write on the connected QP.
  QpRecipe& allow_rdma_write(bool on) noexcept {
    allow_rdma_write_ = on;
    endpoint_caps_ = on ? (endpoint_caps_ | EndpointCaps::rdma_write)
                        : static_cast<EndpointCaps>(static_cast<std::uint32_t>(endpoint_caps_) &
                                                    ~static_cast<std::uint32_t>(EndpointCaps::rdma_write));
    return *this;
  }

  /// The GID selection the recipe is built around.
  const GidSelection& gid() const noexcept { return gid_; }
  /// The transport settings.
  const QpTransport& transport() const noexcept { return transport_; }
  /// The transition as it will be given to ibv_modify_qp: `t` after the on_transition hook.
  QpTransition edited(Step step, QpTransition t) const noexcept {
    if (hook_ != nullptr) hook_(step, t, hook_user_);
    return t;
  }
  /// The initial PSN of a QP made (or reset) from this recipe: the fixed one, else a fresh one.
  std::uint32_t initial_psn() const noexcept { return psn_ ? *psn_ : detail::fresh_psn(); }
  /// The transport type.
  QpType type() const noexcept { return type_; }
  /// The path MTU asked for.
  Mtu path_mtu() const noexcept { return mtu_; }
  /// The MTU this side advertises: path_mtu(), capped by the port's active MTU where the
  /// selection knows it.
  Mtu local_mtu() const noexcept {
    const GidPortFacts& f = gid_.port_facts();
    if (!f.known) return mtu_;
    return static_cast<int>(f.active_mtu) < static_cast<int>(mtu_) ? f.active_mtu : mtu_;
  }
  /// True when RTR toward `remote` uses a GRH: always on RoCE and Thunderbolt; on InfiniBand only
  /// when the peer's subnet prefix (the upper 64 bits of its GID) differs from ours.
  bool uses_grh(const Endpoint& remote) const noexcept {
    if (!gid_.is_infiniband()) return true;
    for (int i = 0; i < 8; ++i)
      if (remote.gid.raw()[static_cast<std::size_t>(i)] != gid_.gid().raw()[static_cast<std::size_t>(i)]) return true;
    return false;
  }
  /// The capacities asked for.
  const QpCapacities& requested_capacities() const noexcept { return caps_; }
  /// True when the connected QP may rdma_write.
  bool rdma_write_allowed() const noexcept { return allow_rdma_write_; }
  /// The remote access rights the QP grants its peer (and, the ranks sharing this recipe, the
  /// peer grants it: the one-sided operations its QP admits follow from them, send_ops_for).
  Access access() const noexcept { return access_; }

  /// The attributes of `ibv_create_qp` (send and receive CQs filled in by prepare()).
  abi::ibv_qp_init_attr init_attributes() const noexcept {
    abi::ibv_qp_init_attr a{};
    a.qp_type = static_cast<abi::ibv_qp_type>(type_);
    a.cap.max_send_wr = caps_.max_send_wr;
    a.cap.max_recv_wr = caps_.max_recv_wr;
    a.cap.max_send_sge = caps_.max_send_sge;
    a.cap.max_recv_sge = caps_.max_recv_sge;
    a.cap.max_inline_data = caps_.max_inline_data;
    a.sq_sig_all = 0;
    return a;
  }
  /// RESET → INIT: port (from the selection), pkey 0, remote access rights.
  QpTransition init_transition() const noexcept {
    QpTransition t;
    t.attr.qp_state = abi::IBV_QPS_INIT;
    t.attr.pkey_index = transport_.pkey_index;
    t.attr.port_num = gid_.port();
    t.attr.qp_access_flags = static_cast<unsigned>(access_) &
                             ~static_cast<unsigned>(Access::local_write); // QP rights are remote ones
    t.mask = abi::IBV_QP_STATE | abi::IBV_QP_PKEY_INDEX | abi::IBV_QP_PORT | abi::IBV_QP_ACCESS_FLAGS;
    return t;
  }
  /// INIT → RTR toward `remote`: its QP number, PSN and GID as destination; the source GID
  /// index is the selection's index, the same entry `local_endpoint()` advertises. The path MTU
  /// is the smaller of both ends' (local_mtu() and the peer's advertised MTU). On InfiniBand
  /// within one subnet the peer is addressed by its LID alone (`is_global` 0). Errors:
  /// `gid_index_invalid` at Step::select_gid when the selection's index is above 255, which
  /// `ibv_global_route.sgid_index` (8 bits) cannot carry: no transition with a truncated index
  /// is ever built (prepare() refuses the same selection).
  [[nodiscard]] Result<QpTransition> rtr_transition(const Endpoint& remote) const noexcept {
    if (!gid_index_fits_rtr()) [[unlikely]] {
      Error e = gid_index_too_large();
      return fail(e.on({}, gid_.port(), gid_.index()));
    }
    QpTransition t;
    t.attr.qp_state = abi::IBV_QPS_RTR;
    // Mtu's values are ibv_mtu's (1 = 256 ... 5 = 4096): the smaller value is the smaller MTU.
    const Mtu path = static_cast<int>(local_mtu()) < static_cast<int>(remote.mtu) ? local_mtu() : remote.mtu;
    t.attr.path_mtu = static_cast<abi::ibv_mtu>(path);
    t.attr.dest_qp_num = remote.qp_num;
    t.attr.rq_psn = remote.psn;
    if (uses_grh(remote)) {
      t.attr.ah_attr.is_global = 1;
      std::memcpy(t.attr.ah_attr.grh.dgid.raw, remote.gid.raw().data(), sizeof t.attr.ah_attr.grh.dgid.raw);
      // ibv_global_route's sgid_index is 8 bits: checked above, so this never truncates (index
      // 300 would become 44, routing from another entry than advertised).
      t.attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_.index());
      t.attr.ah_attr.grh.hop_limit = hop_limit_;
      t.attr.ah_attr.grh.traffic_class = transport_.traffic_class;
      t.attr.ah_attr.grh.flow_label = transport_.flow_label & 0xfffffu;
    }
    t.attr.ah_attr.dlid = remote.lid;
    t.attr.ah_attr.sl = transport_.service_level;
    t.attr.ah_attr.src_path_bits = 0;
    t.attr.ah_attr.port_num = gid_.port();
    t.mask = abi::IBV_QP_STATE | abi::IBV_QP_AV | abi::IBV_QP_PATH_MTU | abi::IBV_QP_DEST_QPN | abi::IBV_QP_RQ_PSN;
    if (type_ == QpType::rc) {
      t.attr.max_dest_rd_atomic = transport_.max_dest_rd_atomic;
      t.attr.min_rnr_timer = transport_.min_rnr_timer;
      t.mask |= abi::IBV_QP_MAX_DEST_RD_ATOMIC | abi::IBV_QP_MIN_RNR_TIMER;
    }
    return t;
  }
  /// RTR → RTS with the local initial PSN (and the RC retry budget).
  QpTransition rts_transition(std::uint32_t local_psn) const noexcept {
    QpTransition t;
    t.attr.qp_state = abi::IBV_QPS_RTS;
    t.attr.sq_psn = local_psn & 0xffffffu;
    t.mask = abi::IBV_QP_STATE | abi::IBV_QP_SQ_PSN;
    if (type_ == QpType::rc) {
      t.attr.timeout = transport_.timeout;
      t.attr.retry_cnt = transport_.retry_cnt;
      t.attr.rnr_retry = transport_.rnr_retry;
      t.attr.max_rd_atomic = transport_.max_rd_atomic;
      t.mask |= abi::IBV_QP_TIMEOUT | abi::IBV_QP_RETRY_CNT | abi::IBV_QP_RNR_RETRY | abi::IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return t;
  }
  /// The endpoint to advertise for a QP made from this recipe: the GID is the selection's.
  Endpoint local_endpoint(std::uint32_t qp_num, std::uint32_t psn, std::uint16_t lid = 0) const noexcept {
    Endpoint e;
    e.qp_num = qp_num & 0xffffffu;
    e.psn = psn & 0xffffffu;
    e.lid = lid;
    e.port = gid_.port();
    e.mtu = local_mtu();
    e.qp_type = type_;
    e.caps = endpoint_caps_;
    e.gid = gid_.gid();
    e.gid_type = gid_.type();
    e.link_layer = gid_.port_facts().link_layer;
    return e;
  }

  /// Creates the QP (RESET → INIT) on `pd` with `send_cq` and `recv_cq` (may be the same), and
  /// reads back the capacities the driver granted. Errors: create_qp's errno (EBUSY on
  /// Thunderbolt: the 10-QP cap or an orphaned holder), query_qp, modify_qp(INIT).
  [[nodiscard]] Result<PreparedQueuePair> prepare(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                                  const CompletionQueue& recv_cq) const;
  /// prepare() with one CQ for both directions.
  [[nodiscard]] Result<PreparedQueuePair> prepare(const ProtectionDomain& pd, const CompletionQueue& cq) const;

private:
  explicit QpRecipe(const GidSelection& gid) : gid_(gid) {}

  // The RTR source GID index travels in 8 bits (ibv_global_route.sgid_index).
  bool gid_index_fits_rtr() const noexcept { return gid_.index() >= 0 && gid_.index() <= 255; }
  // Why a selection above 255 is refused (by prepare() and rtr_transition()).
  Error gid_index_too_large() const noexcept {
    Error e = Error::make(Step::select_gid, ErrorKind::gid_index_invalid);
    e.detail.appendf("GID index %d: the verbs ABI carries the RTR source index in 8 bits "
                     "(ibv_global_route.sgid_index), so it would route from index %d instead",
                     gid_.index(), gid_.index() & 0xff);
    return e;
  }

  GidSelection gid_;
  QpType type_ = QpType::uc;
  Mtu mtu_ = Mtu::mtu1024;
  QpCapacities caps_;
  Access access_ = Access::none;
  std::optional<std::uint32_t> psn_;
  std::uint8_t hop_limit_ = 1;
  bool allow_rdma_write_ = false;
  EndpointCaps endpoint_caps_ = EndpointCaps::none;
  QpTransport transport_;
  QpTransitionHook hook_ = nullptr;
  void* hook_user_ = nullptr;
};

/// A created queue pair that is not connected yet: it has an Endpoint to send to the peer, and
/// no post functions (posting before the peer is known cannot compile). `connect` on an rvalue
/// performs RTR and RTS and returns the connected QueuePair.
///
/// **Moved-from.** After a move, or once connect() has succeeded (it moves the QP into the
/// QueuePair), connect() returns EBADF (diagnosis "handle-closed") without calling a verb, as a
/// moved-from QueuePair's posts do, and native_handle() is null. endpoint(), capacities() and
/// recipe() keep describing the QP that was prepared (a loopback connects the second QP to the
/// first one's endpoint after the first connected).
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto prepared
/// \until prepared->endpoint()
/// \skip auto wire
/// \until qp.error()
class PreparedQueuePair {
public:
  /// What the peer needs: QP number, PSN, LID, GID (from the recipe's selection), MTU, type.
  const Endpoint& endpoint() const noexcept { return local_; }
  /// The capacities the driver granted.
  const QpCapacities& capacities() const noexcept { return caps_; }
  /// The recipe the QP was made from.
  const QpRecipe& recipe() const noexcept { return recipe_; }
  /// The raw `ibv_qp*` (for inspection; do not post on it).
  abi::ibv_qp* native_handle() const noexcept { return owned_.get(); }

  /// Connects to `remote`: checks that the peer fits (same QP type, a set GID, the same link
  /// layer, or Thunderbolt facing a usb4_rdma host's Ethernet, and RoCE version where both ends say them: a RoCE v1 end and a v2 end connect but
  /// never carry traffic), re-reads the selected GID entry (a changed table is `gid_stale`, not a
  /// silent RTR failure), then INIT → RTR → RTS. Errors carry the device, port and GID index,
  /// and the diagnosis (an InfiniBand LID of 0 on either end is named: no subnet manager);
  /// EBADF (no verb called) on a moved-from or already connected object.
  [[nodiscard]] Result<QueuePair> connect(const Endpoint& remote) && {
    if (owned_.get() == nullptr || info_ == nullptr) [[unlikely]] {
      // Moved from (connect() itself moves the QP out on success): everything below reads info_,
      // which is null now (the documented retry-after-failure path ends here, not in a SEGV).
      Error e = Error::from_return(Step::modify_qp_rtr, EBADF);
      return fail(e.with_detail(fact::closed_handle));
    }
    const GidSelection& sel = recipe_.gid();
    auto peer_error = [&](const std::string& why) {
      Error e = Error::make(Step::check_endpoint, ErrorKind::incompatible_peer, why);
      return fail(info_->stamp(e, sel.port(), sel.index()));
    };
    if (remote.qp_type != recipe_.type())
      return peer_error("peer QP type " + std::to_string(static_cast<int>(remote.qp_type)) + " differs from local " +
                        std::to_string(static_cast<int>(recipe_.type())));
    if (remote.gid.is_zero())
      return peer_error("the peer advertised an unset (zero) GID: its port has no usable GID entry");
    const LinkLayer ll = sel.port_facts().link_layer;
    // A Linux usb4_rdma port reports Ethernet (RoCE v2) and carries Apple's Thunderbolt wire to a
    // Mac (hellas-ai/thunderbolt-ibverbs, docs/thunderbolt.md "Linux hosts on Thunderbolt"): the
    // one pair of different link layers that shares a cable.
    auto tb_and_ethernet = [](LinkLayer a, LinkLayer b) {
      return (a == LinkLayer::thunderbolt && b == LinkLayer::ethernet) || (a == LinkLayer::ethernet && b == LinkLayer::thunderbolt);
    };
    if (remote.link_layer != LinkLayer::unspecified && ll != LinkLayer::unspecified && remote.link_layer != ll &&
        !tb_and_ethernet(remote.link_layer, ll))
      return peer_error("the peer's port is " + std::string(link_layer_name(remote.link_layer)) + ", this one " +
                        std::string(link_layer_name(ll)) + ": both ends of a QP must be on the same fabric");
    if ((remote.gid_type == GidType::roce_v1 || remote.gid_type == GidType::roce_v2) &&
        (sel.type() == GidType::roce_v1 || sel.type() == GidType::roce_v2) && remote.gid_type != sel.type())
      return peer_error(std::string(fact::roce_version_mismatch) + " connect but never carry traffic: local " +
                        sel.describe() + ", the peer's GID " + remote.gid.to_string() + " is " +
                        std::string(gid_type_name(remote.gid_type)));
    if (auto r = sel.revalidate(); !r) return fail(r.error());

    auto step = [&](Step s, const QpTransition& t) -> Result<void> {
      if (auto r = detail::transition(*info_, owned_.get(), recipe_.edited(s, t), s, sel); !r) {
        Error e = r.error();
        std::string d = "local GID " + sel.gid().to_string() + " -> remote GID " + remote.gid.to_string() +
                        ", remote QP " + std::to_string(remote.qp_num);
        if (sel.type() != GidType::unknown)
          d += ", local " + std::string(gid_type_name(sel.type())) + " GID[" + std::to_string(sel.index()) + "]";
        if (sel.is_infiniband() && (sel.port_facts().lid == 0 || remote.lid == 0))
          d = std::string(fact::infiniband_lid_zero) + " (local " + std::to_string(sel.port_facts().lid) +
              ", remote " + std::to_string(remote.lid) + "); " + d;
        // A port that went down under the transition explains its failure (a timeout then is the
        // port going down, not an unreachable dgid): the state now decides. (A port still in
        // INIT never was ACTIVE: on InfiniBand that is a missing subnet manager, said above.)
        if (const auto state = port_state(sel.port()); state && *state == PortState::down)
          d = std::string(fact::port_left_active) + " (port " + std::to_string(sel.port()) + " is " +
              std::string(port_state_name(*state)) + " now); " + d;
        e.with_detail(d);
        return fail(e);
      }
      return {};
    };
    auto rtr = recipe_.rtr_transition(remote); // refused only for an index prepare() refuses too
    if (!rtr) {
      Error e = rtr.error();
      return fail(info_->stamp(e, sel.port(), sel.index()));
    }
    if (auto r = step(Step::modify_qp_rtr, *rtr); !r) return fail(r.error());
    if (auto r = step(Step::modify_qp_rts, recipe_.rts_transition(local_.psn)); !r) {
      // The QP is in RTR now: back to RESET and INIT, so this object can connect() again (a
      // failed RTR leaves it in INIT by itself).
      if (auto back = reinit(); !back) {
        Error e = r.error();
        e.detail.append("; and the QP could not be reset to INIT for a retry");
        return fail(e);
      }
      return fail(r.error());
    }
    QueuePair qp(std::move(owned_), std::move(info_), caps_, recipe_.rdma_write_allowed(), recipe_.access());
    // The copy reset() re-connects with, owned by the QP.
    struct KeptRecipe final : detail::RefCounted {
      QpRecipe recipe;
      explicit KeptRecipe(const QpRecipe& r) : recipe(r) {}
    };
    auto kept = detail::make_ref<KeptRecipe>(recipe_);
    const QpRecipe* copy = &kept->recipe;
    qp.remember(std::move(kept), copy);
    return qp;
  }

private:
  friend class QpRecipe;
  friend class QueuePair;
  // The port's state now, or nullopt when it cannot be read.
  std::optional<PortState> port_state(int port) const noexcept {
    if (owned_.get() == nullptr || info_ == nullptr || info_->api->query_port == nullptr) return std::nullopt;
    abi::ibv_port_attr a;
    std::memset(&a, 0, sizeof a);
    if (info_->api->query_port(owned_.get()->context, static_cast<std::uint8_t>(port), &a) != 0) return std::nullopt;
    return static_cast<PortState>(a.state);
  }
  // RESET, then INIT again (with the recipe's hook): what a failed RTS and QueuePair::reset need.
  Result<void> reinit() noexcept {
    QpTransition reset;
    reset.attr.qp_state = abi::IBV_QPS_RESET;
    reset.mask = abi::IBV_QP_STATE;
    if (auto r = detail::transition(*info_, owned_.get(), reset, Step::modify_qp_reset, recipe_.gid()); !r) return r;
    return detail::transition(*info_, owned_.get(), recipe_.edited(Step::modify_qp_init, recipe_.init_transition()),
                              Step::modify_qp_init, recipe_.gid());
  }
  PreparedQueuePair(detail::Owned<abi::ibv_qp> qp, detail::Ref<detail::ContextInfo> info, QpRecipe recipe,
                    QpCapacities caps, Endpoint local)
      : owned_(std::move(qp)), info_(std::move(info)), recipe_(std::move(recipe)), caps_(caps), local_(local) {}

  detail::Owned<abi::ibv_qp> owned_;
  detail::Ref<detail::ContextInfo> info_;
  QpRecipe recipe_;
  QpCapacities caps_;
  Endpoint local_;
};

inline Result<PreparedQueuePair> QpRecipe::prepare(const ProtectionDomain& pd, const CompletionQueue& send_cq,
                                                   const CompletionQueue& recv_cq) const {
  const auto& info = pd.info();
  const detail::VerbsApi& api = *info->api;
  if (type_ == QpType::ud) {
    // UD needs a QKEY at INIT, no RTR path, address handles per destination and 40 bytes of GRH in
    // every receive: none of which this recipe builds. Refused before anything is created.
    Error e = Error::make(Step::create_qp, ErrorKind::unsupported,
                          "QpType::ud is not supported by QpRecipe (no QKEY, address handles or GRH room); "
                          "use RC or UC, or build UD on native_handle() with Library::symbol");
    return fail(info->stamp(e, gid_.port(), gid_.index()));
  }
  if (!gid_index_fits_rtr()) {
    Error e = gid_index_too_large();
    return fail(info->stamp(e, gid_.port(), gid_.index()));
  }
  abi::ibv_qp_init_attr init = init_attributes();
  init.send_cq = send_cq.native_handle();
  init.recv_cq = recv_cq.native_handle();
  errno = 0;
  abi::ibv_qp* qp = api.create_qp(pd.native_handle(), &init);
  if (qp == nullptr) {
    Error e = Error::from_errno(Step::create_qp);
    info->stamp(e, gid_.port());
    e.with_detail(std::to_string(info->queue_pairs.load()) + " QPs already open on this device by this process; asked " +
                  std::to_string(caps_.max_send_wr) + " send / " + std::to_string(caps_.max_recv_wr) + " recv");
    return fail(e);
  }
  // The QP keeps its PD and both CQs alive, so it is always destroyed first.
  detail::Owned<abi::ibv_qp> owned(qp, api.destroy_qp,
                                   detail::counted_parent(info, &detail::ContextInfo::queue_pairs, pd.keep_alive(),
                                                          send_cq.keep_alive(), recv_cq.keep_alive()));

  // Granted depths may be lower than asked (Apple counts 4 KiB frames): read them back.
  QpCapacities granted{init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge, init.cap.max_recv_sge,
                       init.cap.max_inline_data};
  abi::ibv_qp_attr qattr{};
  abi::ibv_qp_init_attr qinit{};
  if (api.query_qp(qp, &qattr, abi::IBV_QP_CAP, &qinit) == 0 && qinit.cap.max_send_wr != 0) {
    granted = {qinit.cap.max_send_wr, qinit.cap.max_recv_wr, qinit.cap.max_send_sge, qinit.cap.max_recv_sge,
               qinit.cap.max_inline_data};
  }

  if (auto r = detail::transition(*info, qp, edited(Step::modify_qp_init, init_transition()), Step::modify_qp_init, gid_);
      !r)
    return fail(r.error());
  abi::ibv_port_attr port{};
  const std::uint16_t lid = api.query_port(qp->context, gid_.port(), &port) == 0 ? port.lid : 0;
  const std::uint32_t psn = initial_psn();
  return PreparedQueuePair(std::move(owned), info, *this, granted, local_endpoint(qp->qp_num, psn, lid));
}

inline Result<PreparedQueuePair> QpRecipe::prepare(const ProtectionDomain& pd, const CompletionQueue& cq) const {
  return prepare(pd, cq, cq);
}

inline Result<PreparedQueuePair> QueuePair::reset() && {
  if (recipe_ == nullptr || info_ == nullptr || !qp_.live()) {
    Error e = Error::from_return(Step::modify_qp_reset, EBADF);
    return fail(stamp(e));
  }
  const QpRecipe recipe = *recipe_;
  const std::uint32_t psn = recipe.initial_psn();
  abi::ibv_port_attr port{};
  const std::uint16_t lid =
      info_->api != nullptr && info_->api->query_port(qp_->context, recipe.gid().port(), &port) == 0 ? port.lid : 0;
  const Endpoint local = recipe.local_endpoint(qp_->qp_num, psn, lid);
  qp_.reset();
  PreparedQueuePair prepared(std::move(owned_), std::move(info_), recipe, caps_, local);
  if (auto r = prepared.reinit(); !r) return fail(r.error()); // the QP is destroyed with `prepared`
  return prepared;
}

TBVERBS_NAMESPACE_END
