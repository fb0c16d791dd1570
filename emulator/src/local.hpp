// Process-local objects behind the verbs handles the emulator hands out.
#pragma once

#include "emu.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace emu {

struct EmuDevice {
  ibv_device dev;  // first: the handle is a pointer to it
  Fabric* fab;
  int index;       // global device index
};

struct EmuQp;
struct EmuCq;

struct EmuContext {
  verbs_context v;  // first; ibv_context lives at its end, as rdma-core requires
  Fabric* fab;
  int dev;
  int host;
  // Asynchronous events (ibv_get_async_event, async_events.cpp), all under events_mu:
  // - the ports' states this context last reported, bit p - 1 set when port p was active. A change
  //   (tbverbs-emu port-down / port-up, the other end's) becomes IBV_EVENT_PORT_ERR or
  //   IBV_EVENT_PORT_ACTIVE, one event per change, as rdma-core's kernel raises them
  //   (ibv_get_async_event(3));
  // - events already decided (QP fatal, CQ error, device fatal), oldest first;
  // - the context's QPs and CQs, whose shared state says when one failed.
  // Apple documents no async events (TN3205 is silent); that its driver raises them is our
  // assumption (docs/emulator.md, "Asynchronous events").
  std::mutex events_mu;
  uint32_t ports_seen_active = 0;
  int ports = 0;  // ports 1..ports exist
  std::deque<ibv_async_event> queued;
  bool device_fatal_reported = false;
  std::vector<EmuQp*> qps;
  std::vector<EmuCq*> cqs;
};

struct EmuPd {
  ibv_pd pd;
  uint32_t id;
  uint32_t slot;              // its ShmPd (counted per device across processes)
  std::atomic<int> users{0};  // MRs and QPs: dealloc while in use is EBUSY, as in the kernel
};

// ---------------------------------------------------------------- registration and pinning
// (pages.cpp; docs/emulator.md, "Registration and pinning")
//
// ibv_reg_mr checks the range as rdma-core's kernel does (ib_umem_get: mapped, and writable when
// the access asks for write), pins its pages (io_uring fixed buffers, FOLL_LONGTERM as the kernel
// pins for a NIC) and records what backs it (/proc/self/pagemap) in a file of the state directory,
// so that any process doing a transfer can tell whether the memory behind a region was unmapped
// after ibv_reg_mr (pages_stale).

// What a registration holds: its pin (io_uring buffer slots) and its frame record.
struct PageReg {
  uint32_t frames = 0;     // FrameCheck flags (ShmMr::frames)
  uint64_t record = 0;     // frame record id (0: none)
  int32_t owner = 0;       // the process that registered (names the record file, with its start time)
  uint64_t pid_start = 0;
  int32_t pin_pid = 0;     // the process whose ring holds the slots (0: not pinned)
  uint32_t pin_first = 0, pin_count = 0;
};
// Checks [addr, addr + len) as ib_umem_get does and pins and records it. Returns 0, EFAULT (not
// mapped, or not writable while `access` asks for write) or EINVAL (the range wraps). On success
// `out` holds what release_pages gives back; length 0 holds nothing.
int register_pages(Fabric& f, void* addr, size_t len, unsigned access, PageReg* out);
// Unpins and removes the frame record of a registration that no transfer can reach any more.
void release_pages(const Fabric& f, const PageReg& r);
// TBVERBS_EMU_PAGE_CHECK (read once, at load): false when "off" or "0".
extern bool g_page_check;
// Whether the pages of [addr, addr + len), in process `pid` (started at `start`) and in the region
// of `key`, still hold what the region's frame record says. kStale when some page was replaced or
// is gone (`first` gets its address); kClean also when nothing can be told (no record, the region
// gone, pagemap unreadable). kUnproven: another process's pages that were clean at the last full
// check and cannot have changed since unless one was unmapped and left so, which the copy itself
// reveals by faulting it in: the caller watches thread_faults() around the copy and, when they
// moved, checks again with pages_stale (pages.cpp, "the fast path").
enum class PageCheck { kClean, kStale, kUnproven };
PageCheck check_pages(const Fabric& f, int32_t pid, uint64_t start, uint32_t key, uint64_t addr, uint64_t len,
                      uint64_t* first);
// The full check (no fast path): true when some page is stale; `stale` (when given) gets one flag
// per page from addr's page.
bool pages_stale(const Fabric& f, int32_t pid, uint64_t start, uint32_t key, uint64_t addr, uint64_t len,
                 uint64_t* first, std::vector<uint8_t>* stale = nullptr);
