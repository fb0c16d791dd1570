/// @file error.hpp
/// `tbverbs::Error`: what failed (step or verb), the error number as the verb reported it, the
/// work-completion status, the context (device, port, GID index) and a diagnosis (cause and remedy).
#pragma once

#include "config.hpp"
#include "detail/errno_names.hpp"
#include "result.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

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
};

/// The verbs provider family an error came from: the catalogue's remedies differ between them.
enum class Platform : std::uint8_t {
  any,        ///< Unknown provider, or a catalogue row that applies everywhere.
  apple,      ///< Apple's RDMA over Thunderbolt (librdma.dylib, devices rdma_enN, or its emulation).
  rdma_core,  ///< rdma-core on Linux (libibverbs.so.1, a RoCE or InfiniBand NIC).
};

/// A cause and a remedy from the diagnosis catalogue (`diagnosis.hpp`).
struct Diagnosis {
  std::string_view id;      ///< Stable short key, e.g. "rtr-no-ipv4-gid".
  std::string_view cause;   ///< Why this happens, in the user's terms.
  std::string_view remedy;  ///< What to do, with exact commands.
};

namespace detail {
/// A fixed-capacity, always NUL-terminated string: keeps Error trivially copyable and allocation-free.
template <std::size_t N> struct FixedString {
  char data[N] = {};
  constexpr FixedString() = default;
  FixedString(std::string_view s) noexcept { assign(s); } // NOLINT: implicit from text is the point
  void assign(std::string_view s) noexcept {
    const std::size_t n = std::min(s.size(), N - 1);
    // An empty view may have a null data(); memcpy with a null source is undefined even for
    // zero bytes (UBSan aborts on it), and Error::make passes an empty detail by default.
    if (n != 0) std::memcpy(data, s.data(), n);
    data[n] = '\0';
  }
  std::string_view view() const noexcept { return {data, std::strlen(data)}; }
  bool empty() const noexcept { return data[0] == '\0'; }
};
} // namespace detail

struct Error;
/// The catalogue entry that explains `e`, or nullptr. Defined in diagnosis.hpp.
inline const Diagnosis* find_diagnosis(const Error& e) noexcept;
/// The printable name of a work-completion status ("IBV_WC_RETRY_EXC_ERR"); defined in diagnosis.hpp.
constexpr std::string_view wc_status_name(int status) noexcept;
/// The printable name of a Step: the verb it wraps ("ibv_modify_qp(RTR)") or the step
/// ("side channel"); defined in diagnosis.hpp.
constexpr std::string_view step_name(Step s) noexcept;
/// The printable name of an ErrorKind; defined in diagnosis.hpp.
constexpr std::string_view kind_name(ErrorKind k) noexcept;

/// The error carried by every failed tbverbs::Result.
///
/// A small trivially-copyable value: nothing is formatted or allocated until `message()` is
/// called, so returning one costs no more than a few stores. `sys_errno` is the error number as
/// the verb reported it, through the verb's own convention (see `from_errno`, `from_return`,
/// `from_poll`); it is never a stale global errno.
struct Error {
  Step step = Step::any;                     ///< What failed.
  ErrorKind kind = ErrorKind::verb_failed;   ///< The condition, beyond the error number.
  Platform platform = Platform::any;         ///< Provider family (selects the remedies).
  int sys_errno = 0;                         ///< Positive errno as the verb reported it; 0 = none.
  int wc_status = -1;                        ///< Work-completion status, or -1 when there is none.
  int port = 0;                              ///< Port number, 0 when not known.
  int gid_index = -1;                        ///< GID table index involved, -1 when none.
  std::uint64_t wr_id = 0;                   ///< wr_id of a failed work completion.
  detail::FixedString<64> device;            ///< Device name, empty when not known.
  detail::FixedString<256> detail;           ///< Extra facts: a symbol, a path, the devices found.

