/// @file device.hpp
/// The list of verbs devices a library reports (`ibv_get_device_list`).
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/ref.hpp"
#include "error.hpp"
#include "loader.hpp"
#include "result.hpp"
#include "types.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

namespace detail {
/// Deleter of a device list.
struct FreeDeviceList {
  void (*free)(abi::ibv_device**);
  void operator()(abi::ibv_device** l) const noexcept {
    if (l != nullptr && free != nullptr) free(l);
  }
};
} // namespace detail

/// The transport type Apple's Thunderbolt driver reports for its devices, and the link layer of
/// their ports: 100, which `ibv_devinfo` prints as "Thunderbolt (100)" (TN3205; the output quoted
/// in mlx PR #4191; docs/field-reports.md). No rdma-core transport or link layer has this value.
inline constexpr int thunderbolt_transport = 100;

/// The provider family of one device, decided by what the device is, never by its name: Apple's
/// when it reports the Thunderbolt transport (thunderbolt_transport) or comes from Apple's library
/// (`librdma.dylib`, whose devices are all Thunderbolt); rdma-core otherwise. An rdma-core device may
/// be called `rdma_en1` (udev and the emulator's fabric files name devices freely) and is still an
/// RC-capable NIC; the emulator's Thunderbolt profile reports transport 100 whatever it names a device.
/// `transport_type` is the raw `ibv_device::transport_type` (Device::transport_type()).
constexpr Platform platform_of_device(int transport_type, Platform library_platform) noexcept {
  if (transport_type == thunderbolt_transport || library_platform == Platform::apple) return Platform::apple;
  return Platform::rdma_core;
}

/// Usable UC queue pairs per device on Apple's Thunderbolt driver (TN3205: "10 per device"; the
/// 11th create_qp gets EBUSY, mlx#4209), whatever max_qp reports (public `ibv_devinfo -v` dumps
/// show 11).
inline constexpr int apple_usable_qps = 10;

/// How many queue pairs a job may budget on one device: on Apple, apple_usable_qps (or max_qp
/// if a driver ever reports fewer); elsewhere max_qp as reported (0 when unknown). The one
/// place that turns device caps into a QP budget: tbverbs-doctor and anything else that
/// budgets QPs call it.
constexpr int usable_qps(const DeviceAttributes& attrs, Platform platform) noexcept {
  if (platform == Platform::apple)
    return attrs.max_qp > 0 && attrs.max_qp < apple_usable_qps ? attrs.max_qp : apple_usable_qps;
  return attrs.max_qp > 0 ? attrs.max_qp : 0;
}

/// One device of a DeviceList: a non-owning view, valid while its DeviceList lives.
class Device {
public:
  /// The device name (`rdma_en2`, `mlx5_0`).
  std::string_view name() const noexcept {
    const char* n = api_->get_device_name(dev_);
    return n ? std::string_view(n) : std::string_view();
  }
  /// The node GUID in host order; empty when the library does not export
  /// `ibv_get_device_guid` (an optional symbol: no Apple consumer resolves it).
  std::optional<std::uint64_t> guid() const noexcept {
    if (api_->get_device_guid == nullptr) return std::nullopt;
    const std::uint64_t be = api_->get_device_guid(dev_);
    std::uint64_t host = 0;
    const auto* b = reinterpret_cast<const unsigned char*>(&be);
    for (int i = 0; i < 8; ++i) host = (host << 8) | b[i];
    return host;
  }
  /// The raw `ibv_device::transport_type`: 0 for InfiniBand (RoCE included), 1 iWARP, 100
  /// (thunderbolt_transport) on Apple's Thunderbolt driver. Read as bytes, not as the enum: 100 is
  /// outside the range of rdma-core's `ibv_transport_type`.
  int transport_type() const noexcept {
    int t = 0;
    static_assert(sizeof(dev_->transport_type) == sizeof(t));
    std::memcpy(&t, &dev_->transport_type, sizeof(t));
    return t;
  }
  /// The provider family of this device (platform_of_device: by its transport and library, not its
  /// name).
  Platform platform() const noexcept { return platform_of_device(transport_type(), api_->platform); }
  /// The raw `ibv_device*`.
  abi::ibv_device* native_handle() const noexcept { return dev_; }

private:
  friend class DeviceList;
  Device(const detail::VerbsApi* api, abi::ibv_device* dev) noexcept : api_(api), dev_(dev) {}
  const detail::VerbsApi* api_;
  abi::ibv_device* dev_;
};

/// The devices of one library. Move-only; frees the list on destruction. A Context opened from
/// one of its devices does not need the list to stay alive.
class DeviceList {
public:
  /// Lists the devices. An empty list (or a failed `ibv_get_device_list`, e.g. ENOSYS when the
  /// kernel has no RDMA) is the `no_device` error, carrying the errno and the diagnosis.
  [[nodiscard]] static Result<DeviceList> get(const Library& lib) {
    const detail::VerbsApi& api = lib.api();
    int n = 0;
    errno = 0;
    abi::ibv_device** list = api.get_device_list(&n);
    const int err = errno;
    if (list == nullptr || n <= 0) {
      if (list != nullptr) api.free_device_list(list);
      Error e = Error::make(Step::get_device_list, ErrorKind::no_device,
                            "the verbs library " + api.origin + " lists no RDMA device");
      e.sys_errno = list == nullptr ? err : 0;
      return fail(e.from(lib.platform()));
    }
    DeviceList d;
    d.api_ = &api;
    d.list_ = detail::Unique<abi::ibv_device*, detail::FreeDeviceList>(list, {api.free_device_list});
    d.devices_.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) d.devices_.push_back(Device(&api, list[i]));
    return d;
  }

  /// Number of devices (at least one).
  std::size_t size() const noexcept { return devices_.size(); }
  /// The devices, in the library's order.
  const std::vector<Device>& devices() const noexcept { return devices_; }
  /// First device.
  auto begin() const noexcept { return devices_.begin(); }
  /// Past the last device.
  auto end() const noexcept { return devices_.end(); }

  /// The device called `name`; `device_not_found` listing what exists otherwise.
  [[nodiscard]] Result<Device> find(std::string_view name) const {
    for (const Device& d : devices_)
      if (d.name() == name) return d;
    Error e = Error::make(Step::open_device, ErrorKind::device_not_found,
                          std::string(name) + " not found; " + std::to_string(devices_.size()) +
                              " available: " + names());
    return fail(e.on(name).from(platform()));
  }
  /// The provider family of the listed devices, for errors about a device that is not among them:
  /// Apple's when any listed device is a Thunderbolt device (or the library is Apple's).
  Platform platform() const noexcept {
    for (const Device& d : devices_)
      if (d.platform() == Platform::apple) return Platform::apple;
    return platform_of_device(0, api_->platform);
  }
  /// The device names, comma-separated.
  std::string names() const {
    std::string s;
    for (const Device& d : devices_) {
      if (!s.empty()) s += ", ";
      s += d.name();
    }
    return s;
  }

private:
  DeviceList() = default;
  const detail::VerbsApi* api_ = nullptr;
  detail::Unique<abi::ibv_device*, detail::FreeDeviceList> list_;
  std::vector<Device> devices_;
};

TBVERBS_NAMESPACE_END
