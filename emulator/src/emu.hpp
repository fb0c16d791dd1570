// Internal declarations of the emulated verbs fabric.
//
// Model: every process that opens the emulator maps one shared-memory file per
// fabric (the "state"). It holds the run-time port state (up/down, IPv4), the
// faults, and every QP, CQ and MR of every process on the fabric, including each
// QP's receive ring and each CQ's completion ring. A sender therefore performs the
// whole transfer itself: it takes the peer's next posted receive, checks keys and
// bounds, copies into the peer's memory (process_vm_writev, or memcpy inside one
// process), appends the completion to the peer's CQ and wakes its completion
// channel (a FIFO in the state directory). No progress thread is needed: under
// the Thunderbolt quirk empty_rq=wait a send that finds no receive waits in the
// receiver's QP and the receiver's ibv_post_recv moves it (see WaitEntry).
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace emu {

// thunderbolt: Apple's driver. rdma-core-rc: a generic RC NIC (one RoCE v2 entry per
// address). rdma-core-roce: an mlx5-style RoCE port (every address as a RoCE v1 and a
// RoCE v2 entry). rdma-core-ib: an InfiniBand port (LIDs, subnet-prefix GIDs only).
// Sources of the last two: docs/field-reports.md section 4b, "rdma-core NICs".
// usb4-rdma: the Linux Thunderbolt driver of hellas-ai/thunderbolt-ibverbs (devices usb4_rdmaN;
// RC and UC between Linux hosts; toward a Mac, Apple's UC wire: see mac_compat). Sources: its
// kernel/ibdev.c, cited line by line in docs/emulator.md, "The usb4-rdma profile".
enum class Profile : uint32_t { Thunderbolt = 0, RdmaCoreRc = 1, RdmaCoreRoce = 2, RdmaCoreIb = 3, Usb4Rdma = 4 };
const char* profile_name(Profile p);

// Capacities of the shared state. Slots are fixed so the file layout is a plain
// struct; the rings are large but the file is sparse, so untouched pages cost nothing.
constexpr uint32_t kMaxPorts = 64;
constexpr uint32_t kMaxQps = 256;     // QPN low byte is the slot index
constexpr uint32_t kMaxCqs = 128;
constexpr uint32_t kMaxMrs = 4096;    // key low 12 bits are the slot index
constexpr uint32_t kMaxPds = 1024;
constexpr uint32_t kMaxFaults = 32;
constexpr uint32_t kRecvRing = 4096;  // per-QP receive ring (power of two)
constexpr uint32_t kWaitRing = 4096;  // per-QP queue of sends waiting for a receive (empty_rq=wait)
constexpr uint32_t kCqRing = 16384;   // per-CQ completion ring (power of two)
constexpr uint32_t kMaxSge = 4;
constexpr uint32_t kFrame = 4096;     // Thunderbolt accounting unit (TN3205: queues count 4 KiB frames)

// What ibv_query_device/ibv_query_port report and what the verbs enforce, per
// profile. One table: the sources are in limits_of() (fabric.cpp) and in
// docs/emulator.md's table of limits.
struct Limits {
  uint32_t max_qp;          // reported by ibv_query_device
  uint32_t usable_qps;      // QPs per device that create_qp grants (across processes); the next → EBUSY
  uint32_t max_pd;          // per device, across processes (leaked PDs count); the next → ENOMEM
  uint32_t max_cq;          // per device, across processes; the next → ENOMEM
  uint32_t max_mr;          // per device, across processes; the next → ENOMEM
  uint32_t max_sge;         // create_qp with more → EINVAL; post with more → EINVAL
  uint64_t max_mr_size;     // reg_mr longer → EINVAL
  uint32_t max_depth;       // work requests (RC) or 4 KiB frames (Thunderbolt) per queue
  uint32_t min_depth;       // Thunderbolt: smallest depth the driver grants (requests are rounded up)
  uint64_t max_msg;         // port max_msg_sz; longer sends complete with LOC_LEN_ERR
  uint32_t max_cqe;
  uint32_t max_inline;
  uint32_t max_rd_atom;     // outstanding RDMA READs/atomics per QP (max_qp_rd_atom); RTS asking for more → EINVAL
  bool atomics;             // IBV_ATOMIC_HCA: 8-byte atomics on RC (the rdma-core profiles; not usb4_rdma)
};
const Limits& limits_of(Profile p);
// usb4-rdma's largest messages: the native transport's (proto/native_data.h
// TBV_NATIVE_DATA_MAX_MSG_SIZE) and toward a Mac (kernel/tbv.h TBV_APPLE_MAX_MSG_SIZE).
constexpr uint64_t kUsb4NativeMaxMsg = 16ull << 20;  // TBV_NATIVE_DATA_MAX_MSG_SIZE (16u * 1024u * 1024u)
constexpr uint64_t kUsb4AppleMaxMsg = 16ull << 20;   // TBV_APPLE_MAX_MSG_SIZE SZ_16M
// Thunderbolt: the depth create_qp grants for a request (see limits_of for the model).
uint32_t tb_granted_depth(uint32_t requested);

// ---------------------------------------------------------------- quirks
//
// Contested behaviours of Apple's driver, each one selectable (fabric file
// "quirks", TBVERBS_EMU_QUIRKS, tbverbs-emu quirk). They apply to the Thunderbolt
// profile only. Value 0 of each is the default (the common field experience).
// The names, values and sources live in one table, kQuirks (quirks.cpp), used for
// parsing, for `tbverbs-emu show` and mirrored in docs/emulator.md.
enum class Quirk : uint32_t { EmptyRq = 0, MacOs = 1, MrAccess = 2, CompletionChannels = 3, PostLimit = 4 };
constexpr uint32_t kNumQuirks = 5;
enum EmptyRq : uint32_t { kEmptyRqWait = 0, kEmptyRqDrop = 1, kEmptyRqKill = 2 };
enum MacOs : uint32_t { kMacOs26_3 = 0, kMacOs26_2 = 1 };
enum MrAccess : uint32_t { kMrAccessAny = 0, kMrAccessLocalWriteOnly = 1, kMrAccessRemoteRequired = 2 };
enum Channels : uint32_t { kChannelsOff = 0, kChannelsOn = 1 };
// post_limit (hellas-ai/thunderbolt-ibverbs PR #41): posts accepted up to the granted depth in
// frames (TN3205), or at most kPostLimit63 work requests outstanding per queue.
enum PostLimit : uint32_t { kPostLimitGranted = 0, kPostLimit63 = 1 };
constexpr uint32_t kPostLimitWrs = 63;

struct QuirkValue {
  const char* name;
  const char* source;   // "TN3205", "[R] <report>", "our assumption"
  const char* meaning;
};
struct QuirkDef {
  const char* name;
  QuirkValue values[3];
  uint32_t nvalues;
};
extern const QuirkDef kQuirks[kNumQuirks];
using QuirkSet = uint32_t[kNumQuirks];
// Sets one quirk from "name" and "value"; throws std::runtime_error naming the valid choices.
void set_quirk(QuirkSet q, const std::string& name, const std::string& value);
// Applies "name=value,name=value" (TBVERBS_EMU_QUIRKS, the CLI); throws like set_quirk.
void set_quirks(QuirkSet q, const std::string& assignments);
// "empty_rq=wait macos=26.3 ..."
std::string format_quirks(const QuirkSet q);

// ---------------------------------------------------------------- fabric (static)

// Link pacing of one cable ("link" in the fabric file; docs/emulator.md, "Link pacing"). Each
// direction serialises its messages at `ns_per_byte` (1 / GB/s) after the previous message on
// that direction, and delivers each `latency_ns` after its last byte left. 0 = that dimension is
// unpaced (the default: the wire is a memcpy).
struct LinkModel {
  double ns_per_byte = 0;
  int64_t latency_ns = 0;
  bool paced() const { return ns_per_byte > 0 || latency_ns > 0; }
};
// Parses a "link" object ({"gbytes_per_s": B, "latency_us": L}, either key optional) or the
// TBVERBS_EMU_LINK text "gbytes_per_s=B,latency_us=L"; throws std::runtime_error naming `where`
// and the bad key or value (unknown key, not a number, B <= 0, L < 0, either out of range).
LinkModel parse_link_text(const std::string& text, const std::string& where);

struct PortDef {
  int host = -1;
  int device = -1;
  int port_num = 1;            // 1-based, as verbs numbers ports
  bool initially_up = true;
  bool initial_has_ip = false;
  uint32_t initial_ip = 0;     // host byte order
  uint32_t initial_prefix = 0;
  int peer = -1;               // global index of the port at the other end of the cable
  uint32_t ipv4_gid_index = 1; // where ::ffff:a.b.c.d appears; 1..index-1 hold more fe80:: entries
  // rdma-core-roce / rdma-core-ib (see gid_at, fill_port_attr):
  int lid = -1;                // IB: -1 = assigned (global port index + 1); 0 = no subnet manager
  uint32_t active_mtu = 0;     // ibv_mtu; 0 = the profile's default
  bool routed = false;         // the cable crosses a routed (L3) hop: RoCE v1 does not get across
  bool has_ipv6 = false;       // RoCE: a global IPv6 address (GID entries 4 and 5)
  uint8_t ipv6[16] = {};
  uint8_t subnet_prefix[8] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0};  // IB: upper half of the port GID
  std::string netdev;          // RoCE: the Ethernet interface behind the port (gid_attrs/ndevs)
  LinkModel link;              // pacing of what this port sends into its cable (both ends alike)
};

