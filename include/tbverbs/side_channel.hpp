/// @file side_channel.hpp
/// A TCP side channel for collective backends: rendezvous through a coordinator (rank 0), a full
/// mesh of connections, all-gather, barrier, point-to-point messages and a non-blocking liveness
/// probe. Framed, versioned, checksummed messages carrying a job token; every wait has a deadline.
///
/// Optional: the core umbrella header does not include it. POSIX sockets and `poll()` only, so it
/// builds on macOS and Linux alike.
#pragma once

#include "config.hpp"
#include "error.hpp"
#include "result.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

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
#include <sys/uio.h>
#include <unistd.h>

TBVERBS_NAMESPACE_BEGIN

/// A point in time after which a side-channel wait gives up with ErrorKind::timeout.
using SideChannelDeadline = std::chrono::steady_clock::time_point;

/// A parsed "host:port" (or "[ipv6]:port") address.
struct HostPort {
  std::string host;       ///< Host name or numeric address; empty means "any local address".
  std::uint16_t port = 0; ///< TCP port; 0 asks the system for a free one (listening only).

  /// "host:port", with brackets around an IPv6 literal.
  std::string to_string() const {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

/// Parses "host:port", "[ipv6]:port" or ":port" (any local address). A bare IPv6 address without
/// brackets is refused because its last colon is ambiguous.
/// Fails with ErrorKind::invalid_argument naming what is wrong.
[[nodiscard]] inline Result<HostPort> parse_host_port(std::string_view text) {
  auto bad = [&](const char* why) {
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                            "address \"" + std::string(text.substr(0, 120)) + "\": " + why));
  };
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return bad("missing ']' after the IPv6 address");
    hp.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("missing \":port\"");
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("missing \":port\"");
    if (text.find(':') != colon) return bad("put an IPv6 address in brackets: [addr]:port");
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5) return bad("the port must be a number from 0 to 65535");
  unsigned value = 0;
  for (char ch : port) {
    if (ch < '0' || ch > '9') return bad("the port must be a number from 0 to 65535");
    value = value * 10 + static_cast<unsigned>(ch - '0');
  }
  if (value > 65535) return bad("the port must be a number from 0 to 65535");
  hp.port = static_cast<std::uint16_t>(value);
  return hp;
}

/// A 64-bit job token derived from any text (FNV-1a), e.g. a launcher's job id or an environment
/// variable, so that every rank of one job computes the same token and a stray rank of another
/// job is refused.
constexpr std::uint64_t side_channel_token(std::string_view text) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : text) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// How a SideChannel finds its peers and how long it waits.
struct SideChannelOptions {
  int rank = 0; ///< This process' rank, 0 <= rank < size. Rank 0 is the coordinator.
  int size = 1; ///< Number of ranks in the job.
  /// "host:port" of rank 0. Rank 0 listens there (host must be one of its addresses, or empty /
  /// 0.0.0.0 for all; port 0 picks a free port, reported through on_listening); the other ranks
  /// connect there.
  std::string coordinator;
  std::uint64_t job_token = 0; ///< Same on every rank of a job; frames with another token are refused.
  /// Default bound of every wait: connect() as a whole, and each all_gather, barrier, send_to and
  /// recv_from called without an explicit deadline.
  std::chrono::milliseconds timeout{30000};
  /// Largest frame accepted from (or sent to) a peer; an all_gather result is one frame.
  std::uint32_t max_frame_bytes = 64u << 20;
  /// Called once by rank 0 with the port it listens on, before it waits for the other ranks
  /// (useful with port 0). Never called on other ranks.
  std::function<void(std::uint16_t)> on_listening;
};

namespace detail {
/// Internals of the side channel: frame codec, sockets and per-connection state.
namespace sc {

/// "TBSC": the first four bytes of every frame.
inline constexpr std::uint32_t frame_magic = 0x54425343u;
/// The frame layout this build speaks. Magic and version stay at bytes 0..5 in every version.
inline constexpr std::uint16_t protocol_version = 1;
/// Size of the fixed frame header.
inline constexpr std::size_t header_bytes = 32;

/// What a frame carries.
enum class FrameType : std::uint16_t {
  hello = 1,   ///< rank, size, listen port: identifies a connecting rank.
  welcome,     ///< rank 0 to the others: everyone joined, plus every rank's mesh address.
  gather_in,   ///< A rank's all_gather contribution, to rank 0.
  gather_out,  ///< Every rank's contribution, from rank 0.
  barrier_in,  ///< A rank reached the barrier, to rank 0.
  barrier_out, ///< Everyone reached the barrier, from rank 0.
  data,        ///< A point-to-point message.
  abort,       ///< The sender gave up: error kind, the rank where it started, and why.
};
/// One past the largest FrameType value.
inline constexpr std::uint16_t frame_type_end = 9;

/// A printable name for a frame type.
constexpr std::string_view type_name(FrameType t) noexcept {
  switch (t) {
  case FrameType::hello:
    return "hello";
  case FrameType::welcome:
    return "welcome";
  case FrameType::gather_in:
  case FrameType::gather_out:
    return "all_gather";
  case FrameType::barrier_in:
  case FrameType::barrier_out:
    return "barrier";
  case FrameType::data:
    return "data";
  case FrameType::abort:
    return "abort";
  }
  return "unknown";
}
/// True for the frames of a collective (which must be called in the same order on every rank).
constexpr bool is_collective(FrameType t) noexcept {
  return t == FrameType::gather_in || t == FrameType::gather_out || t == FrameType::barrier_in ||
         t == FrameType::barrier_out;
}

/// The decoded fixed header, all fields in host order. Wire layout (big-endian):
/// magic u32 | version u16 | type u16 | job token u64 | sender u32 | length u32 |
/// payload CRC-32 u32 | header CRC-32 u32 (over the 28 bytes before it).
struct FrameHeader {
  std::uint32_t magic = frame_magic;        ///< Must be frame_magic.
  std::uint16_t version = protocol_version; ///< Must not be newer than protocol_version.
  std::uint16_t type = 0;                   ///< A FrameType.
  std::uint64_t job_token = 0;              ///< The sender's job token.
  std::uint32_t sender = 0;                 ///< The sender's rank.
  std::uint32_t length = 0;                 ///< Payload bytes after the header.
  std::uint32_t payload_crc = 0;            ///< CRC-32 of the payload.
  std::uint32_t header_crc = 0;             ///< CRC-32 of header bytes 0..27.
};

/// A received, validated frame.
struct Frame {
  FrameType type = FrameType::data; ///< What it carries.
  int sender = -1;                  ///< The sender's rank.
  std::vector<std::byte> payload;   ///< Its payload.
};

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) lookup tables for slicing-by-8:
/// table[0] is the classic byte table, table[k] advances a byte k positions further.
inline constexpr auto crc32_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t i = 0; i < 256; ++i)
      t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  return t;
}();

/// CRC-32 of `data` (crc32("123456789") == 0xCBF43926). Eight bytes per step (slicing-by-8,
/// several times faster than a byte at a time: the side channel checksums up to 64 MiB frames).
constexpr std::uint32_t crc32(std::span<const std::byte> data) noexcept {
  const auto& t = crc32_tables;
  std::uint32_t c = 0xFFFFFFFFu;
  const std::byte* p = data.data();
  std::size_t n = data.size();
  auto u = [](std::byte b) { return static_cast<std::uint32_t>(b); };
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = c ^ (u(p[0]) | u(p[1]) << 8 | u(p[2]) << 16 | u(p[3]) << 24);
    const std::uint32_t hi = u(p[4]) | u(p[5]) << 8 | u(p[6]) << 16 | u(p[7]) << 24;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p)
    c = t[0][(c ^ u(*p)) & 0xFFu] ^ (c >> 8);
  return ~c;
}

