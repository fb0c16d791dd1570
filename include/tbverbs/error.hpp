/// @file error.hpp
/// `tbverbs::Error`: what failed (step or verb), the error number as the verb reported it, the
/// work-completion status, the context (device, port, GID index) and a diagnosis (cause and remedy).
#pragma once

#include "config.hpp"
#include "detail/errno_names.hpp"
#include "error_names.hpp"
#include "result.hpp"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iosfwd>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

TBVERBS_NAMESPACE_BEGIN

/// A cause and a remedy from the diagnosis catalogue (`diagnosis.hpp`).
struct Diagnosis {
  std::string_view id;      ///< Stable short key, e.g. "rtr-no-ipv4-gid".
  std::string_view cause;   ///< Why this happens, in the user's terms.
  std::string_view remedy;  ///< What to do, with exact commands.
};

namespace detail {
/// A fixed-capacity, always NUL-terminated string: keeps Error trivially copyable and allocation-free.
/// Text longer than N - 1 characters is cut and ends in "..." so a reader knows it was cut.
template <std::size_t N> struct FixedString {
  static_assert(N > 4, "room for the truncation mark");
  char data[N] = {};
  constexpr FixedString() = default;
  FixedString(std::string_view s) noexcept { assign(s); } // NOLINT: implicit from text is the point
  // Out of line (an error path): inlined into a caller that builds the text from std::string
  // temporaries, GCC 12 reports false -Warray-bounds / -Wstringop-overread on the copy.
  [[gnu::noinline, gnu::cold]] void assign(std::string_view s) noexcept {
    const bool cut = s.size() > N - 1;
    const std::size_t n = cut ? N - 4 : s.size();
    // An empty view may have a null data(); memcpy with a null source is undefined even for
    // zero bytes (UBSan aborts on it), and Error::make passes an empty detail by default.
    if (n != 0) std::memmove(data, s.data(), n); // memmove: `s` may be this string's own text
    if (cut) std::memcpy(data + n, "...", 3);
    data[cut ? N - 1 : n] = '\0';
  }
  /// Appends `s` (cut with the same mark when it does not fit).
  [[gnu::noinline, gnu::cold]] void append(std::string_view s) noexcept {
    const std::size_t have = std::strlen(data);
    const bool cut = have + s.size() > N - 1;
    if (have >= N - 4 && cut) {
      std::memcpy(data + N - 4, "...", 4);
      return;
    }
    const std::size_t n = cut ? N - 4 - have : s.size();
    if (n != 0) std::memmove(data + have, s.data(), n);
    if (cut) std::memcpy(data + have + n, "...", 3);
    data[cut ? N - 1 : have + n] = '\0';
  }
  /// Appends printf-style text (cut with the mark when it does not fit). Allocates nothing.
  template <class... A> void appendf(const char* fmt, A... args) noexcept {
    char buf[N];
    const int w = std::snprintf(buf, sizeof buf, fmt, args...);
    if (w > 0) append(std::string_view(buf, static_cast<std::size_t>(w) < N ? static_cast<std::size_t>(w) : N - 1));
  }
  std::string_view view() const noexcept { return {data, std::strlen(data)}; }
  bool empty() const noexcept { return data[0] == '\0'; }
};
} // namespace detail

struct Error;
namespace detail {
/// The catalogue's lookup, set when diagnosis.hpp is part of the program (every translation unit
/// that includes it registers it before main), so the lean data-path header needs no catalogue:
/// a program that includes tbverbs.hpp, context.hpp or diagnosis.hpp anywhere gets remedies in
/// every Error, wherever it was made.
inline const Diagnosis* (*diagnosis_lookup)(const Error&) noexcept = nullptr;
} // namespace detail
/// The catalogue entry that explains `e`, or nullptr (also when diagnosis.hpp is not in the
/// program).
inline const Diagnosis* find_diagnosis(const Error& e) noexcept {
  return detail::diagnosis_lookup != nullptr ? detail::diagnosis_lookup(e) : nullptr;
}

/// The error carried by every failed tbverbs::Result.
///
/// A small trivially-copyable value: nothing is formatted or allocated until `message()` is
/// called, so returning one costs no more than a few stores. `sys_errno` is the error number as
/// the verb reported it, through the verb's own convention (see `from_errno`, `from_return`,
/// `from_poll`); it is never a stale global errno.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip static int fail_with
/// \until return 1;
/// \line }
/// \skip auto lib
/// \until lib.error()
struct Error {
  /// `qp_num` of an error that concerns no queue pair (QP numbers are 24-bit).
  static constexpr std::uint32_t no_qp = 0xffffffffu;

