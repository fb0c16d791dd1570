// X-macro lists shared by the ABI tests: every struct, field and enumerator that
// include/tbverbs/detail/abi_own.hpp declares (and abi.hpp re-exports), named as in rdma-core.
#pragma once

// The structs, in the order abi.hpp re-exports them.
#define TBV_ABI_STRUCTS(X)                                                                                   \
  X(ibv_ah_attr)                                                                                             \
  X(ibv_comp_channel)                                                                                        \
  X(ibv_context)                                                                                             \
  X(ibv_context_ops)                                                                                         \
  X(ibv_cq)                                                                                                  \
  X(ibv_device)                                                                                              \
  X(ibv_device_attr)                                                                                         \
  X(ibv_gid)                                                                                                 \
  X(ibv_global_route)                                                                                        \
  X(ibv_mr)                                                                                                  \
  X(ibv_pd)                                                                                                  \
  X(ibv_port_attr)                                                                                           \
  X(ibv_qp)                                                                                                  \
  X(ibv_qp_attr)                                                                                             \
  X(ibv_qp_cap)                                                                                              \
  X(ibv_qp_init_attr)                                                                                        \
  X(ibv_recv_wr)                                                                                             \
  X(ibv_send_wr)                                                                                             \
  X(ibv_sge)                                                                                                 \
  X(ibv_wc)