/// Writes `v` big-endian into `p[0..n)`.
inline void put_be(std::byte* p, std::uint64_t v, int n) noexcept {
  for (int i = n - 1; i >= 0; --i) {
    p[i] = static_cast<std::byte>(v & 0xFFu);
    v >>= 8;
  }
}
/// Reads `n` big-endian bytes from `p`.
inline std::uint64_t get_be(const std::byte* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

/// Serialises `h` into `out`, computing the header CRC (h.header_crc is ignored).
inline void encode_header(const FrameHeader& h, std::span<std::byte, header_bytes> out) noexcept {
  std::byte* p = out.data();
  put_be(p + 0, h.magic, 4);
  put_be(p + 4, h.version, 2);
  put_be(p + 6, h.type, 2);
  put_be(p + 8, h.job_token, 8);
  put_be(p + 16, h.sender, 4);
  put_be(p + 20, h.length, 4);
  put_be(p + 24, h.payload_crc, 4);
  put_be(p + 28, crc32(std::span<const std::byte>(p, 28)), 4);
}

/// A header for a frame of `type` carrying `payload`, with its length and payload CRC filled in.
inline FrameHeader make_header(FrameType type, std::uint64_t token, int sender,
                               std::span<const std::byte> payload) noexcept {
  FrameHeader h;
  h.type = static_cast<std::uint16_t>(type);
  h.job_token = token;
  h.sender = static_cast<std::uint32_t>(sender);
  h.length = static_cast<std::uint32_t>(payload.size());
  h.payload_crc = crc32(payload);
  return h;
}

/// Header and payload in one buffer (tests write such buffers, corrupted or not, to sockets).
inline std::vector<std::byte> encode_frame(const FrameHeader& h, std::span<const std::byte> payload) {
  std::vector<std::byte> out(header_bytes + payload.size());
  encode_header(h, std::span<std::byte, header_bytes>(out.data(), header_bytes));
  if (!payload.empty()) std::memcpy(out.data() + header_bytes, payload.data(), payload.size());
  return out;
}

/// Decodes and checks a header received from `from` ("rank 2", or an address before the rank is
/// known): magic, version, header CRC, job token, type and length cap, in that order. Any failure
/// is ErrorKind::bad_frame naming what was wrong and who sent it.
inline Result<FrameHeader> decode_header(std::span<const std::byte, header_bytes> in,
                                         std::uint64_t expected_token, std::uint32_t max_length,
                                         std::string_view from) {
  const std::byte* p = in.data();
  FrameHeader h;
  h.magic = static_cast<std::uint32_t>(get_be(p + 0, 4));
  h.version = static_cast<std::uint16_t>(get_be(p + 4, 2));
  h.type = static_cast<std::uint16_t>(get_be(p + 6, 2));
  h.job_token = get_be(p + 8, 8);
  h.sender = static_cast<std::uint32_t>(get_be(p + 16, 4));
  h.length = static_cast<std::uint32_t>(get_be(p + 20, 4));
  h.payload_crc = static_cast<std::uint32_t>(get_be(p + 24, 4));
  h.header_crc = static_cast<std::uint32_t>(get_be(p + 28, 4));
  char buf[256];
  const std::string who(from.substr(0, 64));
  auto bad = [&] { return fail(Error::make(Step::side_channel, ErrorKind::bad_frame, buf)); };
  if (h.magic != frame_magic) {
    std::snprintf(buf, sizeof buf,
                  "%s sent a frame with foreign magic 0x%08x (not a tbverbs side channel: wrong port?)",
                  who.c_str(), static_cast<unsigned>(h.magic));
    return bad();
  }
  if (h.version > protocol_version || h.version == 0) {
    std::snprintf(buf, sizeof buf,
                  "%s speaks side-channel protocol version %u, this build speaks %u: run the same "
                  "tbverbs version on every host",
                  who.c_str(), static_cast<unsigned>(h.version), static_cast<unsigned>(protocol_version));
    return bad();
  }
  if (crc32(std::span<const std::byte>(p, 28)) != h.header_crc) {
    std::snprintf(buf, sizeof buf, "%s sent a frame whose header checksum does not match (corrupt frame)",
                  who.c_str());
    return bad();
  }
  if (h.job_token != expected_token) {
    std::snprintf(buf, sizeof buf,
                  "%s has job token 0x%016llx, this rank 0x%016llx: a rank of another job, or ranks "
                  "started with different tokens",
                  who.c_str(), static_cast<unsigned long long>(h.job_token),
                  static_cast<unsigned long long>(expected_token));
    return bad();
  }
  if (h.type == 0 || h.type >= frame_type_end) {
    std::snprintf(buf, sizeof buf, "%s sent a frame of unknown type %u", who.c_str(),
                  static_cast<unsigned>(h.type));
    return bad();
  }
  if (h.length > max_length) {
    std::snprintf(buf, sizeof buf, "%s announced a %lu-byte frame, above the %lu-byte cap", who.c_str(),
                  static_cast<unsigned long>(h.length), static_cast<unsigned long>(max_length));
    return bad();
  }
  return h;
}

/// Appends big-endian integers and byte strings to a payload.
struct Writer {
  std::vector<std::byte> out; ///< The payload so far.
  /// Appends the low `n` bytes of `v`, big-endian.
  void num(std::uint64_t v, int n) {
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(n));
    put_be(out.data() + at, v, n);
  }
  /// Appends raw bytes.
  void bytes(std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); }
  /// Appends the bytes of `s`.
  void text(std::string_view s) { bytes(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
};

/// Reads a payload with bounds checks: a short read sets `ok` to false and yields zeros.
struct Reader {
  std::span<const std::byte> in; ///< What is left.
  bool ok = true;                ///< False once a read ran past the end.
  /// Reads `n` big-endian bytes.
  std::uint64_t num(int n) {
    if (!ok || in.size() < static_cast<std::size_t>(n)) {
      ok = false;
      return 0;
    }
    const auto v = get_be(in.data(), n);
    in = in.subspan(static_cast<std::size_t>(n));
    return v;
  }
  /// Reads `n` raw bytes.
  std::span<const std::byte> bytes(std::size_t n) {
    if (!ok || in.size() < n) {
      ok = false;
      return {};
    }
    auto b = in.first(n);
    in = in.subspan(n);
    return b;
  }
  /// Reads `n` bytes as text.
  std::string text(std::size_t n) {
    auto b = bytes(n);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
};

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

/// One connection to one peer: the socket, bytes received but not yet a whole frame, whole frames
/// not yet asked for, and why it stopped working, if it did.
struct Conn {
  int rank = -1;                        ///< The peer's rank; -1 until its hello arrives.
  UniqueFd fd;                          ///< The socket.
  std::string who;                      ///< "rank 2", or the peer's address before the hello.
  std::vector<std::byte> rx;            ///< Receive buffer.
  std::size_t rx_len = 0;               ///< Valid bytes in rx.
  std::optional<FrameHeader> rx_header; ///< The header of the frame being received.
  std::deque<Frame> inbox;              ///< Whole frames waiting for a caller.
  std::size_t inbox_bytes = 0;          ///< Payload bytes in inbox.
  bool eof = false;                     ///< The peer closed the connection.
  int lost_errno = 0;                   ///< recv/send failed with this errno (ECONNRESET, EPIPE...).
  bool tx_broken = false;               ///< A send stopped mid-frame: nothing more can be sent.
  std::optional<Error> bad;             ///< The peer sent a bad frame: the connection was dropped.

  /// True when nothing more can be received.
  bool dead() const noexcept { return eof || lost_errno != 0 || bad.has_value() || fd.get() < 0; }
};

/// Reads what is available on `c` (one non-blocking recv) and splits it into validated frames in
/// c.inbox. A bad frame drops the connection and discards every byte after the last good frame.
inline void pump(Conn& c, std::uint64_t token, std::uint32_t max_len, std::size_t max_inbox) {
  if (c.dead()) return;
  const std::size_t want = header_bytes + (c.rx_header ? c.rx_header->length : 0);
  const std::size_t chunk = std::max<std::size_t>(want > c.rx_len ? want - c.rx_len : 0, 64 * 1024);
  if (c.rx.size() < c.rx_len + chunk) c.rx.resize(c.rx_len + chunk);
  const ssize_t n = ::recv(c.fd.get(), c.rx.data() + c.rx_len, chunk, 0);
  auto drop = [&](Error e) { // nothing after a bad frame is trusted: no garbage is kept
    c.bad = e;
    c.rx = {};
    c.rx_len = 0;
    c.rx_header.reset();
  };
  if (n < 0) {
    if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) c.lost_errno = errno;
    return;
  }
  if (n == 0) { // the peer closed: not an error number (a stale errno here misled mlx#4530)
    if (c.rx_len > 0) {
      drop(Error::make(Step::side_channel, ErrorKind::bad_frame,
                       c.who + " closed its side channel in the middle of a frame (truncated frame: " +
                           std::to_string(c.rx_len) + " of " +
                           std::to_string(header_bytes + (c.rx_header ? c.rx_header->length : 0)) +
                           " bytes)"));
    }
    c.eof = true;
    return;
  }
  c.rx_len += static_cast<std::size_t>(n);
  for (;;) {
    if (!c.rx_header) {
      if (c.rx_len < header_bytes) break;
      auto h = decode_header(std::span<const std::byte, header_bytes>(c.rx.data(), header_bytes), token,
                             max_len, c.who);
      if (!h) return drop(h.error());
      if (c.rank >= 0 && h->sender != static_cast<std::uint32_t>(c.rank))
        return drop(Error::make(Step::side_channel, ErrorKind::bad_frame,
                                c.who + "'s connection carried a frame claiming to be from rank " +
                                    std::to_string(h->sender)));
      c.rx_header = *h;
    }
    const std::size_t total = header_bytes + c.rx_header->length;
    if (c.rx_len < total) break;
    std::span<const std::byte> payload(c.rx.data() + header_bytes, c.rx_header->length);
    const auto type = static_cast<FrameType>(c.rx_header->type);
    if (crc32(payload) != c.rx_header->payload_crc)
      return drop(Error::make(Step::side_channel, ErrorKind::bad_frame,
                              c.who + " sent a " + std::string(type_name(type)) +
                                  " frame whose payload checksum does not match (corrupt frame)"));
    c.inbox.push_back(Frame{type, static_cast<int>(c.rx_header->sender),
                            std::vector<std::byte>(payload.begin(), payload.end())});
    c.inbox_bytes += payload.size();
    std::memmove(c.rx.data(), c.rx.data() + total, c.rx_len - total);
    c.rx_len -= total;
    c.rx_header.reset();
    if (c.inbox_bytes > max_inbox)
      return drop(Error::make(Step::side_channel, ErrorKind::bad_frame,
                              c.who + " sent more than " + std::to_string(max_inbox) +
                                  " bytes that no call on this rank asked for"));
  }
  if (c.rx_len == 0 && c.rx.size() > (1u << 20)) c.rx = {}; // give back a large frame's buffer
}

/// The state behind a SideChannel; heap-allocated so that poison() from another thread sees a
/// stable object while the SideChannel handle is moved.
struct State {
  SideChannelOptions opts;           ///< As given to connect().
  std::vector<Conn> conns;           ///< Indexed by rank; conns[rank] is unused.
  std::atomic<bool> poisoned{false}; ///< Set by poison(); every wait checks it.
  std::mutex poison_mutex;           ///< Guards poison_error.
  Error poison_error;                ///< Why the channel was poisoned.
  std::vector<int> poison_fds;       ///< Sockets poison() shuts down (fixed after connect).
  bool closed = false;               ///< close() was called.
  int abort_origin = -1;             ///< Rank where the last received abort started.
  std::string abort_text;            ///< Its text, for forwarding without re-prefixing.
  bool last_from_abort = false;      ///< The last error of wait_frames came from an abort frame.

  /// The rank's own name in details: "rank 3".
  std::string me() const { return "rank " + std::to_string(opts.rank); }
  /// Payload bytes a peer may queue beyond what is asked for.
  std::size_t max_inbox() const noexcept { return std::size_t{opts.max_frame_bytes} * 4; }
  /// Reads from `c` into its inbox.
  void pump_conn(Conn& c) { pump(c, opts.job_token, opts.max_frame_bytes, max_inbox()); }

  /// The error a poisoned or closed channel returns.
  Error stopped_error() {
    if (closed)
      return Error::make(Step::side_channel, ErrorKind::invalid_argument,
                         me() + "'s side channel was closed");
    std::lock_guard<std::mutex> lock(poison_mutex);
    return poison_error;
  }

  /// The error for a connection that stopped working, in the words of operation `op`.
  Error conn_error(const Conn& c, std::string_view op) const {
    if (c.bad) return *c.bad;
    std::string d;
    Error e;
    if (c.eof || c.fd.get() < 0) {
      e = Error::make(Step::side_channel, ErrorKind::peer_lost);
      d = c.who + " closed its side channel during " + std::string(op) + " (seen by " + me() + ")";
    } else if (c.tx_broken) {
      e = Error::make(Step::side_channel, ErrorKind::peer_lost);
      d = "an earlier send from " + me() + " to " + c.who +
          " stopped mid-frame (timed out); that connection is unusable";
    } else {
      e = Error::from_errno(Step::side_channel, c.lost_errno);
      e.kind = ErrorKind::peer_lost;
      d = "the side channel to " + c.who + " failed during " + std::string(op) + " (seen by " + me() +
          "): the peer is gone";
    }
    return e.with_detail(d);
  }

  /// The error an abort frame from `c` carries (and remembers it for forwarding).
  Error abort_error(const Conn& c, const Frame& f) {
    Reader r{f.payload};
    const auto kind = r.num(1);
    const auto origin = r.num(4);
    const std::string text = r.text(std::min<std::size_t>(r.in.size(), 400));
    if (!r.ok || kind == 0 || kind > static_cast<std::uint64_t>(ErrorKind::result_mismatch))
      return Error::make(Step::side_channel, ErrorKind::peer_lost,
                         c.who + " aborted the job (unreadable reason)");
    abort_origin = static_cast<int>(origin);
    abort_text = text;
    return Error::make(Step::side_channel, static_cast<ErrorKind>(kind),
                       "rank " + std::to_string(origin) + " aborted: " + text);
  }

  /// Removes and returns the first abort frame queued on `c`, as an error.
  std::optional<Error> take_abort(Conn& c) {
    for (auto it = c.inbox.begin(); it != c.inbox.end(); ++it) {
      if (it->type != FrameType::abort) continue;
      Error e = abort_error(c, *it);
      last_from_abort = true;
      c.inbox_bytes -= it->payload.size();
      c.inbox.erase(it);
      return e;
    }
    return std::nullopt;
  }

  /// The first queued frame of type `want` from `c`, in stream order: an abort queued before it is
  /// returned as an error (one queued after it is left for the next call). For a collective, the
  /// first queued collective frame must be of that type: another one means the ranks called
  /// collectives in different orders.
  Result<std::optional<Frame>> take(Conn& c, FrameType want) {
    for (auto it = c.inbox.begin(); it != c.inbox.end(); ++it) {
      if (it->type == FrameType::abort) {
        Error e = abort_error(c, *it);
        last_from_abort = true;
        c.inbox_bytes -= it->payload.size();
        c.inbox.erase(it);
        return fail(e);
      }
      if (it->type == want) {
        Frame f = std::move(*it);
        c.inbox_bytes -= f.payload.size();
        c.inbox.erase(it);
        return std::optional<Frame>(std::move(f));
      }
      if (is_collective(want) && is_collective(it->type))
        return fail(Error::make(Step::side_channel, ErrorKind::bad_frame,
                                c.who + " is in " + std::string(type_name(it->type)) + " while " + me() +
                                    " is in " + std::string(type_name(want)) +
                                    ": every rank must call the collectives in the same order"));
    }
    return std::optional<Frame>();
  }

  /// The abort payload for `e`: its kind, where it started, and its text.
  std::vector<std::byte> abort_payload(const Error& e, bool forwarded) const {
    Writer w;
    w.num(static_cast<std::uint64_t>(e.kind), 1);
    std::string text;
    if (forwarded) {
      w.num(static_cast<std::uint64_t>(abort_origin), 4);
      text = abort_text;
    } else {
      w.num(static_cast<std::uint64_t>(opts.rank), 4);
      text = std::string(e.detail.view());
      if (text.empty()) text = std::string(kind_name(e.kind));
      if (e.sys_errno != 0) {
        // errno numbers differ between macOS and Linux: send the name, never the number.
        const auto name = errno_name(e.sys_errno);
        text += " [" + (name.empty() ? std::to_string(e.sys_errno) : std::string(name)) + "]";
      }
    }
    w.text(std::string_view(text).substr(0, 400));
    return std::move(w.out);
  }

  /// Sends one frame to `c` before `dl`. While the socket is full it keeps reading from every peer
  /// into their queues, so ranks sending large messages to each other at once (a pair, or a whole
  /// ring) cannot deadlock on full socket buffers.
  Result<void> send_frame(Conn& c, FrameType type, std::span<const std::byte> payload, SideChannelDeadline dl,
                          std::string_view op) {
    // A peer that sent a bad frame may still be told why it is dropped (an abort frame).
    if (c.tx_broken || c.lost_errno != 0 || c.fd.get() < 0 || (c.bad && type != FrameType::abort))
      return fail(conn_error(c, op));
    if (payload.size() > opts.max_frame_bytes)
      return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                              me() + ": a " + std::to_string(payload.size()) + "-byte " + std::string(op) +
                                  " frame is above the " + std::to_string(opts.max_frame_bytes) +
                                  "-byte cap (SideChannelOptions::max_frame_bytes)"));
    std::array<std::byte, header_bytes> head;
    encode_header(make_header(type, opts.job_token, opts.rank, payload), head);
    const std::size_t total = header_bytes + payload.size();
    std::size_t sent = 0;
    SigpipeGuard guard;
    while (sent < total) {
      if (poisoned.load(std::memory_order_acquire)) {
        if (sent > 0) c.tx_broken = true;
        return fail(stopped_error());
      }
      iovec iov[2];
      int n_iov = 0;
      if (sent < header_bytes) {
        iov[n_iov++] = {head.data() + sent, header_bytes - sent};
        if (!payload.empty()) iov[n_iov++] = {const_cast<std::byte*>(payload.data()), payload.size()};
      } else {
        const std::size_t off = sent - header_bytes;
        iov[n_iov++] = {const_cast<std::byte*>(payload.data()) + off, payload.size() - off};
      }
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = n_iov;
      const ssize_t n = ::sendmsg(c.fd.get(), &m, 0);
      if (n >= 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        std::vector<pollfd> pfds{{c.fd.get(), POLLOUT | POLLIN, 0}};
        std::vector<Conn*> others{&c};
        for (auto& o : conns)
          if (&o != &c && !o.dead()) {
            pfds.push_back({o.fd.get(), POLLIN, 0});
            others.push_back(&o);
          }
        const int ms = poll_ms(dl);
        const int rc = ::poll(pfds.data(), static_cast<nfds_t>(pfds.size()), ms);
        const pollfd& p = pfds[0];
        if (rc < 0 && errno == EINTR) continue;
        for (std::size_t k = 1; rc > 0 && k < pfds.size(); ++k)
          if (pfds[k].revents != 0) pump_conn(*others[k]);
        if (rc == 0 && ms == 0) {
          if (sent > 0) c.tx_broken = true;
          return fail(Error::make(Step::side_channel, ErrorKind::timeout,
                                  me() + " could not send its " + std::string(op) + " frame to " + c.who +
                                      " before the deadline: " + c.who +
                                      " is not reading (stopped or busy)"));
        }
        if (rc > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
          pump_conn(c);
          if (c.dead()) {
            if (sent > 0) c.tx_broken = true;
            return fail(conn_error(c, op));
          }
        }
        continue;
      }
      if (err == EPIPE) guard.saw_epipe();
      c.lost_errno = err;
      if (sent > 0) c.tx_broken = true;
      return fail(conn_error(c, op));
    }
    return {};
  }

  /// Waits until every rank in `ranks` has sent a frame of type `want`; returns them in that order.
  /// A queued abort, a closed or failed connection, a poisoned channel or the deadline end the wait.
  /// The other peers are watched too, for aborts only (a peer that merely closed after finishing
  /// its work does not end the wait), and only while a wanted frame is still missing.
  Result<std::vector<Frame>> wait_frames(const std::vector<int>& ranks, FrameType want,
                                         SideChannelDeadline dl, std::string_view op) {
    std::vector<std::optional<Frame>> got(ranks.size());
    last_from_abort = false;
    const auto start = std::chrono::steady_clock::now();
    std::vector<pollfd> pfds;
    std::vector<int> pending;
    std::vector<Conn*> watched;
    for (;;) {
      if (poisoned.load(std::memory_order_acquire) || closed) return fail(stopped_error());
      pending.clear();
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        if (got[i]) continue;
        Conn& c = conns[static_cast<std::size_t>(ranks[i])];
        auto f = take(c, want);
        if (!f) return fail(f.error());
        if (*f) {
          got[i] = std::move(**f);
          continue;
        }
        if (c.dead()) return fail(conn_error(c, op));
        pending.push_back(static_cast<int>(i));
      }
      if (pending.empty()) break;
      watched.clear();
      for (auto& o : conns) {
        if (o.rank == opts.rank || std::find(ranks.begin(), ranks.end(), o.rank) != ranks.end()) continue;
        if (auto e = take_abort(o)) return fail(*e);
        if (!o.dead()) watched.push_back(&o);
      }
      pfds.clear();
      for (int i : pending)
        pfds.push_back(
            {conns[static_cast<std::size_t>(ranks[static_cast<std::size_t>(i)])].fd.get(), POLLIN, 0});
      for (Conn* o : watched)
        pfds.push_back({o->fd.get(), POLLIN, 0});
      const int ms = poll_ms(dl);
      const int rc = ::poll(pfds.data(), static_cast<nfds_t>(pfds.size()), ms);
      if (rc < 0) {
        if (errno == EINTR) continue;
        return fail(Error::from_errno(Step::side_channel, errno)
                        .with_detail(me() + ": poll failed during " + std::string(op)));
      }
      if (rc == 0 && ms == 0) {
        std::vector<int> missing;
        for (int i : pending)
          missing.push_back(ranks[static_cast<std::size_t>(i)]);
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        return fail(Error::make(Step::side_channel, ErrorKind::timeout,
                                me() + " waited " + std::to_string(waited.count()) + " ms in " +
                                    std::string(op) + " for " + rank_list(missing) +
                                    " (stopped, busy, or not calling " + std::string(op) + ")"));
      }
      for (std::size_t k = 0; k < pfds.size(); ++k) {
        if (pfds[k].revents == 0) continue;
        if (k < pending.size())
          pump_conn(conns[static_cast<std::size_t>(ranks[static_cast<std::size_t>(pending[k])])]);
        else
          pump_conn(*watched[k - pending.size()]);
      }
    }
    std::vector<Frame> out;
    out.reserve(got.size());
    for (auto& g : got)
      out.push_back(std::move(*g));
    return out;
  }

  /// Tells every connected peer why this rank gives up (best effort, bounded by 200 ms in all).
  void broadcast_abort(const Error& e, bool forwarded) {
    const auto payload = abort_payload(e, forwarded);
    const auto dl = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    for (auto& c : conns)
      if (c.fd.get() >= 0 && !c.tx_broken && c.lost_errno == 0)
        (void)send_frame(c, FrameType::abort, payload, dl, "abort");
  }

  /// A collective or the rendezvous failed with `e`: tell the peers (rank 0 forwards what it was
  /// told, so every rank names the rank where the failure started), then refuse further calls.
  unexpected<Error> fail_collective(const Error& e, bool from_abort_frame) {
    if (!poisoned.load(std::memory_order_acquire) && !closed) {
      if (!from_abort_frame || opts.rank == 0) broadcast_abort(e, from_abort_frame);
      std::lock_guard<std::mutex> lock(poison_mutex);
      poison_error = e;
      poisoned.store(true, std::memory_order_release);
    }
    return fail(e);
  }
};

