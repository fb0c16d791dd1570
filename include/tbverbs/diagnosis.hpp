/// @file diagnosis.hpp
/// The diagnosis catalogue: one table keyed by (platform, step, symbolic errno or
/// work-completion status, error kind), built from the field reports in `docs/field-reports.md`
/// (the row numbers below are that page's section 1 rows, each with its public source).
///
/// Error numbers are matched through the `<cerrno>` names only, never through numbers copied
/// from logs: ENODATA is 96 on macOS and 61 on Linux, where 96 is EPFNOSUPPORT; ETIMEDOUT is 60
/// on macOS, where Linux's 60 is ENOSTR. Because the table is compiled on the platform that
/// runs it, `ENODATA` in a row always means that platform's ENODATA.
#pragma once

#include "error.hpp"

#include <cerrno>
#include <cstddef>
#include <string_view>

TBVERBS_NAMESPACE_BEGIN


/// One row of the catalogue. Fields left at their wildcard match anything; the first row that
/// matches an Error wins, so specific rows come before general ones (a unit test checks that no
/// row is shadowed by an earlier one).
struct DiagnosisRule {
  Platform platform = Platform::any;  ///< Provider family, or any.
  Step step = Step::any;              ///< Failed step, or any.
  int sys_errno = -1;                 ///< errno (a `<cerrno>` name), 0 for "none", -1 for any.
  ErrorKind kind{};                   ///< Error kind, or the zero value `ErrorKind{}` for any.
  int wc_status = -1;                 ///< Work-completion status (a `wc::` name), or -1 for any.
  std::string_view detail_contains{}; ///< A `fact::` that Error::detail must contain, or empty.
  Diagnosis diagnosis;                ///< What the rule says.
};

