// The rest of rdma-core 44's ABI (emulator/src/abi_rest.cpp): the helpers compute what rdma-core
// documents, the kernel-only entry points fail cleanly (an error and errno, no crash), and the
// Thunderbolt profile says once per process that its RDMA WRITEs move nothing.
#include <catch2/catch_test_macros.hpp>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <signal.h>
#include <poll.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <string>

#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include "emu_test_util.hpp"

using namespace emutest;

// rdma-core 44's private provider interface and marshall.h (not installed by Debian); the
// provider-private struct arguments are passed as null here, so opaque pointers do.
extern "C" {
const char* ibv_get_sysfs_path(void);
void ibv_copy_ah_attr_from_kern(ibv_ah_attr*, ib_uverbs_ah_attr*);
void ibv_copy_qp_attr_from_kern(ibv_qp_attr*, ib_uverbs_qp_attr*);
void ibv_copy_path_rec_from_kern(ibv_sa_path_rec*, ib_user_path_rec*);
void ibv_copy_path_rec_to_kern(ib_user_path_rec*, ibv_sa_path_rec*);
int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t[6], uint16_t*);
int ibv_dontfork_range(void*, size_t);
int ibv_query_gid_type(ibv_context*, uint8_t, unsigned int, int*);
int ibv_dofork_range(void*, size_t);
extern bool verbs_allow_disassociate_destroy;
void* _verbs_init_and_alloc_context(ibv_device*, int, size_t, verbs_context*, uint32_t);
ibv_context* verbs_open_device(ibv_device*, void*);
void verbs_register_driver_34(const void*);
void verbs_set_ops(verbs_context*, const void*);
void verbs_uninit_context(verbs_context*);
unsigned int __ioctl_final_num_attrs(unsigned int, void*);
int execute_ioctl(ibv_context*, void*);
int ibv_read_ibdev_sysfs_file(char*, size_t, void*, const char*, ...);
int ibv_cmd_get_context(verbs_context*, void*, size_t, void*, size_t);
int ibv_cmd_alloc_pd(ibv_context*, ibv_pd*, void*, size_t, void*, size_t);
int ibv_cmd_dealloc_pd(ibv_pd*);
int ibv_cmd_reg_mr(ibv_pd*, void*, size_t, uint64_t, int, void*, void*, size_t, void*, size_t);
int ibv_cmd_create_cq(ibv_context*, int, ibv_comp_channel*, int, ibv_cq*, void*, size_t, void*, size_t);
int ibv_cmd_create_qp(ibv_pd*, ibv_qp*, ibv_qp_init_attr*, void*, size_t, void*, size_t);
int ibv_cmd_modify_qp(ibv_qp*, ibv_qp_attr*, int, void*, size_t);
int ibv_cmd_post_send(ibv_qp*, ibv_send_wr*, ibv_send_wr**);
int ibv_cmd_post_recv(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**);
int ibv_cmd_poll_cq(ibv_cq*, int, ibv_wc*);
int ibv_cmd_req_notify_cq(ibv_cq*, int);
int ibv_cmd_query_port(ibv_context*, uint8_t, ibv_port_attr*, void*, size_t);
int ibv_cmd_destroy_qp(ibv_qp*);
int ibv_cmd_free_dm(void*);
}

TEST_CASE("abi: ibv_get_sysfs_path returns the sysfs root", "[abi]") {
  const char* p = ibv_get_sysfs_path();
  REQUIRE(p != nullptr);
  CHECK(std::string(p) == (std::getenv("SYSFS_PATH") ? std::getenv("SYSFS_PATH") : "/sys"));
  CHECK(ibv_get_sysfs_path() == p);  // a stable pointer, as callers keep it
}