// This thread's page faults so far (getrusage RUSAGE_THREAD); UINT64_MAX when unknown.
uint64_t thread_faults();
// Reports a transfer that met a stale region: counted per region and per device, said on stderr
// once per region, traced. `as_source`: the region was read (else written).
void report_stale(const Fabric& f, uint32_t key, uint64_t addr, bool as_source, uint32_t qpn);
// The system's page size (pagemap's unit).
uint64_t page_size();

struct EmuMr {
  ibv_mr mr;
  uint32_t slot;
  PageReg pages;
};

struct EmuChannel {
  ibv_comp_channel ch;
  Fabric* fab;
  int host;
  uint32_t id;
  std::string path;
};

struct EmuCq {
  // ibv_cq_ex starts with ibv_cq's fields (rdma-core's layout): a CQ made by ibv_create_cq_ex
  // is the same object seen through its extended view.
  union {
    ibv_cq cq;
    ibv_cq_ex cqx;
  };
  ibv_wc cur{};  // extended CQ: the completion start_poll/next_poll handed out, read by read_*
  Fabric* fab;
  int host;
  int dev;
  uint32_t slot;
  ShmCq* s;
  std::atomic<int> users{0};  // QPs using it: destroy while in use is EBUSY
};

// A send work request that could not complete when posted (RC waiting for a
// receive or for the peer, or a delivery delay). Only the slow path allocates.
struct SendOp {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  uint32_t imm = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0, swap = 0;  // atomics: the add operand or the compare value; the swap value
  uint32_t num_sge = 0;
  ibv_sge sge[kMaxSge]{};
  bool is_inline = false;
  std::vector<char> inline_copy;  // inline payload captured when the op is deferred
  uint64_t len = 0;
  int64_t first_try_ns = 0;
  int64_t not_before_ns = 0;
  uint32_t frames_counted = 0;    // Thunderbolt: frames this WR holds in the QP's tx_frames
};

// The work requests of one ibv_wr_start() ... ibv_wr_complete() batch (the extended
// send API), posted as one chain by wr_complete. Vectors keep their capacity, so after the
// first batches of a size nothing is allocated. Inline payloads are copied when set (the
// caller may reuse the buffer at once) and referenced by offset until the chain is built.
struct WrBatch {
  struct Wr {
    ibv_send_wr wr;
    uint32_t first_sge, num_sge;
    int64_t inline_at;  // offset in `inline_bytes`, or -1
    uint32_t inline_len;
  };
  std::vector<Wr> wrs;
  std::vector<ibv_sge> sges;
  std::vector<char> inline_bytes;
  std::vector<ibv_send_wr> chain;
  int error = 0;  // the first error of the batch, returned by wr_complete
};

struct EmuQp {
  // ibv_qp_ex starts with the ibv_qp, so both views share one address: ibv_qp_to_qp_ex and
  // the wr_* callbacks move between them by a cast, as rdma-core's providers do.
  union {
    ibv_qp_ex qpx;
    ibv_qp qp;
  };
  std::unique_ptr<WrBatch> batch;  // QPs created with send_ops_flags (ibv_create_qp_ex) only
  EmuContext* ctx;
  uint32_t slot;
  ShmQp* s;
  EmuCq* scq;
  EmuCq* rcq;
  ibv_qp_cap cap;
  bool sq_sig_all;
  ibv_qp_attr attr;       // last attributes set, for ibv_query_qp
  std::mutex mu;          // guards `pending`
  std::deque<SendOp> pending;
  std::atomic<uint32_t> npending{0};
};

int64_t now_ns();

// Asynchronous events (async_events.cpp). A context knows its QPs and CQs (registered at
// create, unregistered at destroy) to find which of them failed.
void register_qp(EmuContext* c, EmuQp* q);
void unregister_qp(EmuContext* c, EmuQp* q);
void register_cq(EmuContext* c, EmuCq* q);
void unregister_cq(EmuContext* c, EmuCq* q);
// Acts on a QP-fatal fault or a device removal that concerns `c`'s objects: queues the event and
// moves the QPs to ERR (flushing their work requests). The data path calls it while faults are armed.
void apply_async_faults(EmuContext* c);

