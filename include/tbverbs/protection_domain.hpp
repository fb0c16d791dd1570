/// @file protection_domain.hpp
/// A protection domain (`ibv_alloc_pd`) and memory registration into it.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/handle.hpp"
#include "diagnosis.hpp"
#include "error.hpp"
#include "loader.hpp"
#include "memory_region.hpp"
#include "result.hpp"
#include "types.hpp"

#include <cerrno>
#include <span>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// A protection domain. Move-only, never null; keeps its context alive and is kept alive by
/// every memory region and queue pair made from it.
///
/// Threads: reg_mr and reg_mr_two_sided may be called from several threads at once (rdma-core's
/// ibv_reg_mr is thread-safe; the region count and the remembered access set are atomic).
/// close() and moves must not race with them.
///
/// Example, from the README's tour (examples/tour/tour.cpp, which the test suite runs):
/// \dontinclude tour/tour.cpp
/// \skip auto pd
/// \until mr.error()
class ProtectionDomain {
public:
  /// Registers `memory` with `access` (least privilege by default: local write, enough to
  /// receive into; add remote rights only for RDMA WRITE/READ targets).
  /// Errors: reg_mr with the errno; on rdma-core ENOMEM usually means RLIMIT_MEMLOCK.
  [[nodiscard]] Result<MemoryRegion> reg_mr(std::span<std::byte> memory, Access access = Access::local_write) const {
    const detail::VerbsApi& api = *info_->api;
    errno = 0;
    abi::ibv_mr* mr = api.reg_mr(pd_.get(), memory.data(), memory.size(), static_cast<int>(access));
    if (mr == nullptr) return fail(reg_mr_failed(memory.size(), access));
    auto parent = detail::counted_parent(info_, &detail::ContextInfo::memory_regions, pd_.keep_alive());
    return MemoryRegion(detail::Owned<abi::ibv_mr>(mr, api.dereg_mr, std::move(parent)), info_, access);
  }
  /// Registers an AlignedBuffer (it must outlive the region).
  [[nodiscard]] Result<MemoryRegion> reg_mr(const AlignedBuffer& buffer, Access access = Access::local_write) const {
    return reg_mr(buffer.bytes(), access);
  }

  /// Registers `memory` for two-sided use (sends from it and receives into it) with access rights
  /// the driver accepts, on either reading of Apple's: TN3205 says register "only as
  /// IBV_ACCESS_LOCAL_WRITE", while llama.cpp reports LOCAL_WRITE-only registrations refused on
  /// hardware and JACCL/ds4 add REMOTE_READ|REMOTE_WRITE. Tries local write first, then local
  /// write with both remote rights; the set that worked is remembered for the device, so later
  /// registrations succeed on their first call. Errors: reg_mr's, from the first set tried, with
  /// the second set's errno in the detail when both were refused.
  [[nodiscard]] Result<MemoryRegion> reg_mr_two_sided(std::span<std::byte> memory) const {
    constexpr Access sets[2] = {Access::local_write, Access::local_write | Access::remote_write | Access::remote_read};
    const int known = info_->two_sided_access.load(detail::Order::relaxed);
    const int first = known == static_cast<int>(sets[1]) ? 1 : 0;
    auto r = reg_mr(memory, sets[first]);
    if (r || known >= 0) {
      if (r) info_->two_sided_access.store(static_cast<int>(sets[first]), detail::Order::relaxed);
      return r;
    }
    auto second = reg_mr(memory, sets[1 - first]);
    if (second) {
      info_->two_sided_access.store(static_cast<int>(sets[1 - first]), detail::Order::relaxed);
      return second;
    }
    Error e = r.error();
    const std::string_view name = detail::errno_name(second.error().sys_errno);
    return fail(e.with_detail(std::string(e.detail.view()) + "; with remote access flags too: " +
                              (name.empty() ? std::to_string(second.error().sys_errno) : std::string(name))));
  }

  /// Deallocates now and returns the verb's result (EBUSY while regions or QPs still use it).
  [[nodiscard]] Result<void> close() noexcept { return pd_.close(); }
  /// The raw `ibv_pd*`.
  abi::ibv_pd* native_handle() const noexcept { return pd_.get(); }

  /// For QpRecipe::prepare: the shared state of the context it belongs to.
  const detail::Ref<detail::ContextInfo>& info() const noexcept { return info_; }
  /// For QpRecipe::prepare: a reference that keeps this PD alive.
  detail::Ref<detail::RefCounted> keep_alive() const noexcept { return pd_.keep_alive(); }

private:
  friend class Context;
  // The error of a refused registration, with the facts the diagnosis catalogue keys on: a length
  // above the device's max_mr_size (16,384,000 bytes on Thunderbolt), or, for EINVAL within it,
  // the access flags (Apple's readings differ on which sets it takes).
  [[gnu::cold]] Error reg_mr_failed(std::size_t bytes, Access access) const {
    Error e = Error::from_errno(Step::reg_mr);
    info_->stamp(e);
    std::string d = std::to_string(bytes) + " bytes";
    abi::ibv_device_attr a{};
    const bool known = info_->api->query_device(pd_.get()->context, &a) == 0 && a.max_mr_size != 0;
    if (known && bytes > a.max_mr_size)
      d += " " + std::string(fact::exceeds_max_mr_size) + " (" + std::to_string(a.max_mr_size) + ")";
    else if (known && e.is(EINVAL))
      d += " within max_mr_size (" + std::to_string(a.max_mr_size) + "): " + std::string(fact::access_refused) +
           "? (access " + std::to_string(static_cast<int>(access)) + ")";
    d += "; " + std::to_string(info_->memory_regions.load()) + " regions already registered on this device";
    return e.with_detail(d);
  }

  ProtectionDomain(detail::Owned<abi::ibv_pd> pd, detail::Ref<detail::ContextInfo> info)
      : pd_(std::move(pd)), info_(std::move(info)) {}
  detail::Owned<abi::ibv_pd> pd_;
  detail::Ref<detail::ContextInfo> info_;
};

TBVERBS_NAMESPACE_END