// Every field: F(struct, member designator) checks offset, size and kind (pointer, signed or
// unsigned integer, array of..., aggregate); O(struct, member) checks offset and size only, for
// members whose type tbverbs makes opaque (pthread mutex/cond).
#define TBV_ABI_FIELDS(F, O)                                                                                 \
  F(ibv_gid, raw)                                                                                            \
  F(ibv_gid, global)                                                                                         \
  F(ibv_gid, global.subnet_prefix)                                                                           \
  F(ibv_gid, global.interface_id)                                                                            \
                                                                                                             \
  F(ibv_device, _ops)                                                                                        \
  F(ibv_device, _ops._dummy1)                                                                                \
  F(ibv_device, _ops._dummy2)                                                                                \
  F(ibv_device, node_type)                                                                                   \
  F(ibv_device, transport_type)                                                                              \
  F(ibv_device, name)                                                                                        \
  F(ibv_device, dev_name)                                                                                    \
  F(ibv_device, dev_path)                                                                                    \
  F(ibv_device, ibdev_path)                                                                                  \
                                                                                                             \
  F(ibv_device_attr, fw_ver)                                                                                 \
  F(ibv_device_attr, node_guid)                                                                              \
  F(ibv_device_attr, sys_image_guid)                                                                         \
  F(ibv_device_attr, max_mr_size)                                                                            \
  F(ibv_device_attr, page_size_cap)                                                                          \
  F(ibv_device_attr, vendor_id)                                                                              \
  F(ibv_device_attr, vendor_part_id)                                                                         \
  F(ibv_device_attr, hw_ver)                                                                                 \
  F(ibv_device_attr, max_qp)                                                                                 \
  F(ibv_device_attr, max_qp_wr)                                                                              \
  F(ibv_device_attr, device_cap_flags)                                                                       \
  F(ibv_device_attr, max_sge)                                                                                \
  F(ibv_device_attr, max_sge_rd)                                                                             \
  F(ibv_device_attr, max_cq)                                                                                 \
  F(ibv_device_attr, max_cqe)                                                                                \
  F(ibv_device_attr, max_mr)                                                                                 \
  F(ibv_device_attr, max_pd)                                                                                 \
  F(ibv_device_attr, max_qp_rd_atom)                                                                         \
  F(ibv_device_attr, max_ee_rd_atom)                                                                         \
  F(ibv_device_attr, max_res_rd_atom)                                                                        \
  F(ibv_device_attr, max_qp_init_rd_atom)                                                                    \
  F(ibv_device_attr, max_ee_init_rd_atom)                                                                    \
  F(ibv_device_attr, atomic_cap)                                                                             \
  F(ibv_device_attr, max_ee)                                                                                 \
  F(ibv_device_attr, max_rdd)                                                                                \
  F(ibv_device_attr, max_mw)                                                                                 \
  F(ibv_device_attr, max_raw_ipv6_qp)                                                                        \
  F(ibv_device_attr, max_raw_ethy_qp)                                                                        \
  F(ibv_device_attr, max_mcast_grp)                                                                          \
  F(ibv_device_attr, max_mcast_qp_attach)                                                                    \
  F(ibv_device_attr, max_total_mcast_qp_attach)                                                              \
  F(ibv_device_attr, max_ah)                                                                                 \
  F(ibv_device_attr, max_fmr)                                                                                \
  F(ibv_device_attr, max_map_per_fmr)                                                                        \
  F(ibv_device_attr, max_srq)                                                                                \
  F(ibv_device_attr, max_srq_wr)                                                                             \
  F(ibv_device_attr, max_srq_sge)                                                                            \
  F(ibv_device_attr, max_pkeys)                                                                              \
  F(ibv_device_attr, local_ca_ack_delay)                                                                     \
  F(ibv_device_attr, phys_port_cnt)                                                                          \
                                                                                                             \
  F(ibv_port_attr, state)                                                                                    \
  F(ibv_port_attr, max_mtu)                                                                                  \
  F(ibv_port_attr, active_mtu)                                                                               \
  F(ibv_port_attr, gid_tbl_len)                                                                              \
  F(ibv_port_attr, port_cap_flags)                                                                           \
  F(ibv_port_attr, max_msg_sz)                                                                               \
  F(ibv_port_attr, bad_pkey_cntr)                                                                            \
  F(ibv_port_attr, qkey_viol_cntr)                                                                           \
  F(ibv_port_attr, pkey_tbl_len)                                                                             \
  F(ibv_port_attr, lid)                                                                                      \
  F(ibv_port_attr, sm_lid)                                                                                   \
  F(ibv_port_attr, lmc)                                                                                      \
  F(ibv_port_attr, max_vl_num)                                                                               \
  F(ibv_port_attr, sm_sl)                                                                                    \
  F(ibv_port_attr, subnet_timeout)                                                                           \
  F(ibv_port_attr, init_type_reply)                                                                          \
  F(ibv_port_attr, active_width)                                                                             \
  F(ibv_port_attr, active_speed)                                                                             \
  F(ibv_port_attr, phys_state)                                                                               \
  F(ibv_port_attr, link_layer)                                                                               \
  F(ibv_port_attr, flags)                                                                                    \
  F(ibv_port_attr, port_cap_flags2)                                                                          \
                                                                                                             \
  F(ibv_context_ops, _compat_query_device)                                                                   \
  F(ibv_context_ops, _compat_query_port)                                                                     \
  F(ibv_context_ops, _compat_alloc_pd)                                                                       \
  F(ibv_context_ops, _compat_dealloc_pd)                                                                     \
  F(ibv_context_ops, _compat_reg_mr)                                                                         \
  F(ibv_context_ops, _compat_rereg_mr)                                                                       \
  F(ibv_context_ops, _compat_dereg_mr)                                                                       \
  F(ibv_context_ops, alloc_mw)                                                                               \
  F(ibv_context_ops, bind_mw)                                                                                \
  F(ibv_context_ops, dealloc_mw)                                                                             \
  F(ibv_context_ops, _compat_create_cq)                                                                      \
  F(ibv_context_ops, poll_cq)                                                                                \
  F(ibv_context_ops, req_notify_cq)                                                                          \
  F(ibv_context_ops, _compat_cq_event)                                                                       \
  F(ibv_context_ops, _compat_resize_cq)                                                                      \
  F(ibv_context_ops, _compat_destroy_cq)                                                                     \
  F(ibv_context_ops, _compat_create_srq)                                                                     \
  F(ibv_context_ops, _compat_modify_srq)                                                                     \
  F(ibv_context_ops, _compat_query_srq)                                                                      \
  F(ibv_context_ops, _compat_destroy_srq)                                                                    \
  F(ibv_context_ops, post_srq_recv)                                                                          \
  F(ibv_context_ops, _compat_create_qp)                                                                      \
  F(ibv_context_ops, _compat_query_qp)                                                                       \
  F(ibv_context_ops, _compat_modify_qp)                                                                      \
  F(ibv_context_ops, _compat_destroy_qp)                                                                     \
  F(ibv_context_ops, post_send)                                                                              \
  F(ibv_context_ops, post_recv)                                                                              \
  F(ibv_context_ops, _compat_create_ah)                                                                      \
  F(ibv_context_ops, _compat_destroy_ah)                                                                     \
  F(ibv_context_ops, _compat_attach_mcast)                                                                   \
  F(ibv_context_ops, _compat_detach_mcast)                                                                   \
  F(ibv_context_ops, _compat_async_event)                                                                    \
                                                                                                             \
  F(ibv_context, device)                                                                                     \
  F(ibv_context, ops)                                                                                        \
  F(ibv_context, ops.poll_cq)                                                                                \
  F(ibv_context, ops.req_notify_cq)                                                                          \
  F(ibv_context, ops.post_srq_recv)                                                                          \
  F(ibv_context, ops.post_send)                                                                              \
  F(ibv_context, ops.post_recv)                                                                              \
  F(ibv_context, cmd_fd)                                                                                     \
  F(ibv_context, async_fd)                                                                                   \
  F(ibv_context, num_comp_vectors)                                                                           \
  O(ibv_context, mutex)                                                                                      \
  F(ibv_context, abi_compat)                                                                                 \
                                                                                                             \
  F(ibv_comp_channel, context)                                                                               \
  F(ibv_comp_channel, fd)                                                                                    \
  F(ibv_comp_channel, refcnt)                                                                                \
                                                                                                             \
  F(ibv_cq, context)                                                                                         \
  F(ibv_cq, channel)                                                                                         \
  F(ibv_cq, cq_context)                                                                                      \
  F(ibv_cq, handle)                                                                                          \
  F(ibv_cq, cqe)                                                                                             \
  O(ibv_cq, mutex)                                                                                           \
  O(ibv_cq, cond)                                                                                            \
  F(ibv_cq, comp_events_completed)                                                                           \
  F(ibv_cq, async_events_completed)                                                                          \
                                                                                                             \
  F(ibv_pd, context)                                                                                         \
  F(ibv_pd, handle)                                                                                          \
                                                                                                             \
  F(ibv_mr, context)                                                                                         \
  F(ibv_mr, pd)                                                                                              \
  F(ibv_mr, addr)                                                                                            \
  F(ibv_mr, length)                                                                                          \
  F(ibv_mr, handle)                                                                                          \
  F(ibv_mr, lkey)                                                                                            \
  F(ibv_mr, rkey)                                                                                            \
                                                                                                             \
  F(ibv_global_route, dgid)                                                                                  \
  F(ibv_global_route, flow_label)                                                                            \
  F(ibv_global_route, sgid_index)                                                                            \
  F(ibv_global_route, hop_limit)                                                                             \
  F(ibv_global_route, traffic_class)                                                                         \
                                                                                                             \
  F(ibv_ah_attr, grh)                                                                                        \
  F(ibv_ah_attr, grh.dgid)                                                                                   \
  F(ibv_ah_attr, grh.sgid_index)                                                                             \
  F(ibv_ah_attr, dlid)                                                                                       \
  F(ibv_ah_attr, sl)                                                                                         \
  F(ibv_ah_attr, src_path_bits)                                                                              \
  F(ibv_ah_attr, static_rate)                                                                                \
  F(ibv_ah_attr, is_global)                                                                                  \
  F(ibv_ah_attr, port_num)                                                                                   \
                                                                                                             \
  F(ibv_qp_cap, max_send_wr)                                                                                 \
  F(ibv_qp_cap, max_recv_wr)                                                                                 \
  F(ibv_qp_cap, max_send_sge)                                                                                \
  F(ibv_qp_cap, max_recv_sge)                                                                                \
  F(ibv_qp_cap, max_inline_data)                                                                             \
                                                                                                             \
  F(ibv_qp_init_attr, qp_context)                                                                            \
  F(ibv_qp_init_attr, send_cq)                                                                               \
  F(ibv_qp_init_attr, recv_cq)                                                                               \
  F(ibv_qp_init_attr, srq)                                                                                   \
  F(ibv_qp_init_attr, cap)                                                                                   \
  F(ibv_qp_init_attr, qp_type)                                                                               \
  F(ibv_qp_init_attr, sq_sig_all)                                                                            \
                                                                                                             \
  F(ibv_qp_attr, qp_state)                                                                                   \
  F(ibv_qp_attr, cur_qp_state)                                                                               \
  F(ibv_qp_attr, path_mtu)                                                                                   \
  F(ibv_qp_attr, path_mig_state)                                                                             \
  F(ibv_qp_attr, qkey)                                                                                       \
  F(ibv_qp_attr, rq_psn)                                                                                     \
  F(ibv_qp_attr, sq_psn)                                                                                     \
  F(ibv_qp_attr, dest_qp_num)                                                                                \
  F(ibv_qp_attr, qp_access_flags)                                                                            \
  F(ibv_qp_attr, cap)                                                                                        \
  F(ibv_qp_attr, cap.max_inline_data)                                                                        \
  F(ibv_qp_attr, ah_attr)                                                                                    \
  F(ibv_qp_attr, ah_attr.grh.sgid_index)                                                                     \
  F(ibv_qp_attr, ah_attr.grh.hop_limit)                                                                      \
  F(ibv_qp_attr, ah_attr.is_global)                                                                          \
  F(ibv_qp_attr, ah_attr.port_num)                                                                           \
  F(ibv_qp_attr, alt_ah_attr)                                                                                \
  F(ibv_qp_attr, pkey_index)                                                                                 \
  F(ibv_qp_attr, alt_pkey_index)                                                                             \
  F(ibv_qp_attr, en_sqd_async_notify)                                                                        \
  F(ibv_qp_attr, sq_draining)                                                                                \
  F(ibv_qp_attr, max_rd_atomic)                                                                              \
  F(ibv_qp_attr, max_dest_rd_atomic)                                                                         \
  F(ibv_qp_attr, min_rnr_timer)                                                                              \
  F(ibv_qp_attr, port_num)                                                                                   \
  F(ibv_qp_attr, timeout)                                                                                    \
  F(ibv_qp_attr, retry_cnt)                                                                                  \
  F(ibv_qp_attr, rnr_retry)                                                                                  \
  F(ibv_qp_attr, alt_port_num)                                                                               \
  F(ibv_qp_attr, alt_timeout)                                                                                \
  F(ibv_qp_attr, rate_limit)                                                                                 \
                                                                                                             \
  F(ibv_qp, context)                                                                                         \
  F(ibv_qp, qp_context)                                                                                      \
  F(ibv_qp, pd)                                                                                              \
  F(ibv_qp, send_cq)                                                                                         \
  F(ibv_qp, recv_cq)                                                                                         \
  F(ibv_qp, srq)                                                                                             \
  F(ibv_qp, handle)                                                                                          \
  F(ibv_qp, qp_num)                                                                                          \
  F(ibv_qp, state)                                                                                           \
  F(ibv_qp, qp_type)                                                                                         \
  O(ibv_qp, mutex)                                                                                           \
  O(ibv_qp, cond)                                                                                            \
  F(ibv_qp, events_completed)                                                                                \
                                                                                                             \
  F(ibv_wc, wr_id)                                                                                           \
  F(ibv_wc, status)                                                                                          \
  F(ibv_wc, opcode)                                                                                          \
  F(ibv_wc, vendor_err)                                                                                      \
  F(ibv_wc, byte_len)                                                                                        \
  F(ibv_wc, imm_data)                                                                                        \
  F(ibv_wc, invalidated_rkey)                                                                                \
  F(ibv_wc, qp_num)                                                                                          \
  F(ibv_wc, src_qp)                                                                                          \
  F(ibv_wc, wc_flags)                                                                                        \
  F(ibv_wc, pkey_index)                                                                                      \
  F(ibv_wc, slid)                                                                                            \
  F(ibv_wc, sl)                                                                                              \
  F(ibv_wc, dlid_path_bits)                                                                                  \
                                                                                                             \
  F(ibv_sge, addr)                                                                                           \
  F(ibv_sge, length)                                                                                         \
  F(ibv_sge, lkey)                                                                                           \
                                                                                                             \
  F(ibv_send_wr, wr_id)                                                                                      \
  F(ibv_send_wr, next)                                                                                       \
  F(ibv_send_wr, sg_list)                                                                                    \
  F(ibv_send_wr, num_sge)                                                                                    \
  F(ibv_send_wr, opcode)                                                                                     \
  F(ibv_send_wr, send_flags)                                                                                 \
  F(ibv_send_wr, imm_data)                                                                                   \
  F(ibv_send_wr, invalidate_rkey)                                                                            \
  F(ibv_send_wr, wr)                                                                                         \
  F(ibv_send_wr, wr.rdma.remote_addr)                                                                        \
  F(ibv_send_wr, wr.rdma.rkey)                                                                               \
  F(ibv_send_wr, wr.atomic.remote_addr)                                                                      \
  F(ibv_send_wr, wr.atomic.compare_add)                                                                      \
  F(ibv_send_wr, wr.atomic.swap)                                                                             \
  F(ibv_send_wr, wr.atomic.rkey)                                                                             \
  F(ibv_send_wr, wr.ud.ah)                                                                                   \
  F(ibv_send_wr, wr.ud.remote_qpn)                                                                           \
  F(ibv_send_wr, wr.ud.remote_qkey)                                                                          \
  F(ibv_send_wr, qp_type)                                                                                    \
  F(ibv_send_wr, qp_type.xrc.remote_srqn)                                                                    \
  F(ibv_send_wr, bind_mw)                                                                                    \
  F(ibv_send_wr, bind_mw.mw)                                                                                 \
  F(ibv_send_wr, bind_mw.rkey)                                                                               \
  F(ibv_send_wr, bind_mw.bind_info)                                                                          \
  F(ibv_send_wr, bind_mw.bind_info.mr)                                                                       \
  F(ibv_send_wr, bind_mw.bind_info.addr)                                                                     \
  F(ibv_send_wr, bind_mw.bind_info.length)                                                                   \
  F(ibv_send_wr, bind_mw.bind_info.mw_access_flags)                                                          \
  F(ibv_send_wr, tso)                                                                                        \
  F(ibv_send_wr, tso.hdr)                                                                                    \
  F(ibv_send_wr, tso.hdr_sz)                                                                                 \
  F(ibv_send_wr, tso.mss)                                                                                    \
                                                                                                             \
  F(ibv_recv_wr, wr_id)                                                                                      \
  F(ibv_recv_wr, next)                                                                                       \
  F(ibv_recv_wr, sg_list)                                                                                    \
  F(ibv_recv_wr, num_sge)

