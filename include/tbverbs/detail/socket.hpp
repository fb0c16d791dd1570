/// @file socket.hpp
/// POSIX socket helpers of the side channel: an owned descriptor, deadlines for poll(), socket
/// options, SIGPIPE suppression, and connecting and listening with bounded retries.
#pragma once

#include "../config.hpp"
#include "../error.hpp"
#include "../host_port.hpp"
#include "../result.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// A point in time after which a side-channel wait gives up with ErrorKind::timeout.
using SideChannelDeadline = std::chrono::steady_clock::time_point;

namespace detail {
namespace sc {

/// An owned file descriptor, closed on destruction; move-only.
class UniqueFd {
public:
  UniqueFd() noexcept = default;
  /// Takes ownership of `fd` (-1 for none).
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  /// The descriptor, or -1.
  int get() const noexcept { return fd_; }
  /// Closes the held descriptor and holds `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

private:
  int fd_ = -1;
};

/// Milliseconds left until `dl` for poll(): rounded up, 0 when passed, capped to int.
inline int poll_ms(SideChannelDeadline dl) noexcept {
  const auto left = dl - std::chrono::steady_clock::now();
  if (left <= left.zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > 0x3fffffff ? 0x3fffffff : static_cast<int>(ms);
}

/// Close-on-exec, non-blocking, no SIGPIPE where the platform has SO_NOSIGPIPE, no Nagle delay,
/// and TCP keepalive so a host that vanishes without a FIN is eventually noticed.
inline void configure_socket(int fd, bool stream) noexcept {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  int one = 1;
#ifdef SO_NOSIGPIPE
  ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
  if (!stream) return;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle = 10, interval = 2, count = 3;
#if defined(TCP_KEEPIDLE)
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
#elif defined(TCP_KEEPALIVE)
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPALIVE, &idle, sizeof idle);
#endif
#ifdef TCP_KEEPINTVL
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
#endif
#ifdef TCP_KEEPCNT
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
  (void)idle;
  (void)interval;
  (void)count;
}

/// Keeps a send to a closed socket from killing the process with SIGPIPE where SO_NOSIGPIPE does
/// not exist (Linux): SIGPIPE is blocked for this thread during the send, and a SIGPIPE that the
/// send raised (and only that one) is consumed before the old mask is restored.
class SigpipeGuard {
public:
#ifdef SO_NOSIGPIPE
  SigpipeGuard() noexcept = default;
  /// Nothing to do: the socket has SO_NOSIGPIPE.
  void saw_epipe() noexcept {}
#else
  SigpipeGuard() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  /// Records that a send failed with EPIPE, so a SIGPIPE may now be pending.
  void saw_epipe() noexcept { epipe_ = true; }
  ~SigpipeGuard() {
    if (!blocked_) return;
    if (epipe_ && !was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      int sig = 0;
      if (sigismember(&pending, SIGPIPE) == 1) sigwait(&pipe_, &sig); // pending: returns at once
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
  bool blocked_ = false;
  bool epipe_ = false;
#endif
};

/// The numeric host of a socket address ("10.0.0.2", "::1").
inline std::string numeric_host(const sockaddr_storage& ss, socklen_t len) {
  char host[1025] = {}; // NI_MAXHOST, which macOS hides under strict POSIX
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) != 0)
    return "?";
  return host;
}
/// The port of a socket address.
inline std::uint16_t port_of(const sockaddr_storage& ss) noexcept {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}
/// "host:port" of the peer of `fd`.
inline std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown address";
  return HostPort{numeric_host(ss, len), port_of(ss)}.to_string();
}

/// "rank 2" or "ranks 2, 3, 5".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size() && i < 16; ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  if (ranks.size() > 16) s += ", ...";
  return s;
}

