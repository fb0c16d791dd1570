/// @file diagnosis.hpp
/// The diagnosis catalogue: one table keyed by (platform, step, symbolic errno or
/// work-completion status, error kind), built from the field-failure reports.
#pragma once

#include "error.hpp"

TBVERBS_NAMESPACE_BEGIN

/// One row of the catalogue. Fields left at their wildcard match anything; the first row that
/// matches an Error wins, so specific rows come before general ones.
struct DiagnosisRule {
  Platform platform = Platform::any;  ///< Provider family, or any.
  Step step = Step::any;              ///< Failed step, or any.
  int sys_errno = -1;                 ///< errno (a <cerrno> name), 0 for "none", -1 for any.
  ErrorKind kind{};                   ///< Error kind, or the zero value for any.
  int wc_status = -1;                 ///< Work-completion status, or -1 for any.
  Diagnosis diagnosis;                ///< What the rule says.
};

/// The catalogue rows, most specific first.
inline constexpr DiagnosisRule diagnosis_catalogue[] = {
    {Platform::apple, Step::modify_qp_rtr, EINVAL, ErrorKind::verb_failed, -1,
     {"rtr-einval-thunderbolt",
      "The RTR transition was refused: the destination GID is zero or unset (the peer had no "
      "IPv4-mapped GID to advertise), the source GID is not the interface's ::ffff: entry, or the "
      "IPv4 address sits on bridge0 instead of the Thunderbolt member interface.",
      "Give each Thunderbolt interface an IPv4 address, one subnet per cable, on both Macs: "
      "`sudo networksetup -setmanual \"<service for enN>\" 169.254.10.1 255.255.0.0 \"\"` (or "
      "`sudo ifconfig enN inet 169.254.10.1 netmask 255.255.0.0 alias`), take the Thunderbolt "
      "Bridge down (`sudo ifconfig bridge0 down`), then check `ibv_devinfo -d rdma_enN -v | grep ffff`."}},
};

namespace detail {
constexpr bool rule_matches(const DiagnosisRule& r, const Error& e) noexcept {
  return (r.platform == Platform::any || r.platform == e.platform) &&
         (r.step == Step::any || r.step == e.step) &&
         (r.sys_errno == -1 || r.sys_errno == e.sys_errno) &&
         (r.kind == ErrorKind{} || r.kind == e.kind) &&
         (r.wc_status == -1 || r.wc_status == e.wc_status);
}
} // namespace detail

inline const Diagnosis* find_diagnosis(const Error& e) noexcept {
  for (const auto& r : diagnosis_catalogue)
    if (detail::rule_matches(r, e)) return &r.diagnosis;
  return nullptr;
}

constexpr std::string_view wc_status_name(int status) noexcept {
  // Values from rdma-core's enum ibv_wc_status; Apple's header is assumed to agree.
  constexpr std::string_view names[] = {
      "IBV_WC_SUCCESS",           "IBV_WC_LOC_LEN_ERR",       "IBV_WC_LOC_QP_OP_ERR",
      "IBV_WC_LOC_EEC_OP_ERR",    "IBV_WC_LOC_PROT_ERR",      "IBV_WC_WR_FLUSH_ERR",
      "IBV_WC_MW_BIND_ERR",       "IBV_WC_BAD_RESP_ERR",      "IBV_WC_LOC_ACCESS_ERR",
      "IBV_WC_REM_INV_REQ_ERR",   "IBV_WC_REM_ACCESS_ERR",    "IBV_WC_REM_OP_ERR",
      "IBV_WC_RETRY_EXC_ERR",     "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR",
      "IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR",    "IBV_WC_INV_EECN_ERR",
      "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",         "IBV_WC_RESP_TIMEOUT_ERR",
      "IBV_WC_GENERAL_ERR",       "IBV_WC_TM_ERR",            "IBV_WC_TM_RNDV_INCOMPLETE",
  };
  if (status >= 0 && static_cast<std::size_t>(status) < std::size(names)) return names[status];
  return "IBV_WC_UNKNOWN_STATUS";
}

constexpr std::string_view step_name(Step s) noexcept {
  switch (s) {
  case Step::any: return "any step";
  case Step::load_library: return "load verbs library";
  case Step::resolve_symbol: return "resolve verbs symbol";
  case Step::get_device_list: return "ibv_get_device_list";
  case Step::open_device: return "ibv_open_device";
  case Step::query_device: return "ibv_query_device";
  case Step::query_port: return "ibv_query_port";
  case Step::query_gid: return "ibv_query_gid";
  case Step::select_gid: return "select GID";
  case Step::revalidate_gid: return "revalidate GID";
  case Step::alloc_pd: return "ibv_alloc_pd";
  case Step::reg_mr: return "ibv_reg_mr";
  case Step::create_comp_channel: return "ibv_create_comp_channel";
  case Step::create_cq: return "ibv_create_cq";
  case Step::req_notify_cq: return "ibv_req_notify_cq";
  case Step::get_cq_event: return "ibv_get_cq_event";
  case Step::create_qp: return "ibv_create_qp";
  case Step::query_qp: return "ibv_query_qp";
  case Step::modify_qp_init: return "ibv_modify_qp(INIT)";
  case Step::modify_qp_rtr: return "ibv_modify_qp(RTR)";
  case Step::modify_qp_rts: return "ibv_modify_qp(RTS)";
  case Step::post_send: return "ibv_post_send";
  case Step::post_recv: return "ibv_post_recv";
  case Step::poll_cq: return "ibv_poll_cq";
  case Step::wait_cq: return "wait for completions";
  case Step::destroy: return "teardown";
  case Step::parse_endpoint: return "parse peer endpoint";
  case Step::check_endpoint: return "check peer endpoint";
  case Step::configure: return "configuration";
  case Step::side_channel: return "side channel";
  case Step::link_warmup: return "link warm-up";
  case Step::collective: return "collective";
  }
  return "unknown step";
}

constexpr std::string_view kind_name(ErrorKind k) noexcept {
  switch (k) {
  case ErrorKind::verb_failed: return "verb failed";
  case ErrorKind::library_not_found: return "verbs library not found";
  case ErrorKind::symbol_missing: return "required verbs symbol missing";
  case ErrorKind::no_device: return "no RDMA device";
  case ErrorKind::device_not_found: return "device not found";
  case ErrorKind::port_not_active: return "port not active";
  case ErrorKind::no_ipv4_gid: return "no IPv4-mapped GID";
  case ErrorKind::gid_not_found: return "no GID matches the address";
  case ErrorKind::gid_index_invalid: return "GID index not usable";
  case ErrorKind::gid_stale: return "GID entry changed since it was selected";
  case ErrorKind::wc_error: return "work completion error";
  case ErrorKind::timeout: return "deadline passed";
  case ErrorKind::peer_lost: return "peer lost";
  case ErrorKind::bad_frame: return "bad frame";
  case ErrorKind::incompatible_peer: return "incompatible peer";
  case ErrorKind::invalid_argument: return "invalid argument";
  case ErrorKind::unsupported: return "unsupported";
  case ErrorKind::capacity: return "capacity exceeded";
  case ErrorKind::result_mismatch: return "result mismatch";
  }
  return "unknown error";
}

TBVERBS_NAMESPACE_END
