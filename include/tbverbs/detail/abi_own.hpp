/// @file abi_own.hpp
/// tbverbs' own declarations of the verbs structs and enums it uses, laid out as rdma-core 44's
/// <infiniband/verbs.h> lays them out.
///
/// Why this exists: tbverbs loads the verbs library with dlopen and never links it, so the only
/// thing it needs from the platform is the ABI: struct layouts (the data path calls through
/// `ctx->ops.post_send` and friends exactly as verbs.h's inline functions do) and enum values.
/// macOS before SDK 26.2, and Linux machines without rdma-core's development headers, have no
/// <infiniband/verbs.h>; there tbverbs still builds against these declarations. abi.hpp picks the
/// platform header when it exists unless TBVERBS_USE_OWN_ABI is defined.
///
/// The declarations are written from the layout facts (names, types, sizes, offsets, values) of
/// rdma-core 44 and declare exactly the names abi.hpp re-exports, with rdma-core's field names.
/// tests/abi compiles them next to rdma-core's header and static_asserts that every size,
/// alignment, offset and enumerator value agrees.
///
/// Deliberate differences from verbs.h, none of which change the layout:
/// - the pthread mutex/cond members are opaque byte arrays of the platform's pthread type's size
///   and alignment (tbverbs never touches them; the library does);
/// - pointers to objects tbverbs does not use (SRQ, AH, MW) point to incomplete types in
///   `abi::opaque`, and fields whose enum type is not re-exported (atomic_cap, path_mig_state)
///   are plain `unsigned int`s;
/// - ops-table slots tbverbs does not call are `opaque_fn` pointers (same size as any function
///   pointer), and the named types of ibv_send_wr's trailing union are nested in the struct
///   (verbs.h uses anonymous types there, which ISO C++ does not allow in an anonymous union).
#pragma once

// abi.hpp re-exports the platform's names into the same namespace when it uses verbs.h, so the
// two cannot meet in one translation unit (tests/abi compares them without abi.hpp).
#if defined(TBVERBS_DETAIL_ABI_REEXPORTS_PLATFORM)
#error "abi.hpp chose the platform's verbs.h: include tbverbs/detail/abi.hpp, not abi_own.hpp"
#endif

#include "../config.hpp"

#include <cstddef>
#include <cstdint>

#include <pthread.h>