struct DeviceDef {
  std::string name;
  int host = -1;
  Profile profile = Profile::Thunderbolt;
  std::vector<int> ports;      // global port indices, in port_num order
  uint64_t guid = 0;           // network byte order, as ibv_get_device_guid returns
  // usb4-rdma only: the device's cable leads to a Mac (a thunderbolt device), so its driver runs
  // Apple's compatible transport (hellas-ai/thunderbolt-ibverbs, module profile mac_compat):
  // UC only, SEND only, 16 MiB messages. Our assumption: one module setting per cable, the one
  // its peer needs (the driver's setting is per module, ibdev.c tbv_state_apple_only).
  bool mac_compat = false;
};

struct HostDef {
  std::string name;
  std::vector<int> devices;    // global device indices
};

struct Shared;

struct Fabric {
  std::string path;            // file it came from ("" = built-in default)
  std::string state_dir;
  Profile profile = Profile::Thunderbolt;
  std::vector<HostDef> hosts;
  std::vector<DeviceDef> devices;
  std::vector<PortDef> ports;
  QuirkSet quirks{};           // the file's "quirks" (defaults elsewhere); the live values are in shm
  bool paced = false;          // some cable has a link model (ports[i].link)
  Shared* shm = nullptr;

  int find_host(const std::string& name) const;
  int find_device(int host, const std::string& name) const;
  int find_port(int device, int port_num) const;
  std::string port_label(int port) const;  // "host:device:port"
};

