// opmagic registration preamble, force-included (g++ -include) before the user's source.
//
// torch's TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL create torch::Library
// objects in static initialisers, i.e. inside dlopen(), where a c10::Error (a duplicate
// namespace, a bad schema) aborts the whole process and nothing can ever be unregistered.
// Here the same macros only record each block; opmagic_init() creates the libraries later,
// from Python, and returns any error as text; opmagic_fini() destroys them, which removes
// every registration they made. So a re-run cell can replace its previous version.
//
// All state lives in an anonymous namespace: with external linkage, GCC would emit the
// function-local statics as STB_GNU_UNIQUE symbols and two loaded versions of a library
// would share one registry.

#ifndef OPMAGIC_PREAMBLE_H
#define OPMAGIC_PREAMBLE_H

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace opmagic_preamble {

using InitFn = void(::torch::Library&);

// One TORCH_LIBRARY* block of the source, in source order.
struct Block {
  ::torch::Library::Kind kind;
  InitFn* init;
  const char* ns;
  std::optional<c10::DispatchKey> key;
  uint32_t line;
};

std::vector<Block>& blocks() {
  static std::vector<Block> recorded;
  return recorded;
}

std::vector<std::unique_ptr<::torch::Library>>& libraries() {
  static std::vector<std::unique_ptr<::torch::Library>> alive;
  return alive;
}

// torch::Library keeps the `file` pointer it is given: the string must outlive it.
std::string& source_file() {
  static std::string file;
  return file;
}

std::string& text_buffer() {
  static std::string text;
  return text;
}

uint32_t& error_line() {
  static uint32_t line = 0;
  return line;
}

// What a TORCH_LIBRARY* macro expands to at namespace scope: record the block, register nothing.
struct Deferred {
  Deferred(
      ::torch::Library::Kind kind,
      InitFn* init,
      const char* ns,
      std::optional<c10::DispatchKey> key,
      uint32_t line) {
    blocks().push_back(Block{kind, init, ns, key, line});
  }
};

const char* kind_name(::torch::Library::Kind kind) {
  switch (kind) {
    case ::torch::Library::DEF:
      return "TORCH_LIBRARY";
    case ::torch::Library::FRAGMENT:
      return "TORCH_LIBRARY_FRAGMENT";
    case ::torch::Library::IMPL:
      return "TORCH_LIBRARY_IMPL";
  }
  return "?";
}

void destroy_libraries() {
  auto& alive = libraries();
  while (!alive.empty()) {
    alive.pop_back();  // newest first: the reverse of creation
  }
}

const char* fail(uint32_t line, const std::string& message) {
  destroy_libraries();
  error_line() = line;
  text_buffer() = message;
  return text_buffer().c_str();
}

}  // namespace opmagic_preamble
}  // namespace

#define OPMAGIC_EXPORT extern "C" __attribute__((visibility("default")))

// Version of the protocol below; opmagic refuses libraries built with another one.
OPMAGIC_EXPORT int opmagic_abi_version() {
  return 1;
}

// Number of TORCH_LIBRARY* blocks in the source.
OPMAGIC_EXPORT int opmagic_block_count() {
  return static_cast<int>(opmagic_preamble::blocks().size());
}

// Block i as "MACRO\tnamespace\tdispatch key or empty\tline".
OPMAGIC_EXPORT const char* opmagic_block(int index) {
  const auto& block = opmagic_preamble::blocks().at(static_cast<size_t>(index));
  std::ostringstream out;
  out << opmagic_preamble::kind_name(block.kind) << '\t' << block.ns << '\t'
      << (block.key ? c10::toString(*block.key) : "") << '\t' << block.line;
  opmagic_preamble::text_buffer() = out.str();
  return opmagic_preamble::text_buffer().c_str();
}

// Create every block's torch::Library (registering its operators and kernels) with `file`
// as the registration site. Returns nullptr, or the error of the first block that failed
// (opmagic_error_line() gives its line); on failure nothing stays registered.
OPMAGIC_EXPORT const char* opmagic_init(const char* file) {
  opmagic_preamble::destroy_libraries();
  opmagic_preamble::source_file() = file;
  for (const auto& block : opmagic_preamble::blocks()) {
    try {
      auto library = std::make_unique<::torch::Library>(
          block.kind,
          block.ns,
          block.key,
          opmagic_preamble::source_file().c_str(),
          block.line);
      block.init(*library);
      opmagic_preamble::libraries().push_back(std::move(library));
    } catch (const c10::Error& error) {
      return opmagic_preamble::fail(block.line, error.what_without_backtrace());
    } catch (const std::exception& error) {
      return opmagic_preamble::fail(block.line, error.what());
    } catch (...) {
      return opmagic_preamble::fail(block.line, "unknown C++ exception");
    }
  }
  return nullptr;
}

