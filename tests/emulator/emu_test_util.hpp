// Helpers for the emulator's own tests: temporary fabrics, devices on named
// hosts (one process can be several hosts: TBVERBS_EMU_HOST is read at each
// ibv_get_device_list), and QP set-up with explicit attributes.
#pragma once

#include <infiniband/verbs.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tbverbs_emu/control.h"

namespace emutest {

// A fabric file in its own temporary directory, so its shared state is private
// to the test; the state directory is removed afterwards.
struct TempFabric {
  std::string dir, path;
  explicit TempFabric(const std::string& json) {
    char tmpl[] = "/tmp/tbemu-test-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp");
    dir = tmpl;
    path = dir + "/fabric.json";
    std::ofstream(path) << json;
    setenv("TBVERBS_EMU_FABRIC", path.c_str(), 1);
  }
  ~TempFabric() {
    std::error_code ec;
    if (const char* sd = tbemu_state_dir(path.c_str())) std::filesystem::remove_all(sd, ec);
    std::filesystem::remove_all(dir, ec);
  }
  const char* p() const { return path.c_str(); }
};

// hostA:rdma_en1 <-> hostB:rdma_en1 (10.0.0.1/30, 10.0.0.2/30) and
// hostA:rdma_en2 <-> hostC:rdma_en1 (10.0.1.1/30, 10.0.1.2/30).
inline std::string three_hosts(const char* profile, bool with_ip = true) {
  std::string ipA1 = with_ip ? R"(, "ipv4": "10.0.0.1/30")" : "";
  std::string ipB1 = with_ip ? R"(, "ipv4": "10.0.0.2/30")" : "";
  return std::string(R"({"profile": ")") + profile + R"(",
    "hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [{"port": 1)" + ipA1 + R"(}]},
                                    {"name": "rdma_en2", "ports": [{"port": 1, "ipv4": "10.0.1.1/30"}]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1)" + ipB1 + R"(}]}]},
      {"name": "hostC", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.1.2/30"}]}]}
    ],
    "cables": [["hostA:rdma_en1:1", "hostB:rdma_en1:1"], ["hostA:rdma_en2:1", "hostC:rdma_en1:1"]]})";
}

inline ibv_context* open_dev(const char* host, const char* dev) {
  setenv("TBVERBS_EMU_HOST", host, 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list && i < n; ++i)
    if (std::strcmp(ibv_get_device_name(list[i]), dev) == 0) ctx = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  return ctx;
}

inline ibv_gid gid_of(ibv_context* ctx, int index) {
  ibv_gid g{};
  ibv_query_gid(ctx, 1, index, &g);
  return g;
}

inline ibv_gid make_v4_gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = a;
  g.raw[13] = b;
  g.raw[14] = c;
  g.raw[15] = d;
  return g;
}

// One endpoint: context, PD, CQ, QP and a registered buffer.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<char> buf;
  ibv_qp_type type = IBV_QPT_UC;

  Side() = default;
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;
  ~Side() { close(); }

  // Returns false (errno set) at the first failing step.
  bool open(const char* host, const char* dev, ibv_qp_type t = IBV_QPT_UC, size_t bufsize = 1 << 16,
            uint32_t depth = 64, int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) {
    type = t;
    ctx = open_dev(host, dev);
    if (!ctx) return false;
    pd = ibv_alloc_pd(ctx);
    if (!pd) return false;
    cq = ibv_create_cq(ctx, 1024, nullptr, nullptr, 0);
    if (!cq) return false;
    buf.assign(bufsize, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), access);
    if (!mr) return false;
    return create_qp(depth);
  }
  bool create_qp(uint32_t depth = 64) {
    ibv_device_attr da{};
    ibv_query_device(ctx, &da);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = depth;
    a.cap.max_send_sge = a.cap.max_recv_sge = std::min(4, da.max_sge);  // Thunderbolt: 1
    a.qp_type = type;
    qp = ibv_create_qp(pd, &a);
    return qp != nullptr;
  }
  void close() {
    if (qp) ibv_destroy_qp(qp);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
    qp = nullptr;
    mr = nullptr;
    cq = nullptr;
    pd = nullptr;
    ctx = nullptr;
  }
};

inline int to_init(ibv_qp* qp, int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.pkey_index = 0;
  a.qp_access_flags = access;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

struct RcOpts {
  uint8_t retry_cnt = 2;
  uint8_t rnr_retry = 0;
  uint8_t timeout = 8;        // 4.096 µs * 2^8 ≈ 1 ms per try
  uint8_t min_rnr_timer = 1;  // 0.01 ms
};

inline int to_rtr(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& dgid, uint8_t sgid_index, bool global = true,
                  const RcOpts& o = {}) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.ah_attr.is_global = global ? 1 : 0;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = sgid_index;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (qp->qp_type == IBV_QPT_RC) {
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = o.min_rnr_timer;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  return ibv_modify_qp(qp, &a, mask);
}

inline int to_rts(ibv_qp* qp, const RcOpts& o = {}) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (qp->qp_type == IBV_QPT_RC) {
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = 1;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &a, mask);
}

// Connects a's QP to b's QP (one direction of the pair) using GID index 1 on both.
inline int connect_one(Side& a, const Side& b, const RcOpts& o = {}) {
  if (int e = to_init(a.qp)) return e;
  if (int e = to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1, true, o)) return e;
  return to_rts(a.qp, o);
}
inline bool connect_pair(Side& a, Side& b, const RcOpts& o = {}) {
  return connect_one(a, b, o) == 0 && connect_one(b, a, o) == 0;
}

inline int post_recv(Side& s, uint64_t wr_id, uint64_t off, uint32_t len) {
  ibv_sge sge{reinterpret_cast<uint64_t>(s.buf.data()) + off, len, s.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(s.qp, &wr, &bad);
}

inline int post_send(Side& s, uint64_t wr_id, uint64_t off, uint32_t len, ibv_wr_opcode op = IBV_WR_SEND,
                     unsigned flags = IBV_SEND_SIGNALED, uint32_t lkey = 0, uint64_t raddr = 0, uint32_t rkey = 0,
                     uint32_t imm = 0) {
  ibv_sge sge{reinterpret_cast<uint64_t>(s.buf.data()) + off, len, lkey ? lkey : s.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.imm_data = imm;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(s.qp, &wr, &bad);
}

// Polls one completion with a deadline; returns false on timeout.
inline bool poll_one(ibv_cq* cq, ibv_wc* wc, int timeout_ms = 2000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n == 1) return true;
    if (n < 0) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return false;
}

// True if no completion arrives within `ms`.
inline bool quiet(ibv_cq* cq, int ms = 100) {
  ibv_wc wc;
  return !poll_one(cq, &wc, ms);
}

}  // namespace emutest