TBVERBS_NAMESPACE_BEGIN
namespace detail::abi {

/// Objects tbverbs only ever holds pointers to.
namespace opaque {
struct ibv_srq;
struct ibv_ah;
struct ibv_mw;
} // namespace opaque

/// An ops-table slot tbverbs never calls: only its size (one function pointer) matters.
using opaque_fn = void (*)();

// ---------------------------------------------------------------------------------------------
// Enums. No fixed underlying type, as in verbs.h, so the compiler picks the same one for both.

enum ibv_node_type {
  IBV_NODE_UNKNOWN = -1,
  IBV_NODE_CA = 1,
  IBV_NODE_SWITCH = 2,
  IBV_NODE_ROUTER = 3,
  IBV_NODE_RNIC = 4,
  IBV_NODE_USNIC = 5,
  IBV_NODE_USNIC_UDP = 6,
  IBV_NODE_UNSPECIFIED = 7,
};

enum ibv_transport_type {
  IBV_TRANSPORT_UNKNOWN = -1,
  IBV_TRANSPORT_IB = 0,
  IBV_TRANSPORT_IWARP = 1,
  IBV_TRANSPORT_USNIC = 2,
  IBV_TRANSPORT_USNIC_UDP = 3,
  IBV_TRANSPORT_UNSPECIFIED = 4,
};

enum ibv_mtu {
  IBV_MTU_256 = 1,
  IBV_MTU_512 = 2,
  IBV_MTU_1024 = 3,
  IBV_MTU_2048 = 4,
  IBV_MTU_4096 = 5,
};

enum ibv_port_state {
  IBV_PORT_NOP = 0,
  IBV_PORT_DOWN = 1,
  IBV_PORT_INIT = 2,
  IBV_PORT_ARMED = 3,
  IBV_PORT_ACTIVE = 4,
  IBV_PORT_ACTIVE_DEFER = 5,
};

enum ibv_wc_status {
  IBV_WC_SUCCESS = 0,
  IBV_WC_LOC_LEN_ERR = 1,
  IBV_WC_LOC_QP_OP_ERR = 2,
  IBV_WC_LOC_EEC_OP_ERR = 3,
  IBV_WC_LOC_PROT_ERR = 4,
  IBV_WC_WR_FLUSH_ERR = 5,
  IBV_WC_MW_BIND_ERR = 6,
  IBV_WC_BAD_RESP_ERR = 7,
  IBV_WC_LOC_ACCESS_ERR = 8,
  IBV_WC_REM_INV_REQ_ERR = 9,
  IBV_WC_REM_ACCESS_ERR = 10,
  IBV_WC_REM_OP_ERR = 11,
  IBV_WC_RETRY_EXC_ERR = 12,
  IBV_WC_RNR_RETRY_EXC_ERR = 13,
  IBV_WC_LOC_RDD_VIOL_ERR = 14,
  IBV_WC_REM_INV_RD_REQ_ERR = 15,
  IBV_WC_REM_ABORT_ERR = 16,
  IBV_WC_INV_EECN_ERR = 17,
  IBV_WC_INV_EEC_STATE_ERR = 18,
  IBV_WC_FATAL_ERR = 19,
  IBV_WC_RESP_TIMEOUT_ERR = 20,
  IBV_WC_GENERAL_ERR = 21,
  IBV_WC_TM_ERR = 22,
  IBV_WC_TM_RNDV_INCOMPLETE = 23,
};

enum ibv_wc_opcode {
  IBV_WC_SEND = 0,
  IBV_WC_RDMA_WRITE = 1,
  IBV_WC_RDMA_READ = 2,
  IBV_WC_COMP_SWAP = 3,
  IBV_WC_FETCH_ADD = 4,
  IBV_WC_BIND_MW = 5,
  IBV_WC_LOCAL_INV = 6,
  IBV_WC_TSO = 7,
  IBV_WC_ATOMIC_WRITE = 9, // 8 is unused
  // Receive opcodes have bit 7 set, so (opcode & IBV_WC_RECV) tests for a receive.
  IBV_WC_RECV = 1 << 7,
  IBV_WC_RECV_RDMA_WITH_IMM = 129,
  IBV_WC_TM_ADD = 130,
  IBV_WC_TM_DEL = 131,
  IBV_WC_TM_SYNC = 132,
  IBV_WC_TM_RECV = 133,
  IBV_WC_TM_NO_TAG = 134,
  IBV_WC_DRIVER1 = 135,
  IBV_WC_DRIVER2 = 136,
  IBV_WC_DRIVER3 = 137,
};

enum ibv_wc_flags {
  IBV_WC_GRH = 1 << 0,
  IBV_WC_WITH_IMM = 1 << 1,
  IBV_WC_IP_CSUM_OK = 1 << 2,
  IBV_WC_WITH_INV = 1 << 3,
  IBV_WC_TM_SYNC_REQ = 1 << 4,
  IBV_WC_TM_MATCH = 1 << 5,
  IBV_WC_TM_DATA_VALID = 1 << 6,
};

enum ibv_access_flags {
  IBV_ACCESS_LOCAL_WRITE = 1 << 0,
  IBV_ACCESS_REMOTE_WRITE = 1 << 1,
  IBV_ACCESS_REMOTE_READ = 1 << 2,
  IBV_ACCESS_REMOTE_ATOMIC = 1 << 3,
  IBV_ACCESS_MW_BIND = 1 << 4,
  IBV_ACCESS_ZERO_BASED = 1 << 5,
  IBV_ACCESS_ON_DEMAND = 1 << 6,
  IBV_ACCESS_HUGETLB = 1 << 7,
  // The first of the "optional" access bits (1 << 20 .. 1 << 29), which a provider may ignore;
  // verbs.h's ibv_reg_mr routes such flags to ibv_reg_mr_iova2 (IBVERBS_1.8).
  IBV_ACCESS_RELAXED_ORDERING = 1 << 20,
};

enum ibv_qp_type {
  IBV_QPT_RC = 2,
  IBV_QPT_UC = 3,
  IBV_QPT_UD = 4,
  IBV_QPT_RAW_PACKET = 8,
  IBV_QPT_XRC_SEND = 9,
  IBV_QPT_XRC_RECV = 10,
  IBV_QPT_DRIVER = 0xff,
};

enum ibv_qp_attr_mask {
  IBV_QP_STATE = 1 << 0,
  IBV_QP_CUR_STATE = 1 << 1,
  IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2,
  IBV_QP_ACCESS_FLAGS = 1 << 3,
  IBV_QP_PKEY_INDEX = 1 << 4,
  IBV_QP_PORT = 1 << 5,
  IBV_QP_QKEY = 1 << 6,
  IBV_QP_AV = 1 << 7,
  IBV_QP_PATH_MTU = 1 << 8,
  IBV_QP_TIMEOUT = 1 << 9,
  IBV_QP_RETRY_CNT = 1 << 10,
  IBV_QP_RNR_RETRY = 1 << 11,
  IBV_QP_RQ_PSN = 1 << 12,
  IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
  IBV_QP_ALT_PATH = 1 << 14,
  IBV_QP_MIN_RNR_TIMER = 1 << 15,
  IBV_QP_SQ_PSN = 1 << 16,
  IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
  IBV_QP_PATH_MIG_STATE = 1 << 18,
  IBV_QP_CAP = 1 << 19,
  IBV_QP_DEST_QPN = 1 << 20,
  // Bits 21..24 (SMAC/VID) were kernel-only and never exposed by libibverbs.
  IBV_QP_RATE_LIMIT = 1 << 25,
};

enum ibv_qp_state {
  IBV_QPS_RESET = 0,
  IBV_QPS_INIT = 1,
  IBV_QPS_RTR = 2,
  IBV_QPS_RTS = 3,
  IBV_QPS_SQD = 4,
  IBV_QPS_SQE = 5,
  IBV_QPS_ERR = 6,
  IBV_QPS_UNKNOWN = 7,
};

enum ibv_wr_opcode {
  IBV_WR_RDMA_WRITE = 0,
  IBV_WR_RDMA_WRITE_WITH_IMM = 1,
  IBV_WR_SEND = 2,
  IBV_WR_SEND_WITH_IMM = 3,
  IBV_WR_RDMA_READ = 4,
  IBV_WR_ATOMIC_CMP_AND_SWP = 5,
  IBV_WR_ATOMIC_FETCH_AND_ADD = 6,
  IBV_WR_LOCAL_INV = 7,
  IBV_WR_BIND_MW = 8,
  IBV_WR_SEND_WITH_INV = 9,
  IBV_WR_TSO = 10,
  IBV_WR_DRIVER1 = 11,
  IBV_WR_ATOMIC_WRITE = 15, // 12..14 are unused
};

enum ibv_send_flags {
  IBV_SEND_FENCE = 1 << 0,
  IBV_SEND_SIGNALED = 1 << 1,
  IBV_SEND_SOLICITED = 1 << 2,
  IBV_SEND_INLINE = 1 << 3,
  IBV_SEND_IP_CSUM = 1 << 4,
};

// ---------------------------------------------------------------------------------------------
// Structs. Offsets in comments are for LP64 with glibc's x86-64 pthread sizes (mutex 40 B,
// cond 48 B); members after a pthread member move with the platform's pthread sizes, exactly as
// they do in verbs.h.

struct ibv_context;
struct ibv_cq;
struct ibv_pd;
struct ibv_qp;
struct ibv_wc;
struct ibv_send_wr;
struct ibv_recv_wr;

/// 16 bytes; the 64-bit halves are big-endian (verbs.h's __be64).
union ibv_gid {
  std::uint8_t raw[16];
  struct {
    std::uint64_t subnet_prefix;
    std::uint64_t interface_id;
  } global;
};

/// 664 bytes.
struct ibv_device {
  struct {
    opaque_fn _dummy1; // obsolete device ops, never used
    opaque_fn _dummy2;
  } _ops;
  ibv_node_type node_type;           // @16
  ibv_transport_type transport_type; // @20
  char name[64];                     // @24, kernel IB device name, e.g. "mlx5_0", "rdma_en3"
  char dev_name[64];                 // @88, uverbs device name
  char dev_path[256];                // @152
  char ibdev_path[256];              // @408
};

/// 232 bytes.
struct ibv_device_attr {
  char fw_ver[64];
  std::uint64_t node_guid; // big-endian
  std::uint64_t sys_image_guid;
  std::uint64_t max_mr_size;
  std::uint64_t page_size_cap;
  std::uint32_t vendor_id;
  std::uint32_t vendor_part_id;
  std::uint32_t hw_ver;
  int max_qp;
  int max_qp_wr;
  unsigned int device_cap_flags;
  int max_sge;
  int max_sge_rd;
  int max_cq;
  int max_cqe;
  int max_mr;
  int max_pd;
  int max_qp_rd_atom;
  int max_ee_rd_atom;
  int max_res_rd_atom;
  int max_qp_init_rd_atom;
  int max_ee_init_rd_atom;
  unsigned int atomic_cap; // enum ibv_atomic_cap in verbs.h (NONE 0, HCA 1, GLOB 2)
  int max_ee;
  int max_rdd;
  int max_mw;
  int max_raw_ipv6_qp;
  int max_raw_ethy_qp;
  int max_mcast_grp;
  int max_mcast_qp_attach;
  int max_total_mcast_qp_attach;
  int max_ah;
  int max_fmr;
  int max_map_per_fmr;
  int max_srq;
  int max_srq_wr;
  int max_srq_sge;
  std::uint16_t max_pkeys;
  std::uint8_t local_ca_ack_delay;
  std::uint8_t phys_port_cnt; // @227
};

/// 52 bytes, 4-aligned. link_layer: 0 unspecified, 1 InfiniBand, 2 Ethernet.
struct ibv_port_attr {
  ibv_port_state state;
  ibv_mtu max_mtu;
  ibv_mtu active_mtu;
  int gid_tbl_len; // @12
  std::uint32_t port_cap_flags;
  std::uint32_t max_msg_sz;
  std::uint32_t bad_pkey_cntr;
  std::uint32_t qkey_viol_cntr;
  std::uint16_t pkey_tbl_len;
  std::uint16_t lid; // @34
  std::uint16_t sm_lid;
  std::uint8_t lmc;
  std::uint8_t max_vl_num;
  std::uint8_t sm_sl;
  std::uint8_t subnet_timeout;
  std::uint8_t init_type_reply;
  std::uint8_t active_width;
  std::uint8_t active_speed; // @44
  std::uint8_t phys_state;
  std::uint8_t link_layer; // @46
  std::uint8_t flags;
  std::uint16_t port_cap_flags2; // @48
};

/// The data-path slots of the context's function table (256 bytes: 32 pointers). Only the
/// slots tbverbs calls have real signatures; verbs.h's inline ibv_post_send, ibv_post_recv,
/// ibv_poll_cq and ibv_req_notify_cq read exactly these.
struct ibv_context_ops {
  opaque_fn _compat_query_device;
  opaque_fn _compat_query_port;
  opaque_fn _compat_alloc_pd;
  opaque_fn _compat_dealloc_pd;
  opaque_fn _compat_reg_mr;
  opaque_fn _compat_rereg_mr;
  opaque_fn _compat_dereg_mr;
  opaque_fn alloc_mw;
  opaque_fn bind_mw;
  opaque_fn dealloc_mw;
  opaque_fn _compat_create_cq;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc); // @88 (@96 in ibv_context)
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only);    // @96
  opaque_fn _compat_cq_event;
  opaque_fn _compat_resize_cq;
  opaque_fn _compat_destroy_cq;
  opaque_fn _compat_create_srq;
  opaque_fn _compat_modify_srq;
  opaque_fn _compat_query_srq;
  opaque_fn _compat_destroy_srq;
  int (*post_srq_recv)(opaque::ibv_srq* srq, ibv_recv_wr* recv_wr,
                       ibv_recv_wr** bad_recv_wr); // @160
  opaque_fn _compat_create_qp;
  opaque_fn _compat_query_qp;
  opaque_fn _compat_modify_qp;
  opaque_fn _compat_destroy_qp;
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr); // @200
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr); // @208
  opaque_fn _compat_create_ah;
  opaque_fn _compat_destroy_ah;
  opaque_fn _compat_attach_mcast;
  opaque_fn _compat_detach_mcast;
  opaque_fn _compat_async_event;
};