// Loads (once per path, cached for the process life) and maps the fabric's shared
// state. Throws std::runtime_error with a message naming the problem.
// The port's max_msg_sz on device `dev`: its profile's, or 16 MiB on a usb4_rdma device facing a
// Mac (ibdev.c tbv_query_port). One value for what query_port reports and what post_send enforces.
inline uint64_t max_msg_of(const Fabric& f, int dev) {
  const DeviceDef& d = f.devices[static_cast<std::size_t>(dev)];
  return d.mac_compat ? kUsb4AppleMaxMsg : limits_of(d.profile).max_msg;
}

Fabric& load_fabric(const std::string& path);
// Parses a fabric description without mapping any state (the loader behind load_fabric; also
// what fuzz/fuzz_fabric_file.cpp feeds). Throws std::runtime_error naming the problem.
std::unique_ptr<Fabric> parse_fabric_text(const std::string& text, const std::string& origin);
// The fabric named by TBVERBS_EMU_FABRIC (or the built-in default).
Fabric& env_fabric();
// The host named by TBVERBS_EMU_HOST (or the first host); -1 with message if unknown.
int env_host(const Fabric& f, std::string* error);
// Parses "a.b.c.d[/n]"; returns false on malformed input.
bool parse_cidr(const std::string& s, uint32_t* ip, uint32_t* prefix);
std::string format_ipv4(uint32_t ip);

// ---------------------------------------------------------------- shared state

