/// @file queue_pair.hpp
/// A connected queue pair (state RTS): the only type with `post_send` and `post_recv`.
/// It is made by `PreparedQueuePair::connect` (recipe.hpp).
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "result.hpp"
#include "types.hpp"
#include "work_request.hpp"

#include <cstdint>

TBVERBS_NAMESPACE_BEGIN

class PreparedQueuePair;
class QpRecipe;

/// Queue-pair state (values of `enum ibv_qp_state`), as `QueuePair::query_state` reads it.
enum class QpState : std::uint8_t {
  reset = 0,         ///< RESET: just created, or reset; nothing may be posted.
  init = 1,          ///< INIT: receives may be posted, nothing is received yet.
  rtr = 2,           ///< RTR: ready to receive.
  rts = 3,           ///< RTS: ready to send (what connect() leaves).
  sqd = 4,           ///< SQD: send queue drained.
  sqe = 5,           ///< SQE: send queue error.
  error = 6,         ///< ERR: every outstanding and later work request completes with IBV_WC_WR_FLUSH_ERR.
  unknown = 7,       ///< A value tbverbs does not know.
};

/// Printable name of a QP state ("IBV_QPS_RTS").
constexpr const char* qp_state_name(QpState s) noexcept {
  switch (s) {
  case QpState::reset: return "IBV_QPS_RESET";
  case QpState::init: return "IBV_QPS_INIT";
  case QpState::rtr: return "IBV_QPS_RTR";
  case QpState::rts: return "IBV_QPS_RTS";
  case QpState::sqd: return "IBV_QPS_SQD";
  case QpState::sqe: return "IBV_QPS_SQE";
  case QpState::error: return "IBV_QPS_ERR";
  case QpState::unknown: break;
  }
  return "IBV_QPS_UNKNOWN";
}

/// The transport settings of a queue pair's INIT/RTR/RTS transitions that a fabric may need
/// changed (QpRecipe::transport). The defaults are what the presets always used: a lossless RoCE
/// fabric wants `traffic_class` and `service_level` (NCCL_IB_TC / NCCL_IB_SL), an InfiniBand
/// partition `pkey_index`, a long-haul or busy fabric `timeout` and the retry counts. The RC-only
/// fields are ignored for UC.
struct QpTransport {
  std::uint8_t traffic_class = 0;      ///< GRH traffic class (DSCP << 2 | ECN) at RTR; RoCE v2 maps it to the IP TOS byte.
  std::uint8_t service_level = 0;      ///< Service level at RTR (ah_attr.sl): the InfiniBand SL, or the RoCE priority (PCP).
  std::uint32_t flow_label = 0;        ///< GRH flow label (20 bits) at RTR.
  std::uint16_t pkey_index = 0;        ///< P_Key table index at INIT.
  std::uint8_t timeout = 14;           ///< RC: local ACK timeout at RTS, 4.096 us * 2^timeout (14: ~67 ms; 0: infinite).
  std::uint8_t retry_cnt = 7;          ///< RC: transport retries at RTS (at most 7).
  std::uint8_t rnr_retry = 7;          ///< RC: receiver-not-ready retries at RTS (7: without limit).
  std::uint8_t min_rnr_timer = 12;     ///< RC: the RNR NAK delay this side asks for at RTR (12: 0.64 ms).
  std::uint8_t max_rd_atomic = 1;      ///< RC: RDMA READs and atomics this side keeps in flight (RTS).
  std::uint8_t max_dest_rd_atomic = 1; ///< RC: RDMA READs and atomics the peer may have in flight here (RTR).
};

