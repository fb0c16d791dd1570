// Registration and pinning: what ibv_reg_mr checks and keeps of the memory behind a region, and
// the check every transfer makes against it (docs/emulator.md, "Registration and pinning").
//
// On hardware ibv_reg_mr (ibv_reg_mr(3)) pins the pages behind the range when it is called: its
// kernel side, ib_umem_get (drivers/infiniband/core/umem.c), pins them with pin_user_pages_fast and
// FOLL_LONGTERM, asking for write access (FOLL_WRITE) when the access flags include a write, and
// fails with the pinning's -EFAULT on a range it cannot pin. The NIC then moves data to and from
// those pages, whatever the program maps at those addresses later: a region whose memory was
// unmapped after ibv_reg_mr receives into the old pages and sends the old pages' bytes. The
// emulator moved data by virtual address, so such a stale region looked healthy. Here:
//
// 1. register_pages: the range must be mapped (MADV_POPULATE_READ; ENOMEM when not) and, with a
//    write flag, writable (MADV_POPULATE_WRITE; EINVAL on a read-only mapping): any failure is
//    EFAULT, as ib_umem_get answers. Apple does not publish its answer; EFAULT on every profile is
//    our assumption (a kernel wiring call on an unmapped or read-only range fails; the errno is not
//    published). Both populate the pages, as the kernel's pinning faults them in.
// 2. The pages are pinned with io_uring fixed buffers (IORING_REGISTER_BUFFERS pins with
//    FOLL_LONGTERM): a pinned page can be neither migrated nor freed and reused while the region
//    lives, so a page mapped at the same address later has another frame.
// 3. What backs the range (pagemap entries: frame number bits 0-54, present bit 63, swapped 62,
//    file or shared 61) is recorded in STATE_DIR/mr-PID-START-RECORD, which the process doing a
//    transfer (often another one) maps and caches.
// 4. check_pages compares the pages a transfer touches with the record: one pread of
//    /proc/PID/pagemap per range, into a reused buffer, or, where the fast path below proves
//    nothing changed since the last such read, a few microseconds. A mismatch means the memory
//    behind the registration was unmapped after ibv_reg_mr; the copy then skips the stale target
//    pages and reads 0xdb for stale source pages (datapath.cpp, copy_checked). This is the field's
//    precedent too: UCX checks a cached registration's frame numbers (UCX_RCACHE_CHECK_PFN).
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/io_uring.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "local.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace emu {

bool g_page_check = true;

namespace {

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
constexpr uint64_t kPmPfn = (1ull << 55) - 1;  // bits 0-54: the frame (0 without CAP_SYS_ADMIN)
constexpr uint64_t kPmFile = 1ull << 61;       // file page or shared anonymous
constexpr uint64_t kPmSwapped = 1ull << 62;
constexpr uint64_t kPmPresent = 1ull << 63;

// io_uring fixed buffers: at most 1 GiB each, at most 16384 in a table (IORING_MAX_REG_BUFFERS).
constexpr uint64_t kPinMax = 1ull << 30;
constexpr uint32_t kPinSlots = 1u << 14;

constexpr uint64_t kRecordMagic = 0x54424d5246524d31ull;  // "TBMRFRM1"
struct RecordHeader {
  uint64_t magic;
  uint64_t record;
  uint64_t first_page;  // address / page size of the first page
  uint64_t npages;
  uint64_t page_size;
  int32_t pid;
  uint32_t frames;
  uint64_t pad[2];
};
static_assert(sizeof(RecordHeader) == 64);

// Read once, when the library is loaded (before any verb can run).
__attribute__((constructor)) void page_check_init() {
  const char* v = std::getenv("TBVERBS_EMU_PAGE_CHECK");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "on") == 0 || std::strcmp(v, "1") == 0) return;
  if (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0) {
    g_page_check = false;
    return;
  }
  std::fprintf(stderr, "tbverbs-emu: TBVERBS_EMU_PAGE_CHECK=%s: expected on or off; the page check stays on\n", v);
}