// Process-shared robust mutex: a process that dies holding it does not wedge the
// fabric; the next locker marks it consistent and carries on.
//
// A stopped holder (SIGSTOP, a debugger) is not dead: it keeps the lock until it runs again. The
// data path's locks another process's verbs take (a CQ, a QP's receive ring) are therefore taken
// with lock_bounded(), which gives up when the holder is stopped (after 50 ms, confirmed by
// /proc/<pid>/stat) or, whatever the holder does, after 10 s; the caller then treats the other
// side as unreachable (issue 19 item 2: a rank hung past its timeout in cq_push behind a stopped
// peer). The control path (slot allocation, faults) still waits without bound.
struct ShmLock {
  pthread_mutex_t m;
  int32_t holder;  // pid of the process holding it (0: nobody); read by lock_bounded's waiters
  uint32_t pad;
  void init();
  void lock();
  // False when the lock could not be had: its holder is stopped, or held it 10 s.
  [[nodiscard]] bool lock_bounded();
  void unlock() {
    __atomic_store_n(&holder, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&m);
  }
};
struct Guard {
  explicit Guard(ShmLock& l) : l_(l) { l_.lock(); }
  ~Guard() { l_.unlock(); }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  ShmLock& l_;
};
// Guard over lock_bounded(): check ok() before touching what the lock guards.
struct BoundedGuard {
  explicit BoundedGuard(ShmLock& l) : l_(l), ok_(l.lock_bounded()) {}
  ~BoundedGuard() {
    if (ok_) l_.unlock();
  }
  BoundedGuard(const BoundedGuard&) = delete;
  BoundedGuard& operator=(const BoundedGuard&) = delete;
  bool ok() const { return ok_; }
  ShmLock& l_;
  bool ok_;
};

struct ShmPort {
  uint32_t up;
  uint32_t has_ip;
  uint32_t ip;       // host byte order
  uint32_t prefix;
  // `tbverbs-emu device-remove`: the device of this port is gone (IBV_EVENT_DEVICE_FATAL on its
  // contexts; the port reads PORT_DOWN until device-restore, fault clear or reset).
  uint32_t removed;
  uint32_t pad;
  // Link pacing: when the direction out of this port is free again (CLOCK_MONOTONIC ns;
  // compare-and-swap by every sender on the port, see wire_due in datapath.cpp).
  int64_t busy_until_ns;
};

// One per process with a CQ: the futex its idle pollers sleep on. Every completion pushed to one
// of the process's CQs bumps `seq` (and wakes it when `waiters`), so a thread napping in
// ibv_poll_cq on one CQ wakes for a completion on any other CQ of its process (a ring rank
// polls two CQs in turn; a nap on the wrong one used to cost the whole nap).
struct ShmBell {
  int32_t pid;         // 0 = free; a slot of a dead process is taken over
  uint32_t seq;
  uint32_t waiters;
  uint32_t pad;
  uint64_t pid_start;  // with pid, names the process (pids are reused)
};

// kFaultQpFatal and kFaultDeviceRemoved are armed until their owners have acted on them (they
// raise an asynchronous event and flush work requests in the owning process, see
// async_events.cpp); while armed they keep the data path's fault check on its slow branch.
enum FaultKind : uint32_t {
  kFaultNone = 0,
  kFaultFailCall = 1,
  kFaultDropNext = 2,
  kFaultDelay = 3,
  kFaultStickyLoss = 4,
  kFaultQpFatal = 5,
  kFaultDeviceRemoved = 6,
};

struct ShmFault {
  uint32_t kind;
  int32_t host;      // -1 = any host
  char verb[48];     // kFaultFailCall: verb name, e.g. "ibv_create_qp"
  uint64_t nth;      // fail from the nth matching call (1-based)
  uint64_t seen;     // matching calls so far
  uint32_t count;    // how many calls to fail (0 = all from nth on)
  uint32_t failed;
  int32_t err;
  uint32_t delay_us; // kFaultDelay
  uint32_t qpn;      // kFaultQpFatal: the QP
  int32_t device;    // kFaultDeviceRemoved: the global device index
};