// Every enum with every enumerator rdma-core 44 gives it: E(enum, LIST) where LIST(X) expands X
// once per enumerator.
#define TBV_ABI_ENUM_NODE_TYPE(X)                                                                            \
  X(IBV_NODE_UNKNOWN)                                                                                        \
  X(IBV_NODE_CA)                                                                                             \
  X(IBV_NODE_SWITCH)                                                                                         \
  X(IBV_NODE_ROUTER)                                                                                         \
  X(IBV_NODE_RNIC)                                                                                           \
  X(IBV_NODE_USNIC)                                                                                          \
  X(IBV_NODE_USNIC_UDP)                                                                                      \
  X(IBV_NODE_UNSPECIFIED)
#define TBV_ABI_ENUM_TRANSPORT_TYPE(X)                                                                       \
  X(IBV_TRANSPORT_UNKNOWN)                                                                                   \
  X(IBV_TRANSPORT_IB)                                                                                        \
  X(IBV_TRANSPORT_IWARP)                                                                                     \
  X(IBV_TRANSPORT_USNIC)                                                                                     \
  X(IBV_TRANSPORT_USNIC_UDP)                                                                                 \
  X(IBV_TRANSPORT_UNSPECIFIED)
#define TBV_ABI_ENUM_MTU(X) X(IBV_MTU_256) X(IBV_MTU_512) X(IBV_MTU_1024) X(IBV_MTU_2048) X(IBV_MTU_4096)
#define TBV_ABI_ENUM_PORT_STATE(X)                                                                           \
  X(IBV_PORT_NOP)                                                                                            \
  X(IBV_PORT_DOWN)                                                                                           \
  X(IBV_PORT_INIT)                                                                                           \
  X(IBV_PORT_ARMED)                                                                                          \
  X(IBV_PORT_ACTIVE)                                                                                         \
  X(IBV_PORT_ACTIVE_DEFER)