// One line on stderr the first time; later calls are silent.
__attribute__((format(printf, 2, 3))) void notice(std::atomic_flag& said, const char* fmt, ...) {
  if (said.test_and_set(std::memory_order_relaxed)) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
}
std::atomic_flag g_said_no_populate = ATOMIC_FLAG_INIT;
std::atomic_flag g_said_no_pin = ATOMIC_FLAG_INIT;
std::atomic_flag g_said_no_pfn = ATOMIC_FLAG_INIT;
std::atomic_flag g_said_no_pfn_peer = ATOMIC_FLAG_INIT;
std::atomic_flag g_said_no_record = ATOMIC_FLAG_INIT;

// MADV_POPULATE_* exist (Linux 5.14): asked once, on a page of our own.
bool populate_supported() {
  static const bool ok = [] {
    void* p = ::mmap(nullptr, page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return true;  // cannot tell: assume so (a failure then reads as EFAULT)
    const bool supported = ::madvise(p, page_size(), MADV_POPULATE_READ) == 0 || errno != EINVAL;
    ::munmap(p, page_size());
    return supported;
  }();
  return ok;
}

// ------------------------------------------------------------ the pin (io_uring fixed buffers)

// One io_uring per process, created at the first registration, with a sparse table of kPinSlots
// buffers; a region takes one slot per GiB. Raw system calls: no liburing.
struct Pinner {
  std::mutex mu;
  int fd = -1;
  int32_t pid = 0;        // the process the ring belongs to (a forked child makes its own)
  int setup_err = 0;      // why there is no ring (sticky for the process)
  std::vector<uint8_t> used;

  // Pins [lo, lo + len) into `count` consecutive slots from `*first`. 0 or an errno.
  int pin(uint64_t lo, uint64_t len, uint32_t* first, uint32_t* count) {
    std::lock_guard<std::mutex> g(mu);
    if (pid != getpid()) {  // first use, or a forked child: the parent's ring is not ours
      if (fd >= 0) ::close(fd);
      fd = -1;
      setup_err = 0;
      pid = getpid();
      used.assign(kPinSlots, 0);
      setup();
    }
    if (fd < 0) return setup_err;
    const auto n = static_cast<uint32_t>((len + kPinMax - 1) / kPinMax);
    uint32_t at = 0, run = 0;
    for (uint32_t i = 0; i < kPinSlots && run < n; ++i) {
      if (used[i]) {
        run = 0;
        continue;
      }
      if (run++ == 0) at = i;
    }
    if (run < n) return ENOSPC;
    std::vector<iovec> iov(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t off = uint64_t(i) * kPinMax;
      iov[i].iov_base = reinterpret_cast<void*>(lo + off);
      iov[i].iov_len = std::min(kPinMax, len - off);
    }
    const long done = update(at, iov.data(), n);
    if (done == static_cast<long>(n)) {
      std::fill_n(used.begin() + at, n, 1);
      *first = at;
      *count = n;
      return 0;
    }
    const int e = done < 0 ? errno : EFAULT;
    if (done > 0) clear(at, static_cast<uint32_t>(done));
    return e;
  }
  void unpin(uint32_t first, uint32_t count) {
    std::lock_guard<std::mutex> g(mu);
    if (pid != getpid() || fd < 0 || first + count > kPinSlots) return;
    clear(first, count);
    std::fill_n(used.begin() + first, count, 0);
  }

 private:
  void setup() {
    io_uring_params p{};
    const long r = syscall(__NR_io_uring_setup, 1, &p);
    if (r < 0) {
      setup_err = errno;
      return;
    }
    fd = static_cast<int>(r);
    io_uring_rsrc_register reg{};
    reg.nr = kPinSlots;
    reg.flags = IORING_RSRC_REGISTER_SPARSE;  // Linux 5.19
    if (syscall(__NR_io_uring_register, fd, IORING_REGISTER_BUFFERS2, &reg, sizeof reg) < 0) {
      setup_err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  long update(uint32_t at, const iovec* iov, uint32_t n) {
    io_uring_rsrc_update2 up{};
    up.offset = at;
    up.data = reinterpret_cast<uint64_t>(iov);
    up.nr = n;
    return syscall(__NR_io_uring_register, fd, IORING_REGISTER_BUFFERS_UPDATE, &up, sizeof up);
  }
  // Empty iovecs release the slots' buffers: the pages are unpinned.
  void clear(uint32_t at, uint32_t n) {
    std::vector<iovec> empty(n, iovec{nullptr, 0});
    if (update(at, empty.data(), n) < 0) {
      // Nothing else to do: the ring keeps them pinned until the process exits.
    }
  }
};
Pinner& pinner() {
  static auto& p = *new Pinner();  // never destroyed: registrations may outlive static destructors
  return p;
}

const char* pin_failure(int e) {
  switch (e) {
    case ENOSYS: return "io_uring is not in this kernel";
    case EPERM:
    case EACCES: return "io_uring is disabled (sysctl kernel.io_uring_disabled) or blocked by a seccomp filter";
    case ENOMEM: return "RLIMIT_MEMLOCK (ulimit -l) is too small and the process lacks CAP_IPC_LOCK";
    case EINVAL: return "this kernel's io_uring has no sparse buffer table (Linux 5.19)";
    case EFAULT:
    case EOPNOTSUPP: return "file-backed memory, which io_uring does not pin";
    case ENOSPC: return "all 16384 io_uring buffer slots of the process are taken";
    default: return std::strerror(e);
  }
}

// ------------------------------------------------------------ a process's /proc files

// The /proc files of process pid (started at `start`) that the check reads, opened once per
// process and thread: pagemap (its pages), stat (its page faults), maps (its mappings).
struct ProcFiles {
  int32_t pid = 0;
  uint64_t start = 0;
  int pagemap = -1, stat = -1, maps = -1;
  void close_all() {
    for (int* fd : {&pagemap, &stat, &maps})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  }
};
ProcFiles* proc_files(int32_t pid, uint64_t start) {
  struct Cache {
    ProcFiles e[8];
    unsigned next = 0;
    ~Cache() {
      for (ProcFiles& x : e) x.close_all();
    }
  };
  thread_local Cache c;
  for (auto& x : c.e)
    if (x.pagemap >= 0 && x.pid == pid && x.start == start) return &x;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/pagemap", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  if (process_start(pid) != start) {  // the pid names another process now
    ::close(fd);
    return nullptr;
  }
  ProcFiles& slot = c.e[c.next++ % 8];
  slot.close_all();
  slot.pid = pid;
  slot.start = start;
  slot.pagemap = fd;
  // The same process (its start time was just checked): the other two files name it too.
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  slot.stat = ::open(path, O_RDONLY | O_CLOEXEC);
  std::snprintf(path, sizeof path, "/proc/%d/maps", static_cast<int>(pid));
  slot.maps = ::open(path, O_RDONLY | O_CLOEXEC);
  return &slot;
}

// Reads `n` entries from page `first` on; false when they cannot be read in full.
bool read_pagemap(int fd, uint64_t first, uint64_t* out, uint64_t n) {
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out + got, (n - got) * 8, static_cast<off_t>((first + got) * 8));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || r % 8 != 0) return false;
    got += static_cast<uint64_t>(r) / 8;
  }
  return true;
}