/// A welcome payload: for each rank, the host and port its mesh listener is reachable at.
struct MeshEntry {
  std::string host;       ///< Numeric host, as rank 0 saw the rank's connection.
  std::uint16_t port = 0; ///< The rank's mesh listener port (0 for rank 0 and when unused).
};

} // namespace sc
} // namespace detail

/// A TCP side channel between the ranks of a job: rendezvous through rank 0, then a full mesh of
/// connections (every pair of ranks has its own socket).
///
/// - Collectives (all_gather, barrier) go through rank 0: each rank sends its part to rank 0,
///   which answers everyone once all parts arrived. Every rank must call them in the same order.
/// - send_to/recv_from go directly over the pair's own socket (no relay), so two ring neighbours
///   exchange messages without rank 0 taking part. Messages between two ranks arrive in order.
/// - Every wait has a deadline: ErrorKind::timeout names the rank(s) waited for and the operation;
///   a peer that closed or died is ErrorKind::peer_lost naming it; a corrupt, foreign, newer or
///   other-job frame is ErrorKind::bad_frame, and that connection is dropped (no garbage kept).
/// - When a collective fails on a rank, that rank sends an abort frame (kind and reason) to its
///   peers and rank 0 forwards what it learns, so every rank reports the rank where the failure
///   started ("rank 0 aborted: rank 2 closed its side channel during all_gather").
///   After a failed collective the channel refuses further calls. A send_to/recv_from timeout
///   leaves the channel usable (a partly received frame is kept and completed later).
///
/// Threading: one thread at a time calls the members, except poison(), which any thread may call
/// while another is blocked in a call (it unblocks it). Move-only; the destructor closes the
/// sockets, which the peers see as this rank closing its side channel.
class SideChannel {
public:
  /// An empty handle: every call fails with ErrorKind::invalid_argument.
  SideChannel() = default;