/// Connects to `to` with a non-blocking connect, retrying refused or unreachable attempts (when
/// `retry`) until `dl`. At the deadline: ErrorKind::timeout carrying the last attempt's errno.
inline Result<UniqueFd> connect_tcp(const HostPort& to, SideChannelDeadline dl, bool retry,
                                    std::string_view who, std::string_view what) {
  int last_errno = 0;
  std::string last_gai;
  auto interval = std::chrono::milliseconds(20);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(to.port);
    const int g = ::getaddrinfo(to.host.empty() ? nullptr : to.host.c_str(), port.c_str(), &hints, &res);
    if (g != 0) {
      last_gai = g == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(g);
    } else {
      std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
        if (fd.get() < 0) {
          last_errno = errno;
          continue;
        }
        configure_socket(fd.get(), true);
        int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
        if (rc == 0) return fd;
        if (errno != EINPROGRESS && errno != EINTR) {
          last_errno = errno;
          continue;
        }
        // The connect proceeds asynchronously (after EINTR too): wait for it to finish.
        pollfd p{fd.get(), POLLOUT, 0};
        do
          rc = ::poll(&p, 1, poll_ms(dl));
        while (rc < 0 && errno == EINTR);
        if (rc == 0) {
          last_errno = ETIMEDOUT;
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        if (rc < 0)
          err = errno;
        else if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
        if (err == 0) return fd;
        last_errno = err;
      }
      last_gai.clear();
    }
    const int left = poll_ms(dl);
    if (!retry || left == 0) break;
    std::this_thread::sleep_for(std::min(std::chrono::milliseconds(left), interval));
    interval = std::min(interval * 2, std::chrono::milliseconds(500));
  }
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  std::string d = std::string(who) + " could not connect to " + std::string(what) + " " + to.to_string() +
                  " within " + std::to_string(waited.count()) + " ms";
  if (!last_gai.empty())
    d += " (cannot resolve the host: " + last_gai + ")";
  else if (last_errno == ECONNREFUSED)
    d += " (refused: nothing listens there yet; is rank 0 running?)";
  else if (last_errno != 0)
    d += ": check the address, the route (route get <host>) and firewalls";
  Error e = Error::from_errno(Step::side_channel, last_gai.empty() ? last_errno : 0);
  e.kind = ErrorKind::timeout;
  return fail(e.with_detail(d));
}

/// Binds and listens on `at` (host empty or "*" = every address). Returns the socket.
inline Result<UniqueFd> listen_tcp(const HostPort& at, int backlog, std::string_view who) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(at.port);
  const bool any = at.host.empty() || at.host == "*";
  const int g = ::getaddrinfo(any ? nullptr : at.host.c_str(), port.c_str(), &hints, &res);
  if (g != 0)
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                            std::string(who) + " cannot resolve " + at.to_string() + ": " +
                                (g == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(g))));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  int last = 0;
  // With a wildcard host prefer IPv4 first: peers are most often given IPv4 addresses.
  for (int pass = 0; pass < 2; ++pass) {
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      if (any && (pass == 0) != (ai->ai_family == AF_INET)) continue;
      if (!any && pass == 1) continue;
      UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (fd.get() < 0) {
        last = errno;
        continue;
      }
      configure_socket(fd.get(), false);
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
        last = errno;
        continue;
      }
      return fd;
    }
  }
  std::string d = std::string(who) + " cannot listen on " + at.to_string();
  if (last == EADDRNOTAVAIL)
    d += ": the host is not an address of this machine (use it, or 0.0.0.0)";
  else if (last == EADDRINUSE)
    d += ": the port is taken (another job still running?)";
  return fail(Error::from_errno(Step::side_channel, last).with_detail(d));
}

/// A TCP port that is free on the loopback interface right now (0 when none could be found), for
/// the coordinator of a job whose ranks all run on this machine (the ring's and the probe's
/// --local). Another process may take it before it is used: callers retry or fail clearly.
inline int free_loopback_port() noexcept {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

} // namespace sc
} // namespace detail
TBVERBS_NAMESPACE_END
