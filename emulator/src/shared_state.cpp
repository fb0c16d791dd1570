// The per-fabric shared state file: the robust process-shared lock, the mapping every process of a
// fabric shares, its bells and the sweep of state left by dead processes. Split from fabric.cpp (the
// fabric file's parser) because this is on the data path and is optimised; the parser is not.
#include "emu.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace emu {

void ShmLock::init() {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&m, &a);
  pthread_mutexattr_destroy(&a);
  holder = 0;
}

void ShmLock::lock() {
  int r = pthread_mutex_lock(&m);
  if (r == EOWNERDEAD) pthread_mutex_consistent(&m);  // holder died; state stays usable
  __atomic_store_n(&holder, static_cast<int32_t>(getpid()), __ATOMIC_RELAXED);
}

namespace {
// Whether process `pid` is stopped (state T: a stop signal; t: a tracer's stop), from
// /proc/<pid>/stat ("pid (comm) S ..."; comm may hold spaces and parentheses: the state follows
// the last ')').
bool process_stopped(int32_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  return close_paren != nullptr && close_paren[1] == ' ' && (close_paren[2] == 'T' || close_paren[2] == 't');
}
} // namespace

bool ShmLock::lock_bounded() {
  constexpr int64_t kStoppedAfterNs = 50'000'000;  // a running holder keeps it for microseconds
  constexpr int64_t kGiveUpNs = 10'000'000'000;    // whatever the holder is doing
  auto mono_ns = [] {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  };
  int r = pthread_mutex_trylock(&m);
  const int64_t start = r == EBUSY ? mono_ns() : 0;
  while (r == EBUSY || r == ETIMEDOUT) {
    // pthread_mutex_timedlock (CLOCK_REALTIME; a clock step only lengthens or shortens one
    // slice) rather than pthread_mutex_clocklock, which ThreadSanitizer does not intercept: it
    // then saw every such lock as never taken (unlocks of unlocked mutexes, false races).
    timespec until{};
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 10'000'000;  // look at the holder every 10 ms
    if (until.tv_nsec >= 1'000'000'000) {
      until.tv_nsec -= 1'000'000'000;
      ++until.tv_sec;
    }
    r = pthread_mutex_timedlock(&m, &until);
    if (r != ETIMEDOUT) break;
    const int64_t waited = mono_ns() - start;
    const int32_t h = __atomic_load_n(&holder, __ATOMIC_RELAXED);
    if ((waited > kStoppedAfterNs && h > 0 && process_stopped(h)) || waited > kGiveUpNs) return false;
  }
  if (r == EOWNERDEAD) {
    pthread_mutex_consistent(&m);
    r = 0;
  }
  if (r != 0) return false;
  __atomic_store_n(&holder, static_cast<int32_t>(getpid()), __ATOMIC_RELAXED);
  return true;
}

static uint64_t layout_id(const Fabric& f) {
  return sizeof(Shared) ^ (uint64_t(f.ports.size()) << 40) ^ (uint64_t(kRecvRing) << 20) ^ kCqRing;
}