#define TBV_ABI_ENUM_WC_STATUS(X)                                                                            \
  X(IBV_WC_SUCCESS)                                                                                          \
  X(IBV_WC_LOC_LEN_ERR)                                                                                      \
  X(IBV_WC_LOC_QP_OP_ERR)                                                                                    \
  X(IBV_WC_LOC_EEC_OP_ERR)                                                                                   \
  X(IBV_WC_LOC_PROT_ERR)                                                                                     \
  X(IBV_WC_WR_FLUSH_ERR)                                                                                     \
  X(IBV_WC_MW_BIND_ERR)                                                                                      \
  X(IBV_WC_BAD_RESP_ERR)                                                                                     \
  X(IBV_WC_LOC_ACCESS_ERR)                                                                                   \
  X(IBV_WC_REM_INV_REQ_ERR)                                                                                  \
  X(IBV_WC_REM_ACCESS_ERR)                                                                                   \
  X(IBV_WC_REM_OP_ERR)                                                                                       \
  X(IBV_WC_RETRY_EXC_ERR)                                                                                    \
  X(IBV_WC_RNR_RETRY_EXC_ERR)                                                                                \
  X(IBV_WC_LOC_RDD_VIOL_ERR)                                                                                 \
  X(IBV_WC_REM_INV_RD_REQ_ERR)                                                                               \
  X(IBV_WC_REM_ABORT_ERR)                                                                                    \
  X(IBV_WC_INV_EECN_ERR)                                                                                     \
  X(IBV_WC_INV_EEC_STATE_ERR)                                                                                \
  X(IBV_WC_FATAL_ERR)                                                                                        \
  X(IBV_WC_RESP_TIMEOUT_ERR)                                                                                 \
  X(IBV_WC_GENERAL_ERR)                                                                                      \
  X(IBV_WC_TM_ERR)                                                                                           \
  X(IBV_WC_TM_RNDV_INCOMPLETE)