  /// Rendezvous: rank 0 listens on options.coordinator and accepts the other size-1 ranks (each
  /// identifies itself with a hello frame); ranks 1..size-1 connect there, retrying refused
  /// attempts until the deadline, so they may start before rank 0. Then the ranks connect the
  /// mesh and pass a barrier, so when connect() returns on one rank, every rank is connected.
  ///
  /// Errors: invalid_argument (bad options, a duplicate rank, a size mismatch); timeout (the
  /// coordinator unreachable, or ranks missing, named, at options.timeout); peer_lost; bad_frame
  /// (a wrong job token, a newer protocol version, a corrupt frame). A connection with another
  /// job's token to rank 0 is refused and mentioned in rank 0's timeout, not fatal to rank 0.
  [[nodiscard]] static Result<SideChannel> connect(const SideChannelOptions& options);

  /// This rank.
  int rank() const noexcept { return s_ ? s_->opts.rank : -1; }
  /// Number of ranks.
  int size() const noexcept { return s_ ? s_->opts.size : 0; }
  /// True unless default-constructed, moved from or closed.
  bool valid() const noexcept { return s_ && !s_->closed; }

  /// Every rank contributes `mine`; every rank gets all `size()` contributions in rank order.
  /// Bounded by options.timeout from the call. The result travels as one frame, so the sum of
  /// all contributions (plus 4 bytes each) must fit in options.max_frame_bytes.
  [[nodiscard]] Result<std::vector<std::vector<std::byte>>> all_gather(std::span<const std::byte> mine) {
    return all_gather(mine, default_deadline());
  }
  /// all_gather with an explicit deadline.
  [[nodiscard]] Result<std::vector<std::vector<std::byte>>> all_gather(std::span<const std::byte> mine,
                                                                       SideChannelDeadline deadline);

