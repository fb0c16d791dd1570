/// @file errno_names.hpp
/// Symbolic names of errno values, matched through <cerrno> macros so that the same table is
/// right on macOS and Linux (ENODATA is 96 on one and 61 on the other).
#pragma once

#include "../config.hpp"

#include <cerrno>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN
namespace detail {

struct ErrnoName {
  int value;
  std::string_view name;
};

// A table rather than a switch: some names share a value on some systems
// (EOPNOTSUPP == ENOTSUP and EWOULDBLOCK == EAGAIN on Linux); the first entry wins.
inline constexpr ErrnoName errno_names[] = {
    {EPERM, "EPERM"},         {ENOENT, "ENOENT"},         {ESRCH, "ESRCH"},
    {EINTR, "EINTR"},         {EIO, "EIO"},               {ENXIO, "ENXIO"},
    {E2BIG, "E2BIG"},         {EBADF, "EBADF"},           {ECHILD, "ECHILD"},
    {EAGAIN, "EAGAIN"},       {ENOMEM, "ENOMEM"},         {EACCES, "EACCES"},
    {EFAULT, "EFAULT"},       {EBUSY, "EBUSY"},           {EEXIST, "EEXIST"},
    {ENODEV, "ENODEV"},       {ENOTDIR, "ENOTDIR"},       {EINVAL, "EINVAL"},
    {ENFILE, "ENFILE"},       {EMFILE, "EMFILE"},         {ENOSPC, "ENOSPC"},
    {EPIPE, "EPIPE"},         {ERANGE, "ERANGE"},         {ENOSYS, "ENOSYS"},
    {ENODATA, "ENODATA"},     {ETIMEDOUT, "ETIMEDOUT"},   {EOPNOTSUPP, "EOPNOTSUPP"},
    {ENOTSUP, "ENOTSUP"},     {ECONNREFUSED, "ECONNREFUSED"}, {ECONNRESET, "ECONNRESET"},
    {EHOSTUNREACH, "EHOSTUNREACH"}, {ENETUNREACH, "ENETUNREACH"}, {EADDRINUSE, "EADDRINUSE"},
    {EADDRNOTAVAIL, "EADDRNOTAVAIL"}, {EPROTO, "EPROTO"}, {EPROTONOSUPPORT, "EPROTONOSUPPORT"},
    {ENOTCONN, "ENOTCONN"},   {EMSGSIZE, "EMSGSIZE"},     {ENOBUFS, "ENOBUFS"},
    {EALREADY, "EALREADY"},   {EINPROGRESS, "EINPROGRESS"}, {ECANCELED, "ECANCELED"},
    {ESTALE, "ESTALE"},       {EOVERFLOW, "EOVERFLOW"},   {EBADMSG, "EBADMSG"},
    {ENOEXEC, "ENOEXEC"},     {ELOOP, "ELOOP"},           {ENAMETOOLONG, "ENAMETOOLONG"},
};

/// The symbolic name of `value` ("EINVAL"), or an empty view when it is not in the table.
constexpr std::string_view errno_name(int value) noexcept {
  for (const auto& e : errno_names)
    if (e.value == value) return e.name;
  return {};
}

} // namespace detail
TBVERBS_NAMESPACE_END