// How the transfers check the pages behind a region (ShmMr::frames; pages.cpp,
// docs/emulator.md "Registration and pinning"): flags.
enum FrameCheck : uint32_t {
  kFramesChecked = 1,  // a frame record exists: transfers compare the pages with it
  kFramesPinned = 2,   // the pages are pinned (io_uring fixed buffers): they stay while the region lives
  kFramesPfn = 4,      // the record holds page frame numbers (pagemap readable with CAP_SYS_ADMIN)
};

struct ShmMr {
  uint32_t key;      // 0 = free slot
  int32_t pid;
  uint32_t pd;
  uint32_t access;
  uint32_t device;
  uint32_t pins;     // copies into the region under way (RegionPins): dereg waits for them
  int32_t pinner;    // the process that pinned it last: dereg stops waiting once it is gone
  uint32_t frames;   // FrameCheck flags; 0 = the pages are not checked
  uint64_t addr;     // process virtual address of the region
  uint64_t iova;     // address the keys are used with (== addr unless reg_mr_iova)
  uint64_t length;
  // The frame record: what backed the range at registration, in STATE_DIR/mr-PID-START-RECORD
  // (pages.cpp). Written before the key is published; removed at dereg (and for dead owners).
  uint64_t record;   // 0 = none
  uint64_t pid_start;  // the owner's start time (with pid, names the record file)
  // Transfers that met memory unmapped after ibv_reg_mr (atomic; the first is reported on stderr).
  uint32_t stale;
  uint32_t pad;
};

struct RecvEntry {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t frames;   // Thunderbolt frame count of this receive
  uint32_t status;   // IBV_WC_SUCCESS, or the error found when it was posted
  uint32_t pad;
  uint64_t total;    // sum of SGE lengths
  ibv_sge sge[kMaxSge];
};

// A send that met an empty receive queue under empty_rq=wait (Thunderbolt, UC):
// it waits in the RECEIVER's ShmQp, under the receiver's lock, until that QP
// has a receive for it. Whoever comes second (the sender finding a receive, or
// the receiver posting one) moves the data, so nobody needs a progress thread.
// Thunderbolt grants one SGE, so one source range.
struct WaitEntry {
  uint64_t wr_id;
  uint64_t src_addr;   // sender's process address (translated through its lkey when posted)
  uint64_t len;
  uint32_t lkey;       // re-checked at delivery: the region must still be registered
  int32_t pid;         // sender process
  uint32_t src_qpn;    // sender QP (its slot must still hold this QPN)
  uint32_t send_cq;    // sender's send CQ slot
  uint32_t frames;     // counted in the sender's tx_frames until it completes
  uint32_t signaled;   // push a send completion (IBV_SEND_SIGNALED or sq_sig_all)
  uint32_t solicited;
  uint32_t pad;
};

struct ShmQp {
  ShmLock lock;      // guards the receive ring, the wait queue and the counters below it
  uint32_t in_use;
  int32_t pid;
  uint64_t pid_start; // the owner's start time: pid and start time name a process (pids are reused)
  uint32_t qpn;
  uint32_t type;     // ibv_qp_type
  uint32_t state;    // ibv_qp_state
  uint32_t device;   // global device index
  uint32_t port;     // global port index (set at INIT)
  uint32_t pd;
  uint32_t dest_qpn;
  int32_t peer_port; // port the dgid resolved to at RTR (-1 unreachable)
  uint32_t access;   // qp_access_flags
  uint32_t recv_cq;  // CQ slot
  uint32_t min_rnr_timer;
  uint32_t drop_tx;  // fault: everything this QP sends is lost
  // rdma-core-roce: the RoCE version of the RTR source GID (1 or 2; 0 elsewhere). A
  // sender and a receiver of different versions do not hear each other (see peer_ready).
  uint32_t wire;
  // RC packet sequence numbers (24-bit): a requester whose next PSN is not what the
  // responder expects gets no ACK, retries, and ends in RETRY_EXC_ERR, as with a
  // botched PSN exchange on a real RC NIC. UC resynchronises on every new message.
  uint32_t sq_psn;   // next PSN this QP sends
  uint32_t rq_psn;   // next PSN this QP expects
  uint32_t mtu_bytes;
  uint32_t max_recv_wr;
  uint32_t recv_frames;  // frames (Thunderbolt) or WRs outstanding in the ring
  uint32_t head, tail;   // free-running ring indices
  // Thunderbolt: frames of this QP's sends posted and not yet completed (atomic;
  // the sender adds, whoever completes the send subtracts). Bounded by max_send_wr.
  uint32_t tx_frames;
  // Thunderbolt: this QP's sends posted and not yet completed, in work requests (atomic, with
  // tx_frames). The quirk post_limit=63 refuses a post beyond kPostLimitWrs of them.
  uint32_t tx_wrs;
  uint32_t pad2;
  // `tbverbs-emu fault qp-fatal`: 1 = raised (the QP is in ERR), 2 = its owner reported
  // IBV_EVENT_QP_FATAL and flushed its work requests (async_events.cpp).
  uint32_t fatal;
  uint32_t whead, wtail; // wait queue (sends addressed to this QP waiting for a receive)
  RecvEntry ring[kRecvRing];
  WaitEntry waiting[kWaitRing];
};