  /// Returns once every rank has called barrier(); bounded by options.timeout from the call.
  [[nodiscard]] Result<void> barrier() { return barrier(default_deadline()); }
  /// barrier with an explicit deadline.
  [[nodiscard]] Result<void> barrier(SideChannelDeadline deadline);

  /// Sends `bytes` to `peer` over their direct connection. Returns once the bytes are handed to
  /// the kernel (not when the peer read them). Bounded by options.timeout from the call.
  [[nodiscard]] Result<void> send_to(int peer, std::span<const std::byte> bytes) {
    return send_to(peer, bytes, default_deadline());
  }
  /// send_to with an explicit deadline.
  [[nodiscard]] Result<void> send_to(int peer, std::span<const std::byte> bytes,
                                     SideChannelDeadline deadline);

  /// The next message send_to'd by `peer` to this rank, in order. A timeout here is harmless: a
  /// later call receives the message. Bounded by options.timeout from the call.
  [[nodiscard]] Result<std::vector<std::byte>> recv_from(int peer) {
    return recv_from(peer, default_deadline());
  }
  /// recv_from with an explicit deadline.
  [[nodiscard]] Result<std::vector<std::byte>> recv_from(int peer, SideChannelDeadline deadline);

  /// Non-blocking liveness probe of every peer, for a completion wait loop (UC QPs report no error
  /// when the peer dies: field-failures row 21). Reads whatever whole frames are already there
  /// into the queues, so an abort a peer sent is reported (with its kind) rather than missed.
  /// Returns peer_lost naming the first peer that closed or died. Does not poison the channel.
  /// Costs one poll() per peer: call it every few milliseconds, not on every CQ poll. In a ring,
  /// probe all peers rather than only the neighbours: over the mesh, a dead rank's close and any
  /// rank's abort (say, a CQ deadline two hops away) then reach every rank directly.
  [[nodiscard]] Result<void> check_peers() noexcept;
  /// check_peers for one peer only.
  [[nodiscard]] Result<void> check_peer(int peer) noexcept;

  /// The IPv4 address of this host on the side channel's network (the local address of the
  /// connection to the coordinator; on rank 0, of the connection to rank 1), as {a, b, c, d}.
  /// GID selection can pick the IPv4-mapped GID (ffff prefix) of the interface that carries it.
  /// Fails with ErrorKind::unsupported when that connection is IPv6 or there is no connection.
  [[nodiscard]] Result<std::array<std::uint8_t, 4>> local_ipv4() const;

  /// Makes every current and later call fail with `cause`, and unblocks a call blocked in another
  /// thread (it shuts the sockets down; the peers see this rank close). Thread-safe, idempotent.
  void poison(const Error& cause) noexcept;
  /// poison() with ECANCELED and "rank N's side channel was poisoned by its owner".
  void poison() noexcept;
  /// Tells every peer why this rank gives up (an abort frame with `cause`'s kind and detail, best
  /// effort, at most 200 ms), then poison(cause). Peers waiting on this rank fail with `cause`'s
  /// kind and "rank N aborted: <detail>". Same thread as the other calls.
  void abort(const Error& cause) noexcept;
  /// Closes every socket now; later calls fail with invalid_argument. The destructor does the same.
  void close() noexcept;

private:
  SideChannelDeadline default_deadline() const noexcept {
    return std::chrono::steady_clock::now() + (s_ ? s_->opts.timeout : std::chrono::milliseconds(0));
  }
  Result<void> usable(std::string_view op) const;
  Result<void> usable_peer(int peer, std::string_view op) const;
  Result<std::vector<detail::sc::Frame>> collective(detail::sc::FrameType in, detail::sc::FrameType out,
                                                    std::span<const std::byte> mine,
                                                    std::vector<std::byte>* result, SideChannelDeadline dl,
                                                    std::string_view op);
  Result<void> rendezvous_root(SideChannelDeadline dl);
  Result<void> rendezvous_rank(SideChannelDeadline dl);
  Result<void> accept_ranks(int listener, std::vector<int> expect, SideChannelDeadline dl,
                            std::string_view op, std::vector<detail::sc::MeshEntry>* directory);