/// The operations a connected QP may post: those its transport offers (RC: all; UC: SEND and
/// RDMA WRITE, with or without immediate; UD: SEND), less what the provider profile does not
/// execute (Apple's driver: IBV_WR_SEND only, TN3205 "2-sided operations only"; RDMA WRITE is
/// accepted there and silently dropped, ds4), without `allow_one_sided` every one-sided one, and
/// every one-sided one the peer's QP does not grant: `granted` is the remote access of the peer's
/// QP, which a job whose ranks share one recipe sets with QpRecipe::access (RDMA WRITE, with or
/// without immediate, needs remote_write; RDMA READ remote_read; atomics remote_atomic). A READ
/// the peer does not grant would post, fail at completion and put both QPs in ERR; refused
/// here, it fails at post() with nothing sent.
constexpr SendOps send_ops_for(QpType type, Platform platform, bool allow_one_sided,
                               Access granted = Access::remote_write | Access::remote_read | Access::remote_atomic) noexcept {
  SendOps ops = type == QpType::rc   ? SendOps::reliable_connected
                : type == QpType::uc ? SendOps::unreliable_connected
                                     : SendOps::datagram;
  if (!allow_one_sided)
    ops = without(ops, SendOps::rdma_write | SendOps::rdma_write_with_imm | SendOps::rdma_read | SendOps::atomics);
  auto grants = [granted](Access a) { return (static_cast<int>(granted) & static_cast<int>(a)) != 0; };
  if (!grants(Access::remote_write)) ops = without(ops, SendOps::rdma_write | SendOps::rdma_write_with_imm);
  if (!grants(Access::remote_read)) ops = without(ops, SendOps::rdma_read);
  if (!grants(Access::remote_atomic)) ops = without(ops, SendOps::atomics);
  if (platform == Platform::apple) ops = ops & SendOps::send;
  return ops;
}

/// A connected queue pair. Move-only, never null; keeps its PD and CQs alive.
///
/// The post functions call the context's ops table exactly as the platform header's inline
/// `ibv_post_send`/`ibv_post_recv` do, and allocate nothing. The error number is the verb's
/// return value (sign-normalised), never `errno`. A failed chain says how far it got: the
/// Error's `posted` is the number of requests posted before the one the driver refused, and its
/// `wr_id` is that request's (the driver's `bad_wr`). A request tbverbs refuses before calling the
/// driver (`unsupported`, `capacity`) refuses its whole chain: `posted` is 0, `wr_id` is the
/// refused request's, and the message says "refused before the driver", never "failed".
///
/// Errors of every post (diagnosed by the catalogue):
/// - ENOMEM: the queue is full, i.e. more outstanding requests than the granted max_send_wr /
///   max_recv_wr (backpressure: poll completions, then post again; on Thunderbolt depths count
///   4 KiB frames), or the QP is in ERR;
/// - EINVAL: more SGEs than the granted max_send_sge / max_recv_sge, inline data above
///   max_inline_data, an opcode the QP lacks, or the QP is not in RTS (send) / RTR (receive);
/// - EBADF (no verb called): the QP was closed or moved from;
/// - `unsupported` (no verb called): an operation the transport or profile does not execute
///   (`allowed_ops()`); `capacity` (no verb called): inline data above the granted
///   max_inline_data.
///
/// **Threads.** The verbs are thread-safe by design on rdma-core: its providers lock each queue,
/// so `post_send`/`post`/`send` and `post_recv`/`recv` may be called from several threads at
/// once on one QueuePair, and sends and receives never contend with each other. Apple's driver
/// does not document its locking: serialise the posts of one queue there. The QP may be moved to
/// another thread between calls; `modify_to_error`, `reset`, `close` and moves must not race with
/// posts. Completions are read from the CompletionQueue, which has its own rule.
///
/// **Closed and moved-from.** After close() or a move, posts return EBADF (diagnosis
/// "handle-closed") instead of touching freed memory, and native_handle() is null.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto qp
/// \until qp.error()
/// \skip qp->recv
/// \until qp->send
class QueuePair {
public:
  /// Posts a chain of send work requests as built by the caller (the escape hatch). On failure
  /// the Error carries `posted` and the wr_id of the first request not posted.
  [[nodiscard]] Result<void> post_send(abi::ibv_send_wr& wr) noexcept {
    abi::ibv_send_wr* bad = nullptr;
    return post_send(wr, bad);
  }
  /// post_send, also handing back the driver's `bad_wr` (the first request not posted; null on
  /// success), as `ibv_post_send` does.
  [[nodiscard]] Result<void> post_send(abi::ibv_send_wr& wr, abi::ibv_send_wr*& bad) noexcept {
    bad = nullptr;
    const int rc = qp_->context->ops.post_send(qp_.get(), &wr, &bad);
    if (rc != 0) [[unlikely]]
      return fail(send_failed(rc, &wr, bad));
    return {};
  }
  /// Posts a chain of receive work requests as built by the caller. On failure the Error carries
  /// `posted` and the wr_id of the first request not posted.
  [[nodiscard]] Result<void> post_recv(abi::ibv_recv_wr& wr) noexcept {
    abi::ibv_recv_wr* bad = nullptr;
    return post_recv(wr, bad);
  }
  /// post_recv, also handing back the driver's `bad_wr` (null on success).
  [[nodiscard]] Result<void> post_recv(abi::ibv_recv_wr& wr, abi::ibv_recv_wr*& bad) noexcept {
    bad = nullptr;
    const int rc = qp_->context->ops.post_recv(qp_.get(), &wr, &bad);
    if (rc != 0) [[unlikely]]
      return fail(recv_failed(rc, &wr, bad));
    return {};
  }