struct ShmCq {
  ShmLock lock;
  uint32_t in_use;
  int32_t pid;
  uint32_t device;       // global device index (per-device CQ limit)
  uint32_t capacity;
  uint32_t head, tail;   // free-running
  uint32_t armed;        // 1 = next completion raises an event, 2 = solicited only
  uint32_t channel;      // completion channel id (0 = none)
  int32_t channel_pid;
  uint32_t overflow;
  uint32_t events;       // events raised (diagnostics)
  uint32_t bell;         // the owner's ShmBell
  // Link pacing: set (for the CQ's life) before the first entry with a due time is written.
  // Pollers that see it take the lock, since producers then insert entries by due time.
  uint32_t paced;
  uint32_t pad;
  ibv_wc ring[kCqRing];
  int64_t due[kCqRing];  // when ring[i] may be handed out (CLOCK_MONOTONIC ns; 0 = at once)
};

// Protection domains live in shared memory only to be counted per device across
// processes. A leaked PD (tbverbs-emu fault leak-pds) has no owner and survives
// until reset, as PDs of orphaned processes do on a Mac until a reboot.
struct ShmPd {
  uint32_t in_use;
  int32_t pid;           // owner; -1 = leaked
  uint32_t device;
  uint32_t id;
};

struct Shared {
  uint64_t magic;
  uint64_t layout;       // sizeof(Shared) ^ counts, to refuse a foreign layout
  uint32_t nports;
  uint32_t nfaults;      // active fault entries (fast check on the hot path)
  ShmLock lock;          // control path: slot allocation, ports, faults
  ShmLock atomics;       // every emulated RDMA atomic of the fabric runs under it (our assumption, docs/emulator.md)
  uint32_t next_gen;
  uint32_t next_channel;
  uint32_t next_pd;
  uint32_t pad;
  uint32_t quirks[kNumQuirks];  // live quirk values (atomic loads), see Quirk
  uint32_t pad2;
  uint64_t next_record;  // frame records (ShmMr::record), atomic
  // Per device (global index; a device has at least one port, so at most kMaxPorts): transfers
  // that met memory unmapped after ibv_reg_mr (pages.cpp), printed by `tbverbs-emu show`.
  uint64_t stale_transfers[kMaxPorts];
  ShmPort ports[kMaxPorts];
  ShmFault faults[kMaxFaults];
  ShmMr mrs[kMaxMrs];
  ShmPd pds[kMaxPds];
  ShmQp qps[kMaxQps];
  ShmCq cqs[kMaxCqs];
  ShmBell bells[kMaxCqs];  // a process with a CQ has one: never more than the CQs
};

constexpr uint64_t kMagic = 0x54425645'4d55000cull;  // "TBVEMU" v12 (frame records and stale counts of regions)

// The bell of this process, allocated on first use (caller holds shm->lock); kMaxCqs if none free.
uint32_t own_bell(Shared* s);

// Maps (creating and initialising if needed) the state file of a fabric.
Shared* open_shared(Fabric& f);
// Removes the state directory so the next user starts from the fabric file.
void reset_shared(const Fabric& f);