/// 328 bytes on x86-64 glibc. rdma-core allocates it as the tail of a larger verbs_context
/// (extended ops live *before* it); abi_compat == (void*)UINTPTR_MAX marks that.
struct ibv_context {
  ibv_device* device;
  ibv_context_ops ops; // @8
  int cmd_fd;          // @264
  int async_fd;
  int num_comp_vectors;
  alignas(pthread_mutex_t) unsigned char mutex[sizeof(pthread_mutex_t)]; // @280
  void* abi_compat;                                                      // @320
};

/// 16 bytes.
struct ibv_comp_channel {
  ibv_context* context;
  int fd;
  int refcnt;
};

/// 128 bytes on x86-64 glibc.
struct ibv_cq {
  ibv_context* context;
  ibv_comp_channel* channel;
  void* cq_context;
  std::uint32_t handle;
  int cqe;
  alignas(pthread_mutex_t) unsigned char mutex[sizeof(pthread_mutex_t)]; // @32
  alignas(pthread_cond_t) unsigned char cond[sizeof(pthread_cond_t)];    // @72
  std::uint32_t comp_events_completed;                                   // @120
  std::uint32_t async_events_completed;
};

/// 16 bytes.
struct ibv_pd {
  ibv_context* context;
  std::uint32_t handle;
};