#define TBV_ABI_ENUM_WC_OPCODE(X)                                                                            \
  X(IBV_WC_SEND)                                                                                             \
  X(IBV_WC_RDMA_WRITE)                                                                                       \
  X(IBV_WC_RDMA_READ)                                                                                        \
  X(IBV_WC_COMP_SWAP)                                                                                        \
  X(IBV_WC_FETCH_ADD)                                                                                        \
  X(IBV_WC_BIND_MW)                                                                                          \
  X(IBV_WC_LOCAL_INV)                                                                                        \
  X(IBV_WC_TSO)                                                                                              \
  X(IBV_WC_ATOMIC_WRITE)                                                                                     \
  X(IBV_WC_RECV)                                                                                             \
  X(IBV_WC_RECV_RDMA_WITH_IMM)                                                                               \
  X(IBV_WC_TM_ADD)                                                                                           \
  X(IBV_WC_TM_DEL)                                                                                           \
  X(IBV_WC_TM_SYNC)                                                                                          \
  X(IBV_WC_TM_RECV)                                                                                          \
  X(IBV_WC_TM_NO_TAG)                                                                                        \
  X(IBV_WC_DRIVER1)                                                                                          \
  X(IBV_WC_DRIVER2)                                                                                          \
  X(IBV_WC_DRIVER3)