// ------------------------------------------------------------ the fast path
//
// Reading pagemap costs about 35 ns a page (32-42 us for 4 MiB, measured here): for both sides of
// a 4 MiB transfer, a quarter of the copy. After a full check found a range clean, the next
// transfer over it can instead prove that nothing changed, for a few microseconds. A page behind a
// region changes only when it is unmapped (munmap, MADV_DONTNEED, a mapping made over it, mremap
// away) and, to hold anything, is mapped again by a page fault (of the owner; populating with
// MAP_POPULATE or MADV_POPULATE_* faults too) or by mremap moving other pages in. So, since the
// full check:
// - the owner took no page fault (all its threads: getrusage for this process, /proc/PID/stat
//   for another; exact counts),
// - its mappings over the range are the same (PROCMAP_QUERY, Linux 6.11: start, end, flags,
//   offset, file; a moved mapping keeps the offset of where it came from),
// - no process found the region stale (ShmMr::stale, which every report bumps),
// - and no page was unmapped and left so: this process's own pages are all resident (mincore);
//   another process's cannot be asked cheaply, but such a page faults when the copy reaches it,
//   and that fault is counted in this thread (getrusage RUSAGE_THREAD around the copy). Then the
//   copy is checked again in full and undone where it went wrong (check_pages' kUnproven).
// Not seen (our assumption that programs do not do this to registered memory while a transfer
// reads or writes it): pages put in by something other than a fault of the owner or of the
// emulator's copy (a debugger's write, userfaultfd's UFFDIO_COPY and UFFDIO_MOVE, a process that
// shares the memory map without being a thread of the owner), and a remap racing with the copy.
// Without PROCMAP_QUERY (before Linux 6.11) every check reads pagemap.