/// 48 bytes.
struct ibv_mr {
  ibv_context* context;
  ibv_pd* pd;
  void* addr;
  std::size_t length;
  std::uint32_t handle; // @32
  std::uint32_t lkey;
  std::uint32_t rkey;
};

/// 24 bytes.
struct ibv_global_route {
  ibv_gid dgid;
  std::uint32_t flow_label; // @16
  std::uint8_t sgid_index;  // @20
  std::uint8_t hop_limit;
  std::uint8_t traffic_class;
};

/// 32 bytes.
struct ibv_ah_attr {
  ibv_global_route grh;
  std::uint16_t dlid; // @24
  std::uint8_t sl;
  std::uint8_t src_path_bits;
  std::uint8_t static_rate;
  std::uint8_t is_global; // @29
  std::uint8_t port_num;
};

/// 20 bytes.
struct ibv_qp_cap {
  std::uint32_t max_send_wr;
  std::uint32_t max_recv_wr;
  std::uint32_t max_send_sge;
  std::uint32_t max_recv_sge;
  std::uint32_t max_inline_data;
};

/// 64 bytes.
struct ibv_qp_init_attr {
  void* qp_context;
  ibv_cq* send_cq;
  ibv_cq* recv_cq;
  opaque::ibv_srq* srq;
  ibv_qp_cap cap;      // @32
  ibv_qp_type qp_type; // @52
  int sq_sig_all;      // @56
};

