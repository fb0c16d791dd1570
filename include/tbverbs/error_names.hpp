/// @file error_names.hpp
/// The Step, ErrorKind and Platform enumerations, the printable names of steps, error kinds and work-completion statuses, the `wc::` status
/// values and the `fact::` strings that Error::detail carries for the catalogue. Split from
/// diagnosis.hpp so that error.hpp, and with it the lean data-path header, does not compile the
/// catalogue's texts.
#pragma once

#include "config.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN

/// The step of the verbs flow (or the verb) that failed. The names follow the verbs they wrap.
enum class Step : std::uint8_t {
  any,                  ///< Wildcard in the diagnosis catalogue; never carried by an Error.
  load_library,         ///< dlopen of the verbs library.
  resolve_symbol,       ///< dlsym of a required verbs function.
  get_device_list,      ///< ibv_get_device_list, and finding no device at all.
  open_device,          ///< Finding a device by name and ibv_open_device.
  query_device,         ///< ibv_query_device.
  query_port,           ///< ibv_query_port.
  query_gid,            ///< ibv_query_gid.
  select_gid,           ///< Choosing a GID table entry.
  revalidate_gid,       ///< Re-reading a selected GID entry before it is used.
  alloc_pd,             ///< ibv_alloc_pd.
  reg_mr,               ///< ibv_reg_mr, and allocating the buffer to register.
  create_comp_channel,  ///< ibv_create_comp_channel.
  create_cq,            ///< ibv_create_cq.
  req_notify_cq,        ///< ibv_req_notify_cq.
  get_cq_event,         ///< ibv_get_cq_event.
  create_qp,            ///< ibv_create_qp.
  query_qp,             ///< ibv_query_qp.
  modify_qp_init,       ///< ibv_modify_qp RESET to INIT.
  modify_qp_rtr,        ///< ibv_modify_qp INIT to RTR (ready to receive).
  modify_qp_rts,        ///< ibv_modify_qp RTR to RTS (ready to send).
  post_send,            ///< ibv_post_send.
  post_recv,            ///< ibv_post_recv.
  poll_cq,              ///< ibv_poll_cq, and a failed work completion.
  wait_cq,              ///< Waiting for completions until a deadline.
  destroy,              ///< A destroy/dealloc/dereg/close verb during teardown.
  parse_endpoint,       ///< Decoding a peer's endpoint frame.
  check_endpoint,       ///< Checking that a peer's endpoint fits the local recipe.
  configure,            ///< Reading operator settings (environment variables, files, flags).
  side_channel,         ///< The TCP side channel (rendezvous, all-gather, barrier).
  link_warmup,          ///< Verifying a freshly connected link with a full-size warm-up.
  collective,           ///< A collective operation built on the library.
  modify_qp_err,        ///< ibv_modify_qp to ERR (QueuePair::modify_to_error: flush outstanding work).
  modify_qp_reset,      ///< ibv_modify_qp to RESET (QueuePair::reset, or a failed connect undone).
  make_sge,             ///< Slicing a memory region into a scatter-gather entry (MemoryRegion::sge).
  work_request,         ///< Building or checking a work request before it is posted.
  get_async_event,      ///< ibv_get_async_event: waiting for a device's asynchronous event.
};

