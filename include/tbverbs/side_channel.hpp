/// @file side_channel.hpp
/// A TCP side channel for collective backends: rendezvous through a coordinator (rank 0), a full
/// mesh of connections, all-gather, barrier, point-to-point messages and a non-blocking liveness
/// probe. Framed, versioned, checksummed messages carrying a job token; every wait has a deadline.
///
/// Optional: the core umbrella header does not include it. POSIX sockets and `poll()` only, so it
/// builds on macOS and Linux alike.
#pragma once

#include "config.hpp"
#include "detail/printable.hpp"
#include "detail/side_channel_frame.hpp"
#include "detail/socket.hpp"
#include "error.hpp"
#include "host_port.hpp"
#include "job_secret.hpp"
#include "notice.hpp"
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

/// A 64-bit job token derived from any text (FNV-1a), e.g. a launcher's job id: job_token(text)
/// without a secret. Anyone who knows the text can compute it; job_token(name, secret) cannot be
/// computed without the job's secret (job_secret.hpp).
constexpr std::uint64_t side_channel_token(std::string_view text) noexcept { return job_token(text); }

/// What a rank leaving the job had done, as it tells one peer (SideChannel::announce_leaving): a
/// peer still finishing one of these calls knows the rank finished it and is not missing from it.
struct LeavingCounts {
  std::uint64_t collectives = 0;        ///< collective calls it made (all of them finished)
  std::uint64_t sent_to_peer = 0;       ///< its sends to that peer
  std::uint64_t received_from_peer = 0; ///< its receives from that peer
};