#ifndef PROCMAP_QUERY
struct procmap_query {
  __u64 size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  __u32 dev_major, dev_minor, vma_name_size, build_id_size;
  __u64 vma_name_addr, build_id_addr;
};
#define PROCMAP_QUERY _IOWR('f', 17, struct procmap_query)
#define PROCMAP_QUERY_COVERING_OR_NEXT_VMA 0x10
#endif

std::atomic<bool> g_no_procmap_query{false};

// A signature of the mappings over [lo, hi) (maps: /proc/PID/maps); 0 when unknown (no
// PROCMAP_QUERY, or a hole in the range).
uint64_t mappings_signature(int maps, uint64_t lo, uint64_t hi) {
  if (maps < 0 || g_no_procmap_query.load(std::memory_order_relaxed)) return 0;
  uint64_t sig = 1469598103934665603ull;  // FNV-1a over the mappings' fields
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) sig = (sig ^ (v & 0xff)) * 1099511628211ull;
  };
  for (uint64_t at = lo; at < hi;) {
    procmap_query q{};
    q.size = sizeof q;
    q.query_flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA;
    q.query_addr = at;
    if (::ioctl(maps, PROCMAP_QUERY, &q) != 0) {
      if (errno == ENOTTY || errno == EINVAL) g_no_procmap_query.store(true, std::memory_order_relaxed);
      return 0;
    }
    if (q.vma_start > at || q.vma_end <= at) return 0;  // a hole
    mix(q.vma_start);
    mix(q.vma_end);
    mix(q.vma_flags);
    mix(q.vma_offset);
    mix(q.inode);
    mix((uint64_t(q.dev_major) << 32) | q.dev_minor);
    at = q.vma_end;
  }
  return sig | 1;
}

// The page faults of every thread of a process so far (minor and major); UINT64_MAX when unknown.
uint64_t process_faults(const ProcFiles& pf, bool own) {
  if (own) {
    rusage ru{};
    if (::getrusage(RUSAGE_SELF, &ru) != 0) return UINT64_MAX;
    return static_cast<uint64_t>(ru.ru_minflt) + static_cast<uint64_t>(ru.ru_majflt);
  }
  if (pf.stat < 0) return UINT64_MAX;
  char buf[2048];
  const ssize_t n = ::pread(pf.stat, buf, sizeof buf - 1, 0);
  if (n <= 0) return UINT64_MAX;
  buf[n] = '\0';
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt ...": the
  // command name may hold spaces and parentheses, so count from the last ')' (field 2's end).
  const char* p = std::strrchr(buf, ')');
  if (!p) return UINT64_MAX;
  uint64_t v[3] = {};
  int field = 2;
  for (; *p && field < 12; ++p) {
    if (*p != ' ') continue;
    ++field;
    if (field >= 10) v[field - 10] = std::strtoull(p + 1, nullptr, 10);
  }
  return field == 12 ? v[0] + v[2] : UINT64_MAX;
}

// Whether every page of [page0, page0 + n) of this process is resident.
bool all_resident(uint64_t page0, uint64_t n) {
  constexpr uint64_t kChunk = 4096;
  thread_local unsigned char vec[kChunk];
  const uint64_t ps = page_size();
  for (uint64_t at = 0; at < n; at += kChunk) {
    const uint64_t k = std::min(kChunk, n - at);
    if (::mincore(reinterpret_cast<void*>((page0 + at) * ps), k * ps, vec) != 0) return false;
    for (uint64_t i = 0; i < k; ++i)
      if (!(vec[i] & 1)) return false;
  }
  return true;
}

// The last full check of a region's pages that found them clean, per thread.
struct Verified {
  const Shared* fabric = nullptr;
  uint64_t record = 0;
  int32_t pid = 0;           // the owner
  int32_t checker = 0;       // the process that checked (a forked child starts afresh)
  uint64_t p0 = 0, p1 = 0;   // the pages checked
  uint64_t faults = 0;       // the owner's process_faults() before the check
  uint64_t signature = 0;    // mappings_signature() of [p0, p1] before the check
  uint32_t stale = 0;        // ShmMr::stale before the check
};
struct VerifiedCache {
  Verified e[16];
  unsigned next = 0;
  Verified* find(const Shared* fabric, uint64_t record, int32_t pid, int32_t me) {
    for (Verified& v : e)
      if (v.record == record && v.fabric == fabric && v.pid == pid && v.checker == me) return &v;
    return nullptr;
  }
};
thread_local VerifiedCache t_verified;