  std::unique_ptr<detail::sc::State> s_;
};

// ---------------------------------------------------------------------------------------------

inline Result<void> SideChannel::usable(std::string_view op) const {
  if (!s_ || s_->closed)
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                            std::string(op) + " on a closed or moved-from side channel"));
  if (s_->poisoned.load(std::memory_order_acquire)) return fail(s_->stopped_error());
  return {};
}

inline Result<void> SideChannel::usable_peer(int peer, std::string_view op) const {
  if (auto u = usable(op); !u) return u;
  if (peer < 0 || peer >= s_->opts.size || peer == s_->opts.rank)
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                            s_->me() + ": " + std::string(op) + " to rank " + std::to_string(peer) +
                                ", not another rank of 0.." + std::to_string(s_->opts.size - 1)));
  return {};
}

inline Result<SideChannel> SideChannel::connect(const SideChannelOptions& o) {
  const auto dl = std::chrono::steady_clock::now() + o.timeout;
  auto invalid = [](std::string d) {
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument, d));
  };
  if (o.size < 1 || o.size > 65536)
    return invalid("side channel size " + std::to_string(o.size) + " is not in 1..65536");
  if (o.rank < 0 || o.rank >= o.size)
    return invalid("side channel rank " + std::to_string(o.rank) + " is not in 0.." +
                   std::to_string(o.size - 1));
  if (o.max_frame_bytes < 4096) return invalid("max_frame_bytes must be at least 4096");
  SideChannel ch;
  ch.s_ = std::make_unique<detail::sc::State>();
  ch.s_->opts = o;
  ch.s_->conns.resize(static_cast<std::size_t>(o.size));
  for (int r = 0; r < o.size; ++r) {
    ch.s_->conns[static_cast<std::size_t>(r)].rank = r;
    ch.s_->conns[static_cast<std::size_t>(r)].who = "rank " + std::to_string(r);
  }
  if (o.size == 1) return ch;
  auto r = o.rank == 0 ? ch.rendezvous_root(dl) : ch.rendezvous_rank(dl);
  if (!r) return fail(r.error());
  for (auto& c : ch.s_->conns)
    if (c.fd.get() >= 0) ch.s_->poison_fds.push_back(c.fd.get());
  // Everyone has its mesh connections once everyone has passed this barrier.
  if (auto b = ch.barrier(dl); !b) return fail(b.error());
  return ch;
}

inline Result<void> SideChannel::accept_ranks(int listener, std::vector<int> expect, SideChannelDeadline dl,
                                              std::string_view op,
                                              std::vector<detail::sc::MeshEntry>* directory) {
  using namespace detail::sc;
  State& s = *s_;
  std::vector<Conn> strangers; // accepted, no hello yet
  std::vector<int> missing = expect;
  std::string notes;
  const auto start = std::chrono::steady_clock::now();
  auto joined_set = [&] {
    std::vector<int> j;
    for (int r : expect)
      if (std::find(missing.begin(), missing.end(), r) == missing.end()) j.push_back(r);
    return j;
  };
  auto fatal = [&](Conn* from, Error e) -> Result<void> {
    if (from) { // tell the offending process too, then drop it
      const auto payload = s.abort_payload(e, false);
      (void)s.send_frame(*from, FrameType::abort, payload,
                         std::chrono::steady_clock::now() + std::chrono::milliseconds(100), op);
    }
    return s.fail_collective(e, false);
  };
  std::vector<pollfd> pfds;
  std::vector<Conn*> owners;
  for (;;) {
    if (s.poisoned.load(std::memory_order_acquire)) return fail(s.stopped_error());
    // Rank 0 watches for an abort or a close while the mesh forms.
    if (s.opts.rank != 0) {
      Conn& c0 = s.conns[0];
      if (auto e = s.take_abort(c0)) return s.fail_collective(*e, true);
      if (c0.dead()) return s.fail_collective(s.conn_error(c0, op), false);
    }
    for (int r : joined_set()) {
      Conn& c = s.conns[static_cast<std::size_t>(r)];
      if (auto e = s.take_abort(c)) return s.fail_collective(*e, true);
      if (c.dead()) return s.fail_collective(s.conn_error(c, op), false);
    }
    for (std::size_t i = 0; i < strangers.size();) {
      Conn& c = strangers[i];
      bool drop = false;
      if (!c.inbox.empty()) {
        Frame f = std::move(c.inbox.front());
        c.inbox.pop_front();
        Reader rd{f.payload};
        const int rank = static_cast<int>(rd.num(4));
        const int size = static_cast<int>(rd.num(4));
        const auto port = static_cast<std::uint16_t>(rd.num(2));
        if (f.type != FrameType::hello || !rd.ok || static_cast<int>(f.sender) != rank) {
          notes = "; refused " + c.who + ": it did not start with a valid hello";
          drop = true;
        } else if (size != s.opts.size) {
          return fatal(&c, Error::make(Step::side_channel, ErrorKind::invalid_argument,
                                       "rank " + std::to_string(rank) + " (" + c.who +
                                           ") was started with size " + std::to_string(size) + ", " + s.me() +
                                           " with size " + std::to_string(s.opts.size)));
        } else if (std::find(expect.begin(), expect.end(), rank) == expect.end() ||
                   std::find(missing.begin(), missing.end(), rank) == missing.end()) {
          const bool dup = std::find(expect.begin(), expect.end(), rank) != expect.end();
          return fatal(&c, Error::make(Step::side_channel, ErrorKind::invalid_argument,
                                       std::string(dup ? "two processes claim rank " : "unexpected rank ") +
                                           std::to_string(rank) + " (the latter from " + c.who + ") in " +
                                           std::string(op) + " at " + s.me()));
        } else {
          Conn& slot = s.conns[static_cast<std::size_t>(rank)];
          const std::string addr = c.who;
          c.rank = rank;
          c.who = "rank " + std::to_string(rank);
          if (directory) {
            // The host rank 0 saw the connection come from is where the other ranks reach it.
            auto hp = parse_host_port(addr);
            (*directory)[static_cast<std::size_t>(rank)] = MeshEntry{hp ? hp->host : std::string(), port};
          }
          slot = std::move(c);
          missing.erase(std::find(missing.begin(), missing.end(), rank));
          strangers.erase(strangers.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
      } else if (c.bad) {
        // Another job's rank, a newer tbverbs, or a port scanner: answer with our token (so that
        // rank reports the mismatch), drop it, and keep waiting for our own ranks.
        notes = "; refused a connection: " + std::string(c.bad->detail.view());
        Error why = *c.bad;
        why.with_detail(s.me() + " refused this connection: " + std::string(c.bad->detail.view()));
        (void)s.send_frame(c, FrameType::abort, s.abort_payload(why, false),
                           std::chrono::steady_clock::now() + std::chrono::milliseconds(100), op);
        drop = true;
      } else if (c.dead()) {
        drop = true;
      }
      if (drop)
        strangers.erase(strangers.begin() + static_cast<std::ptrdiff_t>(i));
      else
        ++i;
    }
    if (missing.empty()) return {};

    pfds.clear();
    owners.clear();
    pfds.push_back({listener, POLLIN, 0});
    owners.push_back(nullptr);
    for (auto& c : strangers) {
      pfds.push_back({c.fd.get(), POLLIN, 0});
      owners.push_back(&c);
    }
    for (int r : joined_set()) {
      Conn& c = s.conns[static_cast<std::size_t>(r)];
      if (!c.dead()) {
        pfds.push_back({c.fd.get(), POLLIN, 0});
        owners.push_back(&c);
      }
    }
    if (s.opts.rank != 0 && !s.conns[0].dead()) {
      pfds.push_back({s.conns[0].fd.get(), POLLIN, 0});
      owners.push_back(&s.conns[0]);
    }
    const int ms = poll_ms(dl);
    const int rc = ::poll(pfds.data(), static_cast<nfds_t>(pfds.size()), ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return s.fail_collective(Error::from_errno(Step::side_channel, errno)
                                   .with_detail(s.me() + ": poll failed in " + std::string(op)),
                               false);
    }
    if (rc == 0 && ms == 0) {
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      return s.fail_collective(
          Error::make(
              Step::side_channel, ErrorKind::timeout,
              s.me() + " waited " + std::to_string(waited.count()) + " ms in " + std::string(op) + " for " +
                  rank_list(missing) + " to connect (not started, crashed, or cannot reach " +
                  (s.opts.rank == 0 ? "the coordinator " + s.opts.coordinator : std::string("this rank")) +
                  ")" + notes),
          false);
    }
    // Pump first (owners point into strangers, which accepting below may reallocate).
    for (std::size_t k = 1; k < pfds.size(); ++k)
      if (pfds[k].revents != 0) s.pump_conn(*owners[k]);
    if (pfds[0].revents != 0) {
      for (;;) {
        const int fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          break; // EAGAIN, or a transient error (EMFILE...): poll again
        }
        configure_socket(fd, true);
        Conn c;
        c.fd = UniqueFd(fd);
        c.who = peer_name(fd);
        strangers.push_back(std::move(c));
      }
    }
  }
}

inline Result<void> SideChannel::rendezvous_root(SideChannelDeadline dl) {
  using namespace detail::sc;
  State& s = *s_;
  auto at = parse_host_port(s.opts.coordinator);
  if (!at) return fail(at.error());
  auto listener = listen_tcp(*at, std::max(128, s.opts.size), "rank 0");
  if (!listener) return fail(listener.error());
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listener->get(), reinterpret_cast<sockaddr*>(&ss), &len);
  if (s.opts.on_listening) s.opts.on_listening(port_of(ss));
  std::vector<int> expect;
  for (int r = 1; r < s.opts.size; ++r)
    expect.push_back(r);
  std::vector<MeshEntry> directory(static_cast<std::size_t>(s.opts.size));
  // As in collectives, rank 0 gives up a little earlier so the others hear which rank is missing.
  const auto now = std::chrono::steady_clock::now();
  const auto margin = std::min<std::chrono::steady_clock::duration>((dl - now) / 10, std::chrono::seconds(1));
  if (auto r = accept_ranks(listener->get(), expect, dl > now ? dl - margin : dl, "rendezvous", &directory);
      !r)
    return r;
  listener->reset(); // late strays are refused from now on
  Writer w;
  w.num(static_cast<std::uint64_t>(s.opts.size), 4);
  for (const auto& e : directory) {
    w.num(e.port, 2);
    w.num(e.host.size(), 2);
    w.text(e.host);
  }
  for (int r = 1; r < s.opts.size; ++r)
    if (auto sent =
            s.send_frame(s.conns[static_cast<std::size_t>(r)], FrameType::welcome, w.out, dl, "rendezvous");
        !sent)
      return s.fail_collective(sent.error(), false);
  return {};
}