/// How a SideChannel finds its peers and how long it waits.
struct SideChannelOptions {
  int rank = 0; ///< This process' rank, 0 <= rank < size. Rank 0 is the coordinator.
  int size = 1; ///< Number of ranks in the job.
  /// "host:port" of rank 0. Rank 0 listens there (host must be one of its addresses, or empty /
  /// 0.0.0.0 for all; port 0 picks a free port, reported through on_listening); the other ranks
  /// connect there.
  std::string coordinator;
  std::uint64_t job_token = 0; ///< Same on every rank of a job; frames with another token are refused.
  /// True when job_token comes from the job's secret (job_token(name, secret)) or another value
  /// only the job's ranks have (a framework's Store). When false, connect() says once per process
  /// that the side channel accepts any process that can reach the coordinator (Notice::no_job_secret).
  bool secret_token = false;
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
namespace sc {

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

/// Largest frame a connection may announce before it has said who it is: a hello is 10 bytes of
/// payload, so a stranger cannot make a rank reserve memory for a large frame.
inline constexpr std::uint32_t stranger_max_frame = 4096;
/// Most bytes one recv() asks for: the receive buffer grows with what actually arrives, never by
/// what a header announces (a 64 MiB announcement costs at most this much until the bytes come).
inline constexpr std::size_t max_recv_chunk = std::size_t{1} << 20;
/// Connections beyond the expected ranks that accept_ranks keeps waiting for a hello (stray
/// scanners, a rank of another job, retries); beyond them the oldest silent one is closed.
inline constexpr std::size_t max_strangers_extra = 8;

/// Who may send which frame, from where the receiving rank stands: `me` (its rank) and whether
/// its rendezvous is over. A frame sent by a rank that may not send it is refused as it arrives,
/// naming the sender, the frame and why, instead of waiting until a deadline blames someone.
struct FrameRules {
  int me = 0;                   ///< The receiving rank.
  bool rendezvous_done = false; ///< connect() returned: hello and welcome are over.
};

/// Why a frame of `type` from rank `sender` is refused under `rules`, or nullopt when it is not:
/// welcome and the collectives' answers (gather_out, barrier_out) only come from rank 0, their
/// requests (gather_in, barrier_in) only go to it, a hello is only a connection's first frame,
/// welcome ends with the rendezvous. Data, abort and leaving frames may come from any rank.
inline std::optional<std::string> refused(const FrameRules& rules, FrameType type, int sender) {
  const std::string who = "rank " + std::to_string(sender);
  const std::string t(type_name(type));
  switch (type) {
  case FrameType::hello: return who + " sent a second hello (a rank says hello once, as its connection's first frame)";
  case FrameType::welcome:
    if (sender != 0) return who + " sent welcome, which only rank 0 sends";
    if (rules.me == 0) return "a welcome came to rank 0, which sends it";
    if (rules.rendezvous_done) return "rank 0 sent welcome after the rendezvous was over";
    return std::nullopt;
  case FrameType::gather_in:
  case FrameType::barrier_in:
    if (rules.me != 0) return who + " sent its " + t + " contribution to rank " + std::to_string(rules.me) + ", but only rank 0 collects them";
    return std::nullopt;
  case FrameType::gather_out:
  case FrameType::barrier_out:
    if (sender != 0) return who + " sent the " + t + " answer, which only rank 0 sends";
    return std::nullopt;
  case FrameType::data:
  case FrameType::abort:
  case FrameType::leaving: return std::nullopt;
  }
  return who + " sent a frame of no known type";
}

/// Splits the whole frames received on `c` into validated frames in c.inbox (see pump). A bad
/// frame, or one its sender may not send (`rules`: refused()), drops the connection and discards
/// every byte after the last good frame. A connection whose rank is not known yet (no hello) is
/// held to frames of stranger_max_frame and to its first frame, until the caller has read that
/// hello and named the connection's rank; the caller then splits again what arrived behind the
/// hello.
inline void split_frames(Conn& c, std::uint64_t token, std::uint32_t max_len, std::size_t max_inbox,
                         const FrameRules& rules = {}) {
  if (c.dead()) return;
  if (c.rank < 0) max_len = std::min(max_len, stranger_max_frame);
  auto drop = [&](Error e) { // nothing after a bad frame is trusted: no garbage is kept
    c.bad = e;
    c.rx = {};
    c.rx_len = 0;
    c.rx_header.reset();
  };
  for (;;) {
    if (c.rank < 0 && !c.inbox.empty()) break; // a stranger's hello is read before anything else
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
    if (c.rank >= 0)
      if (auto why = refused(rules, type, c.rank)) return drop(Error::make(Step::side_channel, ErrorKind::bad_frame, *why));
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

/// Reads what is available on `c` (one non-blocking recv) and splits it into validated frames in
/// c.inbox (split_frames).
inline void pump(Conn& c, std::uint64_t token, std::uint32_t max_len, std::size_t max_inbox, const FrameRules& rules = {}) {
  if (c.dead()) return;
  const std::size_t want = header_bytes + (c.rx_header ? c.rx_header->length : 0);
  const std::size_t chunk =
      std::clamp<std::size_t>(want > c.rx_len ? want - c.rx_len : 0, 64 * 1024, max_recv_chunk);
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
  split_frames(c, token, max_len, max_inbox, rules);
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
  std::atomic<bool> abort_requested{false}; ///< request_abort() was called; the owner acts on it.
  Error requested_cause;             ///< Its cause (guarded by poison_mutex).
  bool closed = false;               ///< close() was called.
  bool rendezvous_done = false;      ///< connect() is over: no more hello or welcome.
  int abort_origin = -1;             ///< Rank where the last received abort started.
  std::string abort_text;            ///< Its text, for forwarding without re-prefixing.
  std::uint8_t abort_claim = 0;      ///< The error kind its origin claimed (forwarded as is).
  bool last_from_abort = false;      ///< The last error of wait_frames came from an abort frame.
  std::uint64_t frames_sent = 0;     ///< Frames this rank began to send (any type, any peer).

  /// The rank's own name in details: "rank 3".
  std::string me() const { return "rank " + std::to_string(opts.rank); }
  /// Payload bytes a peer may queue beyond what is asked for.
  std::size_t max_inbox() const noexcept { return std::size_t{opts.max_frame_bytes} * 4; }
  /// Reads from `c` into its inbox.
  void pump_conn(Conn& c) { pump(c, opts.job_token, opts.max_frame_bytes, max_inbox(), rules()); }
  /// Splits frames already received on `c` (after a stranger's hello named its rank).
  void split_conn(Conn& c) { split_frames(c, opts.job_token, opts.max_frame_bytes, max_inbox(), rules()); }
  /// Who may send what to this rank now (FrameRules).
  FrameRules rules() const noexcept { return {opts.rank, rendezvous_done}; }

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

  /// The error an abort frame from `c` carries (and remembers it for forwarding): always
  /// ErrorKind::peer_aborted. Everything in the frame is the peer's claim, so none of it becomes
  /// this rank's own error kind (a forged frame claiming symbol_missing must not read as "required
  /// verbs symbol missing: rank 1 aborted: ..."): the claimed kind only
  /// appears, by name, in the detail.
  Error abort_error(const Conn& c, const Frame& f) {
    Reader r{f.payload};
    const auto kind = r.num(1);
    const auto origin = r.num(4);
    // A peer's words are data: control characters escaped (they cannot move a terminal's cursor
    // or forge a line), the length bounded.
    const std::string text = printable(r.text(std::min<std::size_t>(r.in.size(), 400)), 400);
    if (!r.ok)
      return Error::make(Step::side_channel, ErrorKind::peer_aborted, c.who + " aborted the job (unreadable reason)");
    // The origin is the peer's claim: a rank outside the job is not believed (the abort is then
    // the sending peer's own).
    const bool origin_ok = origin < static_cast<std::uint64_t>(opts.size);
    abort_origin = origin_ok ? static_cast<int>(origin) : c.rank;
    abort_text = origin_ok ? text
                           : text + " (forwarded by " + c.who + " naming rank " + std::to_string(origin) +
                                 ", which is not in this job)";
    abort_claim = static_cast<std::uint8_t>(kind);
    return Error::make(Step::side_channel, ErrorKind::peer_aborted, abort_detail());
  }

  /// How the last received abort reads: "rank 2 aborted: <its text> (its error: <kind name>)".
  /// It fits an Error's detail whole, with room for a cut mark after it: a longer text loses its beginning ("..."), not its end.
  /// Contexts are prefixes ("rank 0, all_reduce (...), waiting for ...: <cause>"), so the end
  /// holds the cause, and the claim after it says what kind it was.
  std::string abort_detail() const {
    const bool known = abort_claim >= 1 && abort_claim <= static_cast<std::uint8_t>(last_error_kind);
    const std::string head = "rank " + std::to_string(abort_origin) + " aborted: ";
    const std::string tail = " (its error: " +
                             (known ? std::string(kind_name(static_cast<ErrorKind>(abort_claim)))
                                    : "unknown kind " + std::to_string(abort_claim)) +
                             ")";
    // Three characters short of the detail's 255: a caller's context appended after it (the
    // collectives layer's "; here: ...") is then cut to "...", and this text stays whole.
    constexpr std::size_t capacity = sizeof(Error{}.detail.data) - 4;
    const std::size_t room = capacity > head.size() + tail.size() + 3 ? capacity - head.size() - tail.size() : 3;
    if (abort_text.size() <= room) return head + abort_text + tail;
    return head + "..." + abort_text.substr(abort_text.size() - (room - 3)) + tail;
  }

  /// A leaving frame's payload: three big-endian 64-bit counts (LeavingCounts), then the note.
  static constexpr std::size_t leaving_counts_bytes = 24;

  /// The leaving frame queued on `c`, or nullptr.
  const Frame* leaving_frame(const Conn& c) const {
    for (const auto& f : c.inbox)
      if (f.type == FrameType::leaving) return &f;
    return nullptr;
  }

  /// The note of a leaving frame queued on `c` (printable, bounded), or nullopt.
  std::optional<std::string> leaving(const Conn& c) const {
    const Frame* f = leaving_frame(c);
    if (f == nullptr) return std::nullopt;
    const auto p = std::span<const std::byte>(f->payload);
    return printable(p.size() >= leaving_counts_bytes ? p.subspan(leaving_counts_bytes) : p, 200);
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
      // A forwarded abort keeps its origin's claim: e.kind is peer_aborted here.
      w.out.back() = static_cast<std::byte>(abort_claim);
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
    ++frames_sent;
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
      if (auto cause = take_requested_abort()) return fail(*cause);
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
        if (want == FrameType::data)
          if (auto note = leaving(c))
            return fail(Error::make(Step::side_channel, ErrorKind::peer_lost,
                                    c.who + " is leaving the job (" + *note + ") while " + me() + " waits in " +
                                        std::string(op) + " for its message"));
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
      const int ms = std::min(poll_ms(dl), 50); // slices: a request_abort() is acted on within 50 ms
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

  /// The cause of a request_abort() from another thread, once: the peers are told (the owner
  /// thread sends the abort frames) and the channel is poisoned with it. nullopt when none.
  std::optional<Error> take_requested_abort() noexcept {
    if (!abort_requested.exchange(false, std::memory_order_acq_rel)) return std::nullopt;
    Error cause;
    {
      std::lock_guard<std::mutex> lock(poison_mutex);
      cause = requested_cause;
    }
    try {
      (void)fail_collective(cause, false);
    } catch (...) { // allocation failure: the peers see this rank close instead
      std::lock_guard<std::mutex> lock(poison_mutex);
      poison_error = cause;
      poisoned.store(true, std::memory_order_release);
    }
    return cause;
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
///   started, as ErrorKind::peer_aborted ("rank 0 aborted: rank 2 closed its side channel during
///   all_gather (its error: peer lost)"): what a peer says is its claim, never this rank's kind.
///   After a failed collective the channel refuses further calls. A send_to/recv_from timeout
///   leaves the channel usable (a partly received frame is kept and completed later).
///
/// Threading: one thread at a time calls the members, except poison(), which any thread may call
/// while another is blocked in a call (it unblocks it). Move-only; the destructor closes the
/// sockets, which the peers see as this rank closing its side channel.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip SideChannelOptions options
/// \until wires.error()
/// \skip channel->barrier
/// \until qp->send
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
  /// Frames this rank has sent since connect() (rendezvous, collectives, send_to, aborts): a
  /// program checks with it that its data path does not touch the side channel.
  std::uint64_t frames_sent() const noexcept { return s_ ? s_->frames_sent : 0; }

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
  /// when the peer dies: docs/field-reports.md row 21). Reads whatever whole frames are already
  /// there into the queues, so an abort a peer sent is reported (as peer_aborted) rather than missed.
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
  /// Asks the thread that uses the channel to abort(cause): from any thread, at any time. That
  /// thread acts on it at its next check_peers() or within 50 ms of a wait (the peers are then
  /// told `cause`, as abort() tells them), and the call fails with `cause`. Thread-safe.
  void request_abort(const Error& cause) noexcept;
  /// True while a request_abort() waits for the owner thread to act on it (one atomic load: a
  /// caller's fast path checks it and then calls check_peers()).
  bool abort_requested() const noexcept { return s_ && s_->abort_requested.load(std::memory_order_acquire); }
  /// Tells every peer why this rank gives up (an abort frame with `cause`'s kind and detail, best
  /// effort, at most 200 ms), then poison(cause). Peers waiting on this rank fail with
  /// ErrorKind::peer_aborted and "rank N aborted: <detail> (its error: <cause's kind>)". Same thread
  /// as the other calls.
  void abort(const Error& cause) noexcept;
  /// Closes every socket now; later calls fail with invalid_argument. The destructor does the same.
  void close() noexcept;

  /// Tells every peer that this rank is leaving the job (before a final barrier, say), with
  /// `note` on where it stands ("after 5 collective calls") and, per peer, what it had done
  /// (`done(peer)`: its calls, so a peer still finishing one of them knows this rank is not
  /// missing from it): a peer still waiting for this rank's part of something else learns at once
  /// that it will not come (leaving_note(), and recv_from fails). Best effort, at most 200 ms. Same
  /// thread as the other calls.
  void announce_leaving(std::string_view note, const std::function<LeavingCounts(int peer)>& done = {}) noexcept;
  /// The note `peer` sent with announce_leaving(), once a wait or check_peers() has read it
  /// (control characters escaped, at most 200 characters); nullopt until then.
  std::optional<std::string> leaving_note(int peer) const;
  /// The counts `peer` sent with announce_leaving() (zeros when it gave none); nullopt until its
  /// leaving frame was read.
  std::optional<LeavingCounts> leaving_counts(int peer) const;
  /// The error kind the last abort frame this rank received claimed (forwarded as the rank where
  /// it started sent it), or ErrorKind{} when none came. A claim, not this rank's condition: the
  /// collectives layer reports a claimed call_mismatch as its own (the ranks made different calls).
  ErrorKind abort_claim() const noexcept {
    return s_ && s_->abort_claim >= 1 && s_->abort_claim <= static_cast<std::uint8_t>(last_error_kind)
               ? static_cast<ErrorKind>(s_->abort_claim)
               : ErrorKind{};
  }

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
  if (!o.secret_token)
    detail::notice_once(Notice::no_job_secret,
                        Error::make(Step::side_channel, ErrorKind::invalid_argument,
                                    "the job token of " + o.coordinator + " is not from a job secret"));
  auto r = o.rank == 0 ? ch.rendezvous_root(dl) : ch.rendezvous_rank(dl);
  if (!r) return fail(r.error());
  ch.s_->rendezvous_done = true; // from here a welcome or a hello is refused as it arrives
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
          s.split_conn(slot); // frames that came behind the hello
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
        // Connections that have not said who they are are bounded, so strangers cannot hold more
        // than a few buffers open. The oldest goes: a rank sends its hello as soon as it connects,
        // so a connection still silent after the others arrived is the least likely to be one.
        if (strangers.size() >= expect.size() + max_strangers_extra) {
          notes = "; closed connections that sent no hello (e.g. from " + strangers.front().who + ")";
          strangers.erase(strangers.begin());
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
    if (detail::has_control(e.host)) rd.ok = false; // a host name has none: the frame is refused, never printed
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

inline void SideChannel::request_abort(const Error& cause) noexcept {
  if (!s_) return;
  {
    std::lock_guard<std::mutex> lock(s_->poison_mutex);
    if (s_->poisoned.load(std::memory_order_acquire)) return;
    s_->requested_cause = cause;
  }
  s_->abort_requested.store(true, std::memory_order_release);
}

inline Result<void> SideChannel::check_peers() noexcept {
  if (s_ && !s_->closed)
    if (auto cause = s_->take_requested_abort()) return fail(*cause);
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
      // A cause that is itself a peer's abort (from check_peers, recv_from...), as it came or
      // with a caller's prefix ("link 3 to rank 1: ..."), is forwarded with its origin and claim,
      // so the others read "rank 1 aborted: ..." rather than a nested chain.
      bool forwarded = false;
      if (s_->abort_origin >= 0 && cause.is(ErrorKind::peer_aborted)) {
        detail::FixedString<sizeof(cause.detail.data)> same(s_->abort_detail());
        // (after a caller's prefix, or first with the caller's context after it: the collectives
        // layer keeps the origin's text first, detail::in_context).
        forwarded = cause.detail.view().ends_with(same.view()) || cause.detail.view().starts_with(same.view());
      }
      s_->broadcast_abort(cause, forwarded);
    } catch (...) { // allocation failure: the peers will still see this rank close
    }
  }
  poison(cause);
}

inline void SideChannel::announce_leaving(std::string_view note, const std::function<LeavingCounts(int peer)>& done) noexcept {
  if (!s_ || s_->closed || s_->poisoned.load(std::memory_order_acquire)) return;
  try {
    const auto text = std::as_bytes(std::span(note.data(), std::min<std::size_t>(note.size(), 400)));
    const auto dl = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    for (auto& c : s_->conns) {
      if (c.fd.get() < 0 || c.tx_broken || c.lost_errno != 0 || c.bad) continue;
      const LeavingCounts k = done ? done(c.rank) : LeavingCounts{};
      std::vector<std::byte> payload(detail::sc::State::leaving_counts_bytes);
      detail::put_be(payload.data(), k.collectives, 8);
      detail::put_be(payload.data() + 8, k.sent_to_peer, 8);
      detail::put_be(payload.data() + 16, k.received_from_peer, 8);
      payload.insert(payload.end(), text.begin(), text.end());
      (void)s_->send_frame(c, detail::sc::FrameType::leaving, payload, dl, "leaving");
    }
  } catch (...) { // allocation failure (or `done` threw): the peers see this rank close later instead
  }
}

inline std::optional<std::string> SideChannel::leaving_note(int peer) const {
  if (!s_ || peer < 0 || peer >= s_->opts.size || peer == s_->opts.rank) return std::nullopt;
  return s_->leaving(s_->conns[static_cast<std::size_t>(peer)]);
}

inline std::optional<LeavingCounts> SideChannel::leaving_counts(int peer) const {
  if (!s_ || peer < 0 || peer >= s_->opts.size || peer == s_->opts.rank) return std::nullopt;
  const auto* f = s_->leaving_frame(s_->conns[static_cast<std::size_t>(peer)]);
  if (f == nullptr) return std::nullopt;
  LeavingCounts k;
  if (f->payload.size() >= detail::sc::State::leaving_counts_bytes) {
    k.collectives = detail::get_be(f->payload.data(), 8);
    k.sent_to_peer = detail::get_be(f->payload.data() + 8, 8);
    k.received_from_peer = detail::get_be(f->payload.data() + 16, 8);
  }
  return k;
}

inline void SideChannel::close() noexcept {
  if (!s_) return;
  s_->closed = true;
  for (auto& c : s_->conns)
    c.fd.reset();
  s_->poison_fds.clear();
}

/// A TCP port that is free on the loopback interface right now (0 when none could be found), for
/// the coordinator of a job whose ranks all run on this machine (a `--local N` launcher). Another
/// process may take it before it is used: callers retry, or fail clearly.
inline int free_loopback_port() noexcept { return detail::sc::free_loopback_port(); }

TBVERBS_NAMESPACE_END