TEST_CASE("abi: rate conversions are inverse and cover the newer IBTA rates", "[abi]") {
  CHECK(ibv_rate_to_mbps(IBV_RATE_2_5_GBPS) == 2500);
  CHECK(ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125);  // EDR 4x: 25.78125 Gbit/s a lane
  CHECK(ibv_rate_to_mbps(IBV_RATE_MAX) == -1);
  for (int r = IBV_RATE_2_5_GBPS; r <= IBV_RATE_1200_GBPS; ++r) {
    const int mbps = ibv_rate_to_mbps(static_cast<ibv_rate>(r));
    INFO("rate " << r);
    REQUIRE(mbps > 0);
    CHECK(mbps_to_ibv_rate(mbps) == r);
  }
  CHECK(mbps_to_ibv_rate(12345) == IBV_RATE_MAX);
}

TEST_CASE("abi: the kernel-ABI struct copies carry every field", "[abi]") {
  ib_uverbs_qp_attr k{};
  k.qp_state = IBV_QPS_RTS;
  k.cur_qp_state = IBV_QPS_RTR;
  k.path_mtu = IBV_MTU_1024;
  k.qkey = 0x11111111;
  k.rq_psn = 7;
  k.sq_psn = 9;
  k.dest_qp_num = 0x1234;
  k.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  k.max_send_wr = 33;
  k.max_inline_data = 64;
  k.ah_attr.dlid = 0x42;
  k.ah_attr.is_global = 1;
  k.ah_attr.grh.dgid[15] = 0x99;
  k.ah_attr.grh.flow_label = 0xabcde;
  k.ah_attr.grh.sgid_index = 3;
  k.ah_attr.port_num = 1;
  k.alt_ah_attr.sl = 5;
  k.pkey_index = 2;
  k.max_rd_atomic = 4;
  k.timeout = 14;
  k.rnr_retry = 7;
  ibv_qp_attr a{};
  ibv_copy_qp_attr_from_kern(&a, &k);
  CHECK(a.qp_state == IBV_QPS_RTS);
  CHECK(a.cur_qp_state == IBV_QPS_RTR);
  CHECK(a.path_mtu == IBV_MTU_1024);
  CHECK(a.qkey == 0x11111111u);
  CHECK(a.rq_psn == 7u);
  CHECK(a.sq_psn == 9u);
  CHECK(a.dest_qp_num == 0x1234u);
  CHECK(a.qp_access_flags == IBV_ACCESS_REMOTE_WRITE);
  CHECK(a.cap.max_send_wr == 33u);
  CHECK(a.cap.max_inline_data == 64u);
  CHECK(a.ah_attr.dlid == 0x42);
  CHECK(a.ah_attr.is_global == 1);
  CHECK(a.ah_attr.grh.dgid.raw[15] == 0x99);
  CHECK(a.ah_attr.grh.flow_label == 0xabcdeu);
  CHECK(a.ah_attr.grh.sgid_index == 3);
  CHECK(a.ah_attr.port_num == 1);
  CHECK(a.alt_ah_attr.sl == 5);
  CHECK(a.pkey_index == 2);
  CHECK(a.max_rd_atomic == 4);
  CHECK(a.timeout == 14);
  CHECK(a.rnr_retry == 7);

  ibv_sa_path_rec p{};
  p.dgid.raw[0] = 0xfe;
  p.sgid.raw[1] = 0x80;
  p.dlid = htobe16(5);
  p.slid = htobe16(6);
  p.flow_label = htobe32(0x777);
  p.hop_limit = 64;
  p.reversible = 1;
  p.pkey = htobe16(0xffff);
  p.sl = 3;
  p.mtu = IBV_MTU_4096;
  p.rate = IBV_RATE_100_GBPS;
  p.packet_life_time = 18;
  ib_user_path_rec kp{};
  ibv_copy_path_rec_to_kern(&kp, &p);
  CHECK(kp.dgid[0] == 0xfe);
  CHECK(kp.mtu == IBV_MTU_4096);
  ibv_sa_path_rec back{};
  ibv_copy_path_rec_from_kern(&back, &kp);
  CHECK(std::memcmp(back.dgid.raw, p.dgid.raw, 16) == 0);
  CHECK(std::memcmp(back.sgid.raw, p.sgid.raw, 16) == 0);
  CHECK(back.dlid == p.dlid);
  CHECK(back.slid == p.slid);
  CHECK(back.flow_label == p.flow_label);
  CHECK(back.hop_limit == 64);
  CHECK(back.reversible == 1);
  CHECK(back.pkey == p.pkey);
  CHECK(back.sl == 3);
  CHECK(back.mtu == IBV_MTU_4096);
  CHECK(back.rate == IBV_RATE_100_GBPS);
  CHECK(back.packet_life_time == 18);
}