  Step step = Step::any;                     ///< What failed.
  ErrorKind kind = ErrorKind::verb_failed;   ///< The condition, beyond the error number.
  Platform platform = Platform::any;         ///< Provider family (selects the remedies).
  int sys_errno = 0;                         ///< Positive errno as the verb reported it; 0 = none.
  int wc_status = -1;                        ///< Work-completion status, or -1 when there is none.
  int port = 0;                              ///< Port number, 0 when not known.
  int gid_index = -1;                        ///< GID table index involved, -1 when none.
  std::uint64_t wr_id = 0;                   ///< wr_id of a failed work completion, or of the first work request a failed post did not post (the refused one when tbverbs refused the chain before the driver).
  std::uint32_t qp_num = no_qp;              ///< QP number a failed completion or post concerns; `no_qp` when none.
  int posted = -1;                           ///< Work requests of a failed post's chain that were posted before it stopped (0 when tbverbs refused it before the driver); -1 when not a post.
  int vendor_err = 0;                        ///< The provider's vendor_err of a failed work completion (0: none).
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
    e.vendor_err = vendor_err;
    if (vendor_err != 0) e.detail.appendf("vendor_err 0x%x", static_cast<unsigned>(vendor_err));
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

  /// The `<cerrno>` name of `sys_errno` ("ENODATA"), empty when there is none or it has no name.
  std::string_view errno_name() const noexcept { return sys_errno != 0 ? detail::errno_name(sys_errno) : std::string_view(); }
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
    // "ENOSYS (38: Function not implemented)", or "errno (4000: ...)" for a number without a name.
    auto errno_text = [&] {
      const auto name = detail::errno_name(sys_errno);
      return std::string(name.empty() ? std::string_view("errno") : name) + " (" + std::to_string(sys_errno) +
             ": " + std::strerror(sys_errno) + ")";
    };
    m += step_name(step);
    if (kind == ErrorKind::wc_error) {
      m += ": work completion failed with ";
      m += wc_status_name(wc_status);
      m += " (" + std::to_string(wc_status) + ")";
      m += ", wr_id " + std::to_string(wr_id);
      if (sys_errno != 0) m += ", errno " + errno_text();
    } else if (kind != ErrorKind::verb_failed && posted >= 0) {
      // A post tbverbs refused before calling the driver (a condition, not a driver failure):
      // "ibv_post_send: capacity, refused before the driver: ...".
      m += ": ";
      m += kind_name(kind);
      if (sys_errno != 0) m += ", errno " + errno_text();
      m += ", refused before the driver: " + std::to_string(posted) + " work request" + (posted == 1 ? "" : "s") +
           " of the chain posted; refused: wr_id " + std::to_string(wr_id);
    } else if (kind == ErrorKind::verb_failed) {
      // A verb that failed: "ibv_post_send failed with ENOMEM (12: ...) after posting ...".
      m += " failed";
      if (sys_errno != 0) m += " with " + errno_text();
      else m += " (the verb set no errno)";
      if (posted >= 0)
        m += " after posting " + std::to_string(posted) + " work request" + (posted == 1 ? "" : "s") +
             " of the chain; first not posted: wr_id " + std::to_string(wr_id);
    } else {
      // A condition, with the errno that came with it as a separate fact ("no RDMA device with
      // ENOSYS" would read as if the device had the errno).
      m += ": ";
      m += kind_name(kind);
      if (sys_errno != 0) m += ", errno " + errno_text();
    }
    if (!device.empty() || port != 0 || gid_index >= 0 || qp_num != no_qp) {
      m += " [";
      bool first = true;
      auto sep = [&] { if (!first) m += ", "; first = false; };
      if (!device.empty()) { sep(); m += "device "; m += device.view(); }
      if (qp_num != no_qp) { sep(); m += "QP " + std::to_string(qp_num); }
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

/// The whole report, as `message()` gives it.
inline std::string to_string(const Error& e) { return e.message(); }
/// Prints `e.message()`: `std::cerr << r.error() << "\n"`.
template <class Traits>
std::basic_ostream<char, Traits>& operator<<(std::basic_ostream<char, Traits>& os, const Error& e) {
  return os << e.message();
}

/// A failed Result holding `e`: `return fail(Error::from_errno(Step::alloc_pd));`.
inline unexpected<Error> fail(const Error& e) noexcept { return unexpected<Error>(e); }

TBVERBS_NAMESPACE_END

/// ErrorKind converts to std::error_code.
template <> struct std::is_error_code_enum<tbverbs::ErrorKind> : std::true_type {};