// Line of the block whose registration failed in the last opmagic_init().
OPMAGIC_EXPORT int opmagic_error_line() {
  return static_cast<int>(opmagic_preamble::error_line());
}

// Destroy the libraries opmagic_init() created, removing all their registrations.
OPMAGIC_EXPORT void opmagic_fini() {
  opmagic_preamble::destroy_libraries();
}

// Keep operators (newline-separated "ns::name" or "ns::name.overload") alive in the dispatcher
// while a library is replaced: an operator whose last registration goes away is freed, and
// handles to it (a `static auto op = findSchemaOrThrow(...)` in C++, torch.ops objects) would
// dangle. Returns a handle for opmagic_release_operators().
OPMAGIC_EXPORT void* opmagic_hold_operators(const char* names) {
  auto held = std::make_unique<std::vector<c10::RegistrationHandleRAII>>();
  std::istringstream lines(names);
  std::string name;
  while (std::getline(lines, name)) {
    if (name.empty()) {
      continue;
    }
    const auto dot = name.find('.', name.rfind(':') + 1);
    c10::OperatorName op_name(
        name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1));
    held->push_back(c10::Dispatcher::singleton().registerName(std::move(op_name)));
  }
  return held.release();
}

// Let go of operators held by opmagic_hold_operators(); unused ones are freed now.
OPMAGIC_EXPORT void opmagic_release_operators(void* held) {
  delete static_cast<std::vector<c10::RegistrationHandleRAII>*>(held);
}

#undef OPMAGIC_EXPORT

// The registration macros, as in torch/library.h, but deferred (and without __FILE__: the
// registration site is the file name given to opmagic_init, so builds in different
// directories produce identical objects).
#undef TORCH_LIBRARY
#define TORCH_LIBRARY(ns, m)                                                            \
  static void TORCH_LIBRARY_init_##ns(::torch::Library&);                               \
  static const ::opmagic_preamble::Deferred TORCH_LIBRARY_static_init_##ns(             \
      ::torch::Library::DEF, &TORCH_LIBRARY_init_##ns, C10_STRINGIZE(ns), std::nullopt, \
      __LINE__);                                                                        \
  void TORCH_LIBRARY_init_##ns(::torch::Library& m)

#undef _TORCH_LIBRARY_FRAGMENT
#define _TORCH_LIBRARY_FRAGMENT(ns, m, uid)                                   \
  static void C10_CONCATENATE(                                                \
      TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid)(::torch::Library&);           \
  static const ::opmagic_preamble::Deferred C10_CONCATENATE(                  \
      TORCH_LIBRARY_FRAGMENT_static_init_##ns##_, uid)(                       \
      ::torch::Library::FRAGMENT,                                             \
      &C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid),             \
      C10_STRINGIZE(ns),                                                      \
      std::nullopt,                                                           \
      __LINE__);                                                              \
  void C10_CONCATENATE(TORCH_LIBRARY_FRAGMENT_init_##ns##_, uid)(::torch::Library & m)

#undef _TORCH_LIBRARY_IMPL
#define _TORCH_LIBRARY_IMPL(ns, k, m, uid)                                        \
  static void C10_CONCATENATE(                                                    \
      TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid)(::torch::Library&);             \
  static const ::opmagic_preamble::Deferred C10_CONCATENATE(                      \
      TORCH_LIBRARY_IMPL_static_init_##ns##_##k##_, uid)(                         \
      ::torch::Library::IMPL,                                                     \
      &C10_CONCATENATE(TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid),               \
      C10_STRINGIZE(ns),                                                          \
      std::make_optional(c10::DispatchKey::k),                                    \
      __LINE__);                                                                  \
  void C10_CONCATENATE(TORCH_LIBRARY_IMPL_init_##ns##_##k##_, uid)(::torch::Library & m)

#endif  // OPMAGIC_PREAMBLE_H