// ------------------------------------------------------------ frame records

std::string record_path(const std::string& dir, int32_t pid, uint64_t start, uint64_t record) {
  return dir + "/mr-" + std::to_string(pid) + "-" + std::to_string(start) + "-" + std::to_string(record);
}

// The mapped record `record` of process pid/start, cached per thread (a record never changes
// once its region's key is published, and its id is never reused on its fabric, so the cache is
// never stale).
const RecordHeader* record_of(const Fabric& f, int32_t pid, uint64_t start, uint64_t record) {
  struct Cache {
    struct Entry {
      const Shared* fabric = nullptr;
      uint64_t id = 0;
      const RecordHeader* h = nullptr;
      size_t len = 0;
    } e[16];
    unsigned next = 0;
    ~Cache() {
      for (Entry& x : e)
        if (x.h) ::munmap(const_cast<RecordHeader*>(x.h), x.len);
    }
  };
  thread_local Cache c;
  for (const auto& x : c.e)
    if (x.h && x.id == record && x.fabric == f.shm) return x.h;
  const int fd = ::open(record_path(f.state_dir, pid, start, record).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return nullptr;  // deregistered since: nothing to compare with
  struct stat st {};
  void* p = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(RecordHeader))
    p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  const auto* h = static_cast<const RecordHeader*>(p);
  const auto len = static_cast<size_t>(st.st_size);
  if (h->magic != kRecordMagic || h->record != record || h->pid != pid ||
      sizeof(RecordHeader) + h->npages * 8 > len || h->page_size != page_size()) {
    ::munmap(p, len);
    return nullptr;
  }
  auto& slot = c.e[c.next++ % 16];
  if (slot.h) ::munmap(const_cast<RecordHeader*>(slot.h), slot.len);
  slot = {f.shm, record, h, len};
  return h;
}

// Writes a record; false (said once) when the state directory does not take it.
bool write_record(const Fabric& f, const std::string& path, const RecordHeader& h, const uint64_t* entries) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  bool ok = fd >= 0;
  auto put = [&](const void* data, size_t n, off_t at) {
    const char* p = static_cast<const char*>(data);
    while (ok && n > 0) {
      const ssize_t w = ::pwrite(fd, p, n, at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ok = false;
        break;
      }
      p += w;
      n -= static_cast<size_t>(w);
      at += w;
    }
  };
  put(entries, h.npages * 8, sizeof h);
  put(&h, sizeof h, 0);  // the header last: a record with a header is complete
  const int e = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    notice(g_said_no_record,
           "tbverbs-emu: cannot write a frame record in %s (%s): regions registered meanwhile are not checked "
           "for memory unmapped after ibv_reg_mr; this is printed once per process\n",
           f.state_dir.c_str(), std::strerror(e));
  }
  return ok;
}

}  // namespace

uint64_t page_size() {
  static const uint64_t ps = [] {
    const long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<uint64_t>(v) : 4096u;
  }();
  return ps;
}