// Trace mode (trace.cpp): TBVERBS_EMU_TRACE, read once at load. trace_event writes one line
// "emu-trace <µs> <host> <device> qp=0x<qpn> <event> <fmt...>"; EMU_TRACE_QP costs one load and
// an unlikely branch while tracing is off.
extern bool g_trace_on;
void trace_event(const Fabric& f, int host, int dev, uint32_t qpn, const char* event, const char* fmt, ...)
    __attribute__((format(printf, 6, 7)));
const char* opcode_name(ibv_wr_opcode op);
const char* wc_opcode_name(ibv_wc_opcode op);
const char* wc_status_name(ibv_wc_status st);
#define EMU_TRACE_QP(q, event, ...)                                                                      \
  do {                                                                                                  \
    if (__builtin_expect(::emu::g_trace_on, 0))                                                         \
      ::emu::trace_event(*(q)->ctx->fab, (q)->ctx->host, (q)->ctx->dev, (q)->qp.qp_num, (event), __VA_ARGS__); \
  } while (0)

// Data path (datapath.cpp).
int emu_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int emu_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int emu_poll_cq(ibv_cq* cq, int ne, ibv_wc* wc);
int emu_req_notify_cq(ibv_cq* cq, int solicited_only);
// The extended QP API (verbs_ex.cpp): verbs_context.create_qp_ex.
ibv_qp* emu_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);
ibv_cq_ex* emu_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr);
// verbs_context.query_device_ex (verbs_ex.cpp).
int emu_query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                        size_t attr_size);
void progress_all();
bool any_pending();
void forget_pending(EmuQp* q);
// Moves a QP to ERR: flushes pending sends (its waiting ones too) and posted
// receives as WR_FLUSH_ERR; sends waiting for this QP's receives are discarded.
void qp_to_error(EmuQp* q);
// empty_rq=wait. Receiver side: pairs sends waiting in this QP's queue with its
// posted receives (after post_recv, and when the QP reaches RTR). Caller holds q->mu
// or is the only user of q.
void rx_drain(EmuQp* q);
// Sender side: takes this QP's sends out of its peer's wait queue (destroy, RESET,
// ERR); with `flush`, each completes with WR_FLUSH_ERR. Resets tx_frames.
void forget_waiting_sends(EmuQp* q, bool flush);
// Appends a completion to a CQ and rings its owner's bell. `due` (link pacing): the completion is
// handed out no earlier (CLOCK_MONOTONIC ns); 0 = at once, behind what the CQ already holds.
void cq_push(Fabric& f, uint32_t cq_slot, const ibv_wc& wc, bool solicited, int64_t due = 0);
// Removes QP `qpn`'s completions not yet polled from a CQ (a QP moved to RESET).
void cq_clean(Fabric& f, uint32_t cq_slot, uint32_t qpn);
// Resolves an lkey/rkey to a live region. Returns nullptr when the key is stale.
const ShmMr* mr_of_key(Shared* s, uint32_t key);

// Pins the live region of `key` for a copy into it: ibv_dereg_mr clears the key and then waits
// until no pin is left, so nothing is written into a region after its dereg returned (issue 9:
// a send in flight wrote into 7 to 22 of 40 regions deregistered under it). The pin is taken
// before the key is checked and dereg clears the key before it looks at the pins (both seq_cst),
// so one of the two always sees the other. Releases on destruction.
class RegionPins {
 public:
  explicit RegionPins(Shared* s) : s_(s) {}
  RegionPins(const RegionPins&) = delete;
  RegionPins& operator=(const RegionPins&) = delete;
  ~RegionPins() {
    for (unsigned i = 0; i < n_; ++i) __atomic_sub_fetch(&pinned_[i]->pins, 1u, __ATOMIC_SEQ_CST);
  }
  // False when `key` is not (or no longer) registered: nothing may be written through it.
  bool add(uint32_t key) {
    if (key == 0 || n_ == kMaxPins) return false;
    ShmMr* m = &s_->mrs[key & (kMaxMrs - 1)];
    __atomic_add_fetch(&m->pins, 1u, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&m->key, __ATOMIC_SEQ_CST) != key) {
      __atomic_sub_fetch(&m->pins, 1u, __ATOMIC_SEQ_CST);
      return false;
    }
    __atomic_store_n(&m->pinner, getpid(), __ATOMIC_RELAXED);
    pinned_[n_++] = m;
    return true;
  }

 private:
  static constexpr unsigned kMaxPins = kMaxSge + 1;
  Shared* s_;
  ShmMr* pinned_[kMaxPins] = {};
  unsigned n_ = 0;
};

}  // namespace emu