/// 144 bytes.
struct ibv_qp_attr {
  ibv_qp_state qp_state;
  ibv_qp_state cur_qp_state;
  ibv_mtu path_mtu;            // @8
  unsigned int path_mig_state; // enum ibv_mig_state in verbs.h (MIGRATED 0, REARM 1, ARMED 2)
  std::uint32_t qkey;          // @16
  std::uint32_t rq_psn;
  std::uint32_t sq_psn;
  std::uint32_t dest_qp_num;
  unsigned int qp_access_flags; // @32
  ibv_qp_cap cap;               // @36
  ibv_ah_attr ah_attr;          // @56
  ibv_ah_attr alt_ah_attr;      // @88
  std::uint16_t pkey_index;     // @120
  std::uint16_t alt_pkey_index;
  std::uint8_t en_sqd_async_notify;
  std::uint8_t sq_draining;
  std::uint8_t max_rd_atomic; // @126
  std::uint8_t max_dest_rd_atomic;
  std::uint8_t min_rnr_timer; // @128
  std::uint8_t port_num;
  std::uint8_t timeout;
  std::uint8_t retry_cnt;
  std::uint8_t rnr_retry; // @132
  std::uint8_t alt_port_num;
  std::uint8_t alt_timeout;
  std::uint32_t rate_limit; // @136
};

/// 160 bytes on x86-64 glibc.
struct ibv_qp {
  ibv_context* context;
  void* qp_context;
  ibv_pd* pd;
  ibv_cq* send_cq;
  ibv_cq* recv_cq;
  opaque::ibv_srq* srq;
  std::uint32_t handle;                                                  // @48
  std::uint32_t qp_num;                                                  // @52
  ibv_qp_state state;                                                    // @56
  ibv_qp_type qp_type;                                                   // @60
  alignas(pthread_mutex_t) unsigned char mutex[sizeof(pthread_mutex_t)]; // @64
  alignas(pthread_cond_t) unsigned char cond[sizeof(pthread_cond_t)];    // @104
  std::uint32_t events_completed;                                        // @152
};

