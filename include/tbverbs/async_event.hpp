/// @file async_event.hpp
/// `AsyncEvent`: one of a device's asynchronous events (a port going down or up, a QP or CQ
/// error, the device lost), as `Context::wait_async_event` returns it. docs/core-api.md,
/// "Asynchronous events", says what each event means on Apple and on rdma-core.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// The kind of an asynchronous event (rdma-core's `enum ibv_event_type`, one for one).
enum class AsyncEventType : std::uint8_t {
  cq_error,                 ///< IBV_EVENT_CQ_ERR: a CQ overran; its QPs go to ERR.
  qp_fatal,                 ///< IBV_EVENT_QP_FATAL: a QP hit an error no completion reports; it is in ERR.
  qp_request_error,         ///< IBV_EVENT_QP_REQ_ERR: the peer saw a malformed request; the QP is in ERR.
  qp_access_error,          ///< IBV_EVENT_QP_ACCESS_ERR: a remote access violation; the QP is in ERR.
  communication_established,///< IBV_EVENT_COMM_EST: a QP in RTR received its first message.
  sq_drained,               ///< IBV_EVENT_SQ_DRAINED: a QP in SQD has no outstanding sends.
  path_migrated,            ///< IBV_EVENT_PATH_MIG: a QP moved to its alternate path.
  path_migration_error,     ///< IBV_EVENT_PATH_MIG_ERR: the alternate path failed.
  device_fatal,             ///< IBV_EVENT_DEVICE_FATAL: the device is gone; close everything on it.
  port_active,              ///< IBV_EVENT_PORT_ACTIVE: the port came up (PORT_ACTIVE).
  port_error,               ///< IBV_EVENT_PORT_ERR: the port left PORT_ACTIVE (a cable pulled, the peer's port down).
  lid_change,               ///< IBV_EVENT_LID_CHANGE: the port's LID changed (InfiniBand).
  pkey_change,              ///< IBV_EVENT_PKEY_CHANGE: the port's P_Key table changed.
  sm_change,                ///< IBV_EVENT_SM_CHANGE: the subnet manager changed (InfiniBand).
  srq_error,                ///< IBV_EVENT_SRQ_ERR: a shared receive queue failed.
  srq_limit_reached,        ///< IBV_EVENT_SRQ_LIMIT_REACHED: an SRQ fell below its limit.
  qp_last_wqe_reached,      ///< IBV_EVENT_QP_LAST_WQE_REACHED: a QP on an SRQ consumed its last WQE.
  client_reregister,        ///< IBV_EVENT_CLIENT_REREGISTER: the SM asks to re-register (InfiniBand).
  gid_change,               ///< IBV_EVENT_GID_CHANGE: the port's GID table changed (an address added or removed).
  wq_fatal,                 ///< IBV_EVENT_WQ_FATAL: a work queue failed.
  unknown,                  ///< A type this version of tbverbs does not know (see AsyncEvent::raw_type).
};

/// The verbs name of `t` ("IBV_EVENT_PORT_ERR"), or "unknown".
constexpr std::string_view async_event_name(AsyncEventType t) noexcept {
  constexpr std::string_view names[] = {
      "IBV_EVENT_CQ_ERR",      "IBV_EVENT_QP_FATAL",    "IBV_EVENT_QP_REQ_ERR",          "IBV_EVENT_QP_ACCESS_ERR",
      "IBV_EVENT_COMM_EST",    "IBV_EVENT_SQ_DRAINED",  "IBV_EVENT_PATH_MIG",            "IBV_EVENT_PATH_MIG_ERR",
      "IBV_EVENT_DEVICE_FATAL", "IBV_EVENT_PORT_ACTIVE", "IBV_EVENT_PORT_ERR",           "IBV_EVENT_LID_CHANGE",
      "IBV_EVENT_PKEY_CHANGE", "IBV_EVENT_SM_CHANGE",   "IBV_EVENT_SRQ_ERR",             "IBV_EVENT_SRQ_LIMIT_REACHED",
      "IBV_EVENT_QP_LAST_WQE_REACHED", "IBV_EVENT_CLIENT_REREGISTER", "IBV_EVENT_GID_CHANGE", "IBV_EVENT_WQ_FATAL",
  };
  const auto i = static_cast<std::size_t>(t);
  return i < sizeof names / sizeof names[0] ? names[i] : std::string_view("unknown");
}