TEST_CASE("abi: ibv_init_ah_from_wc answers to the sender, on the GID it was sent to", "[abi]") {
  TempFabric f(three_hosts("rdma-core-roce"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx);
  ibv_wc wc{};
  wc.slid = 0x17;
  wc.sl = 2;
  ibv_ah_attr ah{};
  REQUIRE(ibv_init_ah_from_wc(ctx, 1, &wc, nullptr, &ah) == 0);
  CHECK(ah.dlid == 0x17);
  CHECK(ah.sl == 2);
  CHECK(ah.port_num == 1);
  CHECK(ah.is_global == 0);

  ibv_grh grh{};
  grh.dgid = make_v4_gid(10, 0, 0, 1);       // our address's GID
  uint8_t want_index = 0;                      // the first entry that holds it (v1 before v2)
  while (want_index < 16 && std::memcmp(gid_of(ctx, want_index).raw, grh.dgid.raw, 16) != 0) ++want_index;
  REQUIRE(want_index > 0);
  REQUIRE(want_index < 16);
  grh.sgid = make_v4_gid(10, 0, 0, 2);       // the sender
  grh.version_tclass_flow = htonl((6u << 28) | (0x2au << 20) | 0x12345u);
  wc.wc_flags = IBV_WC_GRH;
  REQUIRE(ibv_init_ah_from_wc(ctx, 1, &wc, &grh, &ah) == 0);
  CHECK(ah.is_global == 1);
  CHECK(ah.grh.sgid_index == want_index);
  CHECK(std::memcmp(&ah.grh.dgid, &grh.sgid, sizeof grh.sgid) == 0);
  CHECK(ah.grh.flow_label == 0x12345u);
  CHECK(ah.grh.traffic_class == 0x2a);

  // RoCE v2 over IPv4: an IPv4 header in the GRH's last 20 bytes; the reply goes out on
  // the RoCE v2 entry of our address.
  int v2_index = -1;
  for (int i = 0; i < 16 && v2_index < 0; ++i) {
    int type = -1;
    if (std::memcmp(gid_of(ctx, i).raw, make_v4_gid(10, 0, 0, 1).raw, 16) == 0 &&
        ibv_query_gid_type(ctx, 1, static_cast<unsigned>(i), &type) == 0 && type == 1)
      v2_index = i;
  }
  REQUIRE(v2_index >= 0);
  ibv_grh v4{};
  auto* h = reinterpret_cast<uint8_t*>(&v4) + 20;
  h[0] = 0x45;  // version 4, 5 words
  h[1] = 0x60;  // TOS
  const uint8_t src[4] = {10, 0, 0, 2}, dst[4] = {10, 0, 0, 1};
  std::memcpy(h + 12, src, 4);
  std::memcpy(h + 16, dst, 4);
  REQUIRE(ibv_init_ah_from_wc(ctx, 1, &wc, &v4, &ah) == 0);
  CHECK(ah.is_global == 1);
  CHECK(ah.grh.sgid_index == v2_index);
  const ibv_gid sender = make_v4_gid(10, 0, 0, 2);
  CHECK(std::memcmp(&ah.grh.dgid, &sender, sizeof sender) == 0);
  CHECK(ah.grh.traffic_class == 0x60);

  grh.dgid = make_v4_gid(192, 0, 2, 1);  // not ours
  errno = 0;
  CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, &grh, &ah) == -1);
  CHECK(errno == ENOENT);

  uint8_t mac[6];
  uint16_t vid = 0;
  errno = 0;
  CHECK(ibv_resolve_eth_l2_from_gid(ctx, &ah, mac, &vid) == -1);
  CHECK(errno == EOPNOTSUPP);
  CHECK(ibv_dontfork_range(mac, sizeof mac) == 0);
  CHECK(ibv_dofork_range(mac, sizeof mac) == 0);
  ibv_close_device(ctx);
}