  /// Posts one typed send request (SendWr). Refused without calling the driver when its
  /// operation is not in allowed_ops() (`unsupported`) or its inline payload is above the granted
  /// max_inline_data (`capacity`); a SEND without the inline flag costs no check.
  [[nodiscard]] Result<void> post(const SendWr& wr) noexcept {
    if (!admissible(wr)) [[unlikely]]
      return fail(refused(wr, -1));
    // verbs.h takes a non-const pointer for historical reasons; providers only read the request.
    abi::ibv_send_wr& raw = const_cast<abi::ibv_send_wr&>(wr.wr_); // next is null outside a chain's post
    abi::ibv_send_wr* bad = nullptr;
    const int rc = qp_->context->ops.post_send(qp_.get(), &raw, &bad);
    if (rc != 0) [[unlikely]]
      return fail(send_failed(rc, &raw, bad));
    return {};
  }
  /// Posts a whole chain with one call (one doorbell on most drivers). Every request is checked
  /// first, as post(const SendWr&) does; a refused one posts nothing of the chain (`posted` 0,
  /// `wr_id` and the detail name the refused request). A driver failure part-way says how many
  /// were posted (`posted`) and which was not (`wr_id`).
  template <std::size_t N> [[nodiscard]] Result<void> post(SendChain<N>& chain) noexcept {
    for (std::size_t i = 0; i < chain.size(); ++i)
      if (!admissible(chain[i])) [[unlikely]]
        return fail(refused(chain[i], static_cast<int>(i))); // before the driver: nothing posted
    abi::ibv_send_wr* head = chain.link();
    if (head == nullptr) return {};
    abi::ibv_send_wr* bad = nullptr;
    const int rc = qp_->context->ops.post_send(qp_.get(), head, &bad);
    if (rc != 0) [[unlikely]] {
      const Error e = send_failed(rc, head, bad); // counts along the links: before unlinking
      chain.unlink();
      return fail(e);
    }
    chain.unlink(); // so a request taken from the chain posts alone
    return {};
  }
  /// Posts one typed receive request.
  [[nodiscard]] Result<void> post(const RecvWr& wr) noexcept {
    abi::ibv_recv_wr& raw = const_cast<abi::ibv_recv_wr&>(wr.wr_); // providers only read it; next is null
    return post_recv(raw);
  }
  /// Posts a chain of receives with one call (a window of credits).
  template <std::size_t N> [[nodiscard]] Result<void> post(RecvChain<N>& chain) noexcept {
    abi::ibv_recv_wr* head = chain.link();
    if (head == nullptr) return {};
    auto r = post_recv(*head); // the error is complete (counted along the links) before unlinking
    chain.unlink();
    return r;
  }

  /// Sends one buffer (SEND). Unsignalled sends still complete on some providers (Apple's):
  /// size the CQ for them. `sge` is read during the call only.
  [[nodiscard]] Result<void> send(std::uint64_t wr_id, const abi::ibv_sge& sge, bool signaled = true) noexcept {
    abi::ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = const_cast<abi::ibv_sge*>(&sge); // providers only read it
    wr.num_sge = 1;
    wr.opcode = abi::IBV_WR_SEND;
    wr.send_flags = signaled ? abi::IBV_SEND_SIGNALED : 0;
    return post_send(wr);
  }
  /// Posts one receive buffer. On Thunderbolt it must span as many 4 KiB frames as the send
  /// that will land in it. `sge` is read during the call only.
  [[nodiscard]] Result<void> recv(std::uint64_t wr_id, const abi::ibv_sge& sge) noexcept {
    abi::ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = const_cast<abi::ibv_sge*>(&sge); // providers only read it
    wr.num_sge = 1;
    return post_recv(wr);
  }
  /// RDMA WRITE of one local buffer to the peer's `remote_addr`/`rkey`. Refused with
  /// `unsupported` where the recipe's profile does not execute writes (Apple's driver accepts
  /// them and silently drops them, so tbverbs never lets one through there).
  [[nodiscard]] Result<void> rdma_write(std::uint64_t wr_id, const abi::ibv_sge& sge, std::uint64_t remote_addr,
                                        std::uint32_t rkey, bool signaled = true) noexcept {
    return post(SendWr::rdma_write(wr_id, sge, {remote_addr, rkey}).signaled(signaled));
  }

