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

#include <cstdint>
#include <memory>

TBVERBS_NAMESPACE_BEGIN

class PreparedQueuePair;

/// A connected queue pair. Move-only, never null; keeps its PD and CQs alive.
///
/// The post functions call the context's ops table exactly as the platform header's inline
/// `ibv_post_send`/`ibv_post_recv` do, and allocate nothing. The error number is the verb's
/// return value (sign-normalised), never `errno`. Not thread-safe for concurrent posts to the
/// same queue (as the verbs themselves on most providers).
class QueuePair {
public:
  /// Posts a chain of send work requests as built by the caller (the escape hatch).
  [[nodiscard]] Result<void> post_send(abi::ibv_send_wr& wr) noexcept {
    abi::ibv_send_wr* bad = nullptr;
    const int rc = qp_->context->ops.post_send(qp_, &wr, &bad);
    if (rc != 0) [[unlikely]]
      return fail(post_failed(Step::post_send, rc));
    return {};
  }
  /// Posts a chain of receive work requests as built by the caller.
  [[nodiscard]] Result<void> post_recv(abi::ibv_recv_wr& wr) noexcept {
    abi::ibv_recv_wr* bad = nullptr;
    const int rc = qp_->context->ops.post_recv(qp_, &wr, &bad);
    if (rc != 0) [[unlikely]]
      return fail(post_failed(Step::post_recv, rc));
    return {};
  }
  /// Sends one buffer (SEND). Unsignalled sends still complete on some providers (Apple's):
  /// size the CQ for them.
  [[nodiscard]] Result<void> send(std::uint64_t wr_id, abi::ibv_sge sge, bool signaled = true) noexcept {
    abi::ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = abi::IBV_WR_SEND;
    wr.send_flags = signaled ? abi::IBV_SEND_SIGNALED : 0;
    return post_send(wr);
  }
  /// Posts one receive buffer. On Thunderbolt it must span as many 4 KiB frames as the send
  /// that will land in it.
  [[nodiscard]] Result<void> recv(std::uint64_t wr_id, abi::ibv_sge sge) noexcept {
    abi::ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return post_recv(wr);
  }
  /// RDMA WRITE of one local buffer to the peer's `remote_addr`/`rkey`. Refused with
  /// `unsupported` where the recipe's profile does not execute writes (Apple's driver accepts
  /// them and silently drops them, so tbverbs never lets one through there).
  [[nodiscard]] Result<void> rdma_write(std::uint64_t wr_id, abi::ibv_sge sge, std::uint64_t remote_addr,
                                        std::uint32_t rkey, bool signaled = true) noexcept {
    if (!rdma_write_allowed_) [[unlikely]]
      return fail(write_refused());
    abi::ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = abi::IBV_WR_RDMA_WRITE;
    wr.send_flags = signaled ? abi::IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    return post_send(wr);
  }

  /// The local QP number.
  std::uint32_t qp_num() const noexcept { return qp_->qp_num; }
  /// The transport type.
  QpType type() const noexcept { return static_cast<QpType>(qp_->qp_type); }
  /// The capacities the driver granted (may be lower than the recipe asked: Apple counts 4 KiB
  /// frames and may lower depths).
  const QpCapacities& capacities() const noexcept { return caps_; }
  /// True when rdma_write may be used.
  bool rdma_write_allowed() const noexcept { return rdma_write_allowed_; }

  /// Destroys the QP now and returns the verb's result.
  [[nodiscard]] Result<void> close() noexcept {
    auto r = owned_.close();
    if (r) qp_ = nullptr;
    return r;
  }
  /// The raw `ibv_qp*`.
  abi::ibv_qp* native_handle() const noexcept { return qp_; }

private:
  friend class PreparedQueuePair;
  QueuePair(detail::Owned<abi::ibv_qp> qp, std::shared_ptr<detail::ContextInfo> info, QpCapacities caps,
            bool allow_write) noexcept
      : owned_(std::move(qp)), info_(std::move(info)), caps_(caps), rdma_write_allowed_(allow_write) {
    qp_ = owned_.get();
  }

  // Stamped with the device and platform, so the catalogue's profile-limit row explains it.
  [[gnu::noinline, gnu::cold]] Error write_refused() const noexcept {
    Error e = Error::make(Step::post_send, ErrorKind::unsupported,
                          "RDMA WRITE is not executed by this provider profile (SEND/RECV only)");
    return info_->stamp(e);
  }
  [[gnu::noinline, gnu::cold]] Error post_failed(Step step, int rc) const noexcept {
    Error e = Error::from_return(step, rc);
    info_->stamp(e);
    return e.with_detail("QP " + std::to_string(qp_->qp_num));
  }

  detail::Owned<abi::ibv_qp> owned_;
  std::shared_ptr<detail::ContextInfo> info_;
  QpCapacities caps_;
  bool rdma_write_allowed_ = false;
  abi::ibv_qp* qp_ = nullptr; // cached: the post path reads no shared_ptr
};

TBVERBS_NAMESPACE_END