  /// An error of `kind` at `step` with no error number.
  static Error make(Step step, ErrorKind kind, std::string_view detail_text = {}) noexcept {
    Error e;
    e.step = step;
    e.kind = kind;
    e.detail.assign(detail_text);
    return e;
  }
  /// A pointer-returning verb returned NULL: the number is in `errno` (0 when the verb set none).
  static Error from_errno(Step step, int errno_value = errno) noexcept {
    Error e;
    e.step = step;
    e.sys_errno = errno_value;
    return e;
  }
  /// `ibv_modify_qp`, `ibv_post_*` and friends return the number itself. Some providers return it
  /// negated (Apple's post_recv returned -12, hellas#35), so the sign is normalised.
  static Error from_return(Step step, int rc) noexcept {
    Error e;
    e.step = step;
    e.sys_errno = rc >= 0 ? rc : rc == INT_MIN ? INT_MAX : -rc; // no overflow on INT_MIN
    return e;
  }
  /// `ibv_poll_cq` returns a negative number on failure.
  static Error from_poll(int rc) noexcept { return from_return(Step::poll_cq, rc); }
  /// A work completion finished with `status`; its opcode is not trusted and not kept.
  static Error from_wc(int status, std::uint64_t failed_wr_id, int vendor_err = 0) noexcept {
    Error e;
    e.step = Step::poll_cq;
    e.kind = ErrorKind::wc_error;
    e.wc_status = status;
    e.wr_id = failed_wr_id;
    if (vendor_err != 0) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "vendor_err 0x%x", static_cast<unsigned>(vendor_err));
      e.detail.assign(buf);
    }
    return e;
  }

  /// Adds the device, port and GID index this error concerns.
  Error& on(std::string_view device_name, int port_num = 0, int gid = -1) noexcept {
    device.assign(device_name);
    if (port_num != 0) port = port_num;
    if (gid >= 0) gid_index = gid;
    return *this;
  }
  /// Sets the provider family, which selects the remedies.
  Error& from(Platform p) noexcept {
    platform = p;
    return *this;
  }
  /// Replaces the extra facts.
  Error& with_detail(std::string_view text) noexcept {
    detail.assign(text);
    return *this;
  }

  /// True when the error is `errno_value` (compare with \<cerrno\> names, never with numbers).
  bool is(int errno_value) const noexcept { return sys_errno == errno_value; }
  /// True when the error is of `k`.
  bool is(ErrorKind k) const noexcept { return kind == k; }

  /// The catalogue's cause and remedy for this error, or nullptr when it has none.
  const Diagnosis* diagnosis() const noexcept { return find_diagnosis(*this); }

  /// The whole report: what failed, the errno by name and number, the context, cause and remedy.
  std::string message() const {
    std::string m;
    m.reserve(256);
    m += step_name(step);
    if (kind == ErrorKind::wc_error) {
      m += ": work completion failed with ";
      m += wc_status_name(wc_status);
      m += " (" + std::to_string(wc_status) + ")";
      m += ", wr_id " + std::to_string(wr_id);
    } else if (kind == ErrorKind::verb_failed) {
      m += " failed";
    } else {
      m += ": ";
      m += kind_name(kind);
    }
    if (sys_errno != 0) {
      const auto name = detail::errno_name(sys_errno);
      m += " with ";
      m += name.empty() ? std::string_view("errno") : name;
      m += " (" + std::to_string(sys_errno) + ": " + std::strerror(sys_errno) + ")";
    } else if (kind == ErrorKind::verb_failed) {
      m += " (the verb set no errno)";
    }
    if (!device.empty() || port != 0 || gid_index >= 0) {
      m += " [";
      bool first = true;
      auto sep = [&] { if (!first) m += ", "; first = false; };
      if (!device.empty()) { sep(); m += "device "; m += device.view(); }
      if (port != 0) { sep(); m += "port " + std::to_string(port); }
      if (gid_index >= 0) { sep(); m += "GID index " + std::to_string(gid_index); }
      m += "]";
    }
    if (!detail.empty()) {
      m += ": ";
      m += detail.view();
    }
    if (const Diagnosis* d = diagnosis()) {
      m += "\n  cause: ";
      m += d->cause;
      m += "\n  remedy: ";
      m += d->remedy;
    }
    return m;
  }

  /// A std::error_code: the generic (errno) category when there is an errno, otherwise tbverbs'.
  std::error_code error_code() const noexcept;
};

static_assert(std::is_trivially_copyable_v<Error>, "Error must stay a cheap value");

/// The std::error_category of ErrorKind values.
inline const std::error_category& error_category() noexcept {
  struct Category final : std::error_category {
    const char* name() const noexcept override { return "tbverbs"; }
    std::string message(int v) const override {
      return std::string(kind_name(static_cast<ErrorKind>(v)));
    }
  };
  static const Category c;
  return c;
}

/// Makes a std::error_code from an ErrorKind (found by ADL for std::error_code's constructor).
inline std::error_code make_error_code(ErrorKind k) noexcept {
  return {static_cast<int>(k), error_category()};
}

inline std::error_code Error::error_code() const noexcept {
  if (sys_errno != 0) return {sys_errno, std::generic_category()};
  return make_error_code(kind);
}

/// A failed Result holding `e`: `return fail(Error::from_errno(Step::alloc_pd));`.
inline unexpected<Error> fail(const Error& e) noexcept { return unexpected<Error>(e); }

TBVERBS_NAMESPACE_END

/// ErrorKind converts to std::error_code.
template <> struct std::is_error_code_enum<tbverbs::ErrorKind> : std::true_type {};

#include "diagnosis.hpp"