/// What kind of condition an Error reports, beyond the raw error number.
enum class ErrorKind : std::uint8_t {
  verb_failed = 1,    ///< A verb returned an error; see `sys_errno`.
  library_not_found,  ///< The verbs library could not be loaded.
  symbol_missing,     ///< A required verbs function is missing from the library.
  no_device,          ///< The library loaded but lists no device.
  device_not_found,   ///< No device has the requested name.
  port_not_active,    ///< The port is not PORT_ACTIVE.
  no_ipv4_gid,        ///< No IPv4-mapped GID: only `fe80::` entries (the interface has no IPv4).
  gid_not_found,      ///< No GID entry matches the requested IPv4 address.
  gid_index_invalid,  ///< An operator-given GID index is out of range, empty or not usable.
  gid_stale,          ///< A selected GID entry changed since the table was read.
  wc_error,           ///< A work completion finished with an error status.
  timeout,            ///< A deadline passed (the peer may still be alive).
  peer_lost,          ///< The peer closed its side channel or died.
  bad_frame,          ///< A peer's frame is truncated, foreign, corrupt or from a newer version.
  incompatible_peer,  ///< A peer's endpoint does not fit the local recipe (QP type, MTU, ...).
  invalid_argument,   ///< The caller passed an argument the library refuses.
  unsupported,        ///< The provider lacks the feature (optional symbol or profile limit).
  capacity,           ///< A driver or recipe capacity would be exceeded.
  result_mismatch,    ///< A verified result differs from the expected value.
  /// Another rank gave up and said why (a side-channel abort frame). The detail names that rank
  /// and carries its words and the kind it claimed; that kind is the peer's claim, never this
  /// rank's own condition (a forged frame must not make a rank report a local "required verbs
  /// symbol missing").
  peer_aborted,
  /// The ranks made different calls (collective, element type, op, count, root or peer, or a call
  /// one rank made and another did not): found by comparing every call's identity with the peers'
  /// before any user memory is written. The detail names both calls.
  call_mismatch,
};

/// The last ErrorKind (for tables that cover them all).
inline constexpr ErrorKind last_error_kind = ErrorKind::call_mismatch;

/// The verbs provider family an error came from: the catalogue's remedies differ between them.
enum class Platform : std::uint8_t {
  any,        ///< Unknown provider, or a catalogue row that applies everywhere.
  apple,      ///< Apple's RDMA over Thunderbolt (librdma.dylib, devices rdma_enN, or its emulation).
  rdma_core,  ///< rdma-core on Linux (libibverbs.so.1, a RoCE or InfiniBand NIC).
};

/// Work-completion status values (`enum ibv_wc_status` in rdma-core's `verbs.h`), so catalogue
/// rows name statuses instead of numbers. Apple's header is assumed to use the same values
/// (docs/field-reports.md, "Error numbers and work-completion statuses": unverified; no source
/// lists which statuses Apple produces).
namespace wc {
inline constexpr int success = 0;            ///< IBV_WC_SUCCESS.
inline constexpr int loc_len_err = 1;        ///< IBV_WC_LOC_LEN_ERR: message longer than the receive.
inline constexpr int loc_qp_op_err = 2;      ///< IBV_WC_LOC_QP_OP_ERR: WR invalid for this QP.
inline constexpr int loc_prot_err = 4;       ///< IBV_WC_LOC_PROT_ERR: lkey does not cover the buffer.
inline constexpr int wr_flush_err = 5;       ///< IBV_WC_WR_FLUSH_ERR: QP in ERR flushed the WR.
inline constexpr int loc_access_err = 8;     ///< IBV_WC_LOC_ACCESS_ERR: local access violation.
inline constexpr int rem_access_err = 10;    ///< IBV_WC_REM_ACCESS_ERR: peer refused rkey/range.
inline constexpr int rem_op_err = 11;        ///< IBV_WC_REM_OP_ERR: peer could not complete.
inline constexpr int retry_exc_err = 12;     ///< IBV_WC_RETRY_EXC_ERR: transport retries exhausted.
inline constexpr int rnr_retry_exc_err = 13; ///< IBV_WC_RNR_RETRY_EXC_ERR: peer had no receive.
inline constexpr int fatal_err = 19;         ///< IBV_WC_FATAL_ERR.
inline constexpr int general_err = 21;       ///< IBV_WC_GENERAL_ERR.
} // namespace wc

