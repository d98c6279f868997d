// opmagic preamble for STABLE_TORCH_LIBRARY / _FRAGMENT / _IMPL blocks (the LibTorch stable
// ABI, torch/csrc/stable/library.h), placed after preamble.h in the prefix header: the blocks
// are recorded and registered by opmagic_init(). It includes stable headers only.
//
// torch's StableLibrary ignores the status of the C shim that creates its torch::Library (a
// duplicate namespace leaves it with no library at all); here the shim is called directly and
// its error becomes the block's error. The block's body gets a StableLibrary that views the
// created handle: StableLibrary holds that handle and nothing else (checked below).

#ifndef OPMAGIC_PREAMBLE_STABLE_H
#define OPMAGIC_PREAMBLE_STABLE_H

#include <torch/csrc/stable/library.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace {
namespace opmagic_preamble {

using StableLibrary = ::torch::stable::detail::StableLibrary;
using StableInit = void(StableLibrary&);
static_assert(
    sizeof(StableLibrary) == sizeof(TorchLibraryHandle),
    "opmagic: StableLibrary is no longer a bare library handle; update preamble_stable.h");

// The message of the exception the last failing shim call caught.
inline std::string last_shim_error() {
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
  return torch_exception_get_what_without_backtrace();
#else
  return "the registration failed (this torch's stable ABI does not say why; torch 2.13 does)";
#endif
}

inline Owner create_stable(const Block& block, const char* file) {
  TorchLibraryHandle handle = nullptr;
  AOTITorchError status = TORCH_SUCCESS;
  switch (block.kind) {
    case Kind::DEF:
      status = aoti_torch_library_init_def(block.ns, file, block.line, &handle);
      break;
    case Kind::FRAGMENT:
      status = aoti_torch_library_init_fragment(block.ns, file, block.line, &handle);
      break;
    case Kind::IMPL:
      status = aoti_torch_library_init_impl(block.ns, block.key, file, block.line, &handle);
      break;
  }
  if (status != TORCH_SUCCESS || handle == nullptr) {
    throw std::runtime_error(last_shim_error());
  }
  Owner owner(handle, [](void* library) {
    aoti_torch_delete_library_object(static_cast<TorchLibraryHandle>(library));
  });
  alignas(StableLibrary) unsigned char view[sizeof(StableLibrary)];
  std::memcpy(view, &handle, sizeof handle);
  reinterpret_cast<StableInit*>(block.init)(*std::launder(reinterpret_cast<StableLibrary*>(view)));
  return owner;
}

}  // namespace opmagic_preamble
}  // namespace

// `var` is the block's own name for its library (STABLE_TORCH_LIBRARY(ns, lib) names it lib).
#define OPMAGIC_STABLE_BLOCK(macro, kind, ns, k, var, init, recorder)                     \
  static void init(::opmagic_preamble::StableLibrary&);                                   \
  static const ::opmagic_preamble::Deferred recorder(::opmagic_preamble::Block{           \
      macro, ::opmagic_preamble::Kind::kind, C10_STRINGIZE(ns), k, -1, __LINE__,         \
      reinterpret_cast<::opmagic_preamble::AnyInit>(&init),                               \
      &::opmagic_preamble::create_stable});                                               \
  void init(::opmagic_preamble::StableLibrary& var)

#undef STABLE_TORCH_LIBRARY
#define STABLE_TORCH_LIBRARY(ns, m)                                      \
  OPMAGIC_STABLE_BLOCK("STABLE_TORCH_LIBRARY", DEF, ns, "", m,           \
                       STABLE_TORCH_LIBRARY_init_##ns, STABLE_TORCH_LIBRARY_static_init_##ns)

#undef _STABLE_TORCH_LIBRARY_FRAGMENT
#define _STABLE_TORCH_LIBRARY_FRAGMENT(ns, m, uid)                                        \
  OPMAGIC_STABLE_BLOCK("STABLE_TORCH_LIBRARY_FRAGMENT", FRAGMENT, ns, "", m,              \
                       C10_CONCATENATE(STABLE_TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid), \
                       C10_CONCATENATE(STABLE_TORCH_LIBRARY_FRAGMENT_static_init_##ns##_, uid))

#undef _STABLE_TORCH_LIBRARY_IMPL
#define _STABLE_TORCH_LIBRARY_IMPL(ns, k, m, uid)                                              \
  OPMAGIC_STABLE_BLOCK("STABLE_TORCH_LIBRARY_IMPL", IMPL, ns, C10_STRINGIZE(k), m,             \
                       C10_CONCATENATE(STABLE_TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid),     \
                       C10_CONCATENATE(STABLE_TORCH_LIBRARY_IMPL_static_init_##ns##_##k##_, uid))

#endif  // OPMAGIC_PREAMBLE_STABLE_H
