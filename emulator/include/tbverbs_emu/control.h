/* Control API of the tbverbs emulated verbs fabric.
 *
 * These functions change the run-time state every process on a fabric shares:
 * port state, IPv4 addresses (and so the GID tables), and injected faults. They
 * are exported by libtbverbs_emu.so (version node TBVERBS_EMU_1.0). `fabric` is
 * the path of the fabric description; NULL means $TBVERBS_EMU_FABRIC (or the
 * built-in default fabric). `port` is 1-based. Every function returns 0 on
 * success or a positive errno value; tbemu_last_error() then describes it. */
#ifndef TBVERBS_EMU_CONTROL_H
#define TBVERBS_EMU_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Text of the last failure in this thread ("" if none). */
const char* tbemu_last_error(void);

/* Forgets all run-time state: ports and addresses return to the fabric file's,
 * quirks to the file's, faults (leaked PDs too) are cleared. Only call while no process uses the fabric. */
int tbemu_reset(const char* fabric);

/* IPv4 address of a port, "a.b.c.d/prefix"; it appears as GID ::ffff:a.b.c.d at index 1. */
int tbemu_set_ipv4(const char* fabric, const char* host, const char* device, int port, const char* cidr);
int tbemu_clear_ipv4(const char* fabric, const char* host, const char* device, int port);

/* Administrative port state; the cable's other end then reports PORT_DOWN too. */
int tbemu_set_port_up(const char* fabric, const char* host, const char* device, int port, int up);

/* Fail calls of `verb` (e.g. "ibv_create_qp", "ibv_modify_qp", "ibv_post_send")
 * with errno `err`, starting at the nth matching call (1-based) counted across all
 * processes on `host` (NULL = any host), for `count` calls (0 = every call from then on). */
int tbemu_fault_fail_call(const char* fabric, const char* host, const char* verb, uint64_t nth, int err,
                          uint32_t count);

/* A catastrophic error on QP `qpn`: it goes to ERR at once; its owner raises IBV_EVENT_QP_FATAL and
 * flushes the QP's work requests (IBV_WC_WR_FLUSH_ERR) when it next reads async events, posts or
 * polls. ENOENT if no such QP. */
int tbemu_fault_qp_fatal(const char* fabric, uint32_t qpn);

/* Device removal (removed != 0; a hot unplug, a driver reset): its contexts raise
 * IBV_EVENT_DEVICE_FATAL and move their QPs to ERR, its ports read PORT_DOWN (and the ports cabled
 * to them), ibv_open_device fails with ENODEV. removed == 0 brings it back (as does fault clear);
 * contexts opened before stay dead, as on hardware. */
int tbemu_set_device_removed(const char* fabric, const char* host, const char* device, int removed);

/* Test hook: the calling process takes the receive-queue lock of QP `qpn` and the lock of the QP's
 * receive CQ, stops itself (SIGSTOP) while holding them, and releases them when continued. It
 * plays a peer stopped inside a verb, for testing that no verb waits without bound on it.
 * ENOENT if no such QP. */
int tbemu_hold_qp_locks_and_stop(const char* fabric, uint32_t qpn);

/* Lose everything QP `qpn` sends (one direction of a connection). */
int tbemu_fault_drop_qp(const char* fabric, uint32_t qpn);
/* The same for the next QP created on `host` (NULL = any host). */
int tbemu_fault_drop_next_qp(const char* fabric, const char* host);

/* Delay delivery of every send posted on `host` (NULL = any) by `usec` microseconds. */
int tbemu_fault_delay(const char* fabric, const char* host, uint32_t usec);

/* Apple's driver as ds4 reported it (the quirk empty_rq=kill, for one host): a UC
 * send that meets an empty receive queue is lost and that direction then delivers
 * nothing more (until faults are cleared or the QP is recreated). Applies to sends
 * posted on `host` (NULL = any). */
int tbemu_fault_sticky_loss(const char* fabric, const char* host);

/* Peer death: sends signal `sig` (e.g. SIGKILL) to every process holding a QP on
 * `host`; returns 0 and sets *killed (may be NULL) to how many were signalled. */
int tbemu_kill_host(const char* fabric, const char* host, int sig, int* killed);

/* Protection domains leaked by orphaned processes (Apple: freed only by a reboot):
 * `n` PDs on host:device that belong to nobody and count against the device's
 * max_pd until tbemu_fault_clear or tbemu_reset. While every PD of the device is
 * taken and some are leaked, RTR on that device fails with ENODATA. ENOSPC if
 * fewer than `n` PDs are free. */
int tbemu_fault_leak_pds(const char* fabric, const char* host, const char* device, int n);

/* Sets quirks for every process on the fabric: "name=value[,name=value...]", e.g.
 * "empty_rq=drop,macos=26.2". EINVAL (see tbemu_last_error) for unknown names or values. */
int tbemu_set_quirks(const char* fabric, const char* assignments);
/* The live quirks, "empty_rq=wait macos=26.3 ..."; valid until the next call in this thread. */
const char* tbemu_quirks(const char* fabric);

/* Removes every injected fault (drop flags on existing QPs and leaked PDs included). */
int tbemu_fault_clear(const char* fabric);

/* Human-readable snapshot of the fabric: ports (state, address, GIDs), live QPs,
 * faults. Valid until the next call in this thread; NULL on error. */
const char* tbemu_describe(const char* fabric);

/* Makes QP `qpn` look as if its owner died and another process got its pid (the QP records the
 * owner's start time): nothing may be written into that process any more. */
int tbemu_fault_pid_reused(const char* fabric, uint32_t qpn);

/* Address resolution for the emulated connection manager (the emulator's librdmacm.so.1):
 * which local port reaches IPv4 address `ip` (network byte order) from `host` (NULL = this
 * process's TBVERBS_EMU_HOST). The address is the current one of some port (set-ipv4 and
 * clear-ipv4 apply at once); the local port is that port itself when it is on `host`
 * (loopback), else the port of `host` at the other end of its cable. Fills `device` (`len`
 * bytes), *port (1-based) and `peer_host` (`len` bytes: the host that holds the address).
 * ENOENT: no port has the address; ENETUNREACH: it is on another host that no cable of
 * `host` reaches. */
int tbemu_route_ipv4(const char* fabric, const char* host, uint32_t ip, char* device, size_t len, int* port,
                     char* peer_host);

/* This process's host name on the fabric (TBVERBS_EMU_HOST, or the first host); NULL on error. */
const char* tbemu_host(const char* fabric);

/* Directory holding the fabric's shared state; NULL on error. */
const char* tbemu_state_dir(const char* fabric);

/* Removes this user's emulator state directories (in /dev/shm and /tmp) whose fabric file is
 * gone (or, with no record of it, that were untouched for 10 minutes) and in which no live process
 * has objects; with dry_run, only lists them. Returns one line per directory (valid until the next
 * call in this thread) and sets *count. */
const char* tbemu_gc(int dry_run, int* count);

/* tbemu_gc, also counting every state directory whose fabric file lies under the directory `under`
 * as gone (a test tree's clean-up: its fabric files stay, but it is done with their state). */
const char* tbemu_gc_under(const char* under, int dry_run, int* count);

/* Number of QPs currently held on a device, counted across live processes. */
int tbemu_qp_count(const char* fabric, const char* host, const char* device);

#ifdef __cplusplus
}
#endif

#endif
