// Data path: post_send / post_recv / poll_cq / req_notify_cq.
//
// The sender performs the whole transfer inside ibv_post_send: it validates its
// own SGEs against its registered regions, finds the connected peer QP in shared
// memory, takes the peer's next posted receive, checks the receive (or the rkey)
// and copies the payload straight into the peer's address space. Nothing is ever
// written outside a region that passed the key, bounds and access checks.
//
// Thunderbolt, empty_rq=wait (credit-based flow control): a send that finds no
// receive is queued in the receiver's ShmQp (WaitEntry) and the receiver moves it
// in ibv_post_recv (rx_drain), reading the sender's region with process_vm_readv.
// Both sides decide under the receiver's QP lock, so whoever comes second moves
// the data and order is kept.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "local.hpp"

namespace emu {
namespace {

// How long poll_cq spins on an empty CQ before napping. TBVERBS_EMU_SPIN_US fixes it;
// otherwise 50 us while every process could have a core of its own and 5 us when not: spinning
// only helps while the peer process has a core of its own. "A core of its own" (re-judged every
// 200 ms): the processes on this fabric (one bell each) are no more than the cores, and the
// machine's runnable tasks right now (/proc/loadavg's 4th field, which counts this process and
// its spinning peers) are no more than the cores plus one. Our rule; the 1-minute load average
// it replaces counted the spinners themselves: two processes of a point-to-point run drove it to
// 2 on 2 cores within a minute, every hop then woke from a nap (about 20 us here), and a paced
// 4 us link measured 24 us.
int64_t spin_ns(const Shared* sh) {
  static const long fixed_us = [] {
    const char* e = std::getenv("TBVERBS_EMU_SPIN_US");
    return e && *e ? std::clamp(std::strtol(e, nullptr, 10), 0L, 1000000L) : -1L;
  }();
  if (fixed_us >= 0) return int64_t(fixed_us) * 1000;
  static const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  static std::atomic<int64_t> spin{5000}, checked{0};
  const int64_t now = now_ns();
  if (now - checked.load(std::memory_order_relaxed) > 200'000'000) {
    checked.store(now, std::memory_order_relaxed);
    long processes = 0;
    for (const ShmBell& b : sh->bells)
      if (__atomic_load_n(&b.pid, __ATOMIC_RELAXED) > 0 && pid_alive(b.pid)) ++processes;
    long runnable = cores + 2;  // unknown: assume busy
    if (FILE* f = std::fopen("/proc/loadavg", "re")) {
      double l1, l5, l15;
      long running, total;
      if (std::fscanf(f, "%lf %lf %lf %ld/%ld", &l1, &l5, &l15, &running, &total) == 5) runnable = running;
      std::fclose(f);
    }
    spin.store(processes <= cores && runnable <= cores + 1 ? 50'000 : 5'000, std::memory_order_relaxed);
  }
  return spin.load(std::memory_order_relaxed);
}
constexpr long kPollSleepNs = 200 * 1000;  // longest nap of one empty poll_cq
// Longest nap while a paced completion is pending: it ends at that completion's due time anyway;
// the bound keeps a waiting thread coming back to its caller (liveness checks, deadlines).
constexpr int64_t kPacedNapNs = 10 * 1000 * 1000;
// emu_poll_cq naps once this thread has polled in vain for spin_ns() since t_spin_from_ns: its
// last post or completion, or, when it comes back to an empty CQ after more than spin_ns() away
// from the verbs (t_last_call_ns: a side-channel barrier, its own work), that return, since it is
// then probably about to post (counted from its last post, a ring rank napped 200 us on its first
// poll after every barrier). Counting from the last post otherwise matters too: spinning longer
// than that took the CPU from the peer and cost a 4 KiB ping-pong a fifth of its speed.
thread_local int64_t t_spin_from_ns = 0;
thread_local int64_t t_last_call_ns = 0;

std::mutex g_pending_mu;
std::vector<EmuQp*> g_pending_qps;  // QPs with deferred sends (slow path only)
std::atomic<int> g_pending_count{0};

inline bool is_tb(const EmuQp* q) { return q->ctx->fab->devices[q->ctx->dev].profile == Profile::Thunderbolt; }
inline bool is_usb4(const EmuQp* q) { return q->ctx->fab->devices[q->ctx->dev].profile == Profile::Usb4Rdma; }
// The profile of the device at the other end of this QP's cable (its own when there is none).
inline Profile far_profile(const EmuQp* q) {
  const Fabric& f = *q->ctx->fab;
  const int other = f.ports[q->s->port].peer;
  return f.devices[other >= 0 ? f.ports[other].device : q->ctx->dev].profile;
}
// Apple's receive rules hold where the receiving end is a Mac: frames pair, the empty-RQ reading.
inline bool far_is_tb(const EmuQp* q) { return far_profile(q) == Profile::Thunderbolt; }
// hellas-ai/thunderbolt-ibverbs ibdev.c: TBV_APPLE_PENDING_RX_SLOTS, the early receives one usb4_rdma
// QP buffers from a Mac; when they are taken the next frame finds no slot and is dropped.
constexpr uint32_t kUsb4EarlyReceives = 16;

inline uint32_t frames_of(uint64_t len) { return len == 0 ? 1 : static_cast<uint32_t>((len + kFrame - 1) / kFrame); }

// Resolves [addr, addr+len) through key for process `pid`/pd; on success returns the
// process address. `need` is the access bit the operation requires (0 = local read).
bool check_region(Shared* s, uint32_t key, uint64_t addr, uint64_t len, int32_t pid, uint32_t pd, uint32_t need,
                  uint64_t* host_addr) {
  const ShmMr* m = mr_of_key(s, key);
  if (!m || m->pid != pid || m->pd != pd) return false;
  if ((m->access & need) != need) return false;
  if (addr < m->iova || len > m->length || addr - m->iova > m->length - len) return false;
  *host_addr = m->addr + (addr - m->iova);
  return true;
}

enum class Copy { Ok, Gone, Fault };

// Whether `pid` is still the process that started at `start`. A QP of a dead process is reclaimed
// lazily, and its pid may meanwhile belong to another process: a send to the dead one must not
// land there (issue 9). A pidfd names one process for good, so it is opened and checked against
// the start time once per peer (a small per-thread cache), then each copy asks with a signal-0
// probe whether that very process still lives.
bool same_process(int32_t pid, uint64_t start) {
  struct Entry {
    int32_t pid = 0;
    uint64_t start = 0;
    int fd = -1;
  };
  thread_local Entry cache[8];
  thread_local unsigned next = 0;
  for (const Entry& e : cache)
    if (e.fd >= 0 && e.pid == pid && e.start == start) return syscall(SYS_pidfd_send_signal, e.fd, 0, nullptr, 0) == 0;
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ENOSYS && process_start(pid) == start;  // no pidfds: the start time alone
  if (process_start(pid) != start) {
    ::close(fd);
    return false;
  }
  Entry& slot = cache[next++ % 8];
  if (slot.fd >= 0) ::close(slot.fd);
  slot = Entry{pid, start, fd};
  return syscall(SYS_pidfd_send_signal, fd, 0, nullptr, 0) == 0;
}

// One copy between two processes' registered memory (one of them this process):
// memcpy, process_vm_writev (into the peer) or process_vm_readv (from the peer).
// Gone: the other process no longer exists. Fault: its mapping vanished.
// `other_start` is the start time of the process that is not this one (see same_process).
Copy copy_iov(int32_t src_pid, const iovec* src, unsigned nsrc, int32_t dst_pid, const iovec* dst, unsigned ndst,
              uint64_t total, uint64_t other_start) {
  if (total == 0) return Copy::Ok;
  const int32_t me = getpid();
  if (src_pid == me && dst_pid == me) {
    // Same process (two emulated hosts in one test program): plain memcpy.
    unsigned si = 0, di = 0;
    size_t so = 0, doff = 0;
    uint64_t left = total;
    while (left > 0 && si < nsrc && di < ndst) {
      size_t n = std::min({src[si].iov_len - so, dst[di].iov_len - doff, static_cast<size_t>(left)});
      std::memcpy(static_cast<char*>(dst[di].iov_base) + doff, static_cast<const char*>(src[si].iov_base) + so, n);
      so += n;
      doff += n;
      left -= n;
      if (so == src[si].iov_len) ++si, so = 0;
      if (doff == dst[di].iov_len) ++di, doff = 0;
    }
    return Copy::Ok;
  }
  if (!same_process(src_pid == me ? dst_pid : src_pid, other_start)) return Copy::Gone;
  ssize_t r = src_pid == me ? process_vm_writev(dst_pid, src, nsrc, dst, ndst, 0)
                            : process_vm_readv(src_pid, dst, ndst, src, nsrc, 0);
  if (r < 0) return errno == ESRCH ? Copy::Gone : Copy::Fault;
  return static_cast<uint64_t>(r) == total ? Copy::Ok : Copy::Fault;
}

// One side of a copy between registered memory: its ranges and the region each lies in.
struct Span {
  int32_t pid;
  const iovec* iov;
  const uint32_t* keys;  // the region (lkey/rkey) of each range; 0: not registered memory (inline data)
  unsigned n;
  uint32_t qpn;          // the QP on this side (for the trace)
};

// The 0xdb bytes a stale source gives: the old pages' bytes, which the emulator does not know.
const unsigned char* stale_bytes() {
  static const auto* page = [] {
    auto* p = new unsigned char[4096];
    std::memset(p, 0xdb, 4096);
    return p;
  }();
  return page;
}
constexpr uint64_t kStaleBytes = 4096;

// A range split where its pages go from stale to not (pages.cpp).
struct Seg {
  uint64_t addr, len;
  bool stale;
};
void segments(const Fabric& f, const Span& sp, uint64_t start, unsigned stale_mask, std::vector<Seg>* out) {
  const uint64_t ps = page_size();
  std::vector<uint8_t> pages;
  for (unsigned i = 0; i < sp.n; ++i) {
    const auto addr = reinterpret_cast<uint64_t>(sp.iov[i].iov_base);
    const uint64_t len = sp.iov[i].iov_len;
    if (len == 0) continue;
    pages.clear();
    uint64_t first = 0;
    if (stale_mask & (1u << i)) pages_stale(f, sp.pid, start, sp.keys[i], addr, len, &first, &pages);
    for (uint64_t a = addr, end = addr + len; a < end;) {
      const uint64_t next = std::min(end, (a / ps + 1) * ps);
      const uint64_t idx = a / ps - addr / ps;
      const bool st = idx < pages.size() && pages[idx];
      if (!out->empty() && out->back().stale == st && out->back().addr + out->back().len == a)
        out->back().len += next - a;
      else
        out->push_back(Seg{a, next - a, st});
      a = next;
    }
  }
}

// The copy when some page is stale: page runs of the target that are stale are skipped, stale
// source runs give 0xdb. The slow path (it allocates); taken only when the program has a bug.
Copy copy_stale(const Fabric& f, const Span& src, uint64_t src_start, unsigned src_mask, const Span& dst,
                uint64_t dst_start, unsigned dst_mask, uint64_t total, uint64_t other_start) {
  const int32_t me = getpid();
  if (!(src.pid == me && dst.pid == me) && !same_process(src.pid == me ? dst.pid : src.pid, other_start))
    return Copy::Gone;
  std::vector<Seg> ss, ds;
  segments(f, src, src_start, src_mask, &ss);
  segments(f, dst, dst_start, dst_mask, &ds);
  size_t si = 0, di = 0;
  uint64_t so = 0, doff = 0, left = total;
  while (left > 0 && si < ss.size() && di < ds.size()) {
    const Seg& a = ss[si];
    const Seg& b = ds[di];
    uint64_t n = std::min({a.len - so, b.len - doff, left});
    if (a.stale) n = std::min(n, kStaleBytes);
    void* to = reinterpret_cast<void*>(b.addr + doff);
    const void* from = a.stale ? static_cast<const void*>(stale_bytes()) : reinterpret_cast<const void*>(a.addr + so);
    if (!b.stale) {  // a stale target page is the old page's business: the new one is left alone
      ssize_t r = static_cast<ssize_t>(n);
      if (dst.pid == me && (src.pid == me || a.stale)) {
        std::memcpy(to, from, n);
      } else if (dst.pid == me) {
        iovec l{to, n}, rem{const_cast<void*>(from), n};
        r = process_vm_readv(src.pid, &l, 1, &rem, 1, 0);
      } else {
        iovec l{const_cast<void*>(from), n}, rem{to, n};
        r = process_vm_writev(dst.pid, &l, 1, &rem, 1, 0);
      }
      if (r < 0) return errno == ESRCH ? Copy::Gone : Copy::Fault;
      if (static_cast<uint64_t>(r) != n) return Copy::Fault;
    }
    so += n;
    doff += n;
    left -= n;
    if (so == a.len) ++si, so = 0;
    if (doff == b.len) ++di, doff = 0;
  }
  return Copy::Ok;
}

// copy_iov, with the page check (pages.cpp, docs/emulator.md "Registration and pinning"): memory a
// program unmapped after ibv_reg_mr is, as on hardware, no longer behind its region. A target page
// that is stale is not written (the NIC writes the old page, which the program cannot see), a stale
// source page gives 0xdb bytes (the NIC reads the old page). The transfer completes as usual and is
// reported. Cost: a pagemap read per range, or a few microseconds where the fast path proves the
// pages unchanged (pages.cpp).
Copy copy_checked(const Fabric& f, const Span& src, const Span& dst, uint64_t total, uint64_t other_start) {
  if (!g_page_check || total == 0)
    return copy_iov(src.pid, src.iov, src.n, dst.pid, dst.iov, dst.n, total, other_start);
  const int32_t me = getpid();
  const uint64_t src_start = src.pid == me ? self_start() : other_start;
  const uint64_t dst_start = dst.pid == me ? self_start() : other_start;
  unsigned src_mask = 0, dst_mask = 0, unproven_src = 0, unproven_dst = 0;
  uint64_t first = 0;
  auto check = [&](const Span& sp, uint64_t start, bool as_source, unsigned* mask, unsigned* unproven) {
    for (unsigned i = 0; i < sp.n; ++i) {
      if (!sp.keys[i]) continue;
      switch (check_pages(f, sp.pid, start, sp.keys[i], reinterpret_cast<uint64_t>(sp.iov[i].iov_base),
                          sp.iov[i].iov_len, &first)) {
        case PageCheck::kStale:
          *mask |= 1u << i;
          report_stale(f, sp.keys[i], first, as_source, sp.qpn);
          break;
        case PageCheck::kUnproven: *unproven |= 1u << i; break;
        case PageCheck::kClean: break;
      }
    }
  };
  check(src, src_start, true, &src_mask, &unproven_src);
  check(dst, dst_start, false, &dst_mask, &unproven_dst);
  if (src_mask != 0 || dst_mask != 0)
    return copy_stale(f, src, src_start, src_mask, dst, dst_start, dst_mask, total, other_start);
  const bool watch = (unproven_src | unproven_dst) != 0;
  const uint64_t faults = watch ? thread_faults() : 0;
  const Copy r = copy_iov(src.pid, src.iov, src.n, dst.pid, dst.iov, dst.n, total, other_start);
  if (!watch || r != Copy::Ok || (faults != UINT64_MAX && thread_faults() == faults)) return r;
  // The copy faulted a page in: maybe one of the other process's that was unmapped since its last
  // full check. Checked in full now; where it was, the copy is undone: a stale target page (a new,
  // zero-filled page the copy faulted in) is zeroed again, and the bytes read from a stale source
  // page are written again as 0xdb (copy_stale).
  auto recheck = [&](const Span& sp, uint64_t start, bool as_source, unsigned unproven, unsigned* mask) {
    for (unsigned i = 0; i < sp.n; ++i)
      if ((unproven & (1u << i)) && pages_stale(f, sp.pid, start, sp.keys[i],
                                                reinterpret_cast<uint64_t>(sp.iov[i].iov_base), sp.iov[i].iov_len,
                                                &first)) {
        *mask |= 1u << i;
        report_stale(f, sp.keys[i], first, as_source, sp.qpn);
      }
  };
  recheck(src, src_start, true, unproven_src, &src_mask);
  recheck(dst, dst_start, false, unproven_dst, &dst_mask);
  if (src_mask == 0 && dst_mask == 0) return r;
  if (dst_mask != 0) {
    static const std::vector<unsigned char> zeros(kStaleBytes, 0);
    std::vector<Seg> ds;
    segments(f, dst, dst_start, dst_mask, &ds);
    for (const Seg& sg : ds)
      for (uint64_t at = 0; sg.stale && at < sg.len;) {
        const uint64_t n = std::min(sg.len - at, kStaleBytes);
        void* to = reinterpret_cast<void*>(sg.addr + at);
        if (dst.pid == me) {
          std::memset(to, 0, n);
        } else {
          iovec l{const_cast<unsigned char*>(zeros.data()), n}, rem{to, n};
          if (process_vm_writev(dst.pid, &l, 1, &rem, 1, 0) != static_cast<ssize_t>(n)) break;
        }
        at += n;
      }
  }
  return copy_stale(f, src, src_start, src_mask, dst, dst_start, dst_mask, total, other_start);
}

ibv_wc_opcode send_wc_opcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    default: return IBV_WC_SEND;
  }
}