namespace detail {
/// The catalogue's texts, one per cause; several rows may share one (same id, same words).
namespace diag {

// ---- loading the library -----------------------------------------------------------------

inline constexpr Diagnosis library_missing_macos{
    "library-not-found-macos",
    "librdma.dylib could not be loaded: RDMA over Thunderbolt needs macOS 26.2+ (librdma.dylib), "
    "or TBVERBS_LIBRARY names a file that does not exist.",
    "RDMA over Thunderbolt needs macOS 26.2+ (librdma.dylib): check `sw_vers` (26.2 or later on "
    "every node, the same build everywhere) and `ls -l /usr/lib/librdma.dylib`; unset "
    "`TBVERBS_LIBRARY` or point it at an existing file."};

inline constexpr Diagnosis library_missing_linux{
    "library-not-found-linux",
    "libibverbs.so.1 could not be loaded: rdma-core's verbs library is not installed, or "
    "TBVERBS_LIBRARY names a file that does not exist.",
    "install rdma-core: `sudo apt-get install libibverbs1 ibverbs-providers` (Fedora/RHEL: "
    "`sudo dnf install libibverbs`); check with `ldconfig -p | grep libibverbs`; unset "
    "`TBVERBS_LIBRARY` or point it at an existing file."};

inline constexpr Diagnosis library_missing{
    "library-not-found",
    "No verbs library could be loaded from the explicit path, TBVERBS_LIBRARY or the platform "
    "defaults.",
    "macOS: RDMA over Thunderbolt needs macOS 26.2+ (librdma.dylib; check `sw_vers`). Linux: "
    "install rdma-core: `sudo apt-get install libibverbs1 ibverbs-providers`. Or set "
    "`TBVERBS_LIBRARY=/path/to/the/library`."};

inline constexpr Diagnosis symbol_missing_macos{
    "symbol-missing-macos",
    "librdma.dylib loaded but lacks a required ibv_* function: the macOS build predates 26.2, or "
    "TBVERBS_LIBRARY points at a library that is not Apple's verbs library.",
    "Update every node to macOS 26.2 or later with the same build (`sw_vers`); unset "
    "`TBVERBS_LIBRARY`; check `nm -gU /usr/lib/librdma.dylib | grep <symbol>` where the file "
    "exists."};

inline constexpr Diagnosis symbol_missing_linux{
    "symbol-missing-linux",
    "The loaded library lacks a required ibv_* function at version IBVERBS_1.1: it is not "
    "rdma-core's libibverbs.so.1 (or a very old one), or TBVERBS_LIBRARY points elsewhere.",
    "install rdma-core: `sudo apt-get install libibverbs1 ibverbs-providers`; check "
    "`objdump -T <library> | grep <symbol>`; unset `TBVERBS_LIBRARY`."};

inline constexpr Diagnosis symbol_missing{
    "symbol-missing",
    "The verbs library loaded but lacks a required ibv_* function, so it is too old or not a "
    "verbs library.",
    "macOS: update to 26.2 or later (`sw_vers`). Linux: install rdma-core: `sudo apt-get install "
    "libibverbs1 ibverbs-providers`. Unset `TBVERBS_LIBRARY` if it is set."};

// ---- devices (rows 1, 2) -------------------------------------------------------------------

inline constexpr Diagnosis no_device_rdma_disabled{
    "no-device-rdma-disabled",
    "RDMA disabled (rdma_ctl): `rdma_ctl status` says disabled, so librdma.dylib loads and every "
    "symbol resolves but the device list is empty.",
    "Boot into Recovery → Utilities → Terminal → `rdma_ctl enable` → reboot (it cannot be done "
    "remotely, even with sudo); then `rdma_ctl status` prints enabled and `ibv_devices` lists "
    "rdma_enN. Do the same on every peer: a port is active only when both ends have RDMA enabled."};

inline constexpr Diagnosis no_device_not_tb5{
    "no-device-not-thunderbolt5",
    "Not Thunderbolt 5: RDMA over Thunderbolt needs Thunderbolt 5 at both ends and a TB5 cable; on "
    "Thunderbolt 4 the device list stays empty for good.",
    "Check `system_profiler SPThunderboltDataType | grep Speed`: Thunderbolt 5 shows 80 Gb/s, "
    "40 Gb/s means use TCP (a socket backend) instead. On a Mac Studio, do not use the TB5 port "
    "next to the Ethernet port."};

inline constexpr Diagnosis no_device_macos{
    "no-device-macos",
    "librdma.dylib loaded but lists no device: RDMA disabled (rdma_ctl) on this Mac, or it is not "
    "Thunderbolt 5 (on Thunderbolt 4 this is the permanent state).",
    "Run `rdma_ctl status`. If disabled: boot into Recovery → Terminal → `rdma_ctl enable` → "
    "reboot. If enabled: `system_profiler SPThunderboltDataType | grep Speed` must show 80 Gb/s "
    "(Thunderbolt 5); 40 Gb/s means use TCP."};

inline constexpr Diagnosis no_device_no_kernel_rdma{
    "no-device-no-kernel-rdma",
    "The kernel has no RDMA support: ibv_get_device_list failed with ENOSYS (ib_uverbs not loaded, "
    "CONFIG_INFINIBAND off, or a container or VM without /dev/infiniband).",
    "`sudo modprobe ib_uverbs` plus the NIC's driver (e.g. `sudo modprobe mlx5_ib`; soft-RoCE: "
    "`sudo modprobe rdma_rxe && sudo rdma link add rxe0 type rxe netdev eth0`); check "
    "`ls /dev/infiniband`, `rdma link` and `ibv_devices`. In a container pass "
    "`--device=/dev/infiniband`."};

inline constexpr Diagnosis no_device_linux{
    "no-device-linux",
    "rdma-core loaded but lists no RDMA device: no RDMA NIC, its kernel driver or its user-space "
    "provider is missing, or /dev/infiniband is not visible (containers).",
    "Check `ibv_devices`, `rdma link` and `ls /dev/infiniband`; load the driver "
    "(`sudo modprobe ib_uverbs mlx5_ib`); install the providers (`sudo apt-get install "
    "ibverbs-providers`); in a container pass `--device=/dev/infiniband`."};

inline constexpr Diagnosis no_device{
    "no-device", "The verbs library loaded but lists no RDMA device.",
    "macOS: `rdma_ctl status` (enable it from Recovery with `rdma_ctl enable`) and "
    "`system_profiler SPThunderboltDataType | grep Speed` (Thunderbolt 5 shows 80 Gb/s). Linux: "
    "`ibv_devices`, `rdma link`, `ls /dev/infiniband`, `sudo modprobe ib_uverbs`."};

inline constexpr Diagnosis device_not_found_macos{
    "device-not-found-macos",
    "No device has the configured name (the error lists the devices that exist): the configured "
    "rdma_enN is stale. rdma_enN pairs with the interface enN, and the names change after "
    "re-cabling or a reboot.",
    "List the devices with `ibv_devices` and map them to ports with "
    "`networksetup -listallhardwareports`; fix the device file or `TBVERBS_DEVICE`."};

inline constexpr Diagnosis device_not_found{
    "device-not-found",
    "No device has the configured name (the error lists the devices that exist).",
    "List the devices with `ibv_devices` (Linux also `rdma link`); fix the configured name or "
    "`TBVERBS_DEVICE`."};

inline constexpr Diagnosis open_device_permission{
    "open-device-permission", "The process may not open /dev/infiniband/uverbsN.",
    "Check `ls -l /dev/infiniband`; run as a user with access (often the `rdma` group) or fix the "
    "udev rule; in a container pass `--device=/dev/infiniband`."};

// ---- port and protection domain (row 3) --------------------------------------------------

inline constexpr Diagnosis port_down_macos{
    "port-not-active-macos",
    "The Thunderbolt port is not PORT_ACTIVE: the peer has no RDMA enabled, the cable is out, the "
    "Thunderbolt Bridge holds the interface, or a node slept (Thunderbolt has no Wake-on-LAN).",
    "`ibv_devinfo -d rdma_enN | grep state` must show PORT_ACTIVE (4) on both ends: enable RDMA "
    "on the peer (`rdma_ctl status`), check the cable, `sudo ifconfig bridge0 down`, and disable "
    "sleep (`sudo pmset -a sleep 0`)."};

inline constexpr Diagnosis alloc_pd_port_down{
    "alloc-pd-port-down",
    "Apple's driver refuses a protection domain when the port is PORT_DOWN (peer not RDMA-enabled, "
    "no cable, Thunderbolt Bridge active); it was also seen after many init/teardown cycles.",
    "`ibv_devinfo -d rdma_enN | grep state` must show PORT_ACTIVE (4) on both ends: enable RDMA on "
    "the peer (`rdma_ctl status`), re-seat the cable, `sudo ifconfig bridge0 down`. If both ports "
    "are active and this follows many init/teardown cycles, reboot."};

inline constexpr Diagnosis port_down_linux{
    "port-not-active-linux",
    "The port is not PORT_ACTIVE: the link is down (cable, switch), the RoCE netdev is down, or no "
    "InfiniBand subnet manager runs.",
    "Check `ibv_devinfo -d <dev> | grep state` and `rdma link show`; `sudo ip link set <netdev> "
    "up`; InfiniBand: `sudo systemctl start opensm`."};

inline constexpr Diagnosis no_subnet_manager{
    "infiniband-no-subnet-manager",
    "No subnet manager: an InfiniBand port gets its LID from the subnet manager, and without one it "
    "stays in PORT_INIT with LID 0, so nothing can be addressed to it (RTR is refused).",
    "Start a subnet manager on one node of the fabric (`sudo systemctl start opensm`, or `sudo "
    "opensm -B`; managed switches run their own), then check that `ibstat` shows State: Active "
    "and a non-zero Base lid on every port (`ibv_devinfo | grep -E 'state|port_lid'`)."};

inline constexpr Diagnosis port_down{
    "port-not-active", "The port is not PORT_ACTIVE, so PDs, QPs and connections on it fail.",
    "`ibv_devinfo -d <dev> | grep state` must show PORT_ACTIVE (4) on both ends; check the cable "
    "and that the peer has RDMA enabled."};

// ---- memory registration and CQs (rows 4, 5, 6) -------------------------------------------

inline constexpr Diagnosis memlock{
    "memlock-limit",
    "RLIMIT_MEMLOCK is too small (often 64 KiB or 8 MiB): registering memory and creating queues "
    "pins pages.",
    "`ulimit -l unlimited` in the launching shell; persistently `* - memlock unlimited` in "
    "/etc/security/limits.conf (then log in again), `LimitMEMLOCK=infinity` for systemd units; "
    "containers: `--ulimit memlock=-1 --cap-add=IPC_LOCK`. Check with `ulimit -l`."};

inline constexpr Diagnosis reg_mr_too_large{
    "reg-mr-exceeds-max-mr-size",
    "The region is longer than the device's max_mr_size: Apple's driver reports 16,384,000 bytes "
    "(0xfa0000) per MR and refuses longer registrations with EINVAL.",
    "Register regions of at most max_mr_size (`ibv_devinfo -v | grep max_mr_size`; 16,384,000 "
    "bytes on Thunderbolt): serve a larger buffer as several MRs, each SGE inside one of them "
    "(tbverbs' chunked registration does this), or stage it through bounded registered buffers. "
    "Keep the MR count within max_mr (about 100 per device on Thunderbolt)."};

inline constexpr Diagnosis reg_mr_access_refused{
    "reg-mr-access-refused",
    "The registration was refused for its access flags: Apple advises LOCAL_WRITE only (TN3205), "
    "yet LOCAL_WRITE-only registrations were refused on hardware (llama.cpp) while JACCL and ds4 "
    "register LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE; which set a Mac accepts differs.",
    "Try the other access set: LOCAL_WRITE alone, else LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE "
    "(tbverbs falls back from one to the other on refusal); on rdma-core, REMOTE_WRITE or "
    "REMOTE_ATOMIC need LOCAL_WRITE too."};

inline constexpr Diagnosis reg_mr_einval_macos{
    "reg-mr-einval-macos",
    "Apple's driver refused the registration with EINVAL: either its length is above max_mr_size "
    "(16,384,000 bytes per MR on Thunderbolt), or its access flags are the set this Mac refuses "
    "(TN3205 advises LOCAL_WRITE only; llama.cpp saw LOCAL_WRITE-only refused on hardware).",
    "Register regions of at most max_mr_size (`ibv_devinfo -v | grep max_mr_size`), several MRs "
    "for a larger buffer (tbverbs' chunked registration); if the length is within it, try the "
    "other access set (LOCAL_WRITE alone, or LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE). Buffers "
    "must be page-aligned."};

inline constexpr Diagnosis reg_mr_macos{
    "reg-mr-macos",
    "Apple's driver refused the registration: its reported ceiling is about 100 MRs per device "
    "across the processes of a host (512 KB MRs, macOS 26.3), each MR at most max_mr_size "
    "(16,384,000 bytes), and buffers must be page-aligned (IOMMU).",
    "Budget the MRs a job needs before it starts and keep them well below 100 per device; register "
    "page-aligned memory (tbverbs' AlignedBuffer, or `posix_memalign` with `getpagesize()`) in "
    "regions of at most max_mr_size (tbverbs' chunked registration); deregister regions that are "
    "no longer used, and look for orphaned processes holding MRs (`ps -axo pid,ppid,command | awk "
    "'$2==1'`)."};

inline constexpr Diagnosis reg_mr_efault{
    "reg-mr-bad-address",
    "The buffer range is not mapped in this process (a bad address, or a length beyond the "
    "allocation).",
    "Register only memory this process allocated, with its exact length, and keep it alive until "
    "the MR is deregistered."};

inline constexpr Diagnosis reg_mr_einval{
    "reg-mr-einval",
    "The access flags or the range were refused: REMOTE_WRITE or REMOTE_ATOMIC without "
    "LOCAL_WRITE, a zero length, or a flag the device does not support.",
    "Use least privilege: LOCAL_WRITE for receive buffers, add REMOTE_WRITE (with LOCAL_WRITE) only "
    "for RDMA-write targets; keep each region within max_mr_size; check the device's capabilities "
    "with `ibv_devinfo -v`."};

inline constexpr Diagnosis channel_unsupported{
    "completion-channel-unsupported",
    "The provider has no working completion channels (ibv_create_comp_channel or "
    "ibv_req_notify_cq refused): Apple's TN3205 says \"all queue pair operations are non-blocking "
    "and the caller must poll\", and no public Apple consumer (JACCL, ds4, llama.cpp) uses "
    "channels.",
    "Poll the CQ instead. tbverbs falls back automatically: CompletionQueue::wait and wait_any poll "
    "(a bounded spin, then yields, then sleeps of at most 1 ms, never past the deadline) and say so "
    "once per process; create CQs with CqWait::poll to skip the attempt (the default on Apple)."};

inline constexpr Diagnosis create_cq_too_large{
    "create-cq-too-large", "The CQ size was refused: cqe is larger than the device's max_cqe.",
    "Clamp cqe to `ibv_query_device().max_cqe` (`ibv_devinfo -v | grep max_cqe`; Apple's example "
    "uses 4095+1). Size the CQ for every outstanding signaled send plus every posted receive: an "
    "overrun loses completions and the poll loop then hangs."};

// ---- queue pairs (rows 7, 8, 9, 10) -------------------------------------------------------

inline constexpr Diagnosis qp_cap_or_orphan{
    "create-qp-ebusy-qp-cap",
    "Apple's driver allows 10 QPs per device (not per context): this would be the 11th, or an "
    "orphaned runner (reparented to PID 1) still holds QPs and wired memory. EBUSY looks transient "
    "but never clears by itself.",
    "Don't retry. Count QPs per device and destroy unused ones; look for orphans with "
    "`ps -axo pid,ppid,command | awk '$2==1'` and kill the stale runner, otherwise reboot. Give "
    "runners a parent-death watchdog."};

inline constexpr Diagnosis rtr_orphan{
    "rtr-ebusy-orphan",
    "An orphaned runner, reparented to PID 1, still holds the QPs and wired memory; its peer "
    "typically reports \"Recv failed errno=2\" while ping and the link look healthy.",
    "Don't retry. `ps -axo pid,ppid,command | awk '$2==1'`, kill the orphan, otherwise reboot; give "
    "runners a parent-death watchdog."};

inline constexpr Diagnosis uc_only{
    "qp-type-uc-only",
    "Apple's Thunderbolt driver is UC-only: RC fails (EOPNOTSUPP 102 at create, ENOTSUP 45 in ds4, "
    "-ENOTSUPP at RTR from Linux's thunderbolt_ibverbs driver) and UD QPs are not exposed.",
    "Use IBV_QPT_UC on Thunderbolt (`QpRecipe::thunderbolt()`); use RC only on rdma-core NICs."};

inline constexpr Diagnosis qp_type_unsupported{
    "create-qp-unsupported",
    "The device does not support the requested QP type or capability (RC and UD over Thunderbolt, "
    "for example).",
    "Check the device with `ibv_devinfo -v`; on Thunderbolt use UC (`QpRecipe::thunderbolt()`)."};

inline constexpr Diagnosis depth_in_frames{
    "depth-in-4k-frames",
    "Apple counts queue depth in 4 KiB frames, not work requests, and may grant less than asked: a "
    "WR of len bytes takes ceil(len/4096) frames, so a queue fills up although create_qp accepted "
    "more WRs (post_recv returned -12 at 63 of 256).",
    "Ask for at most 4095 per queue; read the granted caps back with `ibv_query_qp` (QueuePair "
    "records them) and budget the sum of ceil(len/4096) frames per queue; poll completions before "
    "posting more. If the QP is in ERR, destroy and recreate it."};

inline constexpr Diagnosis create_qp_enomem_linux{
    "create-qp-enomem-linux",
    "Creating the QP needs pinned memory: RLIMIT_MEMLOCK is too small, or max_send_wr/max_recv_wr "
    "exceed the device's max_qp_wr.",
    "`ulimit -l unlimited` (limits.conf `* - memlock unlimited`; containers `--ulimit memlock=-1 "
    "--cap-add=IPC_LOCK`); clamp the caps to `ibv_devinfo -v | grep max_qp_wr`."};

inline constexpr Diagnosis create_qp_einval{
    "create-qp-einval",
    "The QP capabilities or CQs were refused: caps above the device limits (max_qp_wr, max_sge, "
    "max_inline_data; 4095 frames on Thunderbolt), or the CQs belong to another context.",
    "Clamp the caps to `ibv_query_device()` (`ibv_devinfo -v`), ask for max_inline_data 0 on "
    "Thunderbolt, and create the PD, CQs and QP from one context."};

// ---- QP transitions (rows 11-16) ----------------------------------------------------------

inline constexpr Diagnosis rtr_no_ipv4_gid{
    "rtr-einval-no-ipv4-gid",
    "The RTR transition was refused: no IPv4-mapped GID (the Thunderbolt member interface has no "
    "IPv4 address, so only fe80:: GIDs exist and a zero or uninitialised GID was sent), the "
    "sgid_index is not the ::ffff: entry (hard-coded 1 while the entry sits at 2), or the address "
    "sits on bridge0, which does not count.",
    "Give each Thunderbolt interface an IPv4 address, one /30 per cable, on both Macs: `sudo "
    "ifconfig enN inet 10.99.0.1 netmask 255.255.255.252` here and 10.99.0.2 at the other end "
    "(not 169.254/16: macOS routes all of it through one interface), persistently `sudo "
    "networksetup -setmanual \"<service for enN>\" 10.99.0.1 255.255.255.252 \"\"`; take the "
    "Thunderbolt Bridge down (`sudo ifconfig bridge0 down`, or "
    "`networksetup -setnetworkserviceenabled \"Thunderbolt Bridge\" off`); check with "
    "`ibv_devinfo -d rdma_enN -v | grep ffff`. Use the selection's index for the sgid_index (an "
    "IPv4-mapped GID at index 2 routed from index 1 is EINVAL, mlx PR #3389): QpRecipe takes both "
    "from one GidSelection."};

inline constexpr Diagnosis rtr_einval_wrong_index{
    "rtr-einval-gid-wrong-index",
    "The RTR source GID index is not where the advertised IPv4-mapped GID sits: the GID was routed "
    "from a fixed index (1) while the ::ffff: entry is at index 2 (mlx PR #3389: fails once a "
    "third node joins).",
    "Use the index of the selection the advertised GID came from, never a fixed one: tbverbs' "
    "QpRecipe reads both from one GidSelection, so they agree by construction; check the table "
    "with `ibv_devinfo -d rdma_enN -v | grep GID`."};

inline constexpr Diagnosis rtr_einval_roce{
    "rtr-einval-rdma-core",
    "The RTR transition was refused: RoCE needs a GRH (is_global or sgid_index not set), or "
    "path_mtu > active_mtu of the port, or the attribute mask has fields the QP type lacks.",
    "Set ah_attr.is_global = 1 and grh.sgid_index from the selected RoCE v2 GID (`show_gids`), and "
    "path_mtu <= active_mtu (`ibv_devinfo -d <dev> | grep active_mtu`); the rdma-core RC preset "
    "does both."};

inline constexpr Diagnosis rtr_einval{
    "rtr-einval",
    "The RTR attributes were refused: an unusable source or destination GID, a path_mtu above the "
    "port's active_mtu, or RC-only attributes (MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER) on a UC QP.",
    "Use the IPv4-mapped / RoCE v2 GID from one GidSelection for sgid_index and the advertised GID "
    "(`ibv_devinfo -d <dev> -v | grep GID`), path_mtu <= active_mtu, and the mask of the QP type."};

inline constexpr Diagnosis rtr_timeout_macos{
    "rtr-etimedout-unreachable-gid",
    "The dgid is unreachable on this cable: GID[0] is the fe80:: of another interface, or the "
    "peer's IPv4 address is on a different cable.",
    "Use the ::ffff: GID of the same cable on both ends, a unique /30 per cable (`sudo ifconfig enN "
    "inet 10.99.0.1 netmask 255.255.255.252`), and check that `route get <peer-ip>` names that "
    "enN."};

inline constexpr Diagnosis rtr_timeout_roce{
    "rtr-etimedout-rdma-core",
    "The destination cannot be resolved: a RoCEv1 or link-local GID was chosen, or the peer's "
    "address is not reachable from this port's netdev.",
    "Choose the RoCE v2 IPv4 GID on both ends (`show_gids`, or `cat "
    "/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<i>`), then check that `ip route get "
    "<peer-ip>` leaves through the port's netdev."};

inline constexpr Diagnosis rtr_timeout{
    "rtr-etimedout",
    "The destination GID is not reachable from this port (a link-local GID or an address on "
    "another link was used).",
    "Use the IPv4-mapped (RoCE v2) GID of the same link on both ends and check the route to the "
    "peer (`route get <peer-ip>` / `ip route get <peer-ip>`)."};

inline constexpr Diagnosis rtr_enodata_macos{
    "rtr-enodata-stale-gid",
    "Two causes were reported. The GID table no longer holds what was selected: after sitting idle "
    "or asleep the IPv4 address, its ::ffff: GID or the link was lost (Thunderbolt has no "
    "Wake-on-LAN), or the table is stale or has holes; restarting the application alone does not "
    "help. Or protection domains leaked by orphaned processes exhaust the device (11 per device, "
    "freed only by a reboot).",
    "Look for orphans first: `ps -axo pid,ppid,command | awk '$2==1'` and kill stale runners; if "
    "none is found and it persists, reboot (leaked PDs are freed only then). Otherwise re-query the "
    "GID table at every connect (tbverbs re-selects and revalidates), re-assign the IPv4 address "
    "(`sudo networksetup -setmanual \"<service for enN>\" 10.99.0.1 255.255.255.252 \"\"`, one /30 "
    "per cable), disable "
    "sleep (`sudo pmset -a sleep 0`); re-plug the cable or reboot."};

inline constexpr Diagnosis rtr_enodata{
    "rtr-enodata",
    "The GID entry at sgid_index is gone or empty: the port flapped or the address changed since "
    "the table was read.",
    "Look the GID up by value at every connect instead of caching its index; check the table with "
    "`ibv_devinfo -d <dev> -v | grep GID` (Linux: `show_gids`)."};

inline constexpr Diagnosis init_einval{
    "init-einval",
    "The INIT attributes were refused: the port number does not exist, pkey_index is out of range, "
    "or the access flags ask for something the QP type lacks (remote read or atomics on UC).",
    "Use a port listed by `ibv_devinfo` (port 1 on Thunderbolt), pkey_index 0, and at most "
    "LOCAL_WRITE | REMOTE_WRITE on UC."};

inline constexpr Diagnosis rts_einval{
    "rts-einval",
    "The RTS attributes were refused: RC-only fields (TIMEOUT, RETRY_CNT, RNR_RETRY, "
    "MAX_QP_RD_ATOMIC) on a UC QP, missing on an RC QP, or an sq_psn wider than 24 bits.",
    "UC: IBV_QP_STATE | IBV_QP_SQ_PSN only; RC: add TIMEOUT, RETRY_CNT, RNR_RETRY (7) and "
    "MAX_QP_RD_ATOMIC; mask PSNs with 0xffffff (QpRecipe does all of this)."};

// ---- posting and polling (rows 6, 10, 19, 20, 24) -----------------------------------------

inline constexpr Diagnosis post_enomem_linux{
    "post-enomem-queue-full",
    "The send or receive queue is full (more outstanding WRs than the granted max_send_wr / "
    "max_recv_wr), or the QP is in ERR and refuses posts.",
    "Poll completions before posting more and keep outstanding WRs within the granted caps; if the "
    "QP is in ERR (flush errors seen), destroy and recreate it."};

inline constexpr Diagnosis post_einval{
    "post-einval",
    "The work request was refused: num_sge above the granted max_send_sge/max_recv_sge, an opcode "
    "the QP lacks (Thunderbolt: IBV_WR_SEND only; UC: no RDMA READ or atomics), or the QP is not "
    "in RTS (send) / RTR (receive).",
    "Stay within the caps the QP was granted, post IBV_WR_SEND on Thunderbolt, and post only on a "
    "connected QueuePair."};

inline constexpr Diagnosis closed_handle{
    "handle-closed",
    "The call was made on a CompletionQueue or QueuePair after close() or after it was moved from; "
    "no verb was called (the handle points at an inert stand-in, never at freed memory).",
    "Keep the handle alive and unmoved while it is used; after close() or a move, use the object it "
    "was moved into."};

inline constexpr Diagnosis inline_too_large{
    "post-inline-too-large",
    "A work request asked for IBV_SEND_INLINE with more bytes than the QP's granted "
    "max_inline_data (0 unless the recipe asked for more; Apple's driver documents none).",
    "Ask for max_inline_data in the recipe's capacities and check QueuePair::capacities(), or post "
    "the payload from a registered buffer without the inline flag."};

inline constexpr Diagnosis poll_failed{
    "poll-cq-failed",
    "ibv_poll_cq returned a negative value: the CQ overran (more completions than cqe) or the "
    "device failed; completions were lost.",
    "Size the CQ for every outstanding signaled send plus every posted receive (at most max_cqe, "
    "`ibv_devinfo -v | grep max_cqe`); destroy and recreate the CQ and its QPs."};

inline constexpr Diagnosis wc_len_frames{
    "wc-loc-len-frame-mismatch",
    "Sender and receiver posted different numbers of 4 KiB frames: Apple requires a receive to span "
    "exactly as many frames as the matching send (JACCL posted two receives for one send).",
    "Pair every send with one receive of identical size, in whole 4 KiB frames on both sides."};

inline constexpr Diagnosis wc_len{
    "wc-loc-len", "The message was longer than the receive buffer posted for it (send/recv size mismatch).",
    "Post receives at least as large as the largest send (on Thunderbolt: identical sizes)."};

inline constexpr Diagnosis wc_prot{
    "wc-loc-prot-lkey",
    "A scatter/gather entry's lkey does not cover its buffer: the MR was deregistered, the range "
    "lies outside the registration, or the lkey belongs to another PD.",
    "Use the lkey of the MR that contains [addr, addr + length), from the same PD as the QP; keep "
    "MRs registered until every WR that uses them has completed; receive buffers need "
    "LOCAL_WRITE."};

inline constexpr Diagnosis wc_flush{
    "wc-wr-flush",
    "The QP is in ERR and flushed every outstanding work request: expected during teardown, "
    "otherwise the echo of an earlier real error.",
    "During teardown ignore flushes. Otherwise report the first non-flush error, never post to a "
    "QP in ERR: destroy and recreate it (new QPN and PSN) and exchange endpoints again."};

inline constexpr Diagnosis wc_retry{
    "wc-retry-exceeded",
    "The transport retry counter was exceeded: wrong GID type (a RoCEv1 or link-local GID was "
    "chosen), or the peer is unreachable, dead or its QP is in ERR.",
    "Choose the RoCE v2 IPv4 GID (`show_gids`, or `cat "
    "/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<i>`), check that the peer is alive, then "
    "destroy and recreate the QP."};

inline constexpr Diagnosis wc_rnr{
    "wc-rnr-retry-exceeded",
    "A send reached the peer before it had posted a receive, and rnr_retry (default 0) ran out; "
    "the QP is now in ERR.",
    "Set rnr_retry = 7 (retry without limit; the RC preset does) and pre-post receives before the "
    "peer sends (the \"receives posted\" barrier); recreate the QP."};

inline constexpr Diagnosis wc_rem_access{
    "wc-rem-access",
    "The peer refused an RDMA operation: wrong rkey, an address outside the remote MR, or the "
    "remote MR lacks REMOTE_WRITE / REMOTE_READ.",
    "Send rkey and address with the endpoint and register the target with REMOTE_WRITE | "
    "LOCAL_WRITE. On Thunderbolt use SEND/RECV: RDMA WRITE is accepted but never executes."};

inline constexpr Diagnosis wc_qp_op{
    "wc-loc-qp-op",
    "The work request is not valid for this QP: an opcode the QP type lacks (RDMA READ or atomics "
    "on UC), too many SGEs, or inline data above max_inline_data.",
    "On Thunderbolt post IBV_WR_SEND only with max_inline_data 0; stay within the granted caps."};

inline constexpr Diagnosis wc_failed{
    "wc-error", "A work completion failed; the QP is now in ERR and later work requests flush.",
    "Report the first failure by its status name, destroy and recreate the QP and exchange "
    "endpoints again; never trust the opcode of a failed completion."};

// ---- deadlines, peers, side channel (rows 17, 19, 21, 25, 26) ------------------------------

inline constexpr Diagnosis wait_timeout_macos{
    "wait-timeout-thunderbolt",
    "No completion before the deadline. Over Apple's UC transport a dead or SIGSTOPped peer raises "
    "no error CQE and no event, a send that met no posted receive kills that direction for good, "
    "and a receive whose frame count differs from its send never completes.",
    "Check the peer over the side channel (a closed socket is peer_lost); post receives before the "
    "peer sends (the \"receives posted\" barrier); pair sends and receives of identical size; then "
    "destroy and recreate the QP with a new PSN. In-flight data is lost: do not retry in place."};

inline constexpr Diagnosis wait_timeout{
    "wait-timeout",
    "No completion before the deadline: the peer may be slow, stopped or dead, or nothing was "
    "posted that could complete.",
    "Check the peer over the side channel, check that every send has a posted receive, raise the "
    "deadline if the peer is only slow; otherwise recreate the QP."};

inline constexpr Diagnosis warmup_failed{
    "link-warmup-failed",
    "The full-size warm-up did not get through: one direction of a fresh UC QP can drop everything "
    "(seen right after a working run and after role swaps), while small messages pass.",
    "Destroy and recreate the QPs and CQs on both sides (new QPN), use a new PSN, exchange "
    "endpoints again and repeat the warm-up, a bounded number of times."};

inline constexpr Diagnosis side_channel_route_macos{
    "side-channel-unreachable-macos",
    "The TCP side channel cannot reach the peer: macOS keeps one route for 169.254/16 through the "
    "primary interface (Wi-Fi), or a firewall blocks the port, or the address is wrong.",
    "Give each cable its own subnet (`sudo ifconfig en2 inet 192.168.10.1 netmask "
    "255.255.255.252`), route the peer through it (`sudo route change 192.168.10.2 -interface "
    "en2`), check `route get <peer-ip>`, and allow the port in the firewall."};

inline constexpr Diagnosis side_channel_unreachable{
    "side-channel-unreachable",
    "The TCP side channel cannot reach the peer: no route to its address (on macOS one route for "
    "169.254/16 goes through the primary interface), a firewall drops the port, or the address is "
    "wrong.",
    "Check the route with `route get <peer-ip>` (macOS; fix with `sudo route change <peer-ip> "
    "-interface enN`) or `ip route get <peer-ip>` (Linux), give each cable its own subnet, and "
    "allow the port in the firewall (`nc -vz <host> <port>`)."};

inline constexpr Diagnosis side_channel_refused{
    "side-channel-refused",
    "Nothing listens at the coordinator's address and port (not started yet, or a wrong port).",
    "Start rank 0 first or retry until the deadline; check that all ranks use the same address and "
    "port (`nc -vz <host> <port>`)."};

inline constexpr Diagnosis timeout{
    "timeout",
    "A deadline passed; the peer may still be alive (a peer whose side channel closed is reported "
    "as peer_lost instead).",
    "Raise the deadline if the peer is only slow, otherwise read the peer's log. In-flight data is "
    "lost: recreate the connection instead of retrying in place."};

inline constexpr Diagnosis peer_lost{
    "peer-lost",
    "The peer closed its side channel (recv() returned 0 or POLLHUP): its process exited, crashed "
    "or was killed. A stale errno (such as ENOENT) after such a recv() means nothing.",
    "Read the first failing rank's own error, which has the real cause, and restart the job; "
    "in-flight data is lost."};

inline constexpr Diagnosis peer_aborted{
    "peer-aborted",
    "Another rank of the job gave up and sent its reason over the side channel (the detail names "
    "that rank and quotes it; the error kind in parentheses is that rank's claim, not a condition "
    "of this host).",
    "Read that rank's own output, which has the full error and its remedy, fix it there and restart "
    "the job; in-flight data is lost."};

inline constexpr Diagnosis transition_port_down{
    "transition-port-down",
    "The port left ACTIVE while the queue pair was being connected (a cable pulled, the other end "
    "rebooted or its RDMA disabled): the transition failed because the link went down, not because "
    "of the GID or the peer's address.",
    "Check the cable and the other host (ibv_devinfo shows PORT_ACTIVE on both ends when the link is "
    "back), then set the connection up again."};

inline constexpr Diagnosis call_mismatch{
    "call-mismatch",
    "The ranks made different calls: another collective, element type, op, element count or root, "
    "a send whose recv differs, or a call one rank made and another did not (the detail names both "
    "calls). Every call's identity is compared before any user buffer is written, so no buffer was "
    "written by this call.",
    "Make every rank call the same collectives with the same arguments in the same order (send and "
    "recv in matching pairs); set TBVERBS_ALGORITHM alike on every rank. The communicator is broken: "
    "destroy it and connect a new one."};

// ---- GIDs (rows 11, 12, 15; section 3) -----------------------------------------------------

inline constexpr Diagnosis no_ipv4_gid_macos{
    "no-ipv4-gid-macos",
    "The port's GID table has only fe80:: entries: the Thunderbolt interface enN has no IPv4 "
    "address (or the address is on bridge0, or DHCP/APIPA has not assigned one yet).",
    "One /30 per cable: `sudo ifconfig enN inet 10.99.0.1 netmask 255.255.255.252` here and "
    "10.99.0.2 at the other end (not 169.254/16: macOS routes all of it through one interface), "
    "persistently `sudo networksetup -setmanual \"<service for enN>\" 10.99.0.1 255.255.255.252 "
    "\"\"` (names: `networksetup -listallnetworkservices`); `sudo ifconfig bridge0 down`; check "
    "with `ibv_devinfo -d rdma_enN -v | grep ffff`."};

inline constexpr Diagnosis no_ipv4_gid_linux{
    "no-ipv4-gid-linux", "No GID carries an IPv4 address: the port's netdev has no IPv4 address.",
    "`sudo ip addr add 10.0.0.1/24 dev <netdev>`; check with `show_gids` or `cat "
    "/sys/class/infiniband/<dev>/ports/1/gids/<i>`."};

inline constexpr Diagnosis no_ipv4_gid{
    "no-ipv4-gid", "The port's GID table has no IPv4-mapped entry: its interface has no IPv4 address.",
    "Assign an IPv4 address to the interface (macOS: one /30 per cable, `sudo ifconfig enN inet "
    "10.99.0.1 netmask 255.255.255.252`; Linux: `sudo ip addr add 10.0.0.1/24 dev <netdev>`) and check "
    "`ibv_devinfo -d <dev> -v | grep ffff`."};

inline constexpr Diagnosis gid_stale_macos{
    "gid-stale-macos",
    "The selected GID entry changed since the table was read: the APIPA/DHCP address went away or "
    "came back different (for minutes after a link renegotiation), so the old GID would fail at "
    "RTR.",
    "Re-select from a fresh table at every connect (tbverbs does) and use a static address per "
    "cable, a /30: `sudo networksetup -setmanual \"<service for enN>\" 10.99.0.1 255.255.255.252 \"\"`."};

inline constexpr Diagnosis gid_stale{
    "gid-stale",
    "The selected GID entry changed since the table was read (port flap, address change, GID "
    "change event).",
    "Re-read the table and select by value at every connect; never cache a GID index across "
    "connects."};

inline constexpr Diagnosis gid_not_found{
    "gid-not-found",
    "No GID carries the requested IPv4 address: that address is not on this device's interface, or "
    "its GID has not appeared yet.",
    "Use the device whose interface holds the address (`ifconfig` / `ip addr`) or bind the side "
    "channel to the RDMA interface's address; check `ibv_devinfo -d <dev> -v | grep ffff` "
    "(Linux: `show_gids`)."};

inline constexpr Diagnosis gid_index_invalid{
    "gid-index-invalid",
    "The GID index given by the operator (TBVERBS_GID_INDEX) is malformed, out of range, empty, not "
    "an IPv4-mapped entry on Apple's driver, or another address than the bootstrap socket's.",
    "Unset `TBVERBS_GID_INDEX` to let tbverbs select, or use an index that "
    "`ibv_devinfo -d <dev> -v | grep GID` shows as ::ffff:<IPv4>; with several NICs name each one "
    "(`TBVERBS_GID_INDEX=mlx5_0:3,mlx5_1:3`)."};

// ---- endpoints and profile limits ----------------------------------------------------------

inline constexpr Diagnosis bad_frame{
    "bad-frame",
    "A peer's frame (an endpoint or a side-channel message) is truncated, corrupt, foreign (wrong "
    "magic or job token: another program or job on that address) or from a newer tbverbs version.",
    "Run the same tbverbs version on every rank, give each job its own coordinator port and job "
    "token, and check that the side-channel address reaches this job's peer."};

inline constexpr Diagnosis roce_version_mismatch{
    "roce-version-mismatch",
    "The two ends chose GIDs of different RoCE versions (one RoCE v1, one RoCE v2): such a QP "
    "connects but carries no traffic (RC ends in IBV_WC_RETRY_EXC_ERR).",
    "Use the RoCE v2 entry on both ends: unset `TBVERBS_GID_INDEX` and `TBVERBS_ROCE_VERSION` "
    "(tbverbs then selects RoCE v2), or give each node the index `show_gids` (or `cat "
    "/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<i>`) shows as RoCE v2."};

inline constexpr Diagnosis incompatible_peer{
    "incompatible-peer",
    "The peer's endpoint does not fit the local recipe: QP type, MTU or capabilities differ.",
    "Use the same QpRecipe preset on both ends (`QpRecipe::thunderbolt()` between Macs)."};

inline constexpr Diagnosis result_mismatch{
    "result-mismatch",
    "A verified result differs from the expected value: a completion was lost or misattributed (a "
    "failed wc.status ignored, an overrun CQ, a receive paired with the wrong send), or the ranks "
    "used different inputs.",
    "Check every wc.status (tbverbs does), size the CQ for everything outstanding, pair each "
    "receive with exactly one send of the same size, then rerun with identical inputs on all "
    "ranks; recreate the links if it persists."};

inline constexpr Diagnosis capacity{
    "capacity-exceeded",
    "The request exceeds a driver or recipe capacity (on Thunderbolt: queue depth at most 4095 "
    "frames of 4 KiB, 10 QPs per device, about 100 MRs per device of at most 16,384,000 bytes "
    "each).",
    "Lower the requested depths or counts; read the granted caps back from the QueuePair, keep "
    "each memory region within max_mr_size and the MR count within max_mr, budget QPs with "
    "usable_qps() (10 per device on Thunderbolt), and destroy QPs that are no longer used."};

inline constexpr Diagnosis unsupported{
    "unsupported",
    "The provider lacks the feature: an optional verbs function is missing, or the device profile "
    "does not allow the operation.",
    "Check the device's capabilities with `ibv_devinfo -v`; on Thunderbolt use SEND/RECV over UC "
    "(`QpRecipe::thunderbolt()`)."};

inline constexpr Diagnosis unsupported_macos{
    "unsupported-thunderbolt",
    "Apple's Thunderbolt driver supports UC QPs with SEND/RECV only: no RC or UD, no RDMA READ, "
    "atomics or immediate data; RDMA WRITE is accepted but never executes.",
    "Use SEND/RECV over UC (`QpRecipe::thunderbolt()`) and build one-sided patterns from two-sided "
    "messages."};

} // namespace diag

/// Linux's kernel-internal ENOTSUPP (524), not in `<cerrno>`: the Linux thunderbolt_ibverbs driver
/// returned it from RTR for RC (hellas-perftest). No macOS errno has this value.
inline constexpr int kernel_enotsupp = 524;
} // namespace detail