// The state belongs to the user who runs the emulator and to nobody else: senders trust the pid
// and addresses stored in it for process_vm_writev, so a state file others can write would let
// them aim our writes at any process we may write to (issue 9). The directory is made 0700 and
// the file 0600; a directory or file that is not ours (or not a directory / regular file) is
// refused rather than used.
static void check_private_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw std::runtime_error("cannot create the emulator state directory " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw std::runtime_error("emulator state directory " + dir + " is not a directory (a symlink?): refusing it");
  if (st.st_uid != ::geteuid())
    throw std::runtime_error("emulator state directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                             ", not to this user (uid " + std::to_string(::geteuid()) +
                             "): refusing it; set TBVERBS_EMU_STATE_DIR to a directory of your own");
  // Ours but open to others (made by an older emulator, mode 1777): closed now. A file someone
  // else planted in it is refused below, by its owner.
  if ((st.st_mode & 0077) != 0 && ::chmod(dir.c_str(), 0700) != 0)
    throw std::runtime_error("cannot make the emulator state directory " + dir + " private: " + std::strerror(errno));
}

Shared* open_shared(Fabric& f) {
  if (::mkdir(f.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::error_code ec;  // a nested path: make the parents, then the directory itself, private
    std::filesystem::create_directories(std::filesystem::path(f.state_dir).parent_path(), ec);
    ::mkdir(f.state_dir.c_str(), 0700);
  }
  check_private_dir(f.state_dir);
  // Which fabric file this state belongs to, for `tbverbs-emu gc` (state whose fabric file and
  // processes are gone is removed). Rewritten by every opener: cheap, and always current.
  {
    const std::string record = f.state_dir + "/fabric";
    int rfd = ::open(record.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (rfd >= 0) {
      const std::string text = (f.path.empty() ? std::string("(built-in)") : f.path) + "\n";
      ssize_t w = ::write(rfd, text.data(), text.size());
      (void)w;
      ::close(rfd);
    }
  }
  std::string file = f.state_dir + "/state";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot open emulator state " + file + ": " + std::strerror(errno));
  {
    struct stat fst {};
    if (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_uid != ::geteuid()) {
      ::close(fd);
      throw std::runtime_error("emulator state " + file + " is not a file of this user: refusing it");
    }
    if ((fst.st_mode & 0077) != 0) ::fchmod(fd, 0600);  // an older emulator's 0666
  }
  // flock serialises the one-time initialisation between racing processes.
  if (flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot lock " + file + ": " + std::strerror(errno));
  }
  struct stat st {};
  fstat(fd, &st);
  bool fresh = static_cast<size_t>(st.st_size) != sizeof(Shared);
  if (!fresh) {
    // Only the header: Shared itself is hundreds of MiB (sparse).
    struct {
      uint64_t magic, layout;
      uint32_t nports;
    } probe{};
    static_assert(offsetof(Shared, magic) == 0 && offsetof(Shared, layout) == 8 && offsetof(Shared, nports) == 16);
    if (pread(fd, &probe, 20, 0) != 20 || probe.magic != kMagic || probe.layout != layout_id(f) ||
        probe.nports != f.ports.size())
      fresh = true;
  }
  if (fresh && (ftruncate(fd, 0) != 0 || ftruncate(fd, sizeof(Shared)) != 0)) {
    int e = errno;
    flock(fd, LOCK_UN);
    ::close(fd);
    throw std::runtime_error("cannot size " + file + ": " + std::strerror(e));
  }
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    flock(fd, LOCK_UN);
    ::close(fd);
    throw std::runtime_error("cannot map " + file + ": " + std::strerror(e));
  }
  auto* s = static_cast<Shared*>(p);
  if (fresh) {
    s->layout = layout_id(f);
    s->nports = static_cast<uint32_t>(f.ports.size());
    s->lock.init();
    s->atomics.init();
    s->next_gen = 1;
    s->next_channel = 1;
    s->next_pd = 1;
    for (size_t i = 0; i < f.ports.size(); ++i) {
      s->ports[i].up = f.ports[i].initially_up;
      s->ports[i].has_ip = f.ports[i].initial_has_ip;
      s->ports[i].ip = f.ports[i].initial_ip;
      s->ports[i].prefix = f.ports[i].initial_prefix;
    }
    for (uint32_t i = 0; i < kNumQuirks; ++i) s->quirks[i] = f.quirks[i];
    for (auto& q : s->qps) q.lock.init();
    for (auto& c : s->cqs) c.lock.init();
    __atomic_store_n(&s->magic, kMagic, __ATOMIC_RELEASE);
  }
  flock(fd, LOCK_UN);
  ::close(fd);  // the mapping stays valid
  return s;
}

void reset_shared(const Fabric& f) {
  std::error_code ec;
  std::filesystem::remove_all(f.state_dir, ec);
}

uint32_t own_bell(Shared* s) {
  const int32_t me = getpid();
  const uint64_t start = self_start();
  uint32_t take = kMaxCqs;
  for (uint32_t i = 0; i < kMaxCqs; ++i) {
    const ShmBell& b = s->bells[i];
    if (b.pid == me && b.pid_start == start) return i;
    if (take == kMaxCqs && b.pid == 0) take = i;
  }
  for (uint32_t i = 0; take == kMaxCqs && i < kMaxCqs; ++i)  // none free: one of a process that is gone
    if (!pid_alive(s->bells[i].pid) || process_start(s->bells[i].pid) != s->bells[i].pid_start) take = i;
  if (take < kMaxCqs) {
    ShmBell& b = s->bells[take];
    b.pid_start = start;
    b.waiters = 0;
    __atomic_store_n(&b.pid, me, __ATOMIC_RELEASE);
  }
  return take;
}

bool pid_alive(int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  // A zombie (killed, not yet reaped, e.g. an orphan whose init does not reap)
  // has released its memory and QPs as far as the kernel is concerned.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = 0;
  const char* rp = std::strrchr(buf, ')');  // the command name may contain spaces
  return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

uint64_t process_start(int32_t pid) {
  if (pid <= 0) return 0;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  // Field 22 (starttime); the command name (field 2) may hold spaces and parentheses, so count
  // from its closing parenthesis: the space after it starts field 3.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  ++p;
  for (int field = 3; field < 22 && p; ++field) p = std::strchr(p + 1, ' ');
  return p ? std::strtoull(p + 1, nullptr, 10) : 0;
}

uint64_t self_start() {
  // Cached per pid: a forked child inherits the cache and must read its own.
  static std::atomic<int32_t> pid{0};
  static std::atomic<uint64_t> start{0};
  const int32_t me = getpid();
  if (pid.load(std::memory_order_acquire) != me) {
    start.store(process_start(me), std::memory_order_relaxed);
    pid.store(me, std::memory_order_release);
  }
  return start.load(std::memory_order_relaxed);
}

void collect_dead(Shared* s) {
  for (auto& q : s->qps)
    if (q.in_use && !pid_alive(q.pid)) {
      Guard g(q.lock);
      q.in_use = 0;
      q.state = IBV_QPS_RESET;
      discard_waiting(q);
    }
  for (auto& p : s->pds)
    if (p.in_use && p.pid >= 0 && !pid_alive(p.pid)) p.in_use = 0;
  for (auto& c : s->cqs)
    if (c.in_use && !pid_alive(c.pid)) c.in_use = 0;
  for (auto& m : s->mrs)
    if (m.key && !pid_alive(m.pid)) m.key = 0;
}

namespace {
// The work directories of `--local` launchers (ring_all_sum, tbverbs-probe: /tmp/tbverbs-ring-*,
// /tmp/tbverbs-probe-*) whose launcher is gone, by the "PID STATE" line it wrote in `launcher`
// (tools/common/local_scratch.hpp). Their fabric files count as gone, and once their state is
// removed the work directory goes too (issue 19 item 5: a launcher killed with SIGKILL left both).
struct DeadLauncher {
  std::string dir, state;
};
std::vector<DeadLauncher> dead_launchers() {
  namespace fs = std::filesystem;
  std::vector<DeadLauncher> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/tmp", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tbverbs-ring-", 0) != 0 && name.rfind("tbverbs-probe-", 0) != 0) continue;
    struct stat st {};
    const std::string dir = entry.path().string();
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
    std::ifstream f(dir + "/launcher");
    int32_t pid = 0;
    std::string state;
    if (!(f >> pid >> state) || pid <= 0 || pid_alive(pid)) continue;
    out.push_back({dir, state});
  }
  return out;
}
bool under_dir(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.rfind(dir, 0) == 0 && path[dir.size()] == '/';
}
}  // namespace