  /// Moves the QP to ERR (`ibv_modify_qp`, IBV_QPS_ERR): every outstanding and later work request
  /// completes with IBV_WC_WR_FLUSH_ERR, so polling until the flushes of the requests you posted
  /// have come back drains the QP (recover its credits, then close() or reset()). Errors:
  /// modify_qp's return value at Step::modify_qp_err.
  [[nodiscard]] Result<void> modify_to_error() noexcept { return modify_state(QpState::error, Step::modify_qp_err); }
  /// The QP's current state (`ibv_query_qp` with IBV_QP_STATE): ERR after a failed completion,
  /// RTS while healthy. Errors: query_qp's return value.
  [[nodiscard]] Result<QpState> query_state() const noexcept {
    abi::ibv_qp_attr attr{};
    abi::ibv_qp_init_attr init{};
    const int rc = info_ != nullptr && info_->ops.query_qp != nullptr && qp_.live()
                       ? info_->ops.query_qp(qp_.get(), &attr, abi::IBV_QP_STATE, &init)
                       : EBADF;
    if (rc != 0) return fail(state_failed(Step::query_qp, rc));
    const int s = static_cast<int>(attr.qp_state);
    return s >= 0 && s <= 6 ? static_cast<QpState>(s) : QpState::unknown;
  }
  /// Moves the QP back to RESET and then INIT with a fresh PSN, and returns it as a
  /// PreparedQueuePair with a new endpoint (same QP number): exchange endpoints again and
  /// connect(), without destroying and re-creating the QP (its MRs and CQs stay). Outstanding
  /// work is discarded: drain it first (modify_to_error, then poll the flushes). Defined in
  /// recipe.hpp. Errors: modify_qp(RESET) or modify_qp(INIT); on failure the QP is destroyed.
  [[nodiscard]] Result<PreparedQueuePair> reset() &&;

  /// The local QP number (0 once closed or moved from).
  std::uint32_t qp_num() const noexcept { return qp_->qp_num; }
  /// The transport type.
  QpType type() const noexcept { return type_; }
  /// The capacities the driver granted (may be lower than the recipe asked: Apple counts 4 KiB
  /// frames and may lower depths).
  const QpCapacities& capacities() const noexcept { return caps_; }
  /// The operations post() accepts (see send_ops_for).
  SendOps allowed_ops() const noexcept { return ops_; }
  /// True when rdma_write may be used.
  bool rdma_write_allowed() const noexcept { return contains(ops_, SendOp::rdma_write); }

  /// Destroys the QP now and returns the verb's result. Afterwards posts return EBADF and
  /// native_handle() is null.
  [[nodiscard]] Result<void> close() noexcept {
    auto r = owned_.close();
    if (r) qp_.reset();
    return r;
  }
  /// The raw `ibv_qp*`; null once closed or moved from.
  abi::ibv_qp* native_handle() const noexcept { return owned_.get(); }

private:
  friend class PreparedQueuePair;
  QueuePair(detail::Owned<abi::ibv_qp> qp, detail::Ref<detail::ContextInfo> info, QpCapacities caps,
            bool allow_write, Access granted) noexcept
      : owned_(std::move(qp)), info_(std::move(info)), caps_(caps), qp_(owned_.get()) {
    type_ = static_cast<QpType>(qp_->qp_type);
    ops_ = send_ops_for(type_, info_ != nullptr ? info_->platform : Platform::any, allow_write, granted);
  }
  // The recipe and PSN a reset() re-initialises with (set by PreparedQueuePair::connect).
  // `keep` owns `*recipe` (queue_pair.hpp cannot name the holder's type: QpRecipe is incomplete here).
  void remember(detail::Ref<detail::RefCounted> keep, const QpRecipe* recipe) noexcept {
    recipe_keep_ = std::move(keep);
    recipe_ = recipe;
  }

  // Inline so a SEND without IBV_SEND_INLINE folds to nothing when the request is built in place.
  bool admissible(const SendWr& wr) const noexcept {
    const abi::ibv_send_wr& w = wr.wr_;
    if (w.opcode != abi::IBV_WR_SEND && !contains(ops_, static_cast<SendOp>(w.opcode))) return false;
    if ((w.send_flags & abi::IBV_SEND_INLINE) != 0 && wr.length() > caps_.max_inline_data) return false;
    return true;
  }