TEST_CASE("abi: the provider interface fails cleanly without a kernel", "[abi]") {
  CHECK_FALSE(verbs_allow_disassociate_destroy);
  errno = 0;
  CHECK(_verbs_init_and_alloc_context(nullptr, -1, 64, nullptr, 0) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  verbs_set_ops(nullptr, nullptr);      // no-ops on a context that cannot exist
  verbs_uninit_context(nullptr);
  CHECK(__ioctl_final_num_attrs(3, nullptr) == 3);
  errno = 0;
  CHECK(execute_ioctl(nullptr, nullptr) == EOPNOTSUPP);
  CHECK(errno == EOPNOTSUPP);
  char buf[16] = "x";
  errno = 0;
  CHECK(ibv_read_ibdev_sysfs_file(buf, sizeof buf, nullptr, "ports/%d/rate", 1) == -1);
  CHECK(errno == EOPNOTSUPP);
  CHECK(buf[0] == '\0');

  struct Call {
    const char* name;
    int (*fn)();
  };
  const Call calls[] = {
      {"ibv_cmd_get_context", [] { return ibv_cmd_get_context(nullptr, nullptr, 0, nullptr, 0); }},
      {"ibv_cmd_alloc_pd", [] { return ibv_cmd_alloc_pd(nullptr, nullptr, nullptr, 0, nullptr, 0); }},
      {"ibv_cmd_dealloc_pd", [] { return ibv_cmd_dealloc_pd(nullptr); }},
      {"ibv_cmd_reg_mr", [] { return ibv_cmd_reg_mr(nullptr, nullptr, 0, 0, 0, nullptr, nullptr, 0, nullptr, 0); }},
      {"ibv_cmd_create_cq", [] { return ibv_cmd_create_cq(nullptr, 1, nullptr, 0, nullptr, nullptr, 0, nullptr, 0); }},
      {"ibv_cmd_create_qp", [] { return ibv_cmd_create_qp(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0); }},
      {"ibv_cmd_modify_qp", [] { return ibv_cmd_modify_qp(nullptr, nullptr, 0, nullptr, 0); }},
      {"ibv_cmd_post_send", [] { return ibv_cmd_post_send(nullptr, nullptr, nullptr); }},
      {"ibv_cmd_post_recv", [] { return ibv_cmd_post_recv(nullptr, nullptr, nullptr); }},
      {"ibv_cmd_req_notify_cq", [] { return ibv_cmd_req_notify_cq(nullptr, 0); }},
      {"ibv_cmd_query_port", [] { return ibv_cmd_query_port(nullptr, 1, nullptr, nullptr, 0); }},
      {"ibv_cmd_destroy_qp", [] { return ibv_cmd_destroy_qp(nullptr); }},
      {"ibv_cmd_free_dm", [] { return ibv_cmd_free_dm(nullptr); }},
  };
  for (const auto& c : calls) {
    INFO(c.name);
    errno = 0;
    CHECK(c.fn() == EOPNOTSUPP);
    CHECK(errno == EOPNOTSUPP);
  }
  errno = 0;
  ibv_wc wc{};
  CHECK(ibv_cmd_poll_cq(nullptr, 1, &wc) == -1);
  CHECK(errno == EOPNOTSUPP);

  // verbs_open_device without private data is ibv_open_device; with it, refused.
  TempFabric f(three_hosts("rdma-core-rc"));
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  REQUIRE(list);
  REQUIRE(n > 0);
  int tag = 0;
  errno = 0;
  CHECK(verbs_open_device(list[0], &tag) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  ibv_context* ctx = verbs_open_device(list[0], nullptr);
  CHECK(ctx != nullptr);
  if (ctx) CHECK(ibv_close_device(ctx) == 0);
  ibv_free_device_list(list);
}

TEST_CASE("abi: the IBVERBS_1.0 entry points refuse cleanly", "[abi]") {
  void* h = dlopen(TBVERBS_EMU_LIBRARY_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen(TBVERBS_EMU_LIBRARY_PATH, RTLD_NOW);
  REQUIRE(h);
  using list_fn = void** (*)(int*);
  auto get_list = reinterpret_cast<list_fn>(dlvsym(h, "ibv_get_device_list", "IBVERBS_1.0"));
  REQUIRE(get_list);
  CHECK(reinterpret_cast<void*>(get_list) != dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1"));
  int n = 7;
  errno = 0;
  CHECK(get_list(&n) == nullptr);
  CHECK(n == 0);
  CHECK(errno == EOPNOTSUPP);
  using ptr_fn = void* (*)(void*);
  for (const char* name : {"ibv_open_device", "ibv_alloc_pd", "ibv_get_device_name"}) {
    INFO(name);
    auto fn = reinterpret_cast<ptr_fn>(dlvsym(h, name, "IBVERBS_1.0"));
    REQUIRE(fn);
    errno = 0;
    CHECK(fn(nullptr) == nullptr);
    CHECK(errno == EOPNOTSUPP);
  }
  using int_fn = int (*)(void*);
  for (const char* name : {"ibv_close_device", "ibv_dealloc_pd", "ibv_destroy_qp", "ibv_destroy_cq"}) {
    INFO(name);
    auto fn = reinterpret_cast<int_fn>(dlvsym(h, name, "IBVERBS_1.0"));
    REQUIRE(fn);
    errno = 0;
    CHECK(fn(nullptr) == EOPNOTSUPP);
    CHECK(errno == EOPNOTSUPP);
  }
  dlclose(h);
}

// Run in a fresh process (the test binary re-executed on this hidden case) so the warning's
// once-per-process flag is this case's own.
TEST_CASE("abi child: three RDMA WRITEs on Thunderbolt", "[.][tb_write_child]") {
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  for (int i = 0; i < 3; ++i) {
    REQUIRE(post_send(a, i, 0, 4096, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0,
                      reinterpret_cast<uint64_t>(b.buf.data()), b.mr->rkey) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(a.cq, &wc));
    REQUIRE(wc.status == IBV_WC_SUCCESS);
  }
}

TEST_CASE("tb: an RDMA WRITE that moves nothing is announced once per process on stderr", "[tb][abi]") {
  TempFabric f(three_hosts("thunderbolt"));
  int err[2];
  REQUIRE(pipe(err) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(err[1], 2);
    close(err[0]);
    close(err[1]);
    execl("/proc/self/exe", "test", "[tb_write_child]", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    pollfd p{err[0], POLLIN, 0};
    const int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (ms <= 0 || poll(&p, 1, ms) <= 0) break;
    char buf[512];
    const ssize_t r = read(err[0], buf, sizeof buf);
    if (r <= 0) break;
    text.append(buf, static_cast<size_t>(r));
  }
  close(err[0]);
  if (std::chrono::steady_clock::now() >= deadline) kill(child, SIGKILL);
  int st = 0;
  REQUIRE(waitpid(child, &st, 0) == child);
  INFO(text);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const std::string warning = "tbverbs-emu: RDMA WRITE on Thunderbolt (rdma_en1) is accepted and completes but moves nothing";
  size_t count = 0;
  for (size_t at = text.find(warning); at != std::string::npos; at = text.find(warning, at + 1)) ++count;
  CHECK(count == 1);
  CHECK(text.find("(ds4)") != std::string::npos);
}
