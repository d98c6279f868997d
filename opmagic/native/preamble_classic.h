// opmagic preamble for TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL blocks
// (torch/library.h), placed after preamble.h in the prefix header: the blocks are recorded
// and registered by opmagic_init().

#ifndef OPMAGIC_PREAMBLE_CLASSIC_H
#define OPMAGIC_PREAMBLE_CLASSIC_H

#include <torch/library.h>

#include <optional>
#include <stdexcept>

namespace {
namespace opmagic_preamble {

using ClassicInit = void(::torch::Library&);

inline Owner create_classic(const Block& block, const char* file) {
  static constexpr ::torch::Library::Kind kinds[] = {
      ::torch::Library::DEF, ::torch::Library::FRAGMENT, ::torch::Library::IMPL};
  std::optional<c10::DispatchKey> key;
  if (block.key_id >= 0) {
    key = static_cast<c10::DispatchKey>(block.key_id);
  }
  try {
    auto library = std::make_unique<::torch::Library>(
        kinds[static_cast<int>(block.kind)], block.ns, key, file, block.line);
    reinterpret_cast<ClassicInit*>(block.init)(*library);
    return Owner(library.release(), [](void* p) { delete static_cast<::torch::Library*>(p); });
  } catch (const c10::Error& error) {
    throw std::runtime_error(error.what_without_backtrace());
  }
}

}  // namespace opmagic_preamble
}  // namespace

// The registration macros, as in torch/library.h, but deferred (and without __FILE__: the
// registration site is the file name given to opmagic_init, so builds in different
// directories produce identical objects). c10::DispatchKey::k checks the key when compiling.
// `var` is the block's own name for its library (TORCH_LIBRARY(ns, lib) names it lib).
#define OPMAGIC_CLASSIC_BLOCK(macro, kind, ns, k, key_id, var, init, recorder)         \
  static void init(::torch::Library&);                                                 \
  static const ::opmagic_preamble::Deferred recorder(::opmagic_preamble::Block{        \
      macro, ::opmagic_preamble::Kind::kind, C10_STRINGIZE(ns), k, key_id, __LINE__,  \
      reinterpret_cast<::opmagic_preamble::AnyInit>(&init),                            \
      &::opmagic_preamble::create_classic});                                           \
  void init(::torch::Library& var)

#undef TORCH_LIBRARY
#define TORCH_LIBRARY(ns, m)                                                       \
  OPMAGIC_CLASSIC_BLOCK("TORCH_LIBRARY", DEF, ns, "", -1, m, TORCH_LIBRARY_init_##ns, \
                        TORCH_LIBRARY_static_init_##ns)

#undef _TORCH_LIBRARY_FRAGMENT
#define _TORCH_LIBRARY_FRAGMENT(ns, m, uid)                                          \
  OPMAGIC_CLASSIC_BLOCK("TORCH_LIBRARY_FRAGMENT", FRAGMENT, ns, "", -1, m,           \
                        C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid),   \
                        C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_static_init_##ns##_, uid))

#undef _TORCH_LIBRARY_IMPL
#define _TORCH_LIBRARY_IMPL(ns, k, m, uid)                                                  \
  OPMAGIC_CLASSIC_BLOCK("TORCH_LIBRARY_IMPL", IMPL, ns, C10_STRINGIZE(k),                   \
                        static_cast<int>(c10::DispatchKey::k), m,                           \
                        C10_CONCATENATE(TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid),        \
                        C10_CONCATENATE(TORCH_LIBRARY_IMPL_static_init_##ns##_##k##_, uid))

#endif  // OPMAGIC_PREAMBLE_CLASSIC_H
