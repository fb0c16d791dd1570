// Internal declarations of the emulated verbs fabric.
//
// Model: every process that opens the emulator maps one shared-memory file per
// fabric (the "state"). It holds the run-time port state (up/down, IPv4), the
// faults, and every QP, CQ and MR of every process on the fabric, including each
// QP's receive ring and each CQ's completion ring. A sender therefore performs the
// whole transfer itself: it takes the peer's next posted receive, checks keys and
// bounds, copies into the peer's memory (process_vm_writev, or memcpy inside one
// process), appends the completion to the peer's CQ and wakes its completion
// channel (a FIFO in the state directory). No progress thread is needed.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace emu {

enum class Profile : uint32_t { Thunderbolt = 0, RdmaCoreRc = 1 };
const char* profile_name(Profile p);

// Capacities of the shared state. Slots are fixed so the file layout is a plain
// struct; the rings are large but the file is sparse, so untouched pages cost nothing.
constexpr uint32_t kMaxPorts = 64;
constexpr uint32_t kMaxQps = 256;     // QPN low byte is the slot index
constexpr uint32_t kMaxCqs = 128;
constexpr uint32_t kMaxMrs = 4096;    // key low 12 bits are the slot index
constexpr uint32_t kMaxFaults = 32;
constexpr uint32_t kRecvRing = 4096;  // per-QP receive ring (power of two)
constexpr uint32_t kCqRing = 16384;   // per-CQ completion ring (power of two)
constexpr uint32_t kMaxSge = 4;
constexpr uint32_t kFrame = 4096;     // Thunderbolt accounting unit
constexpr uint32_t kTbMaxQpsPerDevice = 10;
constexpr uint32_t kTbMaxDepth = 4095;
constexpr uint32_t kRcMaxDepth = 4096;
constexpr uint32_t kMaxInlineRc = 256;

// ---------------------------------------------------------------- fabric (static)

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
};

struct DeviceDef {
  std::string name;
  int host = -1;
  Profile profile = Profile::Thunderbolt;
  std::vector<int> ports;      // global port indices, in port_num order
  uint64_t guid = 0;           // network byte order, as ibv_get_device_guid returns
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
  Shared* shm = nullptr;

  int find_host(const std::string& name) const;
  int find_device(int host, const std::string& name) const;
  int find_port(int device, int port_num) const;
  std::string port_label(int port) const;  // "host:device:port"
};

// Loads (once per path, cached for the process life) and maps the fabric's shared
// state. Throws std::runtime_error with a message naming the problem.
Fabric& load_fabric(const std::string& path);
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
struct ShmLock {
  pthread_mutex_t m;
  void init();
  void lock();
  void unlock() { pthread_mutex_unlock(&m); }
};
struct Guard {
  explicit Guard(ShmLock& l) : l_(l) { l_.lock(); }
  ~Guard() { l_.unlock(); }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  ShmLock& l_;
};

struct ShmPort {
  uint32_t up;
  uint32_t has_ip;
  uint32_t ip;       // host byte order
  uint32_t prefix;
};

enum FaultKind : uint32_t { kFaultNone = 0, kFaultFailCall = 1, kFaultDropNext = 2, kFaultDelay = 3, kFaultStickyLoss = 4 };

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
};

struct ShmMr {
  uint32_t key;      // 0 = free slot
  int32_t pid;
  uint32_t pd;
  uint32_t access;
  uint32_t device;
  uint32_t pad;
  uint64_t addr;     // process virtual address of the region
  uint64_t iova;     // address the keys are used with (== addr unless reg_mr_iova)
  uint64_t length;
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

struct ShmQp {
  ShmLock lock;      // guards the receive ring and the counters below it
  uint32_t in_use;
  int32_t pid;
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
  // RC packet sequence numbers (24-bit): a requester whose next PSN is not what the
  // responder expects gets no ACK, retries, and ends in RETRY_EXC_ERR, as with a
  // botched PSN exchange on a real RC NIC. UC resynchronises on every new message.
  uint32_t sq_psn;   // next PSN this QP sends
  uint32_t rq_psn;   // next PSN this QP expects
  uint32_t mtu_bytes;
  uint32_t max_recv_wr;
  uint32_t recv_frames;  // frames (Thunderbolt) or WRs outstanding in the ring
  uint32_t head, tail;   // free-running ring indices
  RecvEntry ring[kRecvRing];
};

struct ShmCq {
  ShmLock lock;
  uint32_t in_use;
  int32_t pid;
  uint32_t capacity;
  uint32_t head, tail;   // free-running
  uint32_t armed;        // 1 = next completion raises an event, 2 = solicited only
  uint32_t channel;      // completion channel id (0 = none)
  int32_t channel_pid;
  uint32_t overflow;
  uint32_t events;       // events raised (diagnostics)
  uint32_t waiters;      // owner threads sleeping on `tail` (futex) in ibv_poll_cq
  ibv_wc ring[kCqRing];
};

struct Shared {
  uint64_t magic;
  uint64_t layout;       // sizeof(Shared) ^ counts, to refuse a foreign layout
  uint32_t nports;
  uint32_t nfaults;      // active fault entries (fast check on the hot path)
  ShmLock lock;          // control path: slot allocation, ports, faults
  uint32_t next_gen;
  uint32_t next_channel;
  uint32_t next_pd;
  uint32_t pad;
  ShmPort ports[kMaxPorts];
  ShmFault faults[kMaxFaults];
  ShmMr mrs[kMaxMrs];
  ShmQp qps[kMaxQps];
  ShmCq cqs[kMaxCqs];
};

constexpr uint64_t kMagic = 0x54425645'4d550002ull;  // "TBVEMU" v2

// Maps (creating and initialising if needed) the state file of a fabric.
Shared* open_shared(Fabric& f);
// Removes the state directory so the next user starts from the fabric file.
void reset_shared(const Fabric& f);

bool pid_alive(int32_t pid);
// Frees QP/CQ/MR slots whose owner process no longer exists. Caller holds shm->lock.
void collect_dead(Shared* s);

// ---------------------------------------------------------------- port view

bool port_active(const Fabric& f, int port);  // own end up, cabled, other end up
// GID table: index 0 = fe80::<id>; index 1 = ::ffff:ipv4 while the port has one
// (or, with "ipv4_gid_index": N in the fabric file, fe80:: entries at 1..N-1 and
// the IPv4-mapped entry at N, as some Macs report).
uint32_t gid_table_len(const Fabric& f, int port);
bool gid_at(const Fabric& f, int port, uint32_t index, ibv_gid* out);
// The port whose GID table holds `gid`, or -1.
int port_of_gid(const Fabric& f, const ibv_gid& gid);

// ---------------------------------------------------------------- faults

// Returns the errno to fail this call with, or 0. `host` = -1 when unknown.
int fault_check(Fabric& f, const char* verb, int host);
uint32_t fault_delay_us(Fabric& f, int host);
bool fault_sticky_loss(Fabric& f, int host);

// Channel FIFO path for a completion channel id owned by pid.
std::string channel_path(const Fabric& f, int32_t pid, uint32_t id);

}  // namespace emu
