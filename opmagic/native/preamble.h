// opmagic registration preamble, force-included (g++ -include) before the user's source,
// through preamble_classic.h (TORCH_LIBRARY*) and/or preamble_stable.h (STABLE_TORCH_LIBRARY*).
//
// torch's registration macros create library objects in static initialisers, i.e. inside
// dlopen(), where an error (a duplicate namespace, a bad schema) aborts the whole process and
// nothing can ever be unregistered. Here the macros only record each block; opmagic_init()
// creates the libraries later, from Python, and returns any error as text; opmagic_fini()
// destroys them, which removes every registration they made. So a re-run cell can replace
// its previous version. This part holds the blocks and the entry points and includes no torch
// header: each flavour adds the function that creates its kind of library.
//
// All state lives in an anonymous namespace: with external linkage, GCC would emit the
// function-local statics as STB_GNU_UNIQUE symbols and two loaded versions of a library
// would share one registry.

#ifndef OPMAGIC_PREAMBLE_H
#define OPMAGIC_PREAMBLE_H

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {
namespace opmagic_preamble {

enum class Kind { DEF, FRAGMENT, IMPL };

// A created library, of whichever flavour: destroying it removes its registrations.
using Owner = std::unique_ptr<void, void (*)(void*)>;
// A block's body; `create` casts it back to a function of its flavour's library type.
using AnyInit = void (*)();

// One registration block of the source, in source order.
struct Block {
  const char* macro;  // "TORCH_LIBRARY_IMPL", "STABLE_TORCH_LIBRARY", ...
  Kind kind;
  const char* ns;
  const char* key;  // an _IMPL block's dispatch key as written, else ""
  int key_id;  // the classic flavour's c10::DispatchKey value, else -1
  uint32_t line;
  AnyInit init;
  Owner (*create)(const Block& block, const char* file);  // registers the block, or throws
};

inline std::vector<Block>& blocks() {
  static std::vector<Block> recorded;
  return recorded;
}

inline std::vector<Owner>& libraries() {
  static std::vector<Owner> alive;
  return alive;
}

// torch keeps the `file` pointer a library is given: the string must outlive it.
inline std::string& source_file() {
  static std::string file;
  return file;
}

inline std::string& text_buffer() {
  static std::string text;
  return text;
}

inline uint32_t& error_line() {
  static uint32_t line = 0;
  return line;
}

// What a registration macro expands to at namespace scope: record the block, register nothing.
struct Deferred {
  explicit Deferred(const Block& block) {
    blocks().push_back(block);
  }
};

inline void destroy_libraries() {
  auto& alive = libraries();
  while (!alive.empty()) {
    alive.pop_back();  // newest first: the reverse of creation
  }
}

inline const char* fail(uint32_t line, const std::string& message) {
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
  return 2;
}

// Number of registration blocks in the source.
OPMAGIC_EXPORT int opmagic_block_count() {
  return static_cast<int>(opmagic_preamble::blocks().size());
}

// Block i as "MACRO\tnamespace\tdispatch key or empty\tline".
OPMAGIC_EXPORT const char* opmagic_block(int index) {
  const auto& block = opmagic_preamble::blocks().at(static_cast<size_t>(index));
  opmagic_preamble::text_buffer() = std::string(block.macro) + '\t' + block.ns + '\t' +
      block.key + '\t' + std::to_string(block.line);
  return opmagic_preamble::text_buffer().c_str();
}

// Create blocks [0, count) (all when count < 0), registering their operators and kernels, with
// `file` as the registration site. Returns nullptr, or the error of the first block that failed
// (opmagic_error_line() gives its line); on failure nothing stays registered.
OPMAGIC_EXPORT const char* opmagic_init(const char* file, int count) {
  opmagic_preamble::destroy_libraries();
  opmagic_preamble::source_file() = file;
  const auto& all = opmagic_preamble::blocks();
  const size_t stop = count < 0 ? all.size() : static_cast<size_t>(count);
  for (size_t index = 0; index < stop && index < all.size(); ++index) {
    const auto& block = all[index];
    try {
      opmagic_preamble::libraries().push_back(
          block.create(block, opmagic_preamble::source_file().c_str()));
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

// This library's handle for __cxa_finalize, which runs the destructors of its static objects
// and the atexit() handlers it registered (as exit() would): opmagic tries them in a child.
extern void* __dso_handle __attribute__((visibility("hidden")));  // what GCC and Clang define
OPMAGIC_EXPORT void* opmagic_dso_handle() {
  return &__dso_handle;
}

#undef OPMAGIC_EXPORT

#endif  // OPMAGIC_PREAMBLE_H