  Error& stamp(Error& e) const noexcept {
    if (info_ != nullptr) info_->stamp(e);
    e.qp_num = qp_->qp_num;
    if (!qp_.live()) e.with_detail(fact::closed_handle);
    return e;
  }
  // How far a chain got: the requests before `bad` were posted.
  template <class W> static int count_posted(W* head, W* bad) noexcept {
    if (bad == nullptr) return 0; // the driver did not say: assume none (ibv_post_* leaves it unset)
    int n = 0;
    for (W* w = head; w != nullptr && w != bad; w = w->next) ++n;
    return n;
  }
  [[gnu::noinline, gnu::cold]] Error send_failed(int rc, abi::ibv_send_wr* head, abi::ibv_send_wr* bad) const noexcept {
    Error e = Error::from_return(Step::post_send, rc);
    e.posted = count_posted(head, bad);
    e.wr_id = bad != nullptr ? bad->wr_id : head->wr_id;
    return stamp(e);
  }
  [[gnu::noinline, gnu::cold]] Error recv_failed(int rc, abi::ibv_recv_wr* head, abi::ibv_recv_wr* bad) const noexcept {
    Error e = Error::from_return(Step::post_recv, rc);
    e.posted = count_posted(head, bad);
    e.wr_id = bad != nullptr ? bad->wr_id : head->wr_id;
    return stamp(e);
  }
  // A request refused before the driver is called: `index` is its place in a chain (-1: posted
  // alone). Nothing of the chain reached the driver, so `posted` is 0 whatever the index (a
  // backend counting credits from it must not wait for requests never posted). Stamped with the device and platform, so the catalogue's profile-limit row
  // explains it.
  [[gnu::noinline, gnu::cold]] Error refused(const SendWr& wr, int index) const noexcept {
    const abi::ibv_send_wr& w = wr.wr_;
    Error e;
    if (w.opcode != abi::IBV_WR_SEND && !contains(ops_, static_cast<SendOp>(w.opcode))) {
      e = Error::make(Step::post_send, ErrorKind::unsupported);
      if (index >= 0) e.detail.appendf("request %d of the chain: ", index);
      e.detail.appendf("%s is not executed by this QP (%s, %s profile; one-sided operations also need the "
                       "recipe's allow_rdma_write and the remote access its peer grants, QpRecipe::access)",
                       send_op_name(static_cast<SendOp>(w.opcode)), type_ == QpType::rc ? "RC" : type_ == QpType::uc ? "UC" : "UD",
                       info_ != nullptr && info_->platform == Platform::apple ? "Thunderbolt: SEND/RECV only" : "this");
    } else {
      e = Error::make(Step::post_send, ErrorKind::capacity);
      if (index >= 0) e.detail.appendf("request %d of the chain: ", index);
      e.detail.appendf("%s: %llu bytes, the QP was granted %u", fact::inline_too_large.data(),
                       static_cast<unsigned long long>(wr.length()), caps_.max_inline_data);
    }
    e.wr_id = w.wr_id;
    e.posted = 0;
    return stamp(e);
  }
  Result<void> modify_state(QpState to, Step step) noexcept {
    abi::ibv_qp_attr attr{};
    attr.qp_state = static_cast<abi::ibv_qp_state>(to);
    const int rc = info_ != nullptr && qp_.live() ? info_->modify_qp(qp_.get(), attr, abi::IBV_QP_STATE) : EBADF;
    if (rc != 0) return fail(state_failed(step, rc));
    return {};
  }
  [[gnu::cold]] Error state_failed(Step step, int rc) const noexcept {
    Error e = Error::from_return(step, rc);
    return stamp(e);
  }

  // Hot members first: the post path reads qp_, ops_ and (for inline sends) caps_.
  detail::Owned<abi::ibv_qp> owned_;
  detail::Ref<detail::ContextInfo> info_;
  QpCapacities caps_;
  detail::HotPtr<abi::ibv_qp> qp_; // cached: the post path reads no Ref; the stand-in once closed
  SendOps ops_ = SendOps::send;
  QpType type_ = QpType::uc;
  detail::Ref<detail::RefCounted> recipe_keep_; // owns *recipe_
  detail::NullOnMove<const QpRecipe> recipe_;  // for reset()
};

TBVERBS_NAMESPACE_END