bool pid_alive(int32_t pid);
// The start time of process `pid` (clock ticks since boot, /proc/PID/stat), 0 when unknown; and
// this process's, read once.
uint64_t process_start(int32_t pid);
uint64_t self_start();
// Frees QP/CQ/MR/PD slots whose owner process no longer exists (leaked PDs stay).
// Caller holds shm->lock.
void collect_dead(Shared* s);
// Removes the frame records (pages.cpp: STATE_DIR/mr-PID-START-RECORD) of processes that are gone:
// collect_dead's part in the state directory.
void remove_dead_records(const std::string& state_dir);
// `tbverbs-emu gc`: removes this user's state directories in /dev/shm and /tmp whose fabric file
// is gone (or, unrecorded, untouched for 10 minutes) and in which no live process has objects,
// plus the ring launcher's empty ones. Returns them; `report` gets one line per directory.
std::vector<std::string> collect_state_dirs(bool dry_run, std::string* report, const std::string& under = {});
// PDs in use on a device (leaked ones included); whether any of them is leaked.
// Caller holds shm->lock.
uint32_t count_pds(const Shared* s, int device, bool* any_leaked = nullptr);
// Discards the sends waiting in a receiver QP's queue: they never complete, as a
// send without credits on hardware. Caller holds q.lock.
inline void discard_waiting(ShmQp& q) { q.whead = q.wtail = 0; }

// Live value of a quirk for a device of profile p. Other profiles behave like an
// rdma-core NIC whatever the quirks say: UC drops a send that meets no receive,
// messages of any frame count, any MR access, completion channels.
inline uint32_t quirk(const Fabric& f, Profile p, Quirk q) {
  if (p != Profile::Thunderbolt) {
    switch (q) {
      case Quirk::EmptyRq: return kEmptyRqDrop;
      case Quirk::CompletionChannels: return kChannelsOn;
      default: return 0;
    }
  }
  return __atomic_load_n(&f.shm->quirks[static_cast<uint32_t>(q)], __ATOMIC_RELAXED);
}

// ---------------------------------------------------------------- port view

bool port_active(const Fabric& f, int port);  // own end up, cabled, other end up, neither device removed
// Whether `tbverbs-emu device-remove` took the device (global index) away.
bool device_removed(const Fabric& f, int device);
// GID table: index 0 = fe80::<id>; index 1 = ::ffff:ipv4 while the port has one
// (or, with "ipv4_gid_index": N in the fabric file, fe80:: entries at 1..N-1 and
// the IPv4-mapped entry at N, as some Macs report).
uint32_t gid_table_len(const Fabric& f, int port);
bool gid_at(const Fabric& f, int port, uint32_t index, ibv_gid* out);
// The type of an entry, as enum ibv_gid_type (IBV_GID_TYPE_IB / _ROCE_V1 / _ROCE_V2).
// rdma-core-roce: even indices RoCE v1, odd RoCE v2 (mlx5 publishes each address as a
// v1 and a v2 entry, v1 first); rdma-core-ib: IB; thunderbolt, rdma-core-rc: RoCE v2.
uint32_t gid_type_at(const Fabric& f, int port, uint32_t index);
// The netdev name of a port ("" on Thunderbolt and InfiniBand).
std::string port_netdev(const Fabric& f, int port);
// rdma-core-roce and rdma-core-ib devices get a sysfs-like directory (ibdev_path) with
// ports/N/gid_attrs/{types,ndevs}/I, as the kernel publishes them, so programs that read
// the GID type or netdev from sysfs (show_gids, rdma-core's ibv_query_gid_type) see them.
// Returns the directory ("" when the profile has none or it cannot be written).
std::string ensure_sysfs(const Fabric& f, int device);
// The port whose GID table holds `gid`, or -1.
int port_of_gid(const Fabric& f, const ibv_gid& gid);

// ---------------------------------------------------------------- faults

// Returns the errno to fail this call with, or 0. `host` = -1 when unknown.
int fault_check(Fabric& f, const char* verb, int host);
uint32_t fault_delay_us(Fabric& f, int host);
bool fault_sticky_loss(Fabric& f, int host);

// Channel FIFO path for a completion channel id owned by pid.
std::string channel_path(const Fabric& f, int32_t pid, uint32_t id);
// Unlinks the channel FIFOs of processes that are gone (called when a channel is created).
void remove_dead_channels(const Fabric& f);

}  // namespace emu