inline Result<void> SideChannel::rendezvous_rank(SideChannelDeadline dl) {
  using namespace detail::sc;
  State& s = *s_;
  auto at = parse_host_port(s.opts.coordinator);
  if (!at) return fail(at.error());
  if (at->host.empty() || at->port == 0)
    return fail(
        Error::make(Step::side_channel, ErrorKind::invalid_argument,
                    s.me() + " needs the coordinator's host and port, got \"" + s.opts.coordinator + "\""));
  auto fd = connect_tcp(*at, dl, true, s.me(), "coordinator");
  if (!fd) return fail(fd.error());
  Conn& c0 = s.conns[0];
  c0.fd = std::move(*fd);
  c0.who = "rank 0 (coordinator " + at->to_string() + ")";
  // The mesh listener sits on the address this host reaches the coordinator from.
  UniqueFd listener;
  std::uint16_t mesh_port = 0;
  const bool mesh = s.opts.size > 2;
  if (mesh) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(c0.fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    auto l = listen_tcp(HostPort{numeric_host(ss, len), 0}, 128, s.me());
    if (!l) return fail(l.error());
    listener = std::move(*l);
    len = sizeof ss;
    ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    mesh_port = port_of(ss);
  }
  Writer hello;
  hello.num(static_cast<std::uint64_t>(s.opts.rank), 4);
  hello.num(static_cast<std::uint64_t>(s.opts.size), 4);
  hello.num(mesh_port, 2);
  if (auto r = s.send_frame(c0, FrameType::hello, hello.out, dl, "rendezvous"); !r) return fail(r.error());
  auto welcome = s.wait_frames({0}, FrameType::welcome, dl, "rendezvous");
  if (!welcome) return fail(welcome.error());
  Reader rd{welcome->front().payload};
  const auto n = rd.num(4);
  std::vector<MeshEntry> dir;
  for (std::uint64_t i = 0; rd.ok && n == static_cast<std::uint64_t>(s.opts.size) && i < n; ++i) {
    MeshEntry e;
    e.port = static_cast<std::uint16_t>(rd.num(2));
    e.host = rd.text(static_cast<std::size_t>(rd.num(2)));
    dir.push_back(std::move(e));
  }
  if (!rd.ok || dir.size() != static_cast<std::size_t>(s.opts.size))
    return s.fail_collective(
        Error::make(Step::side_channel, ErrorKind::bad_frame, c0.who + " sent an unreadable welcome frame"),
        false);
  if (!mesh) return {};
  // Connect to the lower ranks (their listeners exist before their hello), then accept the higher.
  for (int r = 1; r < s.opts.rank; ++r) {
    const auto& e = dir[static_cast<std::size_t>(r)];
    Conn& c = s.conns[static_cast<std::size_t>(r)];
    auto f = connect_tcp(HostPort{e.host, e.port}, dl, true, s.me(), "rank " + std::to_string(r) + " at");
    if (!f) return s.fail_collective(f.error(), false);
    c.fd = std::move(*f);
    if (auto sent = s.send_frame(c, FrameType::hello, hello.out, dl, "rendezvous"); !sent)
      return s.fail_collective(sent.error(), false);
  }
  std::vector<int> expect;
  for (int r = s.opts.rank + 1; r < s.opts.size; ++r)
    expect.push_back(r);
  return accept_ranks(listener.get(), expect, dl, "rendezvous (mesh)", nullptr);
}

inline Result<std::vector<detail::sc::Frame>>
SideChannel::collective(detail::sc::FrameType in, detail::sc::FrameType out, std::span<const std::byte> mine,
                        std::vector<std::byte>* result, SideChannelDeadline dl, std::string_view op) {
  using namespace detail::sc;
  State& s = *s_;
  if (s.opts.rank != 0) {
    if (auto r = s.send_frame(s.conns[0], in, mine, dl, op); !r) return s.fail_collective(r.error(), false);
    auto got = s.wait_frames({0}, out, dl, op);
    if (!got) return s.fail_collective(got.error(), s.last_from_abort);
    return got;
  }
  // Rank 0 gives up a little before the others, so they hear which rank stalled before their own
  // deadline passes and they would only be able to name rank 0.
  const auto now = std::chrono::steady_clock::now();
  const auto margin = std::min<std::chrono::steady_clock::duration>((dl - now) / 10, std::chrono::seconds(1));
  std::vector<int> others;
  for (int r = 1; r < s.opts.size; ++r)
    others.push_back(r);
  auto got = s.wait_frames(others, in, dl > now ? dl - margin : dl, op);
  if (!got) return s.fail_collective(got.error(), s.last_from_abort);
  if (result) {
    // Build the answer: count, then each contribution with its length, rank order.
    Writer w;
    w.num(static_cast<std::uint64_t>(s.opts.size), 4);
    w.num(mine.size(), 4);
    w.bytes(mine);
    for (auto& f : *got) {
      w.num(f.payload.size(), 4);
      w.bytes(f.payload);
    }
    if (w.out.size() > s.opts.max_frame_bytes)
      return s.fail_collective(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                                           "all_gather result of " + std::to_string(w.out.size()) +
                                               " bytes is above the " +
                                               std::to_string(s.opts.max_frame_bytes) + "-byte frame cap"),
                               false);
    *result = std::move(w.out);
  }
  for (int r = 1; r < s.opts.size; ++r)
    if (auto sent =
            s.send_frame(s.conns[static_cast<std::size_t>(r)], out,
                         result ? std::span<const std::byte>(*result) : std::span<const std::byte>(), dl, op);
        !sent)
      return s.fail_collective(sent.error(), false);
  return got;
}