int register_pages(Fabric& f, void* addr, size_t len, unsigned access, PageReg* out) {
  *out = PageReg{};
  if (len == 0) return 0;  // nothing to pin or check (rdma-core's kernel takes length 0 too)
  const uint64_t ps = page_size();
  const auto a = reinterpret_cast<uint64_t>(addr);
  if (a + len < a || a + len > UINT64_MAX - ps) return EINVAL;  // wraps: ib_umem_get's -EINVAL
  const uint64_t lo = a & ~(ps - 1), hi = (a + len + ps - 1) & ~(ps - 1);
  void* const base = reinterpret_cast<void*>(lo);
  const bool want_write =
      (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;

  // 1. What ib_umem_get checks: mapped (POPULATE_READ fails with ENOMEM on a hole) and, for a
  // writable registration, writable (POPULATE_WRITE fails with EINVAL on a read-only mapping).
  // Every failure is EFAULT, rdma-core's answer; on Apple's profile our assumption (the errno of a
  // kernel wiring call on such a range is not published).
  if (populate_supported()) {
    if (::madvise(base, hi - lo, want_write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0) return EFAULT;
  } else {
    notice(g_said_no_populate,
           "tbverbs-emu: this kernel has no MADV_POPULATE_READ/WRITE (Linux 5.14): ibv_reg_mr does not check that "
           "the range is mapped (hardware fails such a registration with EFAULT); this is printed once per process\n");
  }

  // 2. The pin. io_uring asks for write access, so a read-only mapping is not pinned (it is
  // recorded all the same); a writable one is pinned whatever the access flags.
  uint32_t first = 0, count = 0;
  int pin_err = pinner().pin(lo, hi - lo, &first, &count);
  if (pin_err == 0) {
    out->pin_pid = getpid();
    out->pin_first = first;
    out->pin_count = count;
    out->frames |= kFramesPinned;
  } else if (want_write || pin_err != EFAULT) {  // EFAULT without write access: a read-only mapping
    notice(g_said_no_pin,
           "tbverbs-emu: registered memory is not pinned (io_uring fixed buffers: %s). Without a pin, a page the "
           "program unmaps may be freed and come back at the same address, so a region whose memory was unmapped "
           "after ibv_reg_mr can go unseen (pages no longer mapped are still seen); this is printed once per "
           "process\n",
           pin_failure(pin_err));
  }

  // 3. The record: what backs the range now (read after pinning: a long-term pin may migrate pages).
  const uint64_t npages = (hi - lo) / ps;
  std::vector<uint64_t> entries(npages);
  const ProcFiles* pf = proc_files(getpid(), self_start());
  if (!pf || !read_pagemap(pf->pagemap, lo / ps, entries.data(), npages)) return 0;  // cannot be checked
  bool any_present = false, pfn_visible = false;
  for (uint64_t& e : entries) {
    e &= kPmPfn | kPmFile | kPmSwapped | kPmPresent;
    any_present = any_present || (e & kPmPresent);
    pfn_visible = pfn_visible || ((e & kPmPresent) && (e & kPmPfn));
  }
  if (!any_present) return 0;  // nothing populated (no MADV_POPULATE, no pin): nothing to compare
  if (pfn_visible && (out->frames & kFramesPinned)) out->frames |= kFramesPfn;
  if (!pfn_visible)
    notice(g_said_no_pfn,
           "tbverbs-emu: page frame numbers are not readable (/proc/PID/pagemap shows them with CAP_SYS_ADMIN "
           "only): a region's page that the program unmapped and mapped again and then touched goes unseen; only "
           "pages no longer mapped are seen; this is printed once per process\n");
  static std::atomic<bool> swept{false};
  if (!swept.exchange(true)) remove_dead_records(f.state_dir);
  RecordHeader h{};
  h.magic = kRecordMagic;
  h.record = __atomic_add_fetch(&f.shm->next_record, 1, __ATOMIC_RELAXED);
  h.first_page = lo / ps;
  h.npages = npages;
  h.page_size = ps;
  h.pid = getpid();
  h.frames = out->frames | kFramesChecked;
  out->owner = h.pid;
  out->pid_start = self_start();
  if (!write_record(f, record_path(f.state_dir, h.pid, out->pid_start, h.record), h, entries.data())) return 0;
  out->record = h.record;
  out->frames = h.frames;
  return 0;
}

void release_pages(const Fabric& f, const PageReg& r) {
  if (r.pin_count && r.pin_pid == getpid()) pinner().unpin(r.pin_first, r.pin_count);
  // A forked child deregistering its parent's region leaves the parent's record alone.
  if (r.record && r.owner == getpid()) ::unlink(record_path(f.state_dir, r.owner, r.pid_start, r.record).c_str());
}

void remove_dead_records(const std::string& state_dir) {
  DIR* d = ::opendir(state_dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    long pid = 0;
    unsigned long long start = 0, rec = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "mr-%ld-%llu-%llu%c", &pid, &start, &rec, &tail) != 3 || pid <= 0) continue;
    if (process_start(static_cast<int32_t>(pid)) != start) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

namespace {

// What a region's record says about [addr, addr + len) of its owner pid/start; null when nothing
// can be told (no record, the region gone, the range outside it).
struct RegionPages {
  const uint64_t* rec = nullptr;  // the recorded entries, from page p0
  uint64_t p0 = 0, p1 = 0;
  uint64_t record = 0;
  uint32_t frames = 0, stale = 0;
};
bool region_pages(const Fabric& f, int32_t pid, uint64_t start, uint32_t key, uint64_t addr, uint64_t len,
                  RegionPages* out) {
  if (len == 0 || key == 0) return false;
  const ShmMr& m = f.shm->mrs[key & (kMaxMrs - 1)];
  // The key is published last (release) by whoever fills the slot: read it first and again after
  // the fields, so that they are the registration's whose key this is.
  if (__atomic_load_n(&m.key, __ATOMIC_ACQUIRE) != key) return false;
  out->stale = __atomic_load_n(&m.stale, __ATOMIC_RELAXED);
  out->frames = __atomic_load_n(&m.frames, __ATOMIC_RELAXED);
  out->record = __atomic_load_n(&m.record, __ATOMIC_RELAXED);
  const bool same = m.pid == pid && m.pid_start == start;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (__atomic_load_n(&m.key, __ATOMIC_RELAXED) != key || !(out->frames & kFramesChecked) || out->record == 0 || !same)
    return false;
  const RecordHeader* h = record_of(f, pid, start, out->record);
  if (!h) return false;
  const uint64_t ps = page_size();
  out->p0 = addr / ps;
  out->p1 = (addr + len - 1) / ps;
  if (out->p0 < h->first_page || out->p1 >= h->first_page + h->npages) return false;
  out->rec = reinterpret_cast<const uint64_t*>(h + 1) + (out->p0 - h->first_page);
  return true;
}

// The full check: the pages' pagemap entries against the record, one pread per range (per
// 16 MiB of it) into a buffer the thread reuses.
bool full_check(const RegionPages& rp, int pagemap, uint64_t* first, std::vector<uint8_t>* stale) {
  const uint64_t ps = page_size();
  const bool pfn = rp.frames & kFramesPfn;
  constexpr uint64_t kChunk = 4096;
  thread_local uint64_t now[kChunk];
  bool any = false;
  if (stale) stale->assign(rp.p1 - rp.p0 + 1, 0);
  for (uint64_t at = 0, n = rp.p1 - rp.p0 + 1; at < n; at += kChunk) {
    const uint64_t k = std::min(kChunk, n - at);
    if (!read_pagemap(pagemap, rp.p0 + at, now, k)) return any;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t r = rp.rec[at + i], c = now[i];
      if (!(r & kPmPresent)) continue;  // not populated at registration: nothing to tell
      bool gone;
      if (c & kPmPresent) {
        if (!pfn) continue;
        if (!(c & kPmPfn)) {  // we cannot see frame numbers of that process
          notice(g_said_no_pfn_peer,
                 "tbverbs-emu: page frame numbers of another process are not readable (CAP_SYS_ADMIN): a region whose "
                 "memory was unmapped and mapped again after ibv_reg_mr can go unseen; this is printed once per "
                 "process\n");
          continue;
        }
        gone = (c & kPmPfn) != (r & kPmPfn);
      } else {
        // An anonymous page not present, and not swapped out or migrating (both show as swapped),
        // was unmapped or discarded (a pinned one cannot be reclaimed). A file or shared page
        // may be dropped from the page tables and mapped again at the next touch: proves nothing.
        gone = !(c & kPmSwapped) && !(r & kPmFile);
      }
      if (!gone) continue;
      if (!any) *first = (rp.p0 + at + i) * ps;
      any = true;
      if (!stale) return true;
      (*stale)[at + i] = 1;
    }
  }
  return any;
}

}  // namespace

PageCheck check_pages(const Fabric& f, int32_t pid, uint64_t start, uint32_t key, uint64_t addr, uint64_t len,
                      uint64_t* first) {
  RegionPages rp;
  if (!region_pages(f, pid, start, key, addr, len, &rp)) return PageCheck::kClean;
  ProcFiles* pf = proc_files(pid, start);
  if (!pf) return PageCheck::kClean;
  const uint64_t ps = page_size();
  const int32_t me = getpid();
  const bool own = pid == me;
  // A short range is read at once: pagemap costs 0.6 us plus 35 ns a page, the fast path's proof
  // 2-5 us (measured here), so it pays from about 64 pages (256 KiB) on.
  constexpr uint64_t kFastFrom = 64;
  if (rp.p1 - rp.p0 + 1 < kFastFrom) {
    uint64_t at = 0;
    if (!full_check(rp, pf->pagemap, &at, nullptr)) return PageCheck::kClean;
    *first = at;
    return PageCheck::kStale;
  }
  // The fast path (see above): what proves the pages unchanged since the last full check.
  const uint64_t faults = process_faults(*pf, own);
  if (const Verified* v = t_verified.find(f.shm, rp.record, pid, me);
      v && faults != UINT64_MAX && v->faults == faults && v->stale == rp.stale && rp.p0 >= v->p0 && rp.p1 <= v->p1 &&
      mappings_signature(pf->maps, v->p0 * ps, (v->p1 + 1) * ps) == v->signature) {
    if (!own) return PageCheck::kUnproven;  // unless the copy faults a page in
    if (all_resident(rp.p0, rp.p1 - rp.p0 + 1)) return PageCheck::kClean;
  }
  const uint64_t signature = faults == UINT64_MAX ? 0 : mappings_signature(pf->maps, rp.p0 * ps, (rp.p1 + 1) * ps);
  if (full_check(rp, pf->pagemap, first, nullptr)) return PageCheck::kStale;
  if (signature != 0) {  // remembered for the fast path
    Verified* v = t_verified.find(f.shm, rp.record, pid, me);
    if (!v) v = &t_verified.e[t_verified.next++ % 16];
    *v = Verified{f.shm, rp.record, pid, me, rp.p0, rp.p1, faults, signature, rp.stale};
  }
  return PageCheck::kClean;
}

bool pages_stale(const Fabric& f, int32_t pid, uint64_t start, uint32_t key, uint64_t addr, uint64_t len,
                 uint64_t* first, std::vector<uint8_t>* stale) {
  RegionPages rp;
  if (!region_pages(f, pid, start, key, addr, len, &rp)) return false;
  const ProcFiles* pf = proc_files(pid, start);
  return pf && full_check(rp, pf->pagemap, first, stale);
}

uint64_t thread_faults() {
  rusage ru{};
  if (::getrusage(RUSAGE_THREAD, &ru) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(ru.ru_minflt) + static_cast<uint64_t>(ru.ru_majflt);
}

void report_stale(const Fabric& f, uint32_t key, uint64_t addr, bool as_source, uint32_t qpn) {
  ShmMr& m = f.shm->mrs[key & (kMaxMrs - 1)];
  if (__atomic_load_n(&m.key, __ATOMIC_ACQUIRE) != key) return;
  const uint32_t dev = m.device;
  if (dev < kMaxPorts) __atomic_add_fetch(&f.shm->stale_transfers[dev], 1, __ATOMIC_RELAXED);
  const bool known = dev < f.devices.size();
  const char* what = as_source ? "the old pages' bytes are sent (unknown to the emulator: 0xdb here)"
                               : "its bytes go to the old pages and the new ones are left untouched";
  if (__atomic_fetch_add(&m.stale, 1u, __ATOMIC_RELAXED) == 0)
    std::fprintf(stderr,
                 "tbverbs-emu: region lkey/rkey 0x%x (pid %d, %s, registered at 0x%llx, %llu bytes): the memory behind "
                 "this registration was unmapped after ibv_reg_mr (page 0x%llx is another page now, or none). As on "
                 "hardware the transfer completes successfully, but %s. Said once per region; `tbverbs-emu show` "
                 "counts them\n",
                 key, static_cast<int>(m.pid), known ? f.devices[dev].name.c_str() : "?",
                 static_cast<unsigned long long>(m.addr), static_cast<unsigned long long>(m.length),
                 static_cast<unsigned long long>(addr), what);
  if (g_trace_on)
    trace_event(f, known ? f.devices[dev].host : -1, known ? static_cast<int>(dev) : -1, qpn, "stale_mr",
                "key=0x%x addr=0x%llx %s: the memory behind this registration was unmapped after ibv_reg_mr; %s", key,
                static_cast<unsigned long long>(addr), as_source ? "source" : "target", what);
}

}  // namespace emu