#define TBV_ABI_ENUM_WC_FLAGS(X)                                                                             \
  X(IBV_WC_GRH)                                                                                              \
  X(IBV_WC_WITH_IMM)                                                                                         \
  X(IBV_WC_IP_CSUM_OK)                                                                                       \
  X(IBV_WC_WITH_INV)                                                                                         \
  X(IBV_WC_TM_SYNC_REQ)                                                                                      \
  X(IBV_WC_TM_MATCH)                                                                                         \
  X(IBV_WC_TM_DATA_VALID)
#define TBV_ABI_ENUM_ACCESS_FLAGS(X)                                                                         \
  X(IBV_ACCESS_LOCAL_WRITE)                                                                                  \
  X(IBV_ACCESS_REMOTE_WRITE)                                                                                 \
  X(IBV_ACCESS_REMOTE_READ)                                                                                  \
  X(IBV_ACCESS_REMOTE_ATOMIC)                                                                                \
  X(IBV_ACCESS_MW_BIND)                                                                                      \
  X(IBV_ACCESS_ZERO_BASED)                                                                                   \
  X(IBV_ACCESS_ON_DEMAND)                                                                                    \
  X(IBV_ACCESS_HUGETLB)                                                                                      \
  X(IBV_ACCESS_RELAXED_ORDERING)
