/// @file errno_names.hpp
/// Symbolic names of errno values, matched through `<cerrno>` macros so that the same table is
/// right on macOS and Linux (ENODATA is 96 on one and 61 on the other).
#pragma once

#include "../config.hpp"

#include <cerrno>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

/// One errno value and its symbolic name.
struct ErrnoName {
  int value;             ///< The value on this platform (from the `<cerrno>` macro).
  std::string_view name; ///< The macro's name, e.g. "ENODATA".
};

// A table rather than a switch: some names share a value on some systems
// (EOPNOTSUPP == ENOTSUP, EWOULDBLOCK == EAGAIN, EDEADLOCK == EDEADLK on Linux); the first
// entry wins, so only the first spelling of a shared value is ever printed. The names that are
// the *other* system's meaning of a number seen in field logs (ENOSTR is Linux's 60, macOS's
// ETIMEDOUT; EPFNOSUPPORT is Linux's 96, macOS's ENODATA) are listed so that a misread log
// shows what the number means here.
/// Every errno name tbverbs can print, in `<cerrno>` terms.
inline constexpr ErrnoName errno_names[] = {
    {EPERM, "EPERM"},
    {ENOENT, "ENOENT"},
    {ESRCH, "ESRCH"},
    {EINTR, "EINTR"},
    {EIO, "EIO"},
    {ENXIO, "ENXIO"},
    {E2BIG, "E2BIG"},
    {ENOEXEC, "ENOEXEC"},
    {EBADF, "EBADF"},
    {ECHILD, "ECHILD"},
    {EAGAIN, "EAGAIN"},
    {ENOMEM, "ENOMEM"},
    {EACCES, "EACCES"},
    {EFAULT, "EFAULT"},
    {EBUSY, "EBUSY"},
    {EEXIST, "EEXIST"},
    {ENODEV, "ENODEV"},
    {ENOTDIR, "ENOTDIR"},
    {EISDIR, "EISDIR"},
    {EINVAL, "EINVAL"},
    {ENFILE, "ENFILE"},
    {EMFILE, "EMFILE"},
    {ENOSPC, "ENOSPC"},
    {EROFS, "EROFS"},
    {EPIPE, "EPIPE"},
    {EDOM, "EDOM"},
    {ERANGE, "ERANGE"},
    {EDEADLK, "EDEADLK"},
    {ENAMETOOLONG, "ENAMETOOLONG"},
    {ENOSYS, "ENOSYS"},
    {ELOOP, "ELOOP"},
    {ENOMSG, "ENOMSG"},
    {ENODATA, "ENODATA"},
#ifdef ENOSTR // XSI STREAMS / BSD extension: hidden in some strict modes
    {ENOSTR, "ENOSTR"},
#endif
#ifdef ETIME // XSI STREAMS / BSD extension: hidden in some strict modes
    {ETIME, "ETIME"},
#endif
#ifdef ENOLINK // XSI STREAMS / BSD extension: hidden in some strict modes
    {ENOLINK, "ENOLINK"},
#endif
    {EPROTO, "EPROTO"},
    {EBADMSG, "EBADMSG"},
    {EOVERFLOW, "EOVERFLOW"},
    {ENOTSOCK, "ENOTSOCK"},
    {EDESTADDRREQ, "EDESTADDRREQ"},
    {EMSGSIZE, "EMSGSIZE"},
    {EPROTOTYPE, "EPROTOTYPE"},
    {ENOPROTOOPT, "ENOPROTOOPT"},
    {EPROTONOSUPPORT, "EPROTONOSUPPORT"},
    {EOPNOTSUPP, "EOPNOTSUPP"},
    {ENOTSUP, "ENOTSUP"},
#ifdef EPFNOSUPPORT // XSI STREAMS / BSD extension: hidden in some strict modes
    {EPFNOSUPPORT, "EPFNOSUPPORT"},
#endif
    {EAFNOSUPPORT, "EAFNOSUPPORT"},
    {EADDRINUSE, "EADDRINUSE"},
    {EADDRNOTAVAIL, "EADDRNOTAVAIL"},
    {ENETDOWN, "ENETDOWN"},
    {ENETUNREACH, "ENETUNREACH"},
    {ENETRESET, "ENETRESET"},
    {ECONNABORTED, "ECONNABORTED"},
    {ECONNRESET, "ECONNRESET"},
    {ENOBUFS, "ENOBUFS"},
    {EISCONN, "EISCONN"},
    {ENOTCONN, "ENOTCONN"},
    {ETIMEDOUT, "ETIMEDOUT"},
    {ECONNREFUSED, "ECONNREFUSED"},
#ifdef EHOSTDOWN // XSI STREAMS / BSD extension: hidden in some strict modes
    {EHOSTDOWN, "EHOSTDOWN"},
#endif
    {EHOSTUNREACH, "EHOSTUNREACH"},
    {EALREADY, "EALREADY"},
    {EINPROGRESS, "EINPROGRESS"},
    {ESTALE, "ESTALE"},
    {ECANCELED, "ECANCELED"},
    {EOWNERDEAD, "EOWNERDEAD"},
    {ENOTRECOVERABLE, "ENOTRECOVERABLE"},
    // Linux's kernel-internal ENOTSUPP; a Thunderbolt verbs driver on Linux leaked it from RTR
    // (hellas-perftest). It is not in <cerrno>, and no macOS errno uses the value.
    {524, "ENOTSUPP"},
};

/// The symbolic name of `value` ("EINVAL"), or an empty view when it is not in the table.
constexpr std::string_view errno_name(int value) noexcept {
  for (const auto& e : errno_names)
    if (e.value == value) return e.name;
  return {};
}

} // namespace detail
TBVERBS_NAMESPACE_END