/// Facts a producer that knows more than the verb told it (the device list, tbverbs-doctor)
/// writes into `Error::detail`, to select a more specific catalogue row
/// (`DiagnosisRule::detail_contains`). Nothing else about `detail` is ever matched.
namespace fact {
/// `rdma_ctl status` printed "disabled" (macOS).
inline constexpr std::string_view rdma_disabled = "rdma_ctl status: disabled";
/// The Mac's Thunderbolt ports are not Thunderbolt 5 (`system_profiler` shows no 80 Gb/s port).
inline constexpr std::string_view not_thunderbolt5 = "not Thunderbolt 5";
/// A registration was longer than the device's max_mr_size (16,384,000 bytes on Thunderbolt):
/// the registering code, which knows both numbers, writes "N bytes exceeds max_mr_size (M)".
inline constexpr std::string_view exceeds_max_mr_size = "exceeds max_mr_size";
/// A registration within max_mr_size was refused for its access flags (the registering code
/// writes it when the length cannot be the cause).
inline constexpr std::string_view access_refused = "access flags refused";
/// The GID at the RTR source index is not the one advertised (a caller or provider that routes
/// from a fixed index while the IPv4-mapped entry sits elsewhere, mlx PR #3389).
inline constexpr std::string_view gid_index_mismatch = "GID not at the RTR source index";
/// An InfiniBand end of the connection has LID 0: no subnet manager assigned one (QpRecipe's
/// connect writes it when RTR fails on an InfiniBand port).
inline constexpr std::string_view infiniband_lid_zero = "InfiniBand LID 0";
/// The two ends selected GIDs of different RoCE versions (QpRecipe's connect names it).
inline constexpr std::string_view roce_version_mismatch = "a RoCE v1 end and a RoCE v2 end";
/// A port in PORT_INIT: the link trained but the port was never configured; on InfiniBand no
/// subnet manager runs (Context::require_active_port writes the state this way).
inline constexpr std::string_view port_init = "state PORT_INIT";
/// A QP transition failed and the port is no longer ACTIVE (checked with ibv_query_port at once):
/// the port went down under it (a cable pulled, the peer gone), whatever errno the verb gave.
inline constexpr std::string_view port_left_active = "the port left ACTIVE";
/// Error::detail of a call on a handle that was closed or moved from (the verb was not called).
inline constexpr std::string_view closed_handle = "handle closed or moved from";
/// Error::detail of a work request whose inline payload exceeds the QP's granted max_inline_data.
inline constexpr std::string_view inline_too_large = "inline data above max_inline_data";
} // namespace fact

/// The printable name of a work-completion status ("IBV_WC_RETRY_EXC_ERR").
constexpr std::string_view wc_status_name(int status) noexcept {
  // Values from rdma-core's enum ibv_wc_status; Apple's header is assumed to agree.
  constexpr std::string_view names[] = {
      "IBV_WC_SUCCESS",
      "IBV_WC_LOC_LEN_ERR",
      "IBV_WC_LOC_QP_OP_ERR",
      "IBV_WC_LOC_EEC_OP_ERR",
      "IBV_WC_LOC_PROT_ERR",
      "IBV_WC_WR_FLUSH_ERR",
      "IBV_WC_MW_BIND_ERR",
      "IBV_WC_BAD_RESP_ERR",
      "IBV_WC_LOC_ACCESS_ERR",
      "IBV_WC_REM_INV_REQ_ERR",
      "IBV_WC_REM_ACCESS_ERR",
      "IBV_WC_REM_OP_ERR",
      "IBV_WC_RETRY_EXC_ERR",
      "IBV_WC_RNR_RETRY_EXC_ERR",
      "IBV_WC_LOC_RDD_VIOL_ERR",
      "IBV_WC_REM_INV_RD_REQ_ERR",
      "IBV_WC_REM_ABORT_ERR",
      "IBV_WC_INV_EECN_ERR",
      "IBV_WC_INV_EEC_STATE_ERR",
      "IBV_WC_FATAL_ERR",
      "IBV_WC_RESP_TIMEOUT_ERR",
      "IBV_WC_GENERAL_ERR",
      "IBV_WC_TM_ERR",
      "IBV_WC_TM_RNDV_INCOMPLETE",
  };
  if (status >= 0 && static_cast<std::size_t>(status) < sizeof names / sizeof names[0]) return names[status];
  return "IBV_WC_UNKNOWN_STATUS";
}