#define TBV_ABI_ENUM_QP_TYPE(X)                                                                              \
  X(IBV_QPT_RC)                                                                                              \
  X(IBV_QPT_UC)                                                                                              \
  X(IBV_QPT_UD)                                                                                              \
  X(IBV_QPT_RAW_PACKET)                                                                                      \
  X(IBV_QPT_XRC_SEND)                                                                                        \
  X(IBV_QPT_XRC_RECV)                                                                                        \
  X(IBV_QPT_DRIVER)
#define TBV_ABI_ENUM_QP_ATTR_MASK(X)                                                                         \
  X(IBV_QP_STATE)                                                                                            \
  X(IBV_QP_CUR_STATE)                                                                                        \
  X(IBV_QP_EN_SQD_ASYNC_NOTIFY)                                                                              \
  X(IBV_QP_ACCESS_FLAGS)                                                                                     \
  X(IBV_QP_PKEY_INDEX)                                                                                       \
  X(IBV_QP_PORT)                                                                                             \
  X(IBV_QP_QKEY)                                                                                             \
  X(IBV_QP_AV)                                                                                               \
  X(IBV_QP_PATH_MTU)                                                                                         \
  X(IBV_QP_TIMEOUT)                                                                                          \
  X(IBV_QP_RETRY_CNT)                                                                                        \
  X(IBV_QP_RNR_RETRY)                                                                                        \
  X(IBV_QP_RQ_PSN)                                                                                           \
  X(IBV_QP_MAX_QP_RD_ATOMIC)                                                                                 \
  X(IBV_QP_ALT_PATH)                                                                                         \
  X(IBV_QP_MIN_RNR_TIMER)                                                                                    \
  X(IBV_QP_SQ_PSN)                                                                                           \
  X(IBV_QP_MAX_DEST_RD_ATOMIC)                                                                               \
  X(IBV_QP_PATH_MIG_STATE)                                                                                   \
  X(IBV_QP_CAP)                                                                                              \
  X(IBV_QP_DEST_QPN)                                                                                         \
  X(IBV_QP_RATE_LIMIT)
