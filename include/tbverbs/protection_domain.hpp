/// @file protection_domain.hpp
/// A protection domain (`ibv_alloc_pd`) and memory registration into it.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "memory_region.hpp"
#include "result.hpp"
#include "types.hpp"

#include <cerrno>
#include <memory>
#include <span>
#include <string>

TBVERBS_NAMESPACE_BEGIN

/// A protection domain. Move-only, never null; keeps its context alive and is kept alive by
/// every memory region and queue pair made from it.
class ProtectionDomain {
public:
  /// Registers `memory` with `access` (least privilege by default: local write, enough to
  /// receive into; add remote rights only for RDMA WRITE/READ targets).
  /// Errors: reg_mr with the errno; on rdma-core ENOMEM usually means RLIMIT_MEMLOCK.
  [[nodiscard]] Result<MemoryRegion> reg_mr(std::span<std::byte> memory, Access access = Access::local_write) const {
    const detail::VerbsApi& api = *info_->api;
    errno = 0;
    abi::ibv_mr* mr = api.reg_mr(pd_.get(), memory.data(), memory.size(), static_cast<int>(access));
    if (mr == nullptr) {
      Error e = Error::from_errno(Step::reg_mr);
      info_->stamp(e);
      e.with_detail(std::to_string(memory.size()) + " bytes; " +
                    std::to_string(info_->memory_regions.load()) + " regions already registered on this device");
      return fail(e);
    }
    auto parent = detail::counted_parent(info_, &detail::ContextInfo::memory_regions, pd_.keep_alive());
    return MemoryRegion(detail::Owned<abi::ibv_mr>(mr, api.dereg_mr, std::move(parent)), info_, access);
  }
  /// Registers an AlignedBuffer (it must outlive the region).
  [[nodiscard]] Result<MemoryRegion> reg_mr(const AlignedBuffer& buffer, Access access = Access::local_write) const {
    return reg_mr(buffer.bytes(), access);
  }

  /// Deallocates now and returns the verb's result (EBUSY while regions or QPs still use it).
  [[nodiscard]] Result<void> close() noexcept { return pd_.close(); }
  /// The raw `ibv_pd*`.
  abi::ibv_pd* native_handle() const noexcept { return pd_.get(); }

  /// For QpRecipe::prepare: the shared state of the context it belongs to.
  const std::shared_ptr<detail::ContextInfo>& info() const noexcept { return info_; }
  /// For QpRecipe::prepare: a reference that keeps this PD alive.
  std::shared_ptr<void> keep_alive() const noexcept { return pd_.keep_alive(); }

private:
  friend class Context;
  ProtectionDomain(detail::Owned<abi::ibv_pd> pd, std::shared_ptr<detail::ContextInfo> info)
      : pd_(std::move(pd)), info_(std::move(info)) {}
  detail::Owned<abi::ibv_pd> pd_;
  std::shared_ptr<detail::ContextInfo> info_;
};

TBVERBS_NAMESPACE_END