std::vector<std::string> collect_state_dirs(bool dry_run, std::string* report, const std::string& under) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const std::string mine = "tbverbs-emu-" + std::to_string(getuid()) + "-";
  const auto now = fs::file_time_type::clock::now();
  const std::vector<DeadLauncher> dead = dead_launchers();
  for (const char* base : {"/dev/shm", "/tmp"}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const std::string name = entry.path().filename().string();
      const bool emu = name.rfind(mine, 0) == 0, ring = name.rfind("tbverbs-ring-", 0) == 0;
      if (!(emu || ring) || !entry.is_directory(ec) || entry.is_symlink(ec)) continue;
      const std::string dir = entry.path().string();
      struct stat st {};
      if (::lstat(dir.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
      // A directory of the launcher's that is not a state directory (its work files) is left alone.
      const bool has_state = fs::exists(dir + "/state", ec);
      if (ring && !has_state && !fs::is_empty(dir, ec)) continue;
      // The fabric file it belongs to, when recorded; without a record (an older emulator, or no
      // state yet), only a directory untouched for 10 minutes counts as abandoned.
      std::string fabric;
      std::ifstream(dir + "/fabric") >> fabric;
      // A fabric file under `under` counts as gone: its owner (a test tree's clean-up) is done with it.
      bool done_with = !under.empty() && !fabric.empty() && fabric.rfind(under, 0) == 0 &&
                       (fabric.size() == under.size() || fabric[under.size()] == '/' || under.back() == '/');
      for (const auto& d : dead) done_with = done_with || (!fabric.empty() && under_dir(fabric, d.dir));
      const bool fabric_gone = done_with ||
                               (!fabric.empty() ? (fabric != "(built-in)" && !fs::exists(fabric, ec))
                                                : now - fs::last_write_time(dir, ec) > std::chrono::minutes(10));
      if (!fabric_gone) continue;
      // Any live process with objects in the state keeps it.
      bool live = false;
      if (has_state) {
        int fd = ::open((dir + "/state").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat fst {};
        if (fd >= 0 && ::fstat(fd, &fst) == 0 && static_cast<size_t>(fst.st_size) == sizeof(Shared)) {
          void* p = mmap(nullptr, sizeof(Shared), PROT_READ, MAP_SHARED, fd, 0);
          if (p != MAP_FAILED) {
            const auto* sh = static_cast<const Shared*>(p);
            if (sh->magic == kMagic) {
              for (const auto& q : sh->qps) live = live || (q.in_use && pid_alive(q.pid));
              for (const auto& c : sh->cqs) live = live || (c.in_use && pid_alive(c.pid));
              for (const auto& m : sh->mrs) live = live || (m.key && pid_alive(m.pid));
            }
            munmap(p, sizeof(Shared));
          }
        }
        if (fd >= 0) ::close(fd);
      }
      if (live) {
        if (!dry_run) remove_dead_records(dir);  // kept: only the frame records of its dead processes go
        continue;
      }
      if (report) *report += (dry_run ? "would remove " : "removed ") + dir + (fabric.empty() ? "" : " (" + fabric + ")") + "\n";
      if (!dry_run) fs::remove_all(dir, ec);
      removed.push_back(dir);
    }
  }
  // A dead launcher's work directory, once its state is gone (removed above, or never made).
  for (const auto& d : dead) {
    std::error_code ec;
    const bool state_left = !d.state.empty() && !under_dir(d.state, d.dir) && fs::exists(d.state, ec) &&
                            std::find(removed.begin(), removed.end(), d.state) == removed.end();
    if (state_left) continue;
    if (report) *report += (dry_run ? "would remove " : "removed ") + d.dir + " (its launcher is gone)\n";
    if (!dry_run) fs::remove_all(d.dir, ec);
    removed.push_back(d.dir);
  }
  return removed;
}

uint32_t count_pds(const Shared* s, int device, bool* any_leaked) {
  uint32_t n = 0;
  if (any_leaked) *any_leaked = false;
  for (const auto& p : s->pds)
    if (p.in_use && p.device == static_cast<uint32_t>(device)) {
      ++n;
      if (p.pid < 0 && any_leaked) *any_leaked = true;
    }
  return n;
}

// ---------------------------------------------------------------- port view

bool port_active(const Fabric& f, int port) {
  if (port < 0 || port >= static_cast<int>(f.ports.size())) return false;
  const ShmPort* sp = f.shm->ports;
  int peer = f.ports[port].peer;
  return __atomic_load_n(&sp[port].up, __ATOMIC_ACQUIRE) && !__atomic_load_n(&sp[port].removed, __ATOMIC_ACQUIRE) &&
         peer >= 0 && __atomic_load_n(&sp[peer].up, __ATOMIC_ACQUIRE) &&
         !__atomic_load_n(&sp[peer].removed, __ATOMIC_ACQUIRE);
}

bool device_removed(const Fabric& f, int device) {
  for (std::size_t p = 0; p < f.ports.size(); ++p)
    if (f.ports[p].device == device) return __atomic_load_n(&f.shm->ports[p].removed, __ATOMIC_ACQUIRE) != 0;
  return false;
}

uint32_t gid_table_len(const Fabric& f, int port) {
  switch (f.devices[f.ports[port].device].profile) {
    case Profile::Thunderbolt: return 1024;
    // Our assumption for both: the lengths public ibv_devinfo output of ConnectX RoCE (256)
    // and InfiniBand (128) ports commonly shows; only the first entries are ever populated.
    case Profile::RdmaCoreRoce: return 256;
    case Profile::RdmaCoreIb: return 128;
    case Profile::Usb4Rdma: return 8;  // hellas-ai/thunderbolt-ibverbs ibdev.c: TBV_IBDEV_GID_TBL_LEN 8
    case Profile::RdmaCoreRc: break;
  }
  return 16;
}

namespace {
// fe80::<interface id from the device GUID>; index > 0 stands for other interfaces
// (Thunderbolt, rdma-core-rc) and is folded into the id.
void link_local_gid(const Fabric& f, int port, uint32_t index, ibv_gid* out) {
  out->raw[0] = 0xfe;
  out->raw[1] = 0x80;
  uint64_t iid = be64toh(f.devices[f.ports[port].device].guid) ^ uint64_t(f.ports[port].port_num) ^
                 (uint64_t(index) << 56);
  iid = htobe64(iid);
  std::memcpy(out->raw + 8, &iid, 8);
}
// Read the address once so the entry is consistent while another process changes it.
bool ipv4_gid(const Fabric& f, int port, ibv_gid* out) {
  ShmPort sp;
  std::memcpy(&sp, &f.shm->ports[port], sizeof sp);
  if (!sp.has_ip) return false;
  out->raw[10] = 0xff;
  out->raw[11] = 0xff;
  uint32_t be = htonl(sp.ip);
  std::memcpy(out->raw + 12, &be, 4);
  return true;
}
}  // namespace

bool gid_at(const Fabric& f, int port, uint32_t index, ibv_gid* out) {
  std::memset(out, 0, sizeof *out);
  const PortDef& pd = f.ports[port];
  switch (f.devices[pd.device].profile) {
    case Profile::RdmaCoreRoce:
      // docs/field-reports.md section 4b: mlx5 publishes every address twice, RoCE v1 then RoCE v2:
      // 0/1 = fe80:: (v1/v2), 2/3 = ::ffff:a.b.c.d, 4/5 = a global IPv6 address. Our
      // assumption: fixed slots (an address that goes away leaves its two slots empty).
      if (index <= 1) {
        link_local_gid(f, port, 0, out);
        return true;
      }
      if (index <= 3) return ipv4_gid(f, port, out);
      if (index <= 5 && pd.has_ipv6) {
        std::memcpy(out->raw, pd.ipv6, 16);
        return true;
      }
      return false;
    case Profile::RdmaCoreIb:
      // docs/field-reports.md section 4b: only the port GID, subnet prefix (default fe80::/64)
      // + GUID.
      if (index != 0) return false;
      link_local_gid(f, port, 0, out);
      std::memcpy(out->raw, pd.subnet_prefix, 8);
      return true;
    case Profile::Thunderbolt:
    case Profile::RdmaCoreRc:
    // usb4-rdma: a RoCE v2 port (ibdev.c: link layer Ethernet, core_cap_flags
    // RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP), so the kernel fills its table from the roce_netdev
    // interface's addresses, one RoCE v2 entry each: fe80:: at 0, ::ffff:a.b.c.d at 1 (our
    // reading of the kernel's RoCE GID management; the driver's own query_gid is not used there).
    case Profile::Usb4Rdma:
      break;
  }
  const uint32_t v4 = pd.ipv4_gid_index;
  if (index < v4) {
    // Link-local entries derived from the device GUID, present whatever the address
    // state; index 0 is the port's own, later ones stand for other interfaces.
    link_local_gid(f, port, index, out);
    return true;
  }
  if (index == v4) return ipv4_gid(f, port, out);
  return false;
}

uint32_t gid_type_at(const Fabric& f, int port, uint32_t index) {
  switch (f.devices[f.ports[port].device].profile) {
    case Profile::RdmaCoreRoce: return index % 2 == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
    case Profile::RdmaCoreIb: return IBV_GID_TYPE_IB;
    // Thunderbolt: what Apple's driver reports is unpublished; RoCE v2 is our assumption.
    case Profile::Thunderbolt:
    case Profile::RdmaCoreRc:
    case Profile::Usb4Rdma: break;  // RoCE v2 only (RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP)
  }
  return IBV_GID_TYPE_ROCE_V2;
}

std::string port_netdev(const Fabric& f, int port) {
  const PortDef& pd = f.ports[port];
  const Profile p = f.devices[pd.device].profile;
  if (p != Profile::RdmaCoreRoce && p != Profile::Usb4Rdma) return "";
  if (!pd.netdev.empty()) return pd.netdev;
  // usb4-rdma: the module's roce_netdev names the interface (ibdev.c); ours is the Thunderbolt
  // network interface of the same number ("usb4_rdma1" → "thunderbolt1"), our assumption.
  if (p == Profile::Usb4Rdma) {
    const std::string& n = f.devices[pd.device].name;
    return "thunderbolt" + (n.rfind("usb4_rdma", 0) == 0 ? n.substr(9) : std::string("0"));
  }
  // Our assumption: one Ethernet interface per port, named after the device ("mlx5_0" port 1 → "mlx5_0p1").
  return f.devices[pd.device].name + "p" + std::to_string(pd.port_num);
}

int port_of_gid(const Fabric& f, const ibv_gid& gid) {
  for (size_t p = 0; p < f.ports.size(); ++p) {
    const uint32_t n = std::min<uint32_t>(gid_table_len(f, static_cast<int>(p)), 16);
    for (uint32_t i = 0; i < n; ++i) {
      ibv_gid g;
      if (gid_at(f, static_cast<int>(p), i, &g) && std::memcmp(&g, &gid, sizeof g) == 0) return static_cast<int>(p);
    }
  }
  return -1;
}

std::string ensure_sysfs(const Fabric& f, int device) {
  const DeviceDef& d = f.devices[device];
  if (d.profile != Profile::RdmaCoreRoce && d.profile != Profile::RdmaCoreIb && d.profile != Profile::Usb4Rdma) return "";
  // <state>/sysfs/<host>/class/infiniband/<dev>: the host is in the path because two hosts
  // may have devices of the same name. The tree is static (slot types and netdevs do not
  // change), so it is written once; files are replaced atomically (rename).
  const std::string dir = f.state_dir + "/sysfs/" + f.hosts[d.host].name + "/class/infiniband/" + d.name;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/.complete", ec)) return dir;
  auto put = [&](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    const std::string tmp = path + ".tmp" + std::to_string(getpid());
    { std::ofstream(tmp) << text << "\n"; }
    std::filesystem::rename(tmp, path, ec);
  };
  for (int gp : d.ports) {
    const std::string pdir = dir + "/ports/" + std::to_string(f.ports[gp].port_num);
    const std::string nd = port_netdev(f, gp);
    for (uint32_t i = 0; i < 6; ++i) {
      if (d.profile == Profile::RdmaCoreIb && i > 0) break;
      if (d.profile == Profile::Usb4Rdma && i > f.ports[gp].ipv4_gid_index) break;
      // The strings rdma-core's ibv_query_gid_type compares against ("IB/RoCE v1", "RoCE v2").
      put(pdir + "/gid_attrs/types/" + std::to_string(i),
          gid_type_at(f, gp, i) == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
      if (!nd.empty()) put(pdir + "/gid_attrs/ndevs/" + std::to_string(i), nd);
    }
  }
  put(dir + "/.complete", "");
  return dir;
}

// ---------------------------------------------------------------- faults

int fault_check(Fabric& f, const char* verb, int host) {
  Shared* s = f.shm;
  if (__atomic_load_n(&s->nfaults, __ATOMIC_ACQUIRE) == 0) return 0;  // hot path: no faults armed
  Guard g(s->lock);
  for (auto& ft : s->faults) {
    if (ft.kind != kFaultFailCall || std::strcmp(ft.verb, verb) != 0) continue;
    if (ft.host >= 0 && ft.host != host) continue;
    ++ft.seen;
    if (ft.seen >= ft.nth && (ft.count == 0 || ft.failed < ft.count)) {
      ++ft.failed;
      return ft.err;
    }
  }
  return 0;
}

uint32_t fault_delay_us(Fabric& f, int host) {
  Shared* s = f.shm;
  if (__atomic_load_n(&s->nfaults, __ATOMIC_ACQUIRE) == 0) return 0;
  Guard g(s->lock);
  uint32_t d = 0;
  for (auto& ft : s->faults)
    if (ft.kind == kFaultDelay && (ft.host < 0 || ft.host == host) && ft.delay_us > d) d = ft.delay_us;
  return d;
}

bool fault_sticky_loss(Fabric& f, int host) {
  Shared* s = f.shm;
  if (__atomic_load_n(&s->nfaults, __ATOMIC_ACQUIRE) == 0) return false;
  Guard g(s->lock);
  for (auto& ft : s->faults)
    if (ft.kind == kFaultStickyLoss && (ft.host < 0 || ft.host == host)) return true;
  return false;
}

std::string channel_path(const Fabric& f, int32_t pid, uint32_t id) {
  return f.state_dir + "/chan-" + std::to_string(pid) + "-" + std::to_string(id);
}

void remove_dead_channels(const Fabric& f) {
  // A process killed before ibv_destroy_comp_channel leaves its FIFO behind (issue 9: they piled
  // up until gc or reset). The name carries the owner's pid; a pid that is reused by a live
  // process keeps its FIFO, which is harmless (nobody writes to it: its CQs are gone).
  DIR* d = ::opendir(f.state_dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    long pid = 0;
    unsigned long id = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "chan-%ld-%lu%c", &pid, &id, &tail) != 2 || pid <= 0) continue;
    if (!pid_alive(static_cast<int32_t>(pid))) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

}  // namespace emu