// Thunderbolt send-queue accounting: frames leave tx_frames when their send
// completes, whoever completes it. Saturating, and only while the slot still
// holds that QP (a reset QP starts from zero).
// A send counted in frames is one work request of tx_wrs too (quirk post_limit).
void tx_release(Shared* s, uint32_t qpn, uint32_t frames) {
  if (!frames) return;
  ShmQp& x = s->qps[qpn & (kMaxQps - 1)];
  if (__atomic_load_n(&x.qpn, __ATOMIC_RELAXED) != qpn) return;
  uint32_t cur = __atomic_load_n(&x.tx_frames, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&x.tx_frames, &cur, cur > frames ? cur - frames : 0u, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  cur = __atomic_load_n(&x.tx_wrs, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&x.tx_wrs, &cur, cur > 0 ? cur - 1 : 0u, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
}

// Link pacing (docs/emulator.md, "Link pacing"): a message of `len` bytes leaving through `port`
// at `ready_ns` (when the sender handed it over; 0: now) starts when the direction is free (the
// previous message's last byte), occupies it len / B, and is delivered L after its last byte.
// Reserves the direction and returns the delivery time (CLOCK_MONOTONIC ns), or 0 on an unpaced
// cable. Senders of several processes may share a port: the busy clock moves by compare-and-swap.
// The emulator's own copy of the payload happens between the hand-over and this call: counting
// from the hand-over keeps that copy out of the modelled latency (it added about 1 us a hop).
int64_t wire_due(Fabric& f, uint32_t port, uint64_t len, int64_t ready_ns = 0) {
  if (!f.paced || port >= f.ports.size()) return 0;
  const LinkModel& m = f.ports[port].link;
  if (!m.paced()) return 0;
  const int64_t now = ready_ns > 0 ? ready_ns : now_ns();
  int64_t end = now;
  if (m.ns_per_byte > 0) {
    const auto busy_ns = static_cast<int64_t>(double(len) * m.ns_per_byte + 0.5);
    int64_t* busy = &f.shm->ports[port].busy_until_ns;
    int64_t cur = __atomic_load_n(busy, __ATOMIC_RELAXED);
    do end = std::max(now, cur) + busy_ns;
    while (!__atomic_compare_exchange_n(busy, &cur, end, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  }
  return std::max<int64_t>(end + m.latency_ns, 1);  // 1: paced, due at once (0 means unpaced)
}

// `due`: when the completion may be handed out (wire_due; 0 = at once).
void complete_send(EmuQp* q, SendOp& op, ibv_wc_status st, int64_t due = 0) {
  tx_release(q->ctx->fab->shm, q->s->qpn, op.frames_counted);
  op.frames_counted = 0;
  if (st == IBV_WC_SUCCESS && !(op.flags & IBV_SEND_SIGNALED) && !q->sq_sig_all) return;
  ibv_wc wc{};
  wc.wr_id = op.wr_id;
  wc.status = st;
  wc.opcode = send_wc_opcode(op.opcode);
  wc.byte_len = static_cast<uint32_t>(op.len);
  wc.qp_num = q->qp.qp_num;
  cq_push(*q->ctx->fab, q->scq->slot, wc, false, due);
}

// A send that went out on the wire and completes successfully (delivered, or lost on the way as
// UC loses): it occupies its direction and completes when the link model delivers it.
void complete_sent(EmuQp* q, SendOp& op) {
  complete_send(q, op, IBV_WC_SUCCESS, wire_due(*q->ctx->fab, q->s->port, op.len));
}

// The completion of a send that waited in a receiver's queue (pushed by whichever
// process resolves it; errors are always reported, successes only if signaled).
void complete_waiting(Fabric& f, const WaitEntry& w, ibv_wc_status st, int64_t due = 0) {
  tx_release(f.shm, w.src_qpn, w.frames);
  if (st == IBV_WC_SUCCESS && !w.signaled) return;
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = st;
  wc.opcode = IBV_WC_SEND;
  wc.byte_len = static_cast<uint32_t>(w.len);
  wc.qp_num = w.src_qpn;
  cq_push(f, w.send_cq, wc, false, due);
}

// Removes (in order) the entries of sender `src_qpn` from a receiver's wait queue.
// Caller holds rx.lock.
void remove_waiting(ShmQp& rx, uint32_t src_qpn, std::vector<WaitEntry>* removed) {
  uint32_t out = rx.whead;
  for (uint32_t i = rx.whead; i != rx.wtail; ++i) {
    const WaitEntry& w = rx.waiting[i & (kWaitRing - 1)];
    if (w.src_qpn == src_qpn) {
      if (removed) removed->push_back(w);
    } else {
      rx.waiting[out++ & (kWaitRing - 1)] = w;
    }
  }
  rx.wtail = out;
}

void notify_channel(Fabric& f, int32_t pid, uint32_t channel, uint32_t cq_slot) {
  // The channel is a FIFO read by its owner; a 4-byte record (<= PIPE_BUF) is atomic.
  std::string path = channel_path(f, pid, channel);
  int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // owner gone: nobody to wake
  ssize_t r = ::write(fd, &cq_slot, sizeof cq_slot);
  (void)r;
  ::close(fd);
}

// Done: the WR left this QP's send queue (completed, lost, or waiting in the
// receiver's queue). Rnr/NotReady: RC retries. NoCredit: empty_rq=wait and the
// peer QP cannot take it yet (no such QP, or no link): it stays queued here and
// is retried on every post and poll, for ever (a send without credits never
// completes on hardware either).
enum class Tx { Done, Rnr, NotReady, NoCredit };

// Packets a message of `len` bytes takes at the sender's path MTU.
inline uint32_t packets_of(const ShmQp* me, uint64_t len) {
  uint32_t mtu = me->mtu_bytes ? me->mtu_bytes : 1024;
  return len == 0 ? 1 : static_cast<uint32_t>((len + mtu - 1) / mtu);
}

// Everything a send needs to know about the receiving side, read once.
struct PeerView {
  ShmQp* qp = nullptr;
  int32_t pid = 0;
  uint64_t pid_start = 0;
  uint32_t pd = 0, qpn = 0, recv_cq = 0, access = 0;
};

// Whether receiver `p` is connected back to sender `me` and may receive.
inline bool peer_ready(const ShmQp* p, const ShmQp* me) {
  uint32_t st = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
  // p->wire != me->wire: a RoCE v1 end and a RoCE v2 end (rdma-core-roce) do not hear each
  // other; RC retries until RETRY_EXC_ERR, UC loses it (docs/field-reports.md row 23; our model).
  return (st == IBV_QPS_RTR || st == IBV_QPS_RTS) && p->type == me->type && p->dest_qpn == me->qpn &&
         static_cast<int32_t>(p->port) == me->peer_port && p->wire == me->wire;
}

enum class Peer { NoLink, Absent, NotReady, Ready };

Peer find_peer(EmuQp* q, PeerView* pv) {
  Fabric& f = *q->ctx->fab;
  ShmQp* me = q->s;
  if (me->peer_port < 0 || !port_active(f, static_cast<int>(me->port))) return Peer::NoLink;
  uint32_t dq = me->dest_qpn;
  ShmQp* p = &f.shm->qps[dq & (kMaxQps - 1)];
  if (!__atomic_load_n(&p->in_use, __ATOMIC_ACQUIRE) || p->qpn != dq) return Peer::Absent;
  pv->qp = p;
  pv->pid = p->pid;
  pv->pid_start = p->pid_start;
  pv->pd = p->pd;
  pv->qpn = p->qpn;
  pv->recv_cq = p->recv_cq;
  pv->access = p->access;
  return peer_ready(p, me) ? Peer::Ready : Peer::NotReady;
}

// Builds the source iovecs of a send and their regions (0 for inline data, which is no region's).
// Returns false if an lkey check fails.
bool source_iov(EmuQp* q, const SendOp& op, iovec* iov, uint32_t* keys, unsigned* n) {
  Shared* s = q->ctx->fab->shm;
  *n = 0;
  for (uint32_t i = 0; i < op.num_sge; ++i) {
    const ibv_sge& g = op.sge[i];
    if (g.length == 0) continue;
    uint64_t a = g.addr;
    if (!op.is_inline && !check_region(s, g.lkey, g.addr, g.length, q->s->pid, q->s->pd, 0, &a)) return false;
    iov[*n].iov_base = reinterpret_cast<void*>(a);
    iov[*n].iov_len = g.length;
    keys[*n] = op.is_inline ? 0 : g.lkey;
    ++*n;
  }
  return true;
}

// A message meeting a receive: the checks and the copy, shared by the sender
// (which found a posted receive) and the receiver (which posted one for a
// waiting send).
struct Msg {
  ibv_wr_opcode opcode;
  uint64_t len;
  const iovec* src;
  const uint32_t* src_keys;  // the region of each source range (the page check)
  unsigned nsrc;
  int32_t src_pid;
  uint32_t src_qpn;
  const iovec* wdst = nullptr;  // RDMA WRITE_WITH_IMM: the checked remote range
  uint32_t wkey = 0;            // ... and its rkey
};
struct Outcome {
  ibv_wc_status recv = IBV_WC_SUCCESS;
  ibv_wc_status sender = IBV_WC_SUCCESS;  // what an RC responder would report
  bool gone = false;                      // the other process is gone (nothing was written)
};

// `other_start`: the start time of the process on the other side (see same_process).
// `pairs_frames`: the receiver is a Mac, whose driver pairs a send with a receive of as many frames.
Outcome deliver(const Fabric& f, const Msg& m, RecvEntry e, int32_t dst_pid, uint32_t dst_qpn, bool pairs_frames,
                uint64_t other_start) {
  Shared* s = f.shm;
  Outcome o;
  const bool is_write = m.wdst != nullptr;
  // The receive's SGEs were checked when posted; pin their regions (which fails for one
  // deregistered since), so none can be deregistered under the copy.
  RegionPins pins(s);
  for (uint32_t i = 0; i < e.num_sge && e.status == IBV_WC_SUCCESS; ++i)
    if (e.sge[i].length && !pins.add(e.sge[i].lkey)) e.status = IBV_WC_LOC_PROT_ERR;
  if (e.status != IBV_WC_SUCCESS) {
    o.recv = static_cast<ibv_wc_status>(e.status);
    o.sender = IBV_WC_REM_OP_ERR;
    return o;
  }
  if (!is_write && m.len > e.total) {
    o.recv = IBV_WC_LOC_LEN_ERR;
    o.sender = IBV_WC_REM_INV_REQ_ERR;
    return o;
  }
  if (pairs_frames && !is_write && frames_of(m.len) != e.frames) {
    // TN3205: send and receive must span the same number of 4 KiB frames. Fail loudly.
    std::fprintf(stderr,
                 "tbverbs-emu: frame mismatch on QP 0x%x: send of %llu bytes spans %u frame(s), "
                 "posted receive spans %u; the receive completes with an error\n",
                 dst_qpn, static_cast<unsigned long long>(m.len), frames_of(m.len), e.frames);
    o.recv = IBV_WC_LOC_LEN_ERR;
    return o;
  }
  Copy r;
  const Span src{m.src_pid, m.src, m.src_keys, m.nsrc, m.src_qpn};
  if (is_write) {
    r = copy_checked(f, src, Span{dst_pid, m.wdst, &m.wkey, 1, dst_qpn}, m.len, other_start);
  } else {
    iovec dst[kMaxSge];
    uint32_t keys[kMaxSge];
    unsigned nd = 0;
    uint64_t left = m.len;
    for (uint32_t i = 0; i < e.num_sge && left > 0; ++i) {
      uint64_t n = std::min<uint64_t>(e.sge[i].length, left);
      if (n == 0) continue;
      dst[nd].iov_base = reinterpret_cast<void*>(e.sge[i].addr);
      dst[nd].iov_len = n;
      keys[nd] = e.sge[i].lkey;
      ++nd;
      left -= n;
    }
    r = copy_checked(f, src, Span{dst_pid, dst, keys, nd, dst_qpn}, m.len, other_start);
  }
  if (r == Copy::Gone) o.gone = true;
  if (r == Copy::Fault) {
    o.recv = IBV_WC_LOC_PROT_ERR;
    o.sender = IBV_WC_REM_OP_ERR;
  }
  return o;
}

ibv_wc recv_wc(const RecvEntry& e, const Outcome& o, ibv_wr_opcode op, uint64_t len, uint32_t imm, uint32_t qpn,
               uint32_t src_qpn) {
  ibv_wc rwc{};
  rwc.wr_id = e.wr_id;
  rwc.status = o.recv;
  rwc.opcode = op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  rwc.byte_len = o.recv == IBV_WC_SUCCESS ? static_cast<uint32_t>(len) : 0;
  rwc.qp_num = qpn;
  rwc.src_qp = src_qpn;
  if (op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
    rwc.wc_flags = IBV_WC_WITH_IMM;
    rwc.imm_data = imm;
  }
  return rwc;
}

// What a UC send does when the receiver has no receive for it: the receiver's driver decides. A
// Mac: the empty_rq reading. A usb4_rdma host facing a Mac: buffered until a receive is posted
// (ibdev.c: early Apple receives are kept, TBV_APPLE_PENDING_RX_SLOTS of them). rdma-core UC: lost.
uint32_t empty_rq_mode(EmuQp* q, bool far_tb) {
  if (!far_tb) return is_tb(q) && far_profile(q) == Profile::Usb4Rdma ? kEmptyRqWait : kEmptyRqDrop;
  Fabric& f = *q->ctx->fab;
  uint32_t m = quirk(f, Profile::Thunderbolt, Quirk::EmptyRq);
  // The sticky-loss fault is the kill reading for one host.
  if (m != kEmptyRqKill && fault_sticky_loss(f, q->ctx->host)) m = kEmptyRqKill;
  return m;
}

// An RDMA READ (RC only; refused at post elsewhere): the requester copies the peer's
// region into its own SGEs, which need LOCAL_WRITE (IB spec: the read response is written
// into local memory). A bad rkey, a range outside the region, or a region or QP without
// REMOTE_READ is the responder's NAK: REM_ACCESS_ERR.
Tx try_read(EmuQp* q, SendOp& op, const PeerView& pv) {
  const int64_t ready_ns = q->ctx->fab->paced ? now_ns() : 0;  // wire_due: before the copy
  Shared* s = q->ctx->fab->shm;
  RegionPins pins(s);  // the local targets and the remote source, until the copy is done
  iovec dst[kMaxSge];
  uint32_t dkeys[kMaxSge];
  unsigned nd = 0;
  for (uint32_t i = 0; i < op.num_sge; ++i) {
    const ibv_sge& g = op.sge[i];
    if (g.length == 0) continue;
    uint64_t a = 0;
    if (!pins.add(g.lkey) ||
        !check_region(s, g.lkey, g.addr, g.length, q->s->pid, q->s->pd, IBV_ACCESS_LOCAL_WRITE, &a)) {
      complete_send(q, op, IBV_WC_LOC_PROT_ERR);
      qp_to_error(q);
      return Tx::Done;
    }
    dst[nd].iov_base = reinterpret_cast<void*>(a);
    dst[nd].iov_len = g.length;
    dkeys[nd] = g.lkey;
    ++nd;
  }
  uint64_t ra = 0;
  bool ok = (pv.access & IBV_ACCESS_REMOTE_READ) && (op.len == 0 || pins.add(op.rkey)) &&
            (op.len == 0 || check_region(s, op.rkey, op.raddr, op.len, pv.pid, pv.pd, IBV_ACCESS_REMOTE_READ, &ra));
  if (!ok) {
    complete_send(q, op, IBV_WC_REM_ACCESS_ERR);
    qp_to_error(q);
    return Tx::Done;
  }
  {
    BoundedGuard g(pv.qp->lock);  // a stopped responder: no response (RC retries)
    if (!g.ok() || pv.qp->rq_psn != q->s->sq_psn) return Tx::NotReady;  // out of sequence: no response
  }
  iovec src{reinterpret_cast<void*>(ra), op.len};
  if (copy_checked(*q->ctx->fab, Span{pv.pid, &src, &op.rkey, 1, pv.qpn}, Span{q->s->pid, dst, dkeys, nd, q->qp.qp_num},
                   op.len, pv.pid_start) != Copy::Ok)
    return Tx::NotReady;
  uint32_t n = packets_of(q->s, op.len);  // the response packets take the request's PSNs
  {
    BoundedGuard g(pv.qp->lock);
    if (!g.ok()) return Tx::NotReady;  // stopped since: the READ is asked again (it reads the same bytes)
    pv.qp->rq_psn = (pv.qp->rq_psn + n) & 0xffffff;
  }
  q->s->sq_psn = (q->s->sq_psn + n) & 0xffffff;
  // Paced cables (our model): the request waits behind this port's sends and takes L, the
  // response occupies the responder's direction; the READ completes when both are through.
  Fabric& f = *q->ctx->fab;
  const int64_t req = wire_due(f, q->s->port, 0, ready_ns);
  const int64_t resp = q->s->peer_port >= 0 ? wire_due(f, static_cast<uint32_t>(q->s->peer_port), op.len, ready_ns) : 0;
  complete_send(q, op, IBV_WC_SUCCESS, std::max(req, resp));
  return Tx::Done;
}

inline bool is_atomic(ibv_wr_opcode op) { return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD; }

// An RDMA atomic (RC on the profiles with atomic_cap HCA; refused at post elsewhere): 8 bytes at
// an 8-aligned remote address, the original value written to the one local SGE of 8 bytes (IB
// spec). A misaligned address is the responder's Invalid Request NAK (REM_INV_REQ_ERR); a bad
// rkey, a range outside the region or a region or QP without REMOTE_ATOMIC is REM_ACCESS_ERR.
// The read-modify-write runs under the fabric's atomics lock, so the emulated atomics of every
// process are atomic with respect to one another, not to the target CPU's own stores (as
// IBV_ATOMIC_HCA promises; our assumption, docs/emulator.md). The value is the target's native
// 64-bit integer (our assumption: hosts of one emulated fabric share the byte order).
Tx try_atomic(EmuQp* q, SendOp& op, const PeerView& pv) {
  Shared* s = q->ctx->fab->shm;
  const int32_t me = q->s->pid;
  RegionPins pins(s);  // the local result buffer and the remote word, until both are written
  const ibv_sge& g = op.sge[0];
  uint64_t la = 0;
  if (!pins.add(g.lkey) || !check_region(s, g.lkey, g.addr, 8, me, q->s->pd, IBV_ACCESS_LOCAL_WRITE, &la)) {
    complete_send(q, op, IBV_WC_LOC_PROT_ERR);
    qp_to_error(q);
    return Tx::Done;
  }
  if (op.raddr % 8 != 0) {
    complete_send(q, op, IBV_WC_REM_INV_REQ_ERR);
    qp_to_error(q);
    return Tx::Done;
  }
  uint64_t ra = 0;
  if (!(pv.access & IBV_ACCESS_REMOTE_ATOMIC) || !pins.add(op.rkey) ||
      !check_region(s, op.rkey, op.raddr, 8, pv.pid, pv.pd, IBV_ACCESS_REMOTE_ATOMIC, &ra)) {
    complete_send(q, op, IBV_WC_REM_ACCESS_ERR);
    qp_to_error(q);
    return Tx::Done;
  }
  {
    Guard pg(pv.qp->lock);
    if (pv.qp->rq_psn != q->s->sq_psn) return Tx::NotReady;  // out of sequence: no response
  }
  // The page check (pages.cpp): a stale target word is the old page's; the NIC reads and writes
  // that one, so the new page is left alone and the value returned is unknown (0xdb bytes here). A
  // stale local result buffer is not written.
  // An 8-byte word: the full check (one pagemap entry) costs less than the fast path.
  Fabric& f = *q->ctx->fab;
  uint64_t first = 0;
  const bool remote_stale = g_page_check && pages_stale(f, pv.pid, pv.pid_start, op.rkey, ra, 8, &first);
  if (remote_stale) report_stale(f, op.rkey, first, false, pv.qpn);
  const bool local_stale = g_page_check && pages_stale(f, me, self_start(), g.lkey, la, 8, &first);
  if (local_stale) report_stale(f, g.lkey, first, false, q->qp.qp_num);
  uint64_t old = 0;
  if (remote_stale) {
    std::memcpy(&old, stale_bytes(), 8);
  } else {
    Guard ag(s->atomics);
    iovec remote{reinterpret_cast<void*>(ra), 8}, mine{&old, 8};
    if (copy_iov(pv.pid, &remote, 1, me, &mine, 1, 8, pv.pid_start) != Copy::Ok) return Tx::NotReady;
    uint64_t next = op.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? old + op.compare_add
                                                            : (old == op.compare_add ? op.swap : old);
    iovec val{&next, 8};
    if (next != old && copy_iov(me, &val, 1, pv.pid, &remote, 1, 8, pv.pid_start) != Copy::Ok) return Tx::NotReady;
  }
  if (!local_stale) std::memcpy(reinterpret_cast<void*>(la), &old, 8);  // the local SGE is this process's
  {
    Guard pg(pv.qp->lock);
    pv.qp->rq_psn = (pv.qp->rq_psn + 1) & 0xffffff;
  }
  q->s->sq_psn = (q->s->sq_psn + 1) & 0xffffff;
  // Paced cables: as a READ of 8 bytes (request one way, response the other).
  const int64_t req = wire_due(f, q->s->port, 0);
  const int64_t resp = q->s->peer_port >= 0 ? wire_due(f, static_cast<uint32_t>(q->s->peer_port), 8) : 0;
  complete_send(q, op, IBV_WC_SUCCESS, std::max(req, resp));
  return Tx::Done;
}

// Attempts one send work request.
// Trace lines of the sender's side of a message (trace.cpp): lost on the way, with the reason and
// the quirk or fault that decided it; delivered into the peer's memory.
void lost(const EmuQp* q, const SendOp& op, const char* why) {
  EMU_TRACE_QP(q, "drop", "wr_id=%llu op=%s len=%llu %s", static_cast<unsigned long long>(op.wr_id),
               opcode_name(op.opcode), static_cast<unsigned long long>(op.len), why);
}
void delivered(const EmuQp* q, const SendOp& op, const PeerView& pv, int64_t due = 0) {
  if (__builtin_expect(!g_trace_on, 1)) return;
  const Fabric& f = *q->ctx->fab;
  const uint32_t dev = pv.qp ? __atomic_load_n(&pv.qp->device, __ATOMIC_RELAXED) : 0;
  const bool known = pv.qp && dev < f.devices.size();
  const int64_t late = due ? due - now_ns() : 0;
  trace_event(f, q->ctx->host, q->ctx->dev, q->qp.qp_num, "deliver",
              "wr_id=%llu op=%s len=%llu to=%s:%s:0x%06x%s", static_cast<unsigned long long>(op.wr_id),
              opcode_name(op.opcode), static_cast<unsigned long long>(op.len),
              known ? f.hosts[f.devices[dev].host].name.c_str() : "?", known ? f.devices[dev].name.c_str() : "?",
              pv.qpn, late > 0 ? " (paced link: completes later)" : "");
}

Tx try_send(EmuQp* q, SendOp& op) {
  Fabric& f = *q->ctx->fab;
  const int64_t ready_ns = f.paced ? now_ns() : 0;  // wire_due: before the copy
  Shared* s = f.shm;
  const bool rc = q->s->type == IBV_QPT_RC;
  const bool tb = is_tb(q);
  const bool is_write = op.opcode == IBV_WR_RDMA_WRITE || op.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;

  iovec src[kMaxSge];
  uint32_t src_keys[kMaxSge];
  unsigned nsrc = 0;
  if (!source_iov(q, op, src, src_keys, &nsrc)) {
    complete_send(q, op, IBV_WC_LOC_PROT_ERR);
    qp_to_error(q);
    return Tx::Done;
  }
  if (tb && is_write) {
    // As reported for Apple's driver (ds4): RDMA WRITE is accepted and completes, but nothing moves.
    // The driver says nothing; we say it once per process (issue 14), so a benchmark's
    // figure for writes is not mistaken for a transfer.
    static std::atomic_flag warned = ATOMIC_FLAG_INIT;
    if (!warned.test_and_set(std::memory_order_relaxed))
      std::fprintf(stderr,
                   "tbverbs-emu: RDMA WRITE on Thunderbolt (%s) is accepted and completes but moves nothing, "
                   "as reported for Apple's driver (ds4); this is printed once per process\n",
                   f.devices[q->ctx->dev].name.c_str());
    lost(q, op, "reason=thunderbolt_write_moves_nothing (as reported for Apple's driver, ds4)");
    complete_sent(q, op);
    return Tx::Done;
  }
  if (__atomic_load_n(&q->s->drop_tx, __ATOMIC_RELAXED)) {
    if (rc) return Tx::NotReady;  // the wire eats it; RC notices through its retry timer
    lost(q, op, "reason=direction_dead fault=drop or empty_rq=kill");
    complete_sent(q, op);
    return Tx::Done;
  }
  const bool far_tb = far_is_tb(q);  // the receiver is a Mac: its rules hold
  if ((tb || far_tb) && frames_of(op.len) > 1 && quirk(f, Profile::Thunderbolt, Quirk::MacOs) == kMacOs26_2) {
    // Quirk macos=26.2 (ds4, JACCL): a message of more than one frame is never
    // delivered; the send completes, the peer's receive stays posted. Our assumption: the same
    // whichever end is the Mac (reports are Mac to Mac).
    lost(q, op, "reason=multi_frame_message quirk=macos=26.2");
    complete_sent(q, op);
    return Tx::Done;
  }
  const uint32_t mode = rc ? kEmptyRqDrop : empty_rq_mode(q, far_tb);
  const bool wait = mode == kEmptyRqWait;
  PeerView pv;
  Peer peer = find_peer(q, &pv);
  if (peer == Peer::NoLink || peer == Peer::Absent) {
    if (rc) return Tx::NotReady;
    if (wait) return Tx::NoCredit;
    lost(q, op, peer == Peer::NoLink ? "reason=no_link (port down or no cable)" : "reason=no_peer_qp");
    complete_sent(q, op);  // UC: silently lost
    return Tx::Done;
  }
  if (peer == Peer::NotReady && !wait) {
    if (rc) return Tx::NotReady;
    lost(q, op, "reason=peer_qp_not_ready (not in RTR/RTS, or not connected back)");
    complete_sent(q, op);  // UC: silently lost
    return Tx::Done;
  }

  if (op.opcode == IBV_WR_RDMA_READ) return try_read(q, op, pv);
  if (is_atomic(op.opcode)) return try_atomic(q, op, pv);

  // Remote region of an RDMA WRITE: checked before any receive is consumed.
  // (Never under empty_rq=wait: Thunderbolt writes returned above.)
  iovec wdst{};
  RegionPins wpin(s);  // the target region, pinned before it is checked and until the copy is done
  if (is_write) {
    uint64_t a = 0;
    bool ok = (pv.access & IBV_ACCESS_REMOTE_WRITE) && wpin.add(op.rkey) &&
              check_region(s, op.rkey, op.raddr, op.len, pv.pid, pv.pd, IBV_ACCESS_REMOTE_WRITE, &a);
    if (!ok) {
      if (rc) {
        complete_send(q, op, IBV_WC_REM_ACCESS_ERR);
        qp_to_error(q);
      } else {
        lost(q, op, "reason=remote_access (rkey, range or rights)");
        complete_sent(q, op);  // UC responder drops bad packets silently
      }
      return Tx::Done;
    }
    wdst.iov_base = reinterpret_cast<void*>(a);
    wdst.iov_len = op.len;
    if (op.opcode == IBV_WR_RDMA_WRITE) {
      if (rc) {
        BoundedGuard g(pv.qp->lock);  // a stopped responder sends no ACK
        if (!g.ok() || pv.qp->rq_psn != q->s->sq_psn) return Tx::NotReady;  // out of sequence: no ACK
      }
      if (copy_checked(f, Span{q->s->pid, src, src_keys, nsrc, q->qp.qp_num}, Span{pv.pid, &wdst, &op.rkey, 1, pv.qpn},
                       op.len, pv.pid_start) != Copy::Ok) {
        if (rc) return Tx::NotReady;
        lost(q, op, "reason=dead_peer");
        complete_sent(q, op);
        return Tx::Done;
      }
      if (rc) {
        uint32_t n = packets_of(q->s, op.len);
        {
          BoundedGuard g(pv.qp->lock);
          if (!g.ok()) return Tx::NotReady;  // stopped since: no ACK, the same bytes are written again
          pv.qp->rq_psn = (pv.qp->rq_psn + n) & 0xffffff;
        }
        q->s->sq_psn = (q->s->sq_psn + n) & 0xffffff;
      }
      delivered(q, op, pv);
      complete_sent(q, op);
      return Tx::Done;
    }
  }

  // Takes the peer's next posted receive, or (empty_rq=wait) queues the send at
  // the peer, behind the sends already waiting there so that order is kept.
  enum { Took, Empty, Queued, Full, Gone, Stopped } got = Empty;
  RecvEntry e;
  {
    BoundedGuard g(pv.qp->lock);
    ShmQp* p = pv.qp;
    if (!g.ok()) {
      got = Stopped;  // its receive ring is held by a stopped process
    } else if (rc && p->rq_psn != q->s->sq_psn) {
      return Tx::NotReady;  // out of sequence: no ACK
    } else if (p->qpn != pv.qpn) {
      got = Gone;  // destroyed since
    } else if (peer_ready(p, q->s) && p->head != p->tail && (!wait || p->whead == p->wtail)) {
      if (rc) {  // the message is taken: both ends move past its packets
        uint32_t n = packets_of(q->s, op.len);
        p->rq_psn = (p->rq_psn + n) & 0xffffff;
        q->s->sq_psn = (q->s->sq_psn + n) & 0xffffff;
      }
      e = p->ring[p->head & (kRecvRing - 1)];
      p->head++;
      p->recv_frames -= std::min(p->recv_frames, e.frames);
      got = Took;
    } else if (wait && nsrc <= 1) {  // Thunderbolt grants one SGE, so one source range
      if (p->wtail - p->whead >= (far_tb ? kWaitRing : kUsb4EarlyReceives)) {
        got = Full;
      } else {
        WaitEntry& w = p->waiting[p->wtail & (kWaitRing - 1)];
        w = WaitEntry{};
        w.wr_id = op.wr_id;
        w.src_addr = nsrc ? reinterpret_cast<uint64_t>(src[0].iov_base) : 0;
        w.len = op.len;
        for (uint32_t i = 0; i < op.num_sge; ++i)
          if (op.sge[i].length) w.lkey = op.sge[i].lkey;
        w.pid = q->s->pid;
        w.src_qpn = q->s->qpn;
        w.send_cq = q->scq->slot;
        w.frames = op.frames_counted;  // completing it releases them
        w.signaled = (op.flags & IBV_SEND_SIGNALED) || q->sq_sig_all;
        w.solicited = (op.flags & IBV_SEND_SOLICITED) != 0;
        p->wtail++;
        got = Queued;
      }
    }
  }
  switch (got) {
    case Queued:
      op.frames_counted = 0;  // now the waiting entry's
      return Tx::Done;
    case Full:
      if (!far_tb) {  // a usb4_rdma receiver with every early-receive slot taken drops the message
        lost(q, op, "reason=early_receive_slots_full (usb4_rdma buffers 16 sends from a Mac)");
        complete_sent(q, op);
        return Tx::Done;
      }
      [[fallthrough]];
    case Gone:
    case Stopped:
      if (wait) return Tx::NoCredit;
      if (rc) return Tx::NotReady;
      lost(q, op, got == Stopped ? "reason=peer_stopped (a stopped process holds its receive queue)" : "reason=peer_qp_gone");
      complete_sent(q, op);
      return Tx::Done;
    case Empty:
      if (!rc) {
        // UC, no receive posted: lost (drop). kill (ds4's report on Apple's driver):
        // lost, and the direction then stays dead.
        if (mode == kEmptyRqKill) __atomic_store_n(&q->s->drop_tx, 1u, __ATOMIC_RELEASE);
        lost(q, op, mode == kEmptyRqKill ? "reason=empty_receive_queue quirk=empty_rq=kill (this direction is now dead)"
                                         : "reason=empty_receive_queue quirk=empty_rq=drop");
        complete_sent(q, op);
        return Tx::Done;
      }
      return pid_alive(pv.pid) ? Tx::Rnr : Tx::NotReady;
    case Took: break;
  }

  Msg m{op.opcode, op.len, src, src_keys, nsrc, q->s->pid, q->qp.qp_num, is_write ? &wdst : nullptr, op.rkey};
  Outcome o = deliver(f, m, e, pv.pid, pv.qpn, far_tb, pv.pid_start);
  if (o.gone) {  // the peer process is gone, with its memory
    if (rc) return Tx::NotReady;
    if (wait) return Tx::NoCredit;  // a dead receiver gives no credits: never completes
    lost(q, op, "reason=dead_peer");
    complete_sent(q, op);
    return Tx::Done;
  }
  const int64_t due = wire_due(f, q->s->port, op.len, ready_ns);
  delivered(q, op, pv, due);
  cq_push(f, pv.recv_cq, recv_wc(e, o, op.opcode, op.len, op.imm, pv.qpn, q->qp.qp_num),
          (op.flags & IBV_SEND_SOLICITED) != 0, due);
  ibv_wc_status sender_status = rc ? o.sender : IBV_WC_SUCCESS;  // UC has no responder feedback
  complete_send(q, op, sender_status, due);
  if (sender_status != IBV_WC_SUCCESS) qp_to_error(q);
  return Tx::Done;
}

// RNR timer encoding of the IB spec (min_rnr_timer), in nanoseconds.
int64_t rnr_timer_ns(uint32_t code) {
  static const uint32_t us_x100[32] = {65536, 1,    2,    3,    4,     6,     8,     12,    16,    24,   32,
                                       48,    64,   96,   128,  192,   256,   384,   512,   768,   1024, 1536,
                                       2048,  3072, 4096, 6144, 8192,  12288, 16384, 24576, 32768, 49152};
  return int64_t(us_x100[code & 31]) * 10000;
}

// Local ACK timeout 4.096 µs * 2^timeout; 0 ("infinite") is capped so nothing hangs.
int64_t ack_timeout_ns(uint32_t t) {
  if (t == 0 || t > 20) t = 14;
  return int64_t(4096) << t;
}

void add_pending_qp(EmuQp* q) {
  std::lock_guard<std::mutex> g(g_pending_mu);
  if (std::find(g_pending_qps.begin(), g_pending_qps.end(), q) == g_pending_qps.end()) {
    g_pending_qps.push_back(q);
    g_pending_count.fetch_add(1);
  }
}

// Runs the deferred sends of one QP in order. Caller holds q->mu.
void progress_locked(EmuQp* q) {
  while (!q->pending.empty()) {
    int64_t now = now_ns();
    if (now < q->pending.front().not_before_ns) break;
    // Take the op off the queue first: a failure moves the QP to ERR, which
    // flushes whatever is still queued.
    SendOp op = std::move(q->pending.front());
    q->pending.pop_front();
    q->npending.fetch_sub(1);
    if (op.first_try_ns == 0) op.first_try_ns = now;
    Tx r = try_send(q, op);
    if (r == Tx::Done) {
      if (q->s->state == IBV_QPS_ERR) break;
      continue;
    }
    if (r == Tx::NoCredit) {  // waits for the peer for ever (see Tx)
      q->pending.push_front(std::move(op));
      q->npending.fetch_add(1);
      break;
    }
    int64_t budget;
    ibv_wc_status fail;
    if (r == Tx::Rnr) {
      budget = q->attr.rnr_retry >= 7  // 7 = retry for ever, as the spec says
                   ? INT64_MAX
                   : int64_t(q->attr.rnr_retry + 1) *
                         rnr_timer_ns(q->attr.min_rnr_timer ? q->attr.min_rnr_timer : 12);
      fail = IBV_WC_RNR_RETRY_EXC_ERR;
    } else {
      budget = int64_t(q->attr.retry_cnt + 1) * ack_timeout_ns(q->attr.timeout);
      fail = IBV_WC_RETRY_EXC_ERR;
    }
    if (now - op.first_try_ns < budget) {
      q->pending.push_front(std::move(op));
      q->npending.fetch_add(1);
      break;
    }
    complete_send(q, op, fail);
    qp_to_error(q);
    break;
  }
}

}  // namespace

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

const ShmMr* mr_of_key(Shared* s, uint32_t key) {
  if (key == 0) return nullptr;
  const ShmMr* m = &s->mrs[key & (kMaxMrs - 1)];
  return __atomic_load_n(&m->key, __ATOMIC_ACQUIRE) == key ? m : nullptr;
}

// A QP moved to RESET leaves no completions behind in its CQs, as providers clean them
// (rdma-core's mlx5 does; our assumption for the others): a QP restarted from RESET must not
// hand its new user the flushed work of its past. The CQ is marked paced first, so its pollers
// take the lock from now on (see emu_poll_cq) while entries move; our assumption: no thread
// polls the CQ in the very instant the first reset marks it.
void cq_clean(Fabric& f, uint32_t cq_slot, uint32_t qpn) {
  if (cq_slot >= kMaxCqs) return;
  ShmCq& c = f.shm->cqs[cq_slot];
  BoundedGuard g(c.lock);
  if (!g.ok() || !c.in_use) return;  // held by a stopped process: its stale completions stay
  if (!c.paced) __atomic_store_n(&c.paced, 1u, __ATOMIC_SEQ_CST);
  const uint32_t head = __atomic_load_n(&c.head, __ATOMIC_ACQUIRE);
  uint32_t out = head;
  for (uint32_t i = head; i != c.tail; ++i) {
    if (c.ring[i & (kCqRing - 1)].qp_num == qpn) continue;
    c.ring[out & (kCqRing - 1)] = c.ring[i & (kCqRing - 1)];
    c.due[out & (kCqRing - 1)] = c.due[i & (kCqRing - 1)];
    ++out;
  }
  __atomic_store_n(&c.tail, out, __ATOMIC_SEQ_CST);
}

void cq_push(Fabric& f, uint32_t cq_slot, const ibv_wc& wc, bool solicited, int64_t due) {
  if (cq_slot >= kMaxCqs) return;
  ShmCq& c = f.shm->cqs[cq_slot];
  bool wake = false;
  uint32_t channel = 0;
  int32_t chpid = 0;
  {
    BoundedGuard g(c.lock);
    if (!g.ok()) {
      // A stopped process holds the CQ (its owner, or another sender): the completion is lost,
      // as if the CQ had overrun, rather than this verb waiting for a process that may never run.
      static std::atomic_flag said = ATOMIC_FLAG_INIT;
      if (!said.test_and_set(std::memory_order_relaxed))
        std::fprintf(stderr, "tbverbs-emu: a stopped process holds a CQ's lock: its completions are being lost\n");
      if (g_trace_on)
        trace_event(f, -1, static_cast<int>(c.device), wc.qp_num, "cq_lost",
                    "wr_id=%llu (a stopped process holds the CQ's lock)", static_cast<unsigned long long>(wc.wr_id));
      return;
    }
    if (!c.in_use) return;
    uint32_t head = __atomic_load_n(&c.head, __ATOMIC_ACQUIRE);
    if (c.tail - head >= c.capacity) {
      // CQ overrun: the completion is lost, as on hardware. Say so once per CQ.
      // overflow: 1 = overran, 2 = its owner reported IBV_EVENT_CQ_ERR (async_events.cpp).
      if (!c.overflow) {
        std::fprintf(stderr, "tbverbs-emu: CQ overrun (capacity %u): completions are being lost\n", c.capacity);
        c.overflow = 1;
      }
      if (g_trace_on)
        trace_event(f, -1, static_cast<int>(c.device), wc.qp_num, "cq_overrun", "wr_id=%llu capacity=%u (completion lost)",
                    static_cast<unsigned long long>(wc.wr_id), c.capacity);
      return;
    }
    uint32_t pos = c.tail;
    if (due > 0) {
      // Paced: pollers of this CQ take its lock from now on (see emu_poll_cq), so entries may move.
      // The entry goes ahead of those due later (another direction's, another QP's), never ahead
      // of one due no later: a QP's own completions keep their order (their due times only grow,
      // and an unpaced one, due 0, stays behind everything queued before it).
      if (!c.paced) __atomic_store_n(&c.paced, 1u, __ATOMIC_SEQ_CST);
      for (; pos != head && c.due[(pos - 1) & (kCqRing - 1)] > due; --pos) {
        c.ring[pos & (kCqRing - 1)] = c.ring[(pos - 1) & (kCqRing - 1)];
        c.due[pos & (kCqRing - 1)] = c.due[(pos - 1) & (kCqRing - 1)];
      }
    }
    c.ring[pos & (kCqRing - 1)] = wc;
    c.due[pos & (kCqRing - 1)] = due;
    __atomic_store_n(&c.tail, c.tail + 1, __ATOMIC_SEQ_CST);
    // The owner may be napping in ibv_poll_cq on any of its CQs (see there); seq_cst pairs with
    // its check of `seq` after it counted itself in `waiters`.
    if (c.bell < kMaxCqs) {
      ShmBell& b = f.shm->bells[c.bell];
      __atomic_add_fetch(&b.seq, 1u, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&b.waiters, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, &b.seq, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    }
    if (c.armed == 1 || (c.armed == 2 && (solicited || wc.status != IBV_WC_SUCCESS))) {
      c.armed = 0;
      wake = c.channel != 0;
      channel = c.channel;
      chpid = c.channel_pid;
      ++c.events;
    }
  }
  if (wake) notify_channel(f, chpid, channel, cq_slot);
}

void qp_to_error(EmuQp* q) {
  Fabric& f = *q->ctx->fab;
  EMU_TRACE_QP(q, "to_error", "sends_pending=%zu receives_posted=%u (all complete with WR_FLUSH_ERR)", q->pending.size(),
               __atomic_load_n(&q->s->tail, __ATOMIC_RELAXED) - __atomic_load_n(&q->s->head, __ATOMIC_RELAXED));
  __atomic_store_n(&q->s->state, static_cast<uint32_t>(IBV_QPS_ERR), __ATOMIC_RELEASE);
  q->attr.qp_state = IBV_QPS_ERR;
  q->qp.state = IBV_QPS_ERR;
  // Flush outstanding sends, oldest first: those waiting at the peer, then the
  // local ones (the caller already took the failed one off the queue).
  forget_waiting_sends(q, true);
  while (!q->pending.empty()) {
    SendOp op = std::move(q->pending.front());
    q->pending.pop_front();
    q->npending.fetch_sub(1);
    complete_send(q, op, IBV_WC_WR_FLUSH_ERR);
  }
  // Flush posted receives; sends waiting for them never complete.
  std::vector<RecvEntry> flushed;
  {
    BoundedGuard g(q->s->lock);  // held by a stopped sender: its receives are flushed at the next ERR
    if (g.ok()) {
      while (q->s->head != q->s->tail) flushed.push_back(q->s->ring[q->s->head++ & (kRecvRing - 1)]);
      q->s->recv_frames = 0;
      discard_waiting(*q->s);
    }
  }
  for (const auto& e : flushed) {
    ibv_wc wc{};
    wc.wr_id = e.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    cq_push(f, q->rcq->slot, wc, false);
  }
}

bool any_pending() { return g_pending_count.load(std::memory_order_relaxed) > 0; }

void progress_all() {
  // Held throughout so a QP cannot be destroyed (forget_pending) while it is progressed.
  // Lock order: g_pending_mu → q->mu; post_send registers only after dropping q->mu.
  std::lock_guard<std::mutex> g(g_pending_mu);
  for (auto it = g_pending_qps.begin(); it != g_pending_qps.end();) {
    EmuQp* q = *it;
    {
      std::lock_guard<std::mutex> gq(q->mu);
      progress_locked(q);
    }
    if (q->npending.load() == 0) {
      it = g_pending_qps.erase(it);
      g_pending_count.fetch_sub(1);
    } else {
      ++it;
    }
  }
}

void forget_pending(EmuQp* q) {
  std::lock_guard<std::mutex> g(g_pending_mu);
  auto it = std::find(g_pending_qps.begin(), g_pending_qps.end(), q);
  if (it != g_pending_qps.end()) {
    g_pending_qps.erase(it);
    g_pending_count.fetch_sub(1);
  }
}

namespace {
int post_send_locked(EmuQp* q, ibv_send_wr* wr, ibv_send_wr** bad, uint32_t delay, bool* deferred);
}

int emu_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  auto* q = reinterpret_cast<EmuQp*>(qp);
  Fabric& f = *q->ctx->fab;
  if (__atomic_load_n(&f.shm->nfaults, __ATOMIC_RELAXED)) apply_async_faults(q->ctx);
  if (int e = fault_check(f, "ibv_post_send", q->ctx->host)) {
    if (bad) *bad = wr;
    return e;
  }
  uint32_t delay = fault_delay_us(f, q->ctx->host);
  t_spin_from_ns = t_last_call_ns = now_ns();
  bool deferred = false;
  int rc_ret = post_send_locked(q, wr, bad, delay, &deferred);
  if (deferred) add_pending_qp(q);  // after q->mu is released (lock order)
  return rc_ret;
}

namespace {

int post_send_locked(EmuQp* q, ibv_send_wr* wr, ibv_send_wr** bad, uint32_t delay, bool* deferred) {
  const bool tb = is_tb(q);
  std::lock_guard<std::mutex> g(q->mu);
  if (!q->pending.empty()) progress_locked(q);
  for (; wr; wr = wr->next) {
    uint32_t state = q->s->state;
    if (state != IBV_QPS_RTS && state != IBV_QPS_ERR) {
      if (bad) *bad = wr;
      return EINVAL;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > q->cap.max_send_sge) {
      if (bad) *bad = wr;
      return EINVAL;
    }
    // hellas-ai/thunderbolt-ibverbs ibdev.c: an inline send, anything but SEND toward a Mac
    // (tbv_post_apple_send), and atomics (tbv_post_send_one) → -EOPNOTSUPP at post.
    if (is_usb4(q) && ((wr->send_flags & IBV_SEND_INLINE) || is_atomic(wr->opcode) ||
                       (q->ctx->fab->devices[q->ctx->dev].mac_compat && wr->opcode != IBV_WR_SEND))) {
      if (bad) *bad = wr;
      return EOPNOTSUPP;
    }
    // RDMA READ is an RC operation (IB spec: UC carries SEND and WRITE only).
    bool supported = wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_RDMA_WRITE ||
                     (!tb && (wr->opcode == IBV_WR_SEND_WITH_IMM || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) ||
                     (tb && wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) ||
                     (wr->opcode == IBV_WR_RDMA_READ && q->s->type == IBV_QPT_RC && !(wr->send_flags & IBV_SEND_INLINE)) ||
                     // Atomics: RC where the device reports atomic_cap HCA, one 8-byte result SGE (IB spec).
                     (is_atomic(wr->opcode) && q->s->type == IBV_QPT_RC && !tb &&
                      limits_of(q->ctx->fab->devices[q->ctx->dev].profile).atomics &&
                      !(wr->send_flags & IBV_SEND_INLINE) && wr->num_sge == 1 && wr->sg_list[0].length == 8);
    if (!supported) {
      if (bad) *bad = wr;
      return EINVAL;
    }
    SendOp op;
    op.wr_id = wr->wr_id;
    op.opcode = wr->opcode;
    op.flags = wr->send_flags;
    op.imm = wr->imm_data;
    if (is_atomic(wr->opcode)) {  // the atomic member of the union has its own layout
      op.raddr = wr->wr.atomic.remote_addr;
      op.rkey = wr->wr.atomic.rkey;
      op.compare_add = wr->wr.atomic.compare_add;
      op.swap = wr->wr.atomic.swap;
    } else {
      op.raddr = wr->wr.rdma.remote_addr;
      op.rkey = wr->wr.rdma.rkey;
    }
    op.num_sge = static_cast<uint32_t>(wr->num_sge);
    op.is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
    for (uint32_t i = 0; i < op.num_sge; ++i) {
      op.sge[i] = wr->sg_list[i];
      op.len += wr->sg_list[i].length;
    }
    if (op.is_inline && op.len > q->cap.max_inline_data) {
      if (bad) *bad = wr;
      return EINVAL;
    }
    EMU_TRACE_QP(q, "post_send", "wr_id=%llu op=%s len=%llu%s%s", static_cast<unsigned long long>(op.wr_id),
                 opcode_name(op.opcode), static_cast<unsigned long long>(op.len), op.is_inline ? " inline" : "",
                 state == IBV_QPS_ERR ? " (QP in ERR: flushed)" : "");
    if (state == IBV_QPS_ERR) {
      complete_send(q, op, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    if (op.len > max_msg_of(*q->ctx->fab, q->ctx->dev)) {
      if (is_usb4(q)) {  // ibdev.c tbv_prepare_send_segments: -EMSGSIZE at post, nothing queued
        if (bad) *bad = wr;
        return EMSGSIZE;
      }
      complete_send(q, op, IBV_WC_LOC_LEN_ERR);  // longer than the port's max_msg_sz
      qp_to_error(q);
      continue;
    }
    if (tb) {
      // TN3205: the send queue is counted in 4 KiB frames; a send holds its frames
      // until it completes (also while it waits for the peer's receive).
      uint32_t fr = frames_of(op.len);
      if (__atomic_load_n(&q->s->tx_frames, __ATOMIC_RELAXED) + fr > q->cap.max_send_wr) {
        if (bad) *bad = wr;
        return ENOMEM;
      }
      // Quirk post_limit=63 (hellas-ai/thunderbolt-ibverbs PR #41: "sender learned 63/64 usable
      // in-flight sends"): at most 63 sends outstanding, whatever create_qp granted. ENOMEM, as for
      // the frame budget, is our assumption (the errno of that refusal is not published).
      if (quirk(*q->ctx->fab, Profile::Thunderbolt, Quirk::PostLimit) == kPostLimit63 &&
          __atomic_load_n(&q->s->tx_wrs, __ATOMIC_RELAXED) >= kPostLimitWrs) {
        if (bad) *bad = wr;
        return ENOMEM;
      }
      __atomic_add_fetch(&q->s->tx_frames, fr, __ATOMIC_RELAXED);
      __atomic_add_fetch(&q->s->tx_wrs, 1u, __ATOMIC_RELAXED);
      op.frames_counted = fr;
    }
    if (q->pending.empty() && delay == 0) {
      op.first_try_ns = now_ns();
      if (try_send(q, op) == Tx::Done) continue;  // UC completes, loses or queues it at the peer at once
    }
    // Deferred: keep the payload of inline sends, whose buffer the caller may reuse.
    if (!tb && q->pending.size() >= q->cap.max_send_wr + 1u) {
      if (bad) *bad = wr;
      return ENOMEM;
    }
    if (op.is_inline) {
      op.inline_copy.resize(op.len);
      size_t off = 0;
      for (uint32_t i = 0; i < op.num_sge; ++i) {
        std::memcpy(op.inline_copy.data() + off, reinterpret_cast<void*>(op.sge[i].addr), op.sge[i].length);
        off += op.sge[i].length;
      }
      op.num_sge = 1;
      op.sge[0].addr = reinterpret_cast<uint64_t>(op.inline_copy.data());
      op.sge[0].length = static_cast<uint32_t>(op.len);
    }
    if (delay) op.not_before_ns = now_ns() + int64_t(delay) * 1000;
    q->pending.push_back(std::move(op));
    q->npending.fetch_add(1);
    *deferred = true;
  }
  return 0;
}

}  // namespace

int emu_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  auto* q = reinterpret_cast<EmuQp*>(qp);
  Fabric& f = *q->ctx->fab;
  Shared* s = f.shm;
  const bool tb = is_tb(q);
  if (__atomic_load_n(&s->nfaults, __ATOMIC_RELAXED)) apply_async_faults(q->ctx);
  if (int e = fault_check(f, "ibv_post_recv", q->ctx->host)) {
    if (bad) *bad = wr;
    return e;
  }
  t_spin_from_ns = t_last_call_ns = now_ns();
  for (; wr; wr = wr->next) {
    uint32_t state = q->s->state;
    // usb4-rdma takes one SGE per receive whatever max_recv_sge says (ibdev.c tbv_post_recv: num_sge > 1 → -EINVAL).
    if (state == IBV_QPS_RESET || wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > q->cap.max_recv_sge ||
        (is_usb4(q) && wr->num_sge > 1)) {
      if (bad) *bad = wr;
      return EINVAL;
    }
    RecvEntry e{};
    e.wr_id = wr->wr_id;
    e.num_sge = static_cast<uint32_t>(wr->num_sge);
    e.status = IBV_WC_SUCCESS;
    for (uint32_t i = 0; i < e.num_sge; ++i) {
      const ibv_sge& g = wr->sg_list[i];
      e.sge[i] = g;
      e.total += g.length;
      if (g.length == 0) continue;
      uint64_t a = 0;
      // Translate to the process address now so the sender need not know our MRs' iova.
      if (!check_region(s, g.lkey, g.addr, g.length, q->s->pid, q->s->pd, IBV_ACCESS_LOCAL_WRITE, &a))
        e.status = IBV_WC_LOC_PROT_ERR;
      else
        e.sge[i].addr = a;
    }
    e.frames = tb ? frames_of(e.total) : 1;
    EMU_TRACE_QP(q, "post_recv", "wr_id=%llu len=%llu%s", static_cast<unsigned long long>(e.wr_id),
                 static_cast<unsigned long long>(e.total), state == IBV_QPS_ERR ? " (QP in ERR: flushed)" : "");
    if (state == IBV_QPS_ERR) {
      ibv_wc wc{};
      wc.wr_id = e.wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = q->qp.qp_num;
      cq_push(f, q->rcq->slot, wc, false);
      continue;
    }
    BoundedGuard g(q->s->lock);
    if (!g.ok()) {
      if (bad) *bad = wr;
      return EBUSY;  // a stopped process (a sender delivering into it) holds the receive queue
    }
    if (q->s->recv_frames + e.frames > q->s->max_recv_wr || q->s->tail - q->s->head >= kRecvRing) {
      if (bad) *bad = wr;
      return ENOMEM;  // depth exhausted (Thunderbolt: counted in 4 KiB frames)
    }
    // Quirk post_limit=63 (hellas-ai/thunderbolt-ibverbs PR #41: "receiver learned 63/128 usable
    // initial receives"): at most 63 receives posted and not consumed, whatever create_qp granted.
    // ENOMEM: hellas#35 and #39 saw ibv_post_recv return -12 on a Mac; our assumption for this limit.
    if (tb && quirk(f, Profile::Thunderbolt, Quirk::PostLimit) == kPostLimit63 &&
        q->s->tail - q->s->head >= kPostLimitWrs) {
      if (bad) *bad = wr;
      return ENOMEM;
    }
    q->s->ring[q->s->tail & (kRecvRing - 1)] = e;
    q->s->recv_frames += e.frames;
    __atomic_store_n(&q->s->tail, q->s->tail + 1, __ATOMIC_RELEASE);
  }
  // empty_rq=wait (and a usb4_rdma host's early receives from a Mac): sends that arrived first
  // are moved now, by the receiver.
  if (__atomic_load_n(&q->s->wtail, __ATOMIC_ACQUIRE) != __atomic_load_n(&q->s->whead, __ATOMIC_ACQUIRE))
    rx_drain(q);
  return 0;
}

void rx_drain(EmuQp* q) {
  Fabric& f = *q->ctx->fab;
  Shared* s = f.shm;
  ShmQp* me = q->s;
  // The copies and both completions happen under this QP's lock, so a sender
  // deciding "no receive: wait" and this receiver deciding "waiting send: deliver"
  // cannot race, and receives complete in the order they were posted.
  BoundedGuard g(me->lock);
  if (!g.ok()) return;  // a stopped sender holds it: the waiting sends stay until the next post_recv
  while (me->whead != me->wtail && me->head != me->tail) {
    uint32_t st = me->state;
    if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return;  // sends wait until RTR
    const WaitEntry w = me->waiting[me->whead & (kWaitRing - 1)];
    const ShmQp& sq = s->qps[w.src_qpn & (kMaxQps - 1)];
    if (!__atomic_load_n(&sq.in_use, __ATOMIC_ACQUIRE) || sq.qpn != w.src_qpn || sq.pid != w.pid ||
        me->dest_qpn != w.src_qpn) {
      me->whead++;  // the sending QP is gone (destroyed, reset, its process died) or not our peer
      continue;
    }
    if (w.len) {
      const ShmMr* mr = mr_of_key(s, w.lkey);
      if (!mr || mr->pid != w.pid) {
        // The sender deregistered its buffer before the send left: a local
        // protection error on the sender's side, as hardware reports it.
        me->whead++;
        complete_waiting(f, w, IBV_WC_LOC_PROT_ERR);
        continue;
      }
    }
    const RecvEntry e = me->ring[me->head & (kRecvRing - 1)];
    const int64_t ready_ns = f.paced ? now_ns() : 0;  // wire_due: before the copy
    iovec src{reinterpret_cast<void*>(w.src_addr), w.len};
    Msg m{IBV_WR_SEND, w.len, &src, &w.lkey, w.len ? 1u : 0u, w.pid, w.src_qpn};
    Outcome o = deliver(f, m, e, me->pid, me->qpn, is_tb(q), sq.pid_start);
    me->whead++;
    if (o.gone) continue;  // the sender died with its memory: its message is lost
    me->head++;
    me->recv_frames -= std::min(me->recv_frames, e.frames);
    // Paced: the message leaves the sender's port now that it has credit (its wire time starts here).
    const int64_t due = wire_due(f, sq.port, w.len, ready_ns);
    EMU_TRACE_QP(q, "deliver", "wr_id=%llu op=SEND len=%llu from=0x%06x (a send that waited for this receive, empty_rq=wait)",
                 static_cast<unsigned long long>(e.wr_id), static_cast<unsigned long long>(w.len), w.src_qpn);
    cq_push(f, me->recv_cq, recv_wc(e, o, IBV_WR_SEND, w.len, 0, me->qpn, w.src_qpn), w.solicited != 0, due);
    complete_waiting(f, w, IBV_WC_SUCCESS, due);  // UC: the sender learns nothing of receive errors
  }
}

void forget_waiting_sends(EmuQp* q, bool flush) {
  Fabric& f = *q->ctx->fab;
  ShmQp* me = q->s;
  if (me->dest_qpn) {
    std::vector<WaitEntry> removed;
    ShmQp& p = f.shm->qps[me->dest_qpn & (kMaxQps - 1)];
    {
      BoundedGuard g(p.lock);  // a stopped peer: its queue keeps them (never delivered: the QP moved on)
      if (g.ok()) remove_waiting(p, me->qpn, &removed);
    }
    if (flush)
      for (const auto& w : removed) complete_waiting(f, w, IBV_WC_WR_FLUSH_ERR);
  }
  if (!flush) {
    __atomic_store_n(&me->tx_frames, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&me->tx_wrs, 0u, __ATOMIC_RELAXED);
  }
}

namespace {

// Paced CQ (ShmCq::paced): hands out, under the lock, the entries at the head that are due, in
// ring order (an entry not yet due holds back those behind it: see cq_push for why that keeps
// every QP's order).
int take_due(ShmCq& s, int ne, ibv_wc* wc, int64_t now) {
  BoundedGuard g(s.lock);
  if (!g.ok()) return 0;  // a stopped sender holds it: nothing to hand out now
  for (;;) {
    uint32_t head = __atomic_load_n(&s.head, __ATOMIC_ACQUIRE);
    const uint32_t tail = s.tail;
    uint32_t n = 0;
    while (head + n != tail && n < static_cast<uint32_t>(ne) && s.due[(head + n) & (kCqRing - 1)] <= now) {
      wc[n] = s.ring[(head + n) & (kCqRing - 1)];
      ++n;
    }
    // A compare-and-swap although the lock is held: a poller that found the CQ unpaced a moment
    // before its first paced entry may still be claiming unpaced entries without the lock.
    if (n == 0 || __atomic_compare_exchange_n(&s.head, &head, head + n, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return static_cast<int>(n);
  }
}

// The earliest due time of what this process's paced CQs hold (0: nothing pending). A nap must
// not outlast it: the thread may be waiting for any of them (a ring rank polls two CQs in turn).
int64_t earliest_own_due(Shared* sh) {
  const int32_t me = getpid();
  int64_t first = 0;
  for (ShmCq& c : sh->cqs) {
    if (!__atomic_load_n(&c.in_use, __ATOMIC_ACQUIRE) || c.pid != me || !__atomic_load_n(&c.paced, __ATOMIC_ACQUIRE))
      continue;
    BoundedGuard g(c.lock);
    if (g.ok() && c.head != c.tail) {
      const int64_t d = c.due[c.head & (kCqRing - 1)];
      if (first == 0 || d < first) first = d;
    }
  }
  return first;
}

// How late a timed nap wakes after its deadline on this machine: a running average of what the
// naps that timed out measured (each sample moves it 1/16 of the way, by at most 1 us). Our
// measurement, not a source's: a futex wait with 1 us timer slack wakes 15-23 us late (p10-p99)
// on a 2-core VM, and a paced poller that slept until the due time was late by that much at every
// hop (a 50 us link measured 1.4 L). The first naps assume 20 us. Another 2-core VM's timers wake
// 68-77 us late (p10-p90, nanosleep of 200 us), so the bounds below leave room for that: a margin
// capped at 50 us made every hop of a 4-rank 4 KiB all_reduce on a 500 us link 20-150 us late.
std::atomic<int64_t> g_wake_late_ns{20'000};
constexpr int64_t kMaxWakeLateNs = 200'000;  // a sample above is a preemption, not the timer

// How long before a paced due time the nap ends and the rest is spun: the wake-up lateness plus
// 2 us, at most 120 us of spinning per nap.
int64_t paced_margin_ns() {
  return std::min<int64_t>(g_wake_late_ns.load(std::memory_order_relaxed) + 2'000, 120'000);
}

// Sleeps on the process's bell (ShmBell) while its `seq` is still `seen`, until `until_ns`
// (CLOCK_MONOTONIC): woken by the next completion pushed to any CQ of this process. A nap that
// timed out feeds g_wake_late_ns.
void nap(ShmBell& bell, uint32_t seen, int64_t until_ns) {
  // Paced deadlines are exact: the default timer slack (50 us) would deliver a message up to 50 us
  // late, 10% of a 500 us link. This thread only (it is the one that sleeps).
  static thread_local bool slack_set = false;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    slack_set = true;
  }
  __atomic_add_fetch(&bell.waiters, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&bell.seq, __ATOMIC_SEQ_CST) == seen) {
    timespec ts{static_cast<time_t>(until_ns / 1000000000), static_cast<long>(until_ns % 1000000000)};
    if (syscall(SYS_futex, &bell.seq, FUTEX_WAIT_BITSET, seen, &ts, nullptr, FUTEX_BITSET_MATCH_ANY) != 0 &&
        errno == ETIMEDOUT) {
      const int64_t late = now_ns() - until_ns;
      if (late >= 0 && late <= kMaxWakeLateNs) {
        const int64_t est = g_wake_late_ns.load(std::memory_order_relaxed);
        g_wake_late_ns.store(est + std::clamp<int64_t>(late - est, -16'000, 16'000) / 16, std::memory_order_relaxed);
      }
    }
  }
  __atomic_sub_fetch(&bell.waiters, 1u, __ATOMIC_SEQ_CST);
}

}  // namespace

namespace {
int poll_cq(ibv_cq* cq, int ne, ibv_wc* wc);
}

int emu_poll_cq(ibv_cq* cq, int ne, ibv_wc* wc) {
  const int n = poll_cq(cq, ne, wc);
  if (__builtin_expect(g_trace_on, 0) && n > 0) {
    auto* c = reinterpret_cast<EmuCq*>(cq);
    for (int i = 0; i < n; ++i)
      trace_event(*c->fab, c->host, c->dev, wc[i].qp_num, "complete", "wr_id=%llu status=%s opcode=%s len=%u",
                  static_cast<unsigned long long>(wc[i].wr_id), wc_status_name(wc[i].status),
                  wc_opcode_name(wc[i].opcode), wc[i].byte_len);
  }
  return n;
}

namespace {

int poll_cq(ibv_cq* cq, int ne, ibv_wc* wc) {
  auto* c = reinterpret_cast<EmuCq*>(cq);
  Shared* sh = c->fab->shm;
  if (__atomic_load_n(&sh->nfaults, __ATOMIC_RELAXED)) {
    apply_async_faults(reinterpret_cast<EmuContext*>(verbs_get_ctx(c->cq.context)));
    if (int e = fault_check(*c->fab, "ibv_poll_cq", c->host)) return -e;
  }
  if (any_pending()) progress_all();
  ShmCq& s = *c->s;
  // Whether any CQ of this process got a completion since this thread's previous poll (of any
  // CQ): if so this one does not nap, the caller may be about to poll the one that got it.
  ShmBell* bell = s.bell < kMaxCqs ? &sh->bells[s.bell] : nullptr;
  static thread_local const ShmBell* t_bell = nullptr;
  static thread_local uint32_t t_seen = 0;
  const uint32_t seen = bell ? __atomic_load_n(&bell->seq, __ATOMIC_SEQ_CST) : 0;
  const bool quiet = bell && t_bell == bell && t_seen == seen;
  t_bell = bell;
  t_seen = seen;
  if (ne <= 0) return 0;
  for (;;) {
    // Producers serialise among themselves under the CQ lock and publish `tail`. Consumers (a
    // backend may poll one CQ from several threads, as rdma-core allows) claim the entries they
    // copied by moving `head` with a compare-and-swap; one that lost the race starts again
    // (issue 9: two pollers got the same completion twice). `tail` is read before `paced`: an
    // unpaced view then covers only entries written before the first paced one, which never move.
    const uint32_t tail = __atomic_load_n(&s.tail, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s.paced, __ATOMIC_SEQ_CST)) {
      const int64_t now = now_ns();
      const int n = take_due(s, ne, wc, now);
      if (n > 0) {
        t_spin_from_ns = t_last_call_ns = now;
        return n;
      }
      break;
    }
    uint32_t head = __atomic_load_n(&s.head, __ATOMIC_ACQUIRE);
    if (head == tail) break;
    // Entries in [head, tail) are never overwritten while head has not moved past them (a
    // producer refuses to fill more than the capacity, which is below the ring's size).
    const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(ne), tail - head);
    for (uint32_t i = 0; i < n; ++i) wc[i] = s.ring[(head + i) & (kCqRing - 1)];
    if (__atomic_compare_exchange_n(&s.head, &head, head + n, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      t_spin_from_ns = t_last_call_ns = now_ns();
      return static_cast<int>(n);
    }
  }
  // Nothing to hand out. The "hardware" is the peer process: a poller spinning on an empty CQ
  // competes with it for the CPU, and on a loaded machine every hand-off then costs a scheduler
  // slice (sched_yield is no better: EEVDF queues the yielder behind everyone). So once this
  // thread has polled in vain, posting nothing, for spin_ns(), and no CQ of its process got
  // anything since its previous poll, it sleeps on the process's bell, which every completion
  // for the process rings: for at most kPollSleepNs, or (paced) until the earliest completion
  // its CQs hold is due. A thread busy with other CQs or posts never naps here.
  const int64_t now = now_ns();
  const int64_t spin = spin_ns(sh);
  if (now - t_last_call_ns > spin) t_spin_from_ns = now;  // back from elsewhere: spin afresh
  t_last_call_ns = now;
  if (!quiet || now - t_spin_from_ns <= spin) return 0;
  int64_t until = now + kPollSleepNs;
  int64_t first = 0;
  // Paced: the sleep ends this much before the due time and the rest is spun, so a wake-up's own
  // delay does not make the message late (paced_margin_ns: what a wake-up takes here, measured).
  const int64_t margin = paced_margin_ns();
  if (c->fab->paced || __atomic_load_n(&s.paced, __ATOMIC_ACQUIRE)) {
    first = earliest_own_due(sh);
    if (first != 0 && first <= now) return 0;  // due on another CQ of this process: go and poll it
    if (first != 0) until = std::min(first - margin, now + kPacedNapNs);
  }
  if (until > now) nap(*bell, seen, until);
  t_last_call_ns = now_ns();  // the nap was time spent in the verbs, not away from them
  if (first == 0) return 0;
  while (now_ns() < first && first - now_ns() <= margin) {
  }
  // At the due time: hand it out now rather than after another round of the caller.
  t_last_call_ns = now_ns();
  const int n = take_due(s, ne, wc, t_last_call_ns);
  if (n > 0) t_spin_from_ns = t_last_call_ns;
  return n;
}

}  // namespace

int emu_req_notify_cq(ibv_cq* cq, int solicited_only) {
  auto* c = reinterpret_cast<EmuCq*>(cq);
  if (int e = fault_check(*c->fab, "ibv_req_notify_cq", c->host)) return e;
  if (quirk(*c->fab, c->fab->devices[c->dev].profile, Quirk::CompletionChannels) == kChannelsOff)
    return EOPNOTSUPP;  // quirk completion_channels=off
  uint32_t channel = 0;
  {
    BoundedGuard g(c->s->lock);
    if (!g.ok()) return EBUSY;  // a stopped sender holds the CQ; the caller polls instead
    ShmCq& x = *c->s;
    if (x.paced && x.head != x.tail && x.channel) {
      // Paced: the event of a queued completion was raised when it was queued, maybe before it
      // was due, and the consumer found nothing. Raise one now, or it would sleep on its channel
      // past the due time; its poll_cq then naps until the completion is due.
      channel = x.channel;
      ++x.events;
    } else {
      x.armed = solicited_only ? 2 : 1;
    }
  }
  if (channel) notify_channel(*c->fab, c->s->channel_pid, channel, c->slot);
  return 0;
}

}  // namespace emu