inline Result<std::vector<std::vector<std::byte>>> SideChannel::all_gather(std::span<const std::byte> mine,
                                                                           SideChannelDeadline dl) {
  using namespace detail::sc;
  if (auto u = usable("all_gather"); !u) return fail(u.error());
  State& s = *s_;
  if (mine.size() > s.opts.max_frame_bytes)
    return fail(Error::make(Step::side_channel, ErrorKind::invalid_argument,
                            s.me() + ": all_gather contribution of " + std::to_string(mine.size()) +
                                " bytes is above the frame cap"));
  std::vector<std::vector<std::byte>> all;
  if (s.opts.size == 1) {
    all.emplace_back(mine.begin(), mine.end());
    return all;
  }
  std::vector<std::byte> packed;
  auto got = collective(FrameType::gather_in, FrameType::gather_out, mine, &packed, dl, "all_gather");
  if (!got) return fail(got.error());
  std::span<const std::byte> wire = s.opts.rank == 0 ? std::span<const std::byte>(packed)
                                                     : std::span<const std::byte>(got->front().payload);
  Reader rd{wire};
  const auto n = rd.num(4);
  for (std::uint64_t i = 0; rd.ok && n == static_cast<std::uint64_t>(s.opts.size) && i < n; ++i) {
    auto b = rd.bytes(static_cast<std::size_t>(rd.num(4)));
    all.emplace_back(b.begin(), b.end());
  }
  if (!rd.ok || all.size() != static_cast<std::size_t>(s.opts.size) || !rd.in.empty())
    return s.fail_collective(
        Error::make(Step::side_channel, ErrorKind::bad_frame, "rank 0 sent an unreadable all_gather result"),
        false);
  return all;
}

inline Result<void> SideChannel::barrier(SideChannelDeadline dl) {
  using namespace detail::sc;
  if (auto u = usable("barrier"); !u) return fail(u.error());
  if (s_->opts.size == 1) return {};
  auto got = collective(FrameType::barrier_in, FrameType::barrier_out, {}, nullptr, dl, "barrier");
  if (!got) return fail(got.error());
  return {};
}

inline Result<void> SideChannel::send_to(int peer, std::span<const std::byte> bytes, SideChannelDeadline dl) {
  if (auto u = usable_peer(peer, "send_to"); !u) return u;
  return s_->send_frame(s_->conns[static_cast<std::size_t>(peer)], detail::sc::FrameType::data, bytes, dl,
                        "send_to");
}

inline Result<std::vector<std::byte>> SideChannel::recv_from(int peer, SideChannelDeadline dl) {
  if (auto u = usable_peer(peer, "recv_from"); !u) return fail(u.error());
  auto got = s_->wait_frames({peer}, detail::sc::FrameType::data, dl, "recv_from");
  if (!got) return fail(got.error());
  return std::move(got->front().payload);
}

inline Result<void> SideChannel::check_peer(int peer) noexcept try {
  using namespace detail::sc;
  if (auto u = usable_peer(peer, "check_peer"); !u) return u;
  State& s = *s_;
  Conn& c = s.conns[static_cast<std::size_t>(peer)];
  // Drain whatever is readable now: whole frames go to the queue, an abort or a close shows.
  for (int round = 0; round < 64 && !c.dead(); ++round) {
    pollfd p{c.fd.get(), POLLIN, 0};
    const int rc = ::poll(&p, 1, 0);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) break;
    s.pump_conn(c);
  }
  if (auto e = s.take_abort(c)) return fail(*e);
  if (c.dead()) return fail(s.conn_error(c, "check_peers"));
  return {};
} catch (...) { // std::bad_alloc from a queue or an error text
  return fail(Error::from_errno(Step::side_channel, ENOMEM).with_detail("check_peers: out of memory"));
}

inline Result<void> SideChannel::check_peers() noexcept {
  if (!s_ || s_->closed || s_->poisoned.load(std::memory_order_acquire)) return check_peer(-1);
  for (int r = 0; r < s_->opts.size; ++r)
    if (r != s_->opts.rank)
      if (auto ok = check_peer(r); !ok) return ok;
  return {};
}

inline Result<std::array<std::uint8_t, 4>> SideChannel::local_ipv4() const {
  if (!s_ || s_->closed || s_->opts.size < 2)
    return fail(Error::make(Step::side_channel, ErrorKind::unsupported,
                            "local_ipv4: this side channel has no connection"));
  const auto& c = s_->conns[s_->opts.rank == 0 ? 1 : 0];
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (c.fd.get() < 0 || ::getsockname(c.fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return fail(Error::from_errno(Step::side_channel, c.fd.get() < 0 ? EBADF : errno)
                    .with_detail("local_ipv4: getsockname on the coordinator connection"));
  std::array<std::uint8_t, 4> out{};
  if (ss.ss_family == AF_INET) {
    std::memcpy(out.data(), &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, 4);
    return out;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr.s6_addr;
    static constexpr std::uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a, mapped, 12) == 0) {
      std::memcpy(out.data(), a + 12, 4);
      return out;
    }
  }
  return fail(
      Error::make(Step::side_channel, ErrorKind::unsupported,
                  "local_ipv4: the side channel runs over IPv6; give the coordinator as an IPv4 address"));
}

inline void SideChannel::poison(const Error& cause) noexcept {
  if (!s_) return;
  {
    std::lock_guard<std::mutex> lock(s_->poison_mutex);
    if (s_->poisoned.load(std::memory_order_acquire)) return;
    s_->poison_error = cause;
    s_->poisoned.store(true, std::memory_order_release);
  }
  for (int fd : s_->poison_fds)
    ::shutdown(fd, SHUT_RDWR); // wakes a poll() in another thread
}

inline void SideChannel::poison() noexcept {
  if (!s_) return;
  Error e = Error::from_errno(Step::side_channel, ECANCELED);
  e.with_detail("rank " + std::to_string(s_->opts.rank) + "'s side channel was poisoned by its owner");
  poison(e);
}

inline void SideChannel::abort(const Error& cause) noexcept {
  if (!s_ || s_->closed) return;
  if (!s_->poisoned.load(std::memory_order_acquire)) {
    try {
      // A cause that is itself a peer's abort (from check_peers, recv_from...) is forwarded with
      // its origin, so the others read "rank 1 aborted: ..." rather than a nested chain.
      bool forwarded = false;
      if (s_->abort_origin >= 0) {
        const std::string relayed =
            "rank " + std::to_string(s_->abort_origin) + " aborted: " + s_->abort_text;
        detail::FixedString<sizeof(cause.detail.data)> same(relayed);
        forwarded = cause.detail.view() == same.view();
      }
      s_->broadcast_abort(cause, forwarded);
    } catch (...) { // allocation failure: the peers will still see this rank close
    }
  }
  poison(cause);
}

inline void SideChannel::close() noexcept {
  if (!s_) return;
  s_->closed = true;
  for (auto& c : s_->conns)
    c.fd.reset();
  s_->poison_fds.clear();
}

TBVERBS_NAMESPACE_END