#define TBV_ABI_ENUM_QP_STATE(X)                                                                             \
  X(IBV_QPS_RESET)                                                                                           \
  X(IBV_QPS_INIT)                                                                                            \
  X(IBV_QPS_RTR)                                                                                             \
  X(IBV_QPS_RTS)                                                                                             \
  X(IBV_QPS_SQD)                                                                                             \
  X(IBV_QPS_SQE)                                                                                             \
  X(IBV_QPS_ERR)                                                                                             \
  X(IBV_QPS_UNKNOWN)
#define TBV_ABI_ENUM_WR_OPCODE(X)                                                                            \
  X(IBV_WR_RDMA_WRITE)                                                                                       \
  X(IBV_WR_RDMA_WRITE_WITH_IMM)                                                                              \
  X(IBV_WR_SEND)                                                                                             \
  X(IBV_WR_SEND_WITH_IMM)                                                                                    \
  X(IBV_WR_RDMA_READ)                                                                                        \
  X(IBV_WR_ATOMIC_CMP_AND_SWP)                                                                               \
  X(IBV_WR_ATOMIC_FETCH_AND_ADD)                                                                             \
  X(IBV_WR_LOCAL_INV)                                                                                        \
  X(IBV_WR_BIND_MW)                                                                                          \
  X(IBV_WR_SEND_WITH_INV)                                                                                    \
  X(IBV_WR_TSO)                                                                                              \
  X(IBV_WR_DRIVER1)                                                                                          \
  X(IBV_WR_ATOMIC_WRITE)
#define TBV_ABI_ENUM_SEND_FLAGS(X)                                                                           \
  X(IBV_SEND_FENCE) X(IBV_SEND_SIGNALED) X(IBV_SEND_SOLICITED) X(IBV_SEND_INLINE) X(IBV_SEND_IP_CSUM)

#define TBV_ABI_ENUMS(E)                                                                                     \
  E(ibv_access_flags, TBV_ABI_ENUM_ACCESS_FLAGS)                                                             \
  E(ibv_mtu, TBV_ABI_ENUM_MTU)                                                                               \
  E(ibv_node_type, TBV_ABI_ENUM_NODE_TYPE)                                                                   \
  E(ibv_port_state, TBV_ABI_ENUM_PORT_STATE)                                                                 \
  E(ibv_qp_attr_mask, TBV_ABI_ENUM_QP_ATTR_MASK)                                                             \
  E(ibv_qp_state, TBV_ABI_ENUM_QP_STATE)                                                                     \
  E(ibv_qp_type, TBV_ABI_ENUM_QP_TYPE)                                                                       \
  E(ibv_send_flags, TBV_ABI_ENUM_SEND_FLAGS)                                                                 \
  E(ibv_transport_type, TBV_ABI_ENUM_TRANSPORT_TYPE)                                                         \
  E(ibv_wc_flags, TBV_ABI_ENUM_WC_FLAGS)                                                                     \
  E(ibv_wc_opcode, TBV_ABI_ENUM_WC_OPCODE)                                                                   \
  E(ibv_wc_status, TBV_ABI_ENUM_WC_STATUS)                                                                   \
  E(ibv_wr_opcode, TBV_ABI_ENUM_WR_OPCODE)