/// One asynchronous event, already acknowledged (ibv_ack_async_event): a copy of what it said,
/// safe to keep. The object it names (a QP, a CQ) may be gone by the time it is read; only its
/// number is kept, never a pointer to follow.
class AsyncEvent {
public:
  /// The event from the driver's record (`raw` is the verbs struct); `device` names the context.
  static AsyncEvent from_native(const detail::abi::ibv_async_event& raw, std::string_view device) noexcept {
    AsyncEvent e;
    // The type's bytes as an int, not a load of the enum: a driver newer than these headers may
    // report a value outside the enumeration's range, which must not be read as ibv_event_type.
    static_assert(sizeof raw.event_type == sizeof(int), "ibv_event_type is an int-sized enum");
    std::memcpy(&e.raw_type_, &raw.event_type, sizeof(int));
    e.type_ = e.raw_type_ >= 0 && e.raw_type_ < static_cast<int>(AsyncEventType::unknown)
                  ? static_cast<AsyncEventType>(e.raw_type_)
                  : AsyncEventType::unknown;
    if (e.is_port_event()) e.port_ = static_cast<std::uint8_t>(raw.element.port_num);
    else if (e.is_qp_event() && raw.element.qp != nullptr) e.qp_num_ = raw.element.qp->qp_num;
    const std::size_t n = device.size() < sizeof e.device_ - 1 ? device.size() : sizeof e.device_ - 1;
    for (std::size_t i = 0; i < n; ++i) e.device_[i] = device[i];
    return e;
  }

  /// What happened.
  AsyncEventType type() const noexcept { return type_; }
  /// The driver's number for it (what type() maps; useful when type() is unknown).
  int raw_type() const noexcept { return raw_type_; }
  /// The port a port event is about (1-based); 0 for any other event.
  std::uint8_t port() const noexcept { return port_; }
  /// The QP number a QP event is about; 0 for any other event.
  std::uint32_t qp_num() const noexcept { return qp_num_; }
  /// The device of the context that reported it.
  std::string_view device() const noexcept { return device_; }
  /// True for the events about a port (port_active, port_error, lid_change, pkey_change,
  /// sm_change, client_reregister, gid_change).
  bool is_port_event() const noexcept {
    switch (type_) {
    case AsyncEventType::port_active:
    case AsyncEventType::port_error:
    case AsyncEventType::lid_change:
    case AsyncEventType::pkey_change:
    case AsyncEventType::sm_change:
    case AsyncEventType::client_reregister:
    case AsyncEventType::gid_change: return true;
    default: return false;
    }
  }
  /// True for the events about a QP (qp_fatal, qp_request_error, qp_access_error,
  /// communication_established, sq_drained, path_migrated, path_migration_error,
  /// qp_last_wqe_reached).
  bool is_qp_event() const noexcept {
    switch (type_) {
    case AsyncEventType::qp_fatal:
    case AsyncEventType::qp_request_error:
    case AsyncEventType::qp_access_error:
    case AsyncEventType::communication_established:
    case AsyncEventType::sq_drained:
    case AsyncEventType::path_migrated:
    case AsyncEventType::path_migration_error:
    case AsyncEventType::qp_last_wqe_reached: return true;
    default: return false;
    }
  }
  /// True when the event means work on this device (or port, or QP) cannot go on: a port left
  /// ACTIVE, a QP or CQ failed, the device is gone.
  bool is_failure() const noexcept {
    switch (type_) {
    case AsyncEventType::cq_error:
    case AsyncEventType::qp_fatal:
    case AsyncEventType::qp_request_error:
    case AsyncEventType::qp_access_error:
    case AsyncEventType::path_migration_error:
    case AsyncEventType::device_fatal:
    case AsyncEventType::port_error:
    case AsyncEventType::srq_error:
    case AsyncEventType::wq_fatal: return true;
    default: return false;
    }
  }
  /// One line: "IBV_EVENT_PORT_ERR on rdma_en1 port 1".
  std::string describe() const {
    std::string s(async_event_name(type_));
    if (type_ == AsyncEventType::unknown) s += " (type " + std::to_string(raw_type_) + ")";
    s += " on ";
    s += device_[0] != '\0' ? device_ : "the device";
    if (port_ != 0) s += " port " + std::to_string(port_);
    if (qp_num_ != 0) s += " QP " + std::to_string(qp_num_);
    return s;
  }

private:
  AsyncEventType type_ = AsyncEventType::unknown;
  int raw_type_ = -1;
  std::uint8_t port_ = 0;
  std::uint32_t qp_num_ = 0;
  char device_[64] = {};
};

TBVERBS_NAMESPACE_END