/// The catalogue rows, most specific first. A row is found by `find_diagnosis`; the keys are the
/// provider family, the failed step, the errno by its `<cerrno>` name, the error kind, the
/// work-completion status and, rarely, a `fact::` in the error's detail.
inline constexpr DiagnosisRule diagnosis_catalogue[] = {
    // clang-format off
    // Loading (section 3 "no verbs device", loader errors).
    {.platform = Platform::apple,     .kind = ErrorKind::library_not_found, .diagnosis = detail::diag::library_missing_macos},
    {.platform = Platform::rdma_core, .kind = ErrorKind::library_not_found, .diagnosis = detail::diag::library_missing_linux},
    {                                 .kind = ErrorKind::library_not_found, .diagnosis = detail::diag::library_missing},
    {.platform = Platform::apple,     .kind = ErrorKind::symbol_missing, .diagnosis = detail::diag::symbol_missing_macos},
    {.platform = Platform::rdma_core, .kind = ErrorKind::symbol_missing, .diagnosis = detail::diag::symbol_missing_linux},
    {                                 .kind = ErrorKind::symbol_missing, .diagnosis = detail::diag::symbol_missing},

    // Row 1: no device. A producer that ran rdma_ctl or system_profiler names the fact.
    {.platform = Platform::apple, .kind = ErrorKind::no_device, .detail_contains = fact::rdma_disabled,    .diagnosis = detail::diag::no_device_rdma_disabled},
    {.platform = Platform::apple, .kind = ErrorKind::no_device, .detail_contains = fact::not_thunderbolt5, .diagnosis = detail::diag::no_device_not_tb5},
    {.platform = Platform::apple, .kind = ErrorKind::no_device, .diagnosis = detail::diag::no_device_macos},
    {.platform = Platform::rdma_core, .step = Step::get_device_list, .sys_errno = ENOSYS, .diagnosis = detail::diag::no_device_no_kernel_rdma},
    {.platform = Platform::rdma_core, .kind = ErrorKind::no_device, .diagnosis = detail::diag::no_device_linux},
    {                                 .kind = ErrorKind::no_device, .diagnosis = detail::diag::no_device},
    // Row 2: the configured name is not found.
    {.platform = Platform::apple, .kind = ErrorKind::device_not_found, .diagnosis = detail::diag::device_not_found_macos},
    {                             .kind = ErrorKind::device_not_found, .diagnosis = detail::diag::device_not_found},
    {.platform = Platform::rdma_core, .step = Step::open_device, .sys_errno = EACCES, .diagnosis = detail::diag::open_device_permission},
    {.platform = Platform::rdma_core, .step = Step::open_device, .sys_errno = EPERM,  .diagnosis = detail::diag::open_device_permission},

    // Row 3 and section 3 "inactive port": PD allocation on a port that is down.
    {.platform = Platform::apple,     .kind = ErrorKind::port_not_active, .diagnosis = detail::diag::port_down_macos},
    {.platform = Platform::rdma_core, .kind = ErrorKind::port_not_active, .detail_contains = fact::port_init, .diagnosis = detail::diag::no_subnet_manager},
    {.platform = Platform::rdma_core, .kind = ErrorKind::port_not_active, .diagnosis = detail::diag::port_down_linux},
    {                                 .kind = ErrorKind::port_not_active, .detail_contains = fact::port_init, .diagnosis = detail::diag::no_subnet_manager},
    {                                 .kind = ErrorKind::port_not_active, .diagnosis = detail::diag::port_down},
    {.platform = Platform::apple, .step = Step::alloc_pd, .diagnosis = detail::diag::alloc_pd_port_down},

    // Rows 4, 5: memory registration.
    {.platform = Platform::rdma_core, .step = Step::reg_mr, .sys_errno = ENOMEM, .diagnosis = detail::diag::memlock},
    // Section 4b: max_mr_size 16,384,000 on Thunderbolt; LOCAL_WRITE-only refused (llama.cpp)
    // against TN3205's LOCAL_WRITE-only advice. The registering code names the cause it knows.
    {                                 .step = Step::reg_mr, .detail_contains = fact::exceeds_max_mr_size, .diagnosis = detail::diag::reg_mr_too_large},
    {                                 .step = Step::reg_mr, .sys_errno = EINVAL, .detail_contains = fact::access_refused, .diagnosis = detail::diag::reg_mr_access_refused},
    {.platform = Platform::apple,     .step = Step::reg_mr, .sys_errno = EINVAL, .diagnosis = detail::diag::reg_mr_einval_macos},
    {.platform = Platform::apple,     .step = Step::reg_mr, .diagnosis = detail::diag::reg_mr_macos},
    {                                 .step = Step::reg_mr, .sys_errno = EFAULT, .diagnosis = detail::diag::reg_mr_efault},
    {                                 .step = Step::reg_mr, .sys_errno = EINVAL, .diagnosis = detail::diag::reg_mr_einval},

    // Section 4b: completion channels (TN3205: "the caller must poll"). EOPNOTSUPP and ENOTSUP
    // are one value on Linux, two on macOS; `unsupported` is a library without the symbols.
    {.step = Step::create_comp_channel, .sys_errno = EOPNOTSUPP, .diagnosis = detail::diag::channel_unsupported},
    {.step = Step::create_comp_channel, .sys_errno = ENOTSUP,    .diagnosis = detail::diag::channel_unsupported},
    {.step = Step::create_comp_channel, .kind = ErrorKind::unsupported, .diagnosis = detail::diag::channel_unsupported},
    {.step = Step::req_notify_cq,       .sys_errno = EOPNOTSUPP, .diagnosis = detail::diag::channel_unsupported},
    {.step = Step::req_notify_cq,       .sys_errno = ENOTSUP,    .diagnosis = detail::diag::channel_unsupported},
    {.step = Step::req_notify_cq,       .kind = ErrorKind::unsupported, .diagnosis = detail::diag::channel_unsupported},
    {.step = Step::get_cq_event,        .kind = ErrorKind::unsupported, .diagnosis = detail::diag::channel_unsupported},
    {.platform = Platform::apple, .step = Step::create_comp_channel, .diagnosis = detail::diag::channel_unsupported},
    {.platform = Platform::apple, .step = Step::req_notify_cq,       .diagnosis = detail::diag::channel_unsupported},

    // Rows 5, 6: completion queues.
    {.platform = Platform::rdma_core, .step = Step::create_cq, .sys_errno = ENOMEM, .diagnosis = detail::diag::memlock},
    {                                 .step = Step::create_cq, .sys_errno = EINVAL, .diagnosis = detail::diag::create_cq_too_large},
    {.platform = Platform::apple,     .step = Step::create_cq, .diagnosis = detail::diag::create_cq_too_large},

    // Rows 7-10: queue pairs. EOPNOTSUPP and ENOTSUP are one value on Linux, two on macOS:
    // one row each, so both spellings match everywhere (on Linux the first row answers).
    {.platform = Platform::apple, .step = Step::create_qp, .sys_errno = EBUSY, .diagnosis = detail::diag::qp_cap_or_orphan},
    {.platform = Platform::apple, .step = Step::create_qp, .kind = ErrorKind::capacity, .diagnosis = detail::diag::qp_cap_or_orphan},
    {.platform = Platform::apple, .step = Step::modify_qp_rtr, .sys_errno = EBUSY, .diagnosis = detail::diag::rtr_orphan},
    {.platform = Platform::apple, .step = Step::create_qp, .sys_errno = EOPNOTSUPP, .diagnosis = detail::diag::uc_only},
    {.platform = Platform::apple, .step = Step::create_qp, .sys_errno = ENOTSUP,    .diagnosis = detail::diag::uc_only},
    {.platform = Platform::apple, .step = Step::create_qp, .kind = ErrorKind::unsupported, .diagnosis = detail::diag::uc_only},
    {.platform = Platform::apple, .step = Step::modify_qp_rtr, .sys_errno = EOPNOTSUPP, .diagnosis = detail::diag::uc_only},
    {.platform = Platform::apple, .step = Step::modify_qp_rtr, .sys_errno = ENOTSUP,    .diagnosis = detail::diag::uc_only},
    {                             .step = Step::modify_qp_rtr, .sys_errno = detail::kernel_enotsupp, .diagnosis = detail::diag::uc_only},
    {.platform = Platform::apple, .step = Step::create_qp, .sys_errno = ENOMEM, .diagnosis = detail::diag::depth_in_frames},
    {.platform = Platform::apple, .step = Step::post_recv, .sys_errno = ENOMEM, .diagnosis = detail::diag::depth_in_frames},
    {.platform = Platform::apple, .step = Step::post_send, .sys_errno = ENOMEM, .diagnosis = detail::diag::depth_in_frames},
    {.platform = Platform::rdma_core, .step = Step::create_qp, .sys_errno = ENOMEM, .diagnosis = detail::diag::create_qp_enomem_linux},
    {                             .step = Step::create_qp, .sys_errno = EINVAL,     .diagnosis = detail::diag::create_qp_einval},
    {                             .step = Step::create_qp, .sys_errno = EOPNOTSUPP, .diagnosis = detail::diag::qp_type_unsupported},
    {                             .step = Step::create_qp, .sys_errno = ENOTSUP,    .diagnosis = detail::diag::qp_type_unsupported},

    // Rows 11-16: the INIT -> RTR -> RTS transitions.
    // InfiniBand (section 4b): a LID of 0 means no subnet manager, whatever errno RTR gave.
    {                                 .step = Step::modify_qp_rtr, .detail_contains = fact::port_left_active, .diagnosis = detail::diag::transition_port_down},
    {                                 .step = Step::modify_qp_rts, .detail_contains = fact::port_left_active, .diagnosis = detail::diag::transition_port_down},
    {                                 .step = Step::modify_qp_rtr, .detail_contains = fact::infiniband_lid_zero, .diagnosis = detail::diag::no_subnet_manager},
    {                                 .step = Step::modify_qp_rtr, .sys_errno = EINVAL, .detail_contains = fact::gid_index_mismatch, .diagnosis = detail::diag::rtr_einval_wrong_index},
    {.platform = Platform::apple,     .step = Step::modify_qp_rtr, .sys_errno = EINVAL,    .diagnosis = detail::diag::rtr_no_ipv4_gid},
    {.platform = Platform::rdma_core, .step = Step::modify_qp_rtr, .sys_errno = EINVAL,    .diagnosis = detail::diag::rtr_einval_roce},
    {                                 .step = Step::modify_qp_rtr, .sys_errno = EINVAL,    .diagnosis = detail::diag::rtr_einval},
    {.platform = Platform::apple,     .step = Step::modify_qp_rtr, .sys_errno = ETIMEDOUT, .diagnosis = detail::diag::rtr_timeout_macos},
    {.platform = Platform::rdma_core, .step = Step::modify_qp_rtr, .sys_errno = ETIMEDOUT, .diagnosis = detail::diag::rtr_timeout_roce},
    {                                 .step = Step::modify_qp_rtr, .sys_errno = ETIMEDOUT, .diagnosis = detail::diag::rtr_timeout},
    {.platform = Platform::apple,     .step = Step::modify_qp_rtr, .sys_errno = ENODATA,   .diagnosis = detail::diag::rtr_enodata_macos},
    {                                 .step = Step::modify_qp_rtr, .sys_errno = ENODATA,   .diagnosis = detail::diag::rtr_enodata},
    {                                 .step = Step::modify_qp_init, .sys_errno = EINVAL,   .diagnosis = detail::diag::init_einval},
    {                                 .step = Step::modify_qp_rts,  .sys_errno = EINVAL,   .diagnosis = detail::diag::rts_einval},

    // Rows 10, 24: posting.
    {.sys_errno = EBADF, .detail_contains = fact::closed_handle, .diagnosis = detail::diag::closed_handle},
    {.kind = ErrorKind::capacity, .detail_contains = fact::inline_too_large, .diagnosis = detail::diag::inline_too_large},
    {.platform = Platform::rdma_core, .step = Step::post_send, .sys_errno = ENOMEM, .diagnosis = detail::diag::post_enomem_linux},
    {.platform = Platform::rdma_core, .step = Step::post_recv, .sys_errno = ENOMEM, .diagnosis = detail::diag::post_enomem_linux},
    {                                 .step = Step::post_send, .sys_errno = EINVAL, .diagnosis = detail::diag::post_einval},
    {                                 .step = Step::post_recv, .sys_errno = EINVAL, .diagnosis = detail::diag::post_einval},

    // Rows 18-20, 23, 24: failed work completions (matched on any platform unless noted).
    {.platform = Platform::apple, .kind = ErrorKind::wc_error, .wc_status = wc::loc_len_err, .diagnosis = detail::diag::wc_len_frames},
    {.kind = ErrorKind::wc_error, .wc_status = wc::loc_len_err,       .diagnosis = detail::diag::wc_len},
    {.kind = ErrorKind::wc_error, .wc_status = wc::loc_prot_err,      .diagnosis = detail::diag::wc_prot},
    {.kind = ErrorKind::wc_error, .wc_status = wc::wr_flush_err,      .diagnosis = detail::diag::wc_flush},
    {.kind = ErrorKind::wc_error, .wc_status = wc::retry_exc_err,     .diagnosis = detail::diag::wc_retry},
    {.kind = ErrorKind::wc_error, .wc_status = wc::rnr_retry_exc_err, .diagnosis = detail::diag::wc_rnr},
    {.kind = ErrorKind::wc_error, .wc_status = wc::rem_access_err,    .diagnosis = detail::diag::wc_rem_access},
    {.kind = ErrorKind::wc_error, .wc_status = wc::loc_qp_op_err,     .diagnosis = detail::diag::wc_qp_op},
    {.kind = ErrorKind::wc_error, .diagnosis = detail::diag::wc_failed},
    // Row 6: a negative ibv_poll_cq return.
    {.step = Step::poll_cq, .kind = ErrorKind::verb_failed, .diagnosis = detail::diag::poll_failed},

    // Rows 17, 19, 21, 25, 26 and section 3: deadlines, peers, the side channel.
    {.platform = Platform::apple, .step = Step::wait_cq, .kind = ErrorKind::timeout, .diagnosis = detail::diag::wait_timeout_macos},
    {                             .step = Step::wait_cq, .kind = ErrorKind::timeout, .diagnosis = detail::diag::wait_timeout},
    {                             .step = Step::link_warmup, .kind = ErrorKind::timeout,         .diagnosis = detail::diag::warmup_failed},
    {                             .step = Step::link_warmup, .kind = ErrorKind::result_mismatch, .diagnosis = detail::diag::warmup_failed},
    // A peer that is gone is peer_lost whatever errno the socket left (ETIMEDOUT, ECONNRESET).
    {.kind = ErrorKind::peer_lost, .diagnosis = detail::diag::peer_lost},
    {.kind = ErrorKind::peer_aborted, .diagnosis = detail::diag::peer_aborted},
    {.kind = ErrorKind::call_mismatch, .diagnosis = detail::diag::call_mismatch},
    {.platform = Platform::apple, .step = Step::side_channel, .sys_errno = ETIMEDOUT,    .diagnosis = detail::diag::side_channel_route_macos},
    {.platform = Platform::apple, .step = Step::side_channel, .sys_errno = EHOSTUNREACH, .diagnosis = detail::diag::side_channel_route_macos},
    {                             .step = Step::side_channel, .sys_errno = ETIMEDOUT,    .diagnosis = detail::diag::side_channel_unreachable},
    {                             .step = Step::side_channel, .sys_errno = EHOSTUNREACH, .diagnosis = detail::diag::side_channel_unreachable},
    {                             .step = Step::side_channel, .sys_errno = ENETUNREACH,  .diagnosis = detail::diag::side_channel_unreachable},
    {                             .step = Step::side_channel, .sys_errno = ECONNREFUSED, .diagnosis = detail::diag::side_channel_refused},
    {.kind = ErrorKind::timeout,   .diagnosis = detail::diag::timeout},

    // GID selection (rows 11, 12, 15; section 3 "APIPA address changes", "stale GID index").
    {.platform = Platform::apple,     .kind = ErrorKind::no_ipv4_gid, .diagnosis = detail::diag::no_ipv4_gid_macos},
    {.platform = Platform::rdma_core, .kind = ErrorKind::no_ipv4_gid, .diagnosis = detail::diag::no_ipv4_gid_linux},
    {                                 .kind = ErrorKind::no_ipv4_gid, .diagnosis = detail::diag::no_ipv4_gid},
    {.platform = Platform::apple,     .kind = ErrorKind::gid_stale,   .diagnosis = detail::diag::gid_stale_macos},
    {                                 .kind = ErrorKind::gid_stale,   .diagnosis = detail::diag::gid_stale},
    {.kind = ErrorKind::gid_not_found,     .diagnosis = detail::diag::gid_not_found},
    {.kind = ErrorKind::gid_index_invalid, .diagnosis = detail::diag::gid_index_invalid},

    // Endpoints and the Thunderbolt profile's limits (section 4).
    {.kind = ErrorKind::bad_frame,         .diagnosis = detail::diag::bad_frame},
    {.kind = ErrorKind::incompatible_peer, .detail_contains = fact::roce_version_mismatch, .diagnosis = detail::diag::roce_version_mismatch},
    {.kind = ErrorKind::incompatible_peer, .diagnosis = detail::diag::incompatible_peer},
    {.platform = Platform::apple, .kind = ErrorKind::unsupported, .diagnosis = detail::diag::unsupported_macos},
    {                             .kind = ErrorKind::unsupported, .diagnosis = detail::diag::unsupported},
    {                             .kind = ErrorKind::capacity,    .diagnosis = detail::diag::capacity},
    // Row 20: what an ignored completion status looks like from above.
    {                             .kind = ErrorKind::result_mismatch, .diagnosis = detail::diag::result_mismatch},
    // clang-format on
};

