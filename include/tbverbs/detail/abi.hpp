/// @file abi.hpp
/// The verbs ABI tbverbs speaks: the platform's <infiniband/verbs.h> when it is present (macOS
/// SDK 26.2+, Linux with rdma-core headers), otherwise tbverbs' own declarations of the few
/// structs and enums it needs (abi_own.hpp). Either way the names live in `tbverbs::detail::abi`,
/// and tests/abi checks that both agree with rdma-core's header.
#pragma once

#include "../config.hpp"

#if TBVERBS_ABI_FROM_PLATFORM // decided in config.hpp, which also names the inline namespace after it
#include <infiniband/verbs.h>
/// Internal: abi.hpp re-exports the platform's names (abi_own.hpp refuses to be included then).
#define TBVERBS_DETAIL_ABI_REEXPORTS_PLATFORM 1

TBVERBS_NAMESPACE_BEGIN
namespace detail::abi {
using ::ibv_ah_attr;
using ::ibv_async_event;
using ::ibv_event_type;
using ::ibv_comp_channel;
using ::ibv_context;
using ::ibv_context_ops;
using ::ibv_cq;
using ::ibv_device;
using ::ibv_device_attr;
using ::ibv_gid;
using ::ibv_global_route;
using ::ibv_mr;
using ::ibv_pd;
using ::ibv_port_attr;
using ::ibv_qp;
using ::ibv_qp_attr;
using ::ibv_qp_cap;
using ::ibv_qp_init_attr;
using ::ibv_recv_wr;
using ::ibv_send_wr;
using ::ibv_sge;
using ::ibv_wc;

using ::ibv_access_flags;
using ::ibv_mtu;
using ::ibv_node_type;
using ::ibv_port_state;
using ::ibv_qp_attr_mask;
using ::ibv_qp_state;
using ::ibv_qp_type;
using ::ibv_send_flags;
using ::ibv_transport_type;
using ::ibv_wc_flags;
using ::ibv_wc_opcode;
using ::ibv_wc_status;
using ::ibv_wr_opcode;
using enum ::ibv_access_flags;
using enum ::ibv_mtu;
using enum ::ibv_event_type;
using enum ::ibv_node_type;
using enum ::ibv_port_state;
using enum ::ibv_qp_attr_mask;
using enum ::ibv_qp_state;
using enum ::ibv_qp_type;
using enum ::ibv_send_flags;
using enum ::ibv_transport_type;
using enum ::ibv_wc_flags;
using enum ::ibv_wc_opcode;
using enum ::ibv_wc_status;
using enum ::ibv_wr_opcode;
} // namespace detail::abi
TBVERBS_NAMESPACE_END

#else
#include "abi_own.hpp"
#endif

TBVERBS_NAMESPACE_BEGIN
/// The raw verbs types and constants (`abi::ibv_send_wr`, `abi::IBV_WR_SEND`), for the escape
/// hatches (`post_send(ibv_send_wr&)`, `native_handle()`): the platform's when it has verbs.h.
namespace abi = detail::abi;
TBVERBS_NAMESPACE_END
