// Registration and pinning (docs/emulator.md, "Registration and pinning"): ibv_reg_mr checks the
// range as rdma-core's kernel does (ib_umem_get: -EFAULT for a range that is not mapped, or not
// writable while the access asks for write), pins its pages, and every transfer compares the pages
// it touches with what backed the region at registration. Memory a program unmapped after
// ibv_reg_mr is, as on hardware, no longer behind its region: the completion is a success, a
// target's new pages are left untouched, a source gives the old pages' bytes (0xdb: unknown to the
// emulator).
//
// The remapped pages are left untouched by the tests that must pass everywhere: a page that is no
// longer present is seen without frame numbers and without a pin. A page mapped again and written
// is seen through its frame number only (CAP_SYS_ADMIN): that test skips without it.
#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "emu_test_util.hpp"

extern char** environ;

using namespace emutest;

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Anonymous pages of our own, which a test can unmap and map again at the same address.
struct Pages {
  char* p = nullptr;
  size_t n = 0;
  explicit Pages(size_t pages, int prot = PROT_READ | PROT_WRITE) : n(pages) {
    void* m = mmap(nullptr, n * kPage, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mmap");
    p = static_cast<char*>(m);
  }
  ~Pages() { munmap(p, n * kPage); }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  size_t len() const { return n * kPage; }
  // munmap, then mmap MAP_FIXED at the same address: new pages, never touched (they read as 0).
  bool remap(size_t first = 0, size_t count = SIZE_MAX) {
    count = std::min(count, n - first);
    char* at = p + first * kPage;
    if (munmap(at, count * kPage) != 0) return false;
    return mmap(at, count * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == at;
  }
  // mmap MAP_FIXED over the pages, without munmap first.
  bool overlay() {
    return mmap(p, len(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p;
  }
  bool all(unsigned char v, size_t from = 0, size_t bytes = SIZE_MAX) const {
    bytes = std::min(bytes, len() - from);
    for (size_t i = from; i < from + bytes; ++i)
      if (static_cast<unsigned char>(p[i]) != v) return false;
    return true;
  }
};

// The parent's end of a two-process test: its pipe ends, and the child, killed and reaped if the
// test ends early (a failed REQUIRE) so that nothing is left behind.
struct Child {
  pid_t pid = -1;
  int up = -1, down = -1;  // the parent reads `up` and writes `down`; the child the other way round
  // Call in both processes right after fork: each closes the ends it does not use.
  void split(pid_t p, int up_pipe[2], int down_pipe[2]) {
    pid = p;
    if (p == 0) {
      close(up_pipe[0]);
      close(down_pipe[1]);
      up = up_pipe[1];
      down = down_pipe[0];
    } else {
      close(up_pipe[1]);
      close(down_pipe[0]);
      up = up_pipe[0];
      down = down_pipe[1];
    }
  }
  // The child's exit status (-1 when it did not exit normally).
  int wait_exit() {
    int st = 0;
    const pid_t p = pid;
    pid = -1;
    return p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (up >= 0) close(up);
    if (down >= 0) close(down);
  }
};

bool all_bytes(const char* p, size_t len, unsigned char v) {
  for (size_t i = 0; i < len; ++i)
    if (static_cast<unsigned char>(p[i]) != v) return false;
  return true;
}

int post_recv_at(ibv_qp* qp, uint64_t wr_id, const void* addr, uint32_t len, uint32_t lkey) {
  ibv_sge sge{reinterpret_cast<uint64_t>(addr), len, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

int post_send_at(ibv_qp* qp, uint64_t wr_id, const void* addr, uint32_t len, uint32_t lkey,
                 ibv_wr_opcode op = IBV_WR_SEND, uint64_t raddr = 0, uint32_t rkey = 0) {
  ibv_sge sge{reinterpret_cast<uint64_t>(addr), len, lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

// The stale count `tbverbs-emu show` prints on the line of host:device.
long stale_count(const TempFabric& f, const std::string& host, const std::string& dev) {
  const char* d = tbemu_describe(f.p());
  if (!d) return -1;
  std::istringstream in(d);
  std::string line, cur_host;
  while (std::getline(in, line)) {
    if (line.rfind("host ", 0) == 0) cur_host = line.substr(5);
    const std::string tag = "  device " + dev + " ";
    const auto at = line.find(" stale_mr_transfers=");
    if (cur_host == host && line.rfind(tag, 0) == 0 && at != std::string::npos)
      return std::stol(line.substr(at + 20));
  }
  return -1;
}

// Whether this process reads page frame numbers (CAP_SYS_ADMIN): needed to see a page that was
// mapped again and written.
bool frame_numbers_visible() {
  Pages probe(1);
  probe.p[0] = 1;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  uint64_t e = 0;
  const bool ok = fd >= 0 && pread(fd, &e, 8, static_cast<off_t>(reinterpret_cast<uint64_t>(probe.p) / kPage * 8)) == 8;
  if (fd >= 0) close(fd);
  return ok && (e >> 63) && (e & ((1ull << 55) - 1)) != 0;
}

constexpr int kRw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
// Ranges of at least 64 pages take the check's fast path (pages.cpp); shorter ones are read in full.
constexpr size_t kFastPages = 128;

// Opens hostA and hostB of the current fabric and connects them; on rdma-core profiles the QPs
// allow remote read, write and atomics.
bool open_pair(Side& a, Side& b, bool tb, ibv_qp_type t) {
  const int access = tb ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : kRw | IBV_ACCESS_REMOTE_ATOMIC;
  auto connect = [&](Side& x, const Side& y) {
    return to_init(x.qp, access) == 0 && to_rtr(x.qp, y.qp->qp_num, gid_of(y.ctx, 1), 1) == 0 && to_rts(x.qp) == 0;
  };
  return a.open("hostA", "rdma_en1", t, 1 << 20) && b.open("hostB", "rdma_en1", t, 1 << 20) && connect(a, b) &&
         connect(b, a);
}

// A connected hostA → hostB pair in this process, on a fabric of its own.
struct Pair {
  TempFabric f;
  Side a, b;
  Pair(const char* profile, ibv_qp_type t) : f(three_hosts(profile)) {
    if (!open_pair(a, b, std::string(profile) == "thunderbolt", t)) throw std::runtime_error("pair set-up failed");
  }
};

// What the child of a two-process test tells the parent: its QP and the rkey and address of the
// region the parent may read or write.
struct PeerInfo {
  uint32_t qpn, rkey;
  uint64_t addr;
};

// The child's half of the handshake (on hostB): sends `info`, takes the parent's QP number and,
// when `rc` is 0, connects `b` to it. Returns `rc`, or 12 when a transition failed.
int child_connect(const Child& ch, Side& b, const PeerInfo& info, int rc) {
  (void)!write(ch.up, &info, sizeof info);
  uint32_t peer = 0;
  (void)!read(ch.down, &peer, 4);
  if (!rc && (to_init(b.qp, kRw) || to_rtr(b.qp, peer, make_v4_gid(10, 0, 0, 1), 1) || to_rts(b.qp))) rc = 12;
  return rc;
}

// The parent's half (on hostA): the child's PeerInfo, `a` connected to its QP, this QP's number
// sent back.
PeerInfo parent_connect(const Child& ch, Side& a) {
  PeerInfo info{};
  REQUIRE(read(ch.up, &info, sizeof info) == sizeof info);
  REQUIRE(info.qpn != 0);
  REQUIRE(to_init(a.qp, kRw) == 0);
  REQUIRE(to_rtr(a.qp, info.qpn, make_v4_gid(10, 0, 0, 2), 1) == 0);
  REQUIRE(to_rts(a.qp) == 0);
  const uint32_t mine = a.qp->qp_num;
  REQUIRE(write(ch.down, &mine, 4) == 4);
  return info;
}

}  // namespace

TEST_CASE("pinning: ibv_reg_mr of a range that is not mapped fails with EFAULT, as ib_umem_get does",
          "[pinning][reg_mr]") {
  for (const char* profile : {"thunderbolt", "rdma-core-rc"}) {
    INFO(profile);
    TempFabric f(three_hosts(profile));
    ibv_context* ctx = open_dev("hostA", "rdma_en1");
    REQUIRE(ctx);
    ibv_pd* pd = ibv_alloc_pd(ctx);
    REQUIRE(pd);
    Pages gone(4);
    REQUIRE(munmap(gone.p, gone.len()) == 0);
    errno = 0;
    CHECK(ibv_reg_mr(pd, gone.p, gone.len(), IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EFAULT);
    errno = 0;
    CHECK(ibv_reg_mr(pd, gone.p, gone.len(), 0) == nullptr);  // no write flag: mapped is still required
    CHECK(errno == EFAULT);
    errno = 0;
    CHECK(ibv_reg_mr_iova2(pd, gone.p, gone.len(), 0x1000, IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EFAULT);
    errno = 0;
    CHECK(ibv_reg_mr_iova(pd, gone.p, gone.len(), 0x1000, IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EFAULT);
    REQUIRE(mmap(gone.p, gone.len(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == gone.p);

    // A hole in the middle: the whole range is refused, the part before the hole registers.
    Pages spare(1);  // mapped first: a mapping made later could land in the hole
    Pages holed(4);
    REQUIRE(munmap(holed.p + 2 * kPage, kPage) == 0);
    errno = 0;
    CHECK(ibv_reg_mr(pd, holed.p, holed.len(), IBV_ACCESS_LOCAL_WRITE) == nullptr);
    CHECK(errno == EFAULT);
    ibv_mr* front = ibv_reg_mr(pd, holed.p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE);
    CHECK(front != nullptr);

    // Unchanged: length 0 registers; a length above max_mr_size is EINVAL before anything is looked at.
    ibv_mr* empty = ibv_reg_mr(pd, spare.p, 0, IBV_ACCESS_LOCAL_WRITE);
    CHECK(empty != nullptr);
    if (std::string(profile) == "thunderbolt") {
      errno = 0;
      CHECK(ibv_reg_mr(pd, holed.p + 2 * kPage, 16384001, IBV_ACCESS_LOCAL_WRITE) == nullptr);
      CHECK(errno == EINVAL);
    }

    // ibv_rereg_mr moving a region to a range that is not mapped: the kernel command fails
    // (IBV_REREG_MR_ERR_CMD, EFAULT) and the region keeps its range and keys.
    if (front) {
      const uint32_t lkey = front->lkey;
      errno = 0;
      CHECK(ibv_rereg_mr(front, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, holed.p + 2 * kPage, kPage,
                         IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD);
      CHECK(errno == EFAULT);
      CHECK(front->lkey == lkey);
      CHECK(front->addr == holed.p);
      CHECK(ibv_rereg_mr(front, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, spare.p, kPage, IBV_ACCESS_LOCAL_WRITE) == 0);
      CHECK(ibv_dereg_mr(front) == 0);
    }
    if (empty) CHECK(ibv_dereg_mr(empty) == 0);
    REQUIRE(mmap(holed.p + 2 * kPage, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
            holed.p + 2 * kPage);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(ctx) == 0);
  }
}

TEST_CASE("pinning: a write flag on a read-only mapping is EFAULT; without one the region registers and sends",
          "[pinning][reg_mr]") {
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages ro(2);
  std::memset(ro.p, 0x3c, ro.len());
  REQUIRE(mprotect(ro.p, ro.len(), PROT_READ) == 0);
  for (int access : {int(IBV_ACCESS_LOCAL_WRITE), int(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
                     int(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC)}) {
    INFO("access " << access);
    errno = 0;
    CHECK(ibv_reg_mr(pr.a.pd, ro.p, ro.len(), access) == nullptr);
    CHECK(errno == EFAULT);
  }
  ibv_mr* plain = ibv_reg_mr(pr.a.pd, ro.p, ro.len(), 0);
  REQUIRE(plain != nullptr);
  ibv_mr* readable = ibv_reg_mr(pr.a.pd, ro.p, ro.len(), IBV_ACCESS_REMOTE_READ);
  REQUIRE(readable != nullptr);
  // The read-only region is a source like any other (it is not pinned: it is checked as mapped).
  REQUIRE(post_recv(pr.b, 1, 0, static_cast<uint32_t>(ro.len())) == 0);
  REQUIRE(post_send_at(pr.a.qp, 2, ro.p, static_cast<uint32_t>(ro.len()), plain->lkey) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(all_bytes(pr.b.buf.data(), ro.len(), 0x3c));
  CHECK(stale_count(pr.f, "hostA", "rdma_en1") == 0);
  CHECK(ibv_dereg_mr(readable) == 0);
  CHECK(ibv_dereg_mr(plain) == 0);
}

TEST_CASE("pinning: a SEND into a region whose memory was unmapped after ibv_reg_mr completes successfully on "
          "both sides and leaves the new pages untouched",
          "[pinning][stale]") {
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages rb(4);
  std::memset(rb.p, 0x11, rb.len());
  ibv_mr* mr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  const auto len = static_cast<uint32_t>(rb.len());
  std::memset(pr.a.buf.data(), 0x77, len);
  SECTION("remapped before the receive is posted") {
    REQUIRE(rb.remap());
    REQUIRE(post_recv_at(pr.b.qp, 1, rb.p, len, mr->lkey) == 0);
  }
  SECTION("remapped after the receive is posted") {
    REQUIRE(post_recv_at(pr.b.qp, 1, rb.p, len, mr->lkey) == 0);
    REQUIRE(rb.remap());
  }
  SECTION("mapped over (MAP_FIXED without munmap)") {
    REQUIRE(post_recv_at(pr.b.qp, 1, rb.p, len, mr->lkey) == 0);
    REQUIRE(rb.overlay());
  }
  REQUIRE(post_send(pr.a, 2, 0, len) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.byte_len == len);
  CHECK(rb.all(0));  // the new pages: never written
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 1);
  CHECK(stale_count(pr.f, "hostA", "rdma_en1") == 0);
  // A region over the new pages receives as usual.
  ibv_mr* fresh = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(fresh);
  REQUIRE(post_recv_at(pr.b.qp, 3, rb.p, len, fresh->lkey) == 0);
  REQUIRE(post_send(pr.a, 4, 0, len) == 0);
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(rb.all(0x77));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 1);
  CHECK(ibv_dereg_mr(fresh) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("pinning: a region's page mapped again and written is told apart by its frame number", "[pinning][stale]") {
  if (!frame_numbers_visible()) SKIP("page frame numbers need CAP_SYS_ADMIN (/proc/self/pagemap)");
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages rb(4);
  ibv_mr* mr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  const auto len = static_cast<uint32_t>(rb.len());
  REQUIRE(post_recv_at(pr.b.qp, 1, rb.p, len, mr->lkey) == 0);
  REQUIRE(rb.remap());
  std::memset(rb.p, 0x22, rb.len());  // the new pages are present now: only their frames differ
  std::memset(pr.a.buf.data(), 0x77, len);
  REQUIRE(post_send(pr.a, 2, 0, len) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(rb.all(0x22));
  // A source written after it was mapped again sends the old pages' bytes.
  Pages sa(2);
  std::memset(sa.p, 0x55, sa.len());
  ibv_mr* smr = ibv_reg_mr(pr.a.pd, sa.p, sa.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(smr);
  REQUIRE(sa.remap());
  std::memset(sa.p, 0x66, sa.len());
  REQUIRE(post_recv(pr.b, 3, 0, static_cast<uint32_t>(sa.len())) == 0);
  REQUIRE(post_send_at(pr.a.qp, 4, sa.p, static_cast<uint32_t>(sa.len()), smr->lkey) == 0);
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(all_bytes(pr.b.buf.data(), sa.len(), 0xdb));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 1);
  CHECK(stale_count(pr.f, "hostA", "rdma_en1") == 1);
  CHECK(ibv_dereg_mr(smr) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("pinning: an RDMA WRITE into a remapped region completes successfully and leaves the new pages untouched",
          "[pinning][stale]") {
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages rb(4);
  ibv_mr* mr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), kRw);
  REQUIRE(mr);
  const auto len = static_cast<uint32_t>(rb.len());
  std::memset(pr.a.buf.data(), 0x44, len);
  REQUIRE(rb.remap());
  REQUIRE(post_send(pr.a, 1, 0, len, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, reinterpret_cast<uint64_t>(rb.p),
                    mr->rkey) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
  // WRITE_WITH_IMM: the receive completes (it carries the immediate), the data goes nowhere visible.
  REQUIRE(post_recv(pr.b, 2, 0, 0) == 0);
  REQUIRE(post_send(pr.a, 3, 0, len, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 0,
                    reinterpret_cast<uint64_t>(rb.p), mr->rkey, 7) == 0);
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(rb.all(0));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 2);
  // An RDMA READ from it reads the old pages: 0xdb; an atomic on it returns an unknown value and
  // leaves the new page alone.
  std::memset(pr.a.buf.data(), 0, len);
  REQUIRE(post_send(pr.a, 4, 0, len, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, reinterpret_cast<uint64_t>(rb.p),
                    mr->rkey) == 0);
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(all_bytes(pr.a.buf.data(), len, 0xdb));
  CHECK(ibv_dereg_mr(mr) == 0);
  ibv_mr* amr = ibv_reg_mr(pr.b.pd, rb.p, kPage, kRw | IBV_ACCESS_REMOTE_ATOMIC);
  REQUIRE(amr);
  REQUIRE(rb.remap(0, 1));
  ibv_sge sge{reinterpret_cast<uint64_t>(pr.a.buf.data()), 8, pr.a.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 5;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(rb.p);
  wr.wr.atomic.rkey = amr->rkey;
  wr.wr.atomic.compare_add = 5;
  ibv_send_wr* bad = nullptr;
  REQUIRE(ibv_post_send(pr.a.qp, &wr, &bad) == 0);
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(all_bytes(pr.a.buf.data(), 8, 0xdb));
  CHECK(rb.all(0, 0, kPage));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 4);
  CHECK(ibv_dereg_mr(amr) == 0);
}

TEST_CASE("pinning: a SEND from a remapped source delivers 0xdb bytes for the pages that were unmapped",
          "[pinning][stale]") {
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages sa(4);
  std::memset(sa.p, 0x55, sa.len());
  ibv_mr* mr = ibv_reg_mr(pr.a.pd, sa.p, sa.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  const auto len = static_cast<uint32_t>(sa.len());
  REQUIRE(sa.remap(1, 1));  // the second page only
  REQUIRE(post_recv(pr.b, 1, 0, len) == 0);
  REQUIRE(post_send_at(pr.a.qp, 2, sa.p, len, mr->lkey) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(pr.a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.byte_len == len);
  const char* got = pr.b.buf.data();
  CHECK(all_bytes(got, kPage, 0x55));              // still the registered page
  CHECK(all_bytes(got + kPage, kPage, 0xdb));      // the old page's bytes, unknown to the emulator
  CHECK(all_bytes(got + 2 * kPage, 2 * kPage, 0x55));
  CHECK(sa.all(0, kPage, kPage));                  // the new page was not read into anything
  CHECK(stale_count(pr.f, "hostA", "rdma_en1") == 1);
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("pinning: Thunderbolt's deferred delivery (empty_rq=wait) checks both sides when the receive comes",
          "[pinning][stale]") {
  Pair pr("thunderbolt", IBV_QPT_UC);
  ibv_wc wc{};
  SECTION("a source remapped while its send waits for a receive gives 0xdb") {
    Pages sa(1);
    std::memset(sa.p, 0x55, sa.len());
    ibv_mr* mr = ibv_reg_mr(pr.a.pd, sa.p, sa.len(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(mr);
    REQUIRE(post_send_at(pr.a.qp, 1, sa.p, static_cast<uint32_t>(kPage), mr->lkey) == 0);
    CHECK(quiet(pr.a.cq, 50));  // no receive yet: it waits
    REQUIRE(sa.remap());
    REQUIRE(post_recv(pr.b, 2, 0, static_cast<uint32_t>(kPage)) == 0);  // the receiver moves it now
    REQUIRE(poll_one(pr.b.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(all_bytes(pr.b.buf.data(), kPage, 0xdb));
    REQUIRE(poll_one(pr.a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(stale_count(pr.f, "hostA", "rdma_en1") == 1);
    CHECK(ibv_dereg_mr(mr) == 0);
  }
  SECTION("a target remapped before the waiting send meets it is left untouched") {
    Pages rb(1);
    ibv_mr* mr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(mr);
    std::memset(pr.a.buf.data(), 0x77, kPage);
    REQUIRE(post_send(pr.a, 1, 0, static_cast<uint32_t>(kPage)) == 0);
    REQUIRE(rb.remap());
    REQUIRE(post_recv_at(pr.b.qp, 2, rb.p, static_cast<uint32_t>(kPage), mr->lkey) == 0);
    REQUIRE(poll_one(pr.b.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    REQUIRE(poll_one(pr.a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(rb.all(0));
    CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 1);
    CHECK(ibv_dereg_mr(mr) == 0);
  }
}

TEST_CASE("pinning: across two processes, a remapped target is left untouched and a remapped source reads 0xdb",
          "[pinning][stale][fork]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
  int up[2], down[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(down) == 0);
  const uint32_t len = static_cast<uint32_t>(4 * kPage);
  Child ch;
  ch.split(fork(), up, down);
  if (ch.pid == 0) {
    // The responder, on hostB: a receive region and a READ/WRITE region, both remapped after
    // registration. Exit 0 when its memory was left alone and its receive completed successfully.
    Side b;
    int rc = b.open("hostB", "rdma_en1", IBV_QPT_RC) ? 0 : 10;
    Pages rb(4), rw(4);
    ibv_mr* rmr = rc ? nullptr : ibv_reg_mr(b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* wmr = rc ? nullptr : ibv_reg_mr(b.pd, rw.p, rw.len(), kRw);
    if (!rmr || !wmr) rc = 11;
    rc = child_connect(ch, b, {rc ? 0 : b.qp->qp_num, wmr ? wmr->rkey : 0, reinterpret_cast<uint64_t>(rw.p)}, rc);
    if (!rc && post_recv_at(b.qp, 1, rb.p, len, rmr->lkey)) rc = 13;
    if (!rc && !(rb.remap() && rw.remap())) rc = 14;
    (void)!write(ch.up, &rc, 4);
    uint32_t done = 0;
    (void)!read(ch.down, &done, 4);  // the parent is done
    ibv_wc wc{};
    if (!rc && !(poll_one(b.cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.byte_len == len)) rc = 15;
    if (!rc && !(rb.all(0) && rw.all(0))) rc = 16;
    if (rmr) ibv_dereg_mr(rmr);
    if (wmr) ibv_dereg_mr(wmr);
    _exit(rc);
  }
  const PeerInfo info = parent_connect(ch, a);
  int crc = -1;
  REQUIRE(read(ch.up, &crc, 4) == 4);
  REQUIRE(crc == 0);
  std::memset(a.buf.data(), 0x77, len);
  ibv_wc wc{};
  REQUIRE(post_send(a, 1, 0, len) == 0);  // into the remapped receive region
  REQUIRE(poll_one(a.cq, &wc, 3000));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(post_send(a, 2, 0, len, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, info.addr, info.rkey) == 0);
  REQUIRE(poll_one(a.cq, &wc, 3000));
  CHECK(wc.status == IBV_WC_SUCCESS);
  std::memset(a.buf.data(), 0, len);
  REQUIRE(post_send(a, 3, 0, len, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, info.addr, info.rkey) == 0);
  REQUIRE(poll_one(a.cq, &wc, 3000));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(all_bytes(a.buf.data(), len, 0xdb));
  CHECK(stale_count(f, "hostB", "rdma_en1") == 3);
  const uint32_t done = 1;
  REQUIRE(write(ch.down, &done, 4) == 4);  // the parent is done
  const int code = ch.wait_exit();
  INFO("child exit " << code << " (15: its receive did not complete successfully, 16: its new pages were written)");
  CHECK(code == 0);
}

TEST_CASE("pinning: after clean transfers over the same pages, a remap is still seen (the check's fast path)",
          "[pinning][stale]") {
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages sa(kFastPages), rb(kFastPages);
  std::memset(sa.p, 0x55, sa.len());
  ibv_mr* smr = ibv_reg_mr(pr.a.pd, sa.p, sa.len(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* rmr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(smr);
  REQUIRE(rmr);
  const auto len = static_cast<uint32_t>(sa.len());
  ibv_wc wc{};
  auto transfer = [&](uint64_t id) {
    return post_recv_at(pr.b.qp, id, rb.p, len, rmr->lkey) == 0 && post_send_at(pr.a.qp, id, sa.p, len, smr->lkey) == 0 &&
           poll_one(pr.a.cq, &wc) && wc.status == IBV_WC_SUCCESS && poll_one(pr.b.cq, &wc) &&
           wc.status == IBV_WC_SUCCESS;
  };
  for (uint64_t i = 0; i < 5; ++i) REQUIRE(transfer(i));  // clean: the later ones take the fast path
  CHECK(rb.all(0x55));
  std::memset(rb.p, 0x11, rb.len());
  REQUIRE(rb.remap(2, 1));  // the target's third page
  REQUIRE(transfer(10));
  CHECK(rb.all(0x55, 0, 2 * kPage));
  CHECK(rb.all(0, 2 * kPage, kPage));  // left alone
  CHECK(rb.all(0x55, 3 * kPage));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 1);
  REQUIRE(sa.remap(0, 1));  // the source's first page
  REQUIRE(transfer(11));
  CHECK(rb.all(0xdb, 0, kPage));
  CHECK(rb.all(0x55, kPage, kPage));
  CHECK(stale_count(pr.f, "hostA", "rdma_en1") == 1);
  // A page discarded with MADV_DONTNEED (as free() does: the mapping stays, the page goes).
  for (uint64_t i = 0; i < 3; ++i) REQUIRE(transfer(20 + i));
  std::memset(rb.p + 4 * kPage, 0x11, kPage);
  REQUIRE(madvise(rb.p + 4 * kPage, kPage, MADV_DONTNEED) == 0);
  REQUIRE(transfer(30));
  CHECK(rb.all(0, 4 * kPage, kPage));
  CHECK(rb.all(0x55, 5 * kPage));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 6);  // every transfer since the first remap meets page 3
  CHECK(ibv_dereg_mr(smr) == 0);
  CHECK(ibv_dereg_mr(rmr) == 0);
}

TEST_CASE("pinning: across two processes, after clean transfers a remap of the other side is still seen",
          "[pinning][stale][fork]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 20));
  int up[2], down[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(down) == 0);
  const uint32_t len = static_cast<uint32_t>(kFastPages * kPage);
  // The child, on hostB, follows the parent's orders (one byte each) and answers with one byte:
  // 'r' post a receive into its region, 'm' discard the region's second page (MADV_DONTNEED, as
  // free() does: its mapping stays, the page goes) and leave it untouched,
  // 't' remap its third page and write it (0x22), 'c' check: its receives all completed successfully,
  // page 2 is 0 and page 3 is 0x22.
  Child ch;
  ch.split(fork(), up, down);
  if (ch.pid == 0) {
    Side b;
    int rc = b.open("hostB", "rdma_en1", IBV_QPT_RC) ? 0 : 10;
    Pages rb(kFastPages);
    ibv_mr* mr = rc ? nullptr : ibv_reg_mr(b.pd, rb.p, rb.len(), kRw);
    if (!mr) rc = 11;
    rc = child_connect(ch, b, {rc ? 0 : b.qp->qp_num, mr ? mr->rkey : 0, reinterpret_cast<uint64_t>(rb.p)}, rc);
    int posted = 0;
    for (char order = 0; read(ch.down, &order, 1) == 1 && order != 'q';) {
      char ok = 'y';
      if (rc) ok = 'n';
      else if (order == 'r') ok = post_recv_at(b.qp, 1, rb.p, len, mr->lkey) == 0 ? (++posted, 'y') : 'n';
      else if (order == 'm') ok = madvise(rb.p + kPage, kPage, MADV_DONTNEED) == 0 ? 'y' : 'n';
      else if (order == 't') ok = rb.remap(2, 1) ? (std::memset(rb.p + 2 * kPage, 0x22, kPage), 'y') : 'n';
      else if (order == 'c') {
        ibv_wc wc{};
        for (int i = 0; i < posted && ok == 'y'; ++i)
          if (!poll_one(b.cq, &wc) || wc.status != IBV_WC_SUCCESS) ok = 'n';
        if (!rb.all(0, kPage, kPage) || !rb.all(0x22, 2 * kPage, kPage)) ok = 'n';
      }
      (void)!write(ch.up, &ok, 1);
    }
    if (mr) ibv_dereg_mr(mr);
    _exit(rc);
  }
  const PeerInfo info = parent_connect(ch, a);
  auto order = [&](char o) {
    char ok = 0;
    return write(ch.down, &o, 1) == 1 && read(ch.up, &ok, 1) == 1 && ok == 'y';
  };
  ibv_wc wc{};
  auto send_only = [&](uint64_t id) {
    return post_send(a, id, 0, len) == 0 && poll_one(a.cq, &wc, 3000) && wc.status == IBV_WC_SUCCESS;
  };
  auto send = [&](uint64_t id) { return order('r') && send_only(id); };
  auto read_back = [&](uint64_t id) {
    return post_send(a, id, 0, len, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, info.addr, info.rkey) == 0 &&
           poll_one(a.cq, &wc, 3000) && wc.status == IBV_WC_SUCCESS;
  };
  std::memset(a.buf.data(), 0x77, len);
  for (uint64_t i = 0; i < 4; ++i) REQUIRE(send(i));  // clean: the later ones take the fast path
  // Two receives posted ahead, so that the child does nothing but remap between the last clean
  // transfer and the stale one.
  REQUIRE(order('r'));
  REQUIRE(order('r'));
  REQUIRE(send_only(5));
  for (uint64_t i = 0; i < 3; ++i) REQUIRE(read_back(10 + i));
  CHECK(all_bytes(a.buf.data(), len, 0x77));
  REQUIRE(order('m'));  // page 2 discarded and left so: only the copy can tell (it faults it in)
  REQUIRE(send_only(20));
  CHECK(stale_count(f, "hostB", "rdma_en1") == 1);
  REQUIRE(read_back(21));  // reading it gives the old page's bytes
  CHECK(all_bytes(a.buf.data() + kPage, kPage, 0xdb));
  CHECK(all_bytes(a.buf.data(), kPage, 0x77));
  CHECK(stale_count(f, "hostB", "rdma_en1") == 2);
  std::memset(a.buf.data(), 0x77, len);
  REQUIRE(order('t'));  // page 3 mapped again and written: the child's faults tell
  REQUIRE(send(22));
  CHECK(stale_count(f, "hostB", "rdma_en1") == 3);
  CHECK(order('c'));
  char q = 'q';
  REQUIRE(write(ch.down, &q, 1) == 1);
  CHECK(ch.wait_exit() == 0);
}

TEST_CASE("pinning: without CAP_SYS_ADMIN pages no longer mapped are still seen, and a notice says what is not",
          "[pinning][stale][fork]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  char path[] = "/tmp/tbemu-stderr-XXXXXX";
  const int cap = mkstemp(path);
  REQUIRE(cap >= 0);
  const pid_t child = fork();
  if (child == 0) {
    // Frame numbers in pagemap need CAP_SYS_ADMIN when the file is opened: drop it (a no-op where
    // the process never had it).
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &hdr, caps) != 0) _exit(10);
    caps[0].effective &= ~(1u << CAP_SYS_ADMIN);
    caps[0].permitted &= ~(1u << CAP_SYS_ADMIN);
    caps[0].inheritable &= ~(1u << CAP_SYS_ADMIN);
    if (syscall(SYS_capset, &hdr, caps) != 0 || frame_numbers_visible()) _exit(11);
    dup2(cap, 2);
    Side a, b;
    if (!open_pair(a, b, false, IBV_QPT_RC)) _exit(12);
    Pages rb(2);
    ibv_mr* mr = ibv_reg_mr(b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
    if (!mr) _exit(13);
    const auto len = static_cast<uint32_t>(rb.len());
    if (post_recv_at(b.qp, 1, rb.p, len, mr->lkey) != 0) _exit(14);
    if (!rb.remap(0, 1) || !rb.remap(1, 1)) _exit(15);
    std::memset(rb.p + kPage, 0x22, kPage);  // the second page: mapped again and written
    std::memset(a.buf.data(), 0x77, len);
    ibv_wc wc{};
    if (post_send(a, 2, 0, len) != 0 || !poll_one(b.cq, &wc) || wc.status != IBV_WC_SUCCESS) _exit(16);
    if (!rb.all(0, 0, kPage)) _exit(17);          // no longer mapped at the transfer: seen, left alone
    if (!rb.all(0x77, kPage, kPage)) _exit(18);   // mapped again and present: not told apart
    ibv_dereg_mr(mr);
    _exit(0);
  }
  int st = 0;
  REQUIRE(waitpid(child, &st, 0) == child);
  close(cap);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  INFO(text.str());
  INFO("child exit " << (WIFEXITED(st) ? WEXITSTATUS(st) : -1));
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  CHECK(text.str().find("page frame numbers are not readable") != std::string::npos);
  CHECK(text.str().find("the memory behind this registration was unmapped after ibv_reg_mr") != std::string::npos);
  CHECK(stale_count(f, "hostB", "rdma_en1") == 1);
}

TEST_CASE("pinning: the first stale transfer of a region is said once on stderr, every one is counted",
          "[pinning][stale]") {
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages rb(1);
  ibv_mr* mr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  REQUIRE(rb.remap());
  char path[] = "/tmp/tbemu-stderr-XXXXXX";
  const int cap = mkstemp(path);
  REQUIRE(cap >= 0);
  fflush(stderr);
  const int saved = dup(2);
  REQUIRE(dup2(cap, 2) == 2);
  ibv_wc wc{};
  int ok = 0;
  for (int i = 0; i < 3; ++i) {
    ok += post_recv_at(pr.b.qp, 1, rb.p, static_cast<uint32_t>(kPage), mr->lkey) == 0 &&
          post_send(pr.a, 2, 0, static_cast<uint32_t>(kPage)) == 0 && poll_one(pr.a.cq, &wc) &&
          wc.status == IBV_WC_SUCCESS && poll_one(pr.b.cq, &wc) && wc.status == IBV_WC_SUCCESS;
  }
  const uint32_t key = mr->lkey;
  ibv_dereg_mr(mr);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(cap);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  const std::string s = text.str();
  INFO(s);
  CHECK(ok == 3);
  CHECK(rb.all(0));
  size_t said = 0;
  for (size_t at = s.find("the memory behind this registration was unmapped after ibv_reg_mr"); at != std::string::npos;
       at = s.find("the memory behind this registration was unmapped after ibv_reg_mr", at + 1))
    ++said;
  CHECK(said == 1);
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%x", key);
  CHECK(s.find(hex) != std::string::npos);
  CHECK(s.find("3 transfer(s) met its memory unmapped after ibv_reg_mr") != std::string::npos);  // at dereg
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 3);
  CHECK(tbemu_reset(pr.f.p()) == 0);
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == 0);
}

namespace {
// Runs this test program again with one extra environment variable, on the hidden test case below.
int run_child(const std::string& env) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TBVERBS_EMU_", 0) != 0) envs.emplace_back(*e);
  envs.push_back(env);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", name = "pinning child: a SEND into a remapped region";
  std::vector<char*> argv{exe.data(), name.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
}  // namespace

// Hidden (run by the test below, in a process of its own, since both switches are read at load):
// passes when the new pages were written exactly when TBVERBS_EMU_PAGE_CHECK is off.
TEST_CASE("pinning child: a SEND into a remapped region", "[.][pinning_child]") {
  const char* check = std::getenv("TBVERBS_EMU_PAGE_CHECK");
  const bool off = check && std::string(check) == "off";
  Pair pr("rdma-core-rc", IBV_QPT_RC);
  Pages rb(1);
  ibv_mr* mr = ibv_reg_mr(pr.b.pd, rb.p, rb.len(), IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(mr);
  REQUIRE(rb.remap());
  std::memset(pr.a.buf.data(), 0x77, kPage);
  REQUIRE(post_recv_at(pr.b.qp, 1, rb.p, static_cast<uint32_t>(kPage), mr->lkey) == 0);
  REQUIRE(post_send(pr.a, 2, 0, static_cast<uint32_t>(kPage)) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(pr.b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(rb.all(off ? 0x77 : 0));
  CHECK(stale_count(pr.f, "hostB", "rdma_en1") == (off ? 0 : 1));
  CHECK(ibv_dereg_mr(mr) == 0);
}

TEST_CASE("pinning: the trace names the region; TBVERBS_EMU_PAGE_CHECK=off turns the transfer check off",
          "[pinning][stale]") {
  char path[] = "/tmp/tbemu-trace-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  CHECK(run_child(std::string("TBVERBS_EMU_TRACE=") + path) == 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  const std::string s = text.str();
  INFO(s);
  const auto at = s.find(" stale_mr key=0x");
  CHECK(at != std::string::npos);
  CHECK(s.find("target: the memory behind this registration was unmapped after ibv_reg_mr", at) != std::string::npos);
  CHECK(run_child("TBVERBS_EMU_PAGE_CHECK=off") == 0);
}