namespace detail {
/// True when `r` matches `e`: every key of the rule is a wildcard or equal to the error's.
constexpr bool rule_matches(const DiagnosisRule& r, const Error& e) noexcept {
  return (r.platform == Platform::any || r.platform == e.platform) &&
         (r.step == Step::any || r.step == e.step) && (r.sys_errno == -1 || r.sys_errno == e.sys_errno) &&
         (r.kind == ErrorKind{} || r.kind == e.kind) && (r.wc_status == -1 || r.wc_status == e.wc_status) &&
         (r.detail_contains.empty() || e.detail.view().find(r.detail_contains) != std::string_view::npos);
}
} // namespace detail

namespace detail {
/// The first row of the catalogue that matches `e`, or nullptr.
inline const Diagnosis* find_diagnosis_in_catalogue(const Error& e) noexcept {
  for (const auto& r : diagnosis_catalogue)
    if (rule_matches(r, e)) return &r.diagnosis;
  return nullptr;
}
} // namespace detail

namespace detail {
/// Registers the catalogue as Error::diagnosis()'s lookup in every program that includes this
/// header anywhere (see detail::diagnosis_lookup in error.hpp).
inline const bool catalogue_registered = (diagnosis_lookup = &find_diagnosis_in_catalogue, true);
} // namespace detail

TBVERBS_NAMESPACE_END