/// 48 bytes.
struct ibv_wc {
  std::uint64_t wr_id;
  ibv_wc_status status; // @8
  ibv_wc_opcode opcode; // @12
  std::uint32_t vendor_err;
  std::uint32_t byte_len; // @20
  union {
    std::uint32_t imm_data;         // big-endian; valid when wc_flags & IBV_WC_WITH_IMM
    std::uint32_t invalidated_rkey; // when wc_flags & IBV_WC_WITH_INV
  };                                // @24
  std::uint32_t qp_num;             // @28
  std::uint32_t src_qp;
  unsigned int wc_flags; // @36
  std::uint16_t pkey_index;
  std::uint16_t slid;
  std::uint8_t sl;
  std::uint8_t dlid_path_bits; // @45
};

/// 16 bytes.
struct ibv_sge {
  std::uint64_t addr;
  std::uint32_t length;
  std::uint32_t lkey;
};

/// 128 bytes.
struct ibv_send_wr {
  /// verbs.h's struct ibv_mw_bind_info (32 bytes).
  struct mw_bind_info {
    ibv_mr* mr;
    std::uint64_t addr;
    std::uint64_t length;
    unsigned int mw_access_flags;
  };
  /// Memory-window bind arguments (48 bytes).
  struct bind_mw_args {
    opaque::ibv_mw* mw;
    std::uint32_t rkey;
    mw_bind_info bind_info;
  };
  /// TCP segmentation offload arguments (16 bytes).
  struct tso_args {
    void* hdr;
    std::uint16_t hdr_sz;
    std::uint16_t mss;
  };

  std::uint64_t wr_id;
  ibv_send_wr* next;       // @8
  ibv_sge* sg_list;        // @16
  int num_sge;             // @24
  ibv_wr_opcode opcode;    // @28
  unsigned int send_flags; // @32
  union {
    std::uint32_t imm_data;        // big-endian; for *_WITH_IMM
    std::uint32_t invalidate_rkey; // for *_INV
  };                               // @36
  union {
    struct {
      std::uint64_t remote_addr; // @40
      std::uint32_t rkey;        // @48
    } rdma;
    struct {
      std::uint64_t remote_addr; // @40
      std::uint64_t compare_add; // @48
      std::uint64_t swap;        // @56
      std::uint32_t rkey;        // @64
    } atomic;
    struct {
      opaque::ibv_ah* ah;        // @40
      std::uint32_t remote_qpn;  // @48
      std::uint32_t remote_qkey; // @52
    } ud;
  } wr; // @40, 32 bytes
  union {
    struct {
      std::uint32_t remote_srqn;
    } xrc;
  } qp_type; // @72
  union {
    bind_mw_args bind_mw;
    tso_args tso;
  }; // @80, 48 bytes
};

/// 32 bytes.
struct ibv_recv_wr {
  std::uint64_t wr_id;
  ibv_recv_wr* next;
  ibv_sge* sg_list;
  int num_sge; // @24
};

/// The asynchronous events' types (ibv_get_async_event), numbered as rdma-core's verbs.h.
enum ibv_event_type {
  IBV_EVENT_CQ_ERR,
  IBV_EVENT_QP_FATAL,
  IBV_EVENT_QP_REQ_ERR,
  IBV_EVENT_QP_ACCESS_ERR,
  IBV_EVENT_COMM_EST,
  IBV_EVENT_SQ_DRAINED,
  IBV_EVENT_PATH_MIG,
  IBV_EVENT_PATH_MIG_ERR,
  IBV_EVENT_DEVICE_FATAL,
  IBV_EVENT_PORT_ACTIVE,
  IBV_EVENT_PORT_ERR,
  IBV_EVENT_LID_CHANGE,
  IBV_EVENT_PKEY_CHANGE,
  IBV_EVENT_SM_CHANGE,
  IBV_EVENT_SRQ_ERR,
  IBV_EVENT_SRQ_LIMIT_REACHED,
  IBV_EVENT_QP_LAST_WQE_REACHED,
  IBV_EVENT_CLIENT_REREGISTER,
  IBV_EVENT_GID_CHANGE,
  IBV_EVENT_WQ_FATAL,
};

/// 16 bytes: the object the event is about, then its type.
struct ibv_async_event {
  union {
    ibv_cq* cq;
    ibv_qp* qp;
    opaque::ibv_srq* srq;
    void* wq;
    int port_num;
  } element;
  ibv_event_type event_type; // @8
};

} // namespace detail::abi
TBVERBS_NAMESPACE_END