/// The printable name of a Step: the verb it wraps ("ibv_modify_qp(RTR)") or the step
/// ("side channel").
constexpr std::string_view step_name(Step s) noexcept {
  switch (s) {
  case Step::any:
    return "any step";
  case Step::load_library:
    return "load verbs library";
  case Step::resolve_symbol:
    return "resolve verbs symbol";
  case Step::get_device_list:
    return "ibv_get_device_list";
  case Step::open_device:
    return "ibv_open_device";
  case Step::query_device:
    return "ibv_query_device";
  case Step::query_port:
    return "ibv_query_port";
  case Step::query_gid:
    return "ibv_query_gid";
  case Step::select_gid:
    return "select GID";
  case Step::revalidate_gid:
    return "revalidate GID";
  case Step::alloc_pd:
    return "ibv_alloc_pd";
  case Step::reg_mr:
    return "ibv_reg_mr";
  case Step::create_comp_channel:
    return "ibv_create_comp_channel";
  case Step::create_cq:
    return "ibv_create_cq";
  case Step::req_notify_cq:
    return "ibv_req_notify_cq";
  case Step::get_cq_event:
    return "ibv_get_cq_event";
  case Step::create_qp:
    return "ibv_create_qp";
  case Step::query_qp:
    return "ibv_query_qp";
  case Step::modify_qp_init:
    return "ibv_modify_qp(INIT)";
  case Step::modify_qp_rtr:
    return "ibv_modify_qp(RTR)";
  case Step::modify_qp_rts:
    return "ibv_modify_qp(RTS)";
  case Step::post_send:
    return "ibv_post_send";
  case Step::post_recv:
    return "ibv_post_recv";
  case Step::poll_cq:
    return "ibv_poll_cq";
  case Step::wait_cq:
    return "wait for completions";
  case Step::destroy:
    return "teardown";
  case Step::parse_endpoint:
    return "parse peer endpoint";
  case Step::check_endpoint:
    return "check peer endpoint";
  case Step::configure:
    return "configuration";
  case Step::side_channel:
    return "side channel";
  case Step::link_warmup:
    return "link warm-up";
  case Step::collective:
    return "collective";
  case Step::modify_qp_err:
    return "ibv_modify_qp(ERR)";
  case Step::modify_qp_reset:
    return "ibv_modify_qp(RESET)";
  case Step::make_sge:
    return "MemoryRegion::sge";
  case Step::work_request:
    return "work request";
  case Step::get_async_event:
    return "ibv_get_async_event";
  }
  return "unknown step";
}

/// The printable name of an ErrorKind.
constexpr std::string_view kind_name(ErrorKind k) noexcept {
  switch (k) {
  case ErrorKind::verb_failed:
    return "verb failed";
  case ErrorKind::library_not_found:
    return "verbs library not found";
  case ErrorKind::symbol_missing:
    return "required verbs symbol missing";
  case ErrorKind::no_device:
    return "no RDMA device";
  case ErrorKind::device_not_found:
    return "device not found";
  case ErrorKind::port_not_active:
    return "port not active";
  case ErrorKind::no_ipv4_gid:
    return "no IPv4-mapped GID";
  case ErrorKind::gid_not_found:
    return "no GID matches the address";
  case ErrorKind::gid_index_invalid:
    return "GID index not usable";
  case ErrorKind::gid_stale:
    return "GID entry changed since it was selected";
  case ErrorKind::wc_error:
    return "work completion error";
  case ErrorKind::timeout:
    return "deadline passed";
  case ErrorKind::peer_lost:
    return "peer lost";
  case ErrorKind::bad_frame:
    return "bad frame";
  case ErrorKind::incompatible_peer:
    return "incompatible peer";
  case ErrorKind::invalid_argument:
    return "invalid argument";
  case ErrorKind::unsupported:
    return "unsupported";
  case ErrorKind::capacity:
    return "capacity exceeded";
  case ErrorKind::result_mismatch:
    return "result mismatch";
  case ErrorKind::peer_aborted:
    return "peer aborted";
  case ErrorKind::call_mismatch:
    return "ranks made different calls";
  }
  return "unknown error";
}

TBVERBS_NAMESPACE_END
