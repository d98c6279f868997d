// opmagic's operator observer: records every operator call the dispatcher makes while a trace
// runs, through thread-local RecordFunction callbacks (the hooks torch.profiler uses).
//
// The dispatcher runs RecordFunction callbacks in Dispatcher::call and Dispatcher::callBoxed,
// after it computed the call's dispatch keys and before the first kernel runs, and never on
// redispatch. A callback adds no dispatch key and changes no thread-local dispatch state, so
// the calls it sees dispatch exactly as they would unobserved. The autograd engine runs each
// node under a BACKWARD_FUNCTION RecordFunction, inside an "autograd::engine::evaluate_function"
// range; torch.compile runs each compiled graph inside a "Torch-Compiled Region" range.
//
// Thread-local callbacks travel with torch's ThreadLocalState: where torch hands work to
// another thread with it (the autograd engine's device and re-entrant threads, at::launch),
// the callbacks run there too. Each thread's events go to a log of its own, found through the
// callback's handle in that thread's RecordFunction state.
//
// Each call is logged as an enter and an exit event. An enter event names a "segment" (the
// kernels the call runs, which opmagic's Python side works out with resolve): the observer
// asks Python for it (`describe`) unless the same operator was already described for the
// same dispatch state (thread-local key sets, grad and inference mode, the keys of every
// tensor argument, device/dtype/layout arguments). Those answers are kept across logs; the
// first time a log sees an operator, `check` says whether its registrations changed since
// (then its answers are dropped). Calls whose path depends on Python objects (dispatch modes,
// tensor subclasses, functorch transforms, functionalization) always ask. So the common call
// costs a few microseconds and no Python.
//
// Where a call comes from (the innermost frame of the user's Python code, and the
// nn.Modules whose __call__ is running) is read from the Python stack for the calls Python
// code can have made: the first call of a thread, of an autograd node or compiled region, and
// the calls a Python kernel or handler made. The other calls inherit their caller's.
//
// Built once per torch, Python and compiler by opmagic/_torch/op_observer.py.

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Export.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#ifdef __linux__
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace py = pybind11;

// Two functions of libtorch_python, declared here as torch's own headers declare them
// (torch/csrc/autograd/python_variable.h, torch/csrc/jit/python/pybind_utils.h): those
// headers pull in autograd and the whole TorchScript IR, which made this file take ~25 s of
// CPU to compile instead of ~8 s. A signature torch changed would fail the load with an
// undefined symbol, reported as the build's error.
TORCH_PYTHON_API PyObject* THPVariable_Wrap(const at::TensorBase& var);
namespace torch::jit {
TORCH_PYTHON_API py::object toPyObject(c10::IValue ivalue);
}  // namespace torch::jit

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Keys whose presence means Python code decides the path: always ask Python.
const c10::DispatchKeySet kPythonDecides = c10::DispatchKeySet({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::PythonDispatcher,
    c10::DispatchKey::PreDispatch,
    c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
    c10::DispatchKey::FuncTorchDynamicLayerBackMode,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper,
    c10::DispatchKey::Functionalize,
});

// Event kinds below 0 (an operator call's enter event holds the operator's index, >= 0).
constexpr int kExit = -1;
constexpr int kRange = -2;   // a named range a trace asked for (by the start of its name)
constexpr int kNode = -3;    // an autograd node running its backward
constexpr int kHidden = -4;  // a call describe hid, with everything under it

// describe's answer flags
constexpr int kRunsPython = 1;  // the call's kernels are Python code: its calls' frames differ
constexpr int kHide = 2;        // leave the call and everything under it out of the log
constexpr int kNoValues = 4;    // its outputs are views of its inputs: values=True skips them
constexpr int kMakesValues = 8;  // a decomposition: the calls it makes compute values

// What is open on a thread's stack, innermost last: a call (these bits or none), a group,
// a hidden call.
using Open = uint8_t;
constexpr Open kOpenPython = 1;  // a call whose kernels are Python code
constexpr Open kOpenValues = 2;  // a call whose calls compute values (a decomposition, Python)
constexpr Open kOpenGroup = 4;
constexpr Open kOpenHidden = 8;

struct TensorSummary {
  bool defined = false;
  at::ScalarType dtype = at::ScalarType::Undefined;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool requires_grad = false;
  bool has_sizes = false;  // nested and symbolic-shaped tensors have no plain sizes
  std::vector<int64_t> sizes;
};

// One argument as the log keeps it: tensors summarised (never kept alive), other values kept.
struct ArgumentSummary {
  enum Kind : uint8_t { kValue, kTensor, kTensorList } kind = kValue;
  c10::IValue value;
  std::vector<TensorSummary> tensors;
};

// An output's values in three numbers (values=True): min, max and mean, as 0-dim tensors
// read when the log is handed over (no device synchronisation while the code runs).
struct ValueSummary {
  TensorSummary tensor;
  bool has_values = false;
  at::Tensor low, high, mean;
};

struct OutputSummary {
  bool is_tensor = false;
  bool is_list = false;
  std::vector<ValueSummary> values;
};

struct Event {
  int kind = kExit;  // the operator's index (>= 0), or kExit, kRange, kNode, kHidden
  int segment = -1;  // a call's (or hidden call's) segment
  bool unwinding = false;  // exit: an exception is leaving the call
  int64_t time = 0;
  int64_t overhead = 0;  // observer time spent on this thread so far
  int64_t sequence_nr = -1;  // the autograd sequence number the RecordFunction carries
  int64_t extra = -1;  // forward thread (nodes, ranges), modules loaded (calls), hidden count
  std::string name;  // a node's or range's name
  std::vector<ArgumentSummary> arguments;
  std::vector<OutputSummary> outputs;
  bool has_outputs = false;
  PyObject* described = nullptr;  // arguments as Python summarised them (owned), or null
  PyObject* origin = nullptr;  // (code, line, modules) of the Python code that made it (owned)
};

struct OpEntry {
  std::string name;
  std::string overload;
  size_t arguments = 0;
  std::vector<size_t> selectors;  // positions of the device, dtype and layout arguments
};

struct KeyHash {
  size_t operator()(const std::vector<uint64_t>& key) const {
    size_t hash = key.size();
    for (uint64_t part : key) {
      hash ^= std::hash<uint64_t>{}(part) + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2);
    }
    return hash;
  }
};

// What a thread's observers keep across logs of the same owner: operators by index, the
// segments described for them, and what each segment's kernels are.
struct Answers {
  std::string owner;  // whose answers these are: another owner starts afresh
  std::vector<OpEntry> ops;
  std::unordered_map<const char*, int> op_index;  // by the schema's name (stable) pointer
  std::unordered_map<std::vector<uint64_t>, int, KeyHash> segments;  // key[0]: the op
  std::vector<uint8_t> segment_flags;  // describe's flags, by segment id
};

// One thread's part of a log.
struct ThreadLog {
  int64_t native_id = 0;
  std::string name;
  uint64_t record_function_id = 0;  // at::RecordFunction::currentThreadId() of the thread
  std::vector<Event> events;
  std::vector<Open> stack;
  int64_t overhead = 0;
  int64_t hidden = 0;  // calls left out under the innermost hidden call
  int64_t observer_loaded = 0;  // Python modules loaded by the observer's own callbacks
};

struct Recorder {
  // guards the answers, the logs and `checked`; taken with or without the GIL, but never
  // held while waiting for it (no deadlock with a thread that holds the GIL)
  std::mutex mutex;
  std::shared_ptr<Answers> answers;
  std::vector<bool> checked;  // per op: `check` asked during this log
  std::vector<std::unique_ptr<ThreadLog>> logs;  // the starting thread's first
  std::vector<at::CallbackHandle> handles;
  std::atomic<bool> stopped{false};
  std::atomic<bool> failed{false};
  PyObject* error = nullptr;  // the first exception a callback raised: logging stops
  // Python side (touched with the GIL held)
  PyObject* describe = nullptr;  // describe(op, name, overload, inputs, python_decides)
  PyObject* check = nullptr;     // check(op, name, overload): are its answers still valid?
  PyObject* user_code = nullptr;  // user_code(code) -> bool, or null: frames are not read
  PyObject* stop_frame = nullptr;  // modules are read only from frames inside this one
  PyObject* set_eval_frame = nullptr;  // dynamo's frame hook setter, or null
  std::unordered_set<PyObject*> module_calls;  // code objects of nn.Module.__call__ (owned)
  std::unordered_map<PyObject*, bool> user_codes;  // user_code's answers (codes owned)
  std::vector<std::string> ranges;  // named ranges reported, by the start of their names
  bool values = false;
};

std::mutex g_active_mutex;  // guards g_active
std::vector<std::pair<at::CallbackHandle, std::shared_ptr<Recorder>>> g_active;

thread_local std::shared_ptr<Answers> t_answers;  // this thread's answers, across logs
thread_local std::shared_ptr<Recorder> t_started;  // the log this thread started
thread_local bool t_busy = false;  // the observer itself runs operators (a callback, values)

// The log this thread reports to, and its part of it.
struct Current {
  std::shared_ptr<Recorder> recorder;
  ThreadLog* log = nullptr;
};

thread_local at::CallbackHandle t_handle = 0;  // the handle the cached Current was found by
thread_local Current t_current;

struct BusyGuard {
  BusyGuard() { t_busy = true; }
  ~BusyGuard() { t_busy = false; }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;
};

// torch.compile's frame hook off while the observer's own Python runs (GIL held): a call
// inside a compiled function's run would otherwise have dynamo compile the callbacks too.
struct CompilerPause {
  explicit CompilerPause(PyObject* set_eval_frame) : set(set_eval_frame) {
    if (set != nullptr) {
      prior = PyObject_CallOneArg(set, Py_None);
      if (prior == nullptr) {
        throw py::error_already_set();
      }
    }
  }
  ~CompilerPause() {
    if (prior != nullptr) {
      PyObject* restored = PyObject_CallOneArg(set, prior);
      if (restored == nullptr) {
        PyErr_Clear();
      }
      Py_XDECREF(restored);
      Py_DECREF(prior);
    }
  }
  CompilerPause(const CompilerPause&) = delete;
  CompilerPause& operator=(const CompilerPause&) = delete;
  PyObject* set;
  PyObject* prior = nullptr;
};

int64_t native_thread_id() {
#ifdef __linux__
  return static_cast<int64_t>(syscall(SYS_gettid));
#else
  return 0;
#endif
}

std::string thread_name() {
#ifdef __linux__
  char name[64] = {0};
  if (pthread_getname_np(pthread_self(), name, sizeof(name)) == 0) {
    return name;
  }
#endif
  return "";
}

// This thread's log in `recorder`, made on first use (call with the recorder's mutex held).
ThreadLog* log_of(Recorder& recorder) {
  int64_t id = native_thread_id();
  for (auto& log : recorder.logs) {
    if (log->native_id == id) {
      return log.get();
    }
  }
  auto log = std::make_unique<ThreadLog>();
  log->native_id = id;
  log->name = thread_name();
  log->record_function_id = at::RecordFunction::currentThreadId();
  recorder.logs.push_back(std::move(log));
  return recorder.logs.back().get();
}

// The log this thread's RecordFunction callbacks report to: found by the handles in this
// thread's RecordFunction state (torch copies them to the threads it hands work to).
Current* current() {
  const auto& callbacks = at::get_record_function_tls_().sorted_tls_callbacks_;
  if (t_handle != 0 && t_current.recorder && !t_current.recorder->stopped.load()) {
    for (const auto& entry : callbacks) {
      if (entry.handle_ == t_handle) {
        return &t_current;
      }
    }
  }
  std::shared_ptr<Recorder> found;
  at::CallbackHandle handle = 0;
  {
    std::lock_guard<std::mutex> lock(g_active_mutex);
    for (const auto& entry : callbacks) {
      for (const auto& active : g_active) {
        if (active.first == entry.handle_) {
          found = active.second;
          handle = entry.handle_;
          break;
        }
      }
      if (found) {
        break;
      }
    }
  }
  if (!found || found->stopped.load()) {
    return nullptr;
  }
  ThreadLog* log = nullptr;
  {
    std::lock_guard<std::mutex> lock(found->mutex);
    log = log_of(*found);
  }
  t_handle = handle;
  t_current = Current{std::move(found), log};
  return &t_current;
}

struct Entered : at::ObserverContext {
  Entered(
      std::shared_ptr<Recorder> recorder,
      ThreadLog* log,
      int uncaught,
      bool watched,
      bool summarise = false)
      : recorder(std::move(recorder)),
        log(log),
        uncaught(uncaught),
        watched(watched),
        summarise(summarise) {}
  std::shared_ptr<Recorder> recorder;
  ThreadLog* log;
  int uncaught;  // exceptions in flight when the call began
  bool watched;  // the modules Python has loaded are counted when the call ends
  bool summarise;  // its outputs' values are summarised when it ends
};

void keep_error(Recorder& recorder, const py::object& exception) {
  std::lock_guard<std::mutex> lock(recorder.mutex);
  if (recorder.error == nullptr) {
    recorder.error = exception.inc_ref().ptr();
  }
  recorder.failed.store(true);
}

// Append an event to this thread's log, unless the log was handed over meanwhile (then the
// event's Python objects are let go, with the GIL).
void push(Recorder& recorder, ThreadLog& log, Event&& event) {
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    if (!recorder.stopped.load()) {
      log.events.push_back(std::move(event));
      return;
    }
  }
  if (event.described != nullptr || event.origin != nullptr) {
    py::gil_scoped_acquire gil;
    Py_CLEAR(event.described);
    Py_CLEAR(event.origin);
  }
}

// A Python value for an argument. Tensors stay tensors: torch::jit::toPyObject would turn a
// wrapped number (the 1 of `x + 1`) into a Python int, but the call received a tensor.
py::object to_python(const c10::IValue& value) {
  if (value.isTensor()) {
    PyObject* tensor = THPVariable_Wrap(value.toTensor());
    if (tensor == nullptr) {
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(tensor);
  }
  if (value.isList()) {
    py::list items;
    for (const auto& item : value.toListRef()) {
      items.append(to_python(item));
    }
    return items;
  }
  return torch::jit::toPyObject(value);
}

// The operator behind a RecordFunction, or -1 for a named range (RECORD_FUNCTION("...")).
// Call with the recorder's mutex held.
int op_of(const at::RecordFunction& fn, Recorder& recorder) {
  Answers& answers = *recorder.answers;
  const char* name = fn.name();
  auto found = answers.op_index.find(name);
  if (found != answers.op_index.end()) {
    int index = found->second;
    const OpEntry& op = answers.ops[index];
    if (recorder.checked[index] || (op.name == name && op.overload == fn.overload_name())) {
      return index;
    }
    answers.op_index.erase(found);  // the operator went away and another took its place
  }
  auto op_name = fn.operator_name();
  if (!op_name.has_value()) {
    return -1;
  }
  auto schema = fn.operator_schema();
  OpEntry entry{op_name->name, op_name->overload_name, 0, {}};
  if (schema.has_value()) {
    const auto& arguments = schema->arguments();
    entry.arguments = arguments.size();
    for (size_t i = 0; i < arguments.size(); ++i) {
      const auto& argument_name = arguments[i].name();
      if (argument_name == "device" || argument_name == "dtype" || argument_name == "layout") {
        entry.selectors.push_back(i);
      }
    }
  }
  answers.ops.push_back(std::move(entry));
  recorder.checked.push_back(false);
  int index = static_cast<int>(answers.ops.size()) - 1;
  answers.op_index.emplace(name, index);  // the schema lives as long as the operator
  return index;
}

// Whether the operator's answers are still valid (asks Python once per log and operator);
// drops them when they are not. false when `check` raised (logging stops).
bool checked_op(Recorder& recorder, int index, const OpEntry& op) {
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    if (recorder.checked[index]) {
      return true;
    }
  }
  bool valid = false;
  {
    BusyGuard busy;
    py::gil_scoped_acquire gil;
    py::error_scope pending;
    try {
      CompilerPause paused(recorder.set_eval_frame);
      valid = py::handle(recorder.check)(index, op.name, op.overload).cast<bool>();
    } catch (py::error_already_set& error) {
      keep_error(recorder, error.value());
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(recorder.mutex);
  recorder.checked[index] = true;
  if (!valid) {
    auto& segments = recorder.answers->segments;
    for (auto it = segments.begin(); it != segments.end();) {
      it = it->first[0] == static_cast<uint64_t>(index) ? segments.erase(it) : ++it;
    }
  }
  return true;
}

TensorSummary summarise(const at::Tensor& tensor) {
  TensorSummary summary;
  if (!tensor.defined()) {
    return summary;
  }
  summary.defined = true;
  summary.dtype = tensor.scalar_type();
  summary.device = tensor.device().type();
  summary.requires_grad = tensor.requires_grad();
  auto* impl = tensor.unsafeGetTensorImpl();
  if (!tensor.is_nested() && !impl->has_symbolic_sizes_strides()) {
    summary.has_sizes = true;
    auto sizes = tensor.sizes();
    summary.sizes.assign(sizes.begin(), sizes.end());
  }
  return summary;
}

// The call's arguments: the last ones of what the dispatcher reported (a boxed call reports
// the whole stack, a fallback's own values below the call's).
c10::ArrayRef<const c10::IValue> call_arguments(const at::RecordFunction& fn, const OpEntry& op) {
  auto inputs = fn.inputs();
  if (inputs.size() > op.arguments) {
    return inputs.slice(inputs.size() - op.arguments);
  }
  return inputs;
}

// Key for a call's segment, summaries of its arguments; false when Python decides its path.
bool read_call(
    const c10::ArrayRef<const c10::IValue>& inputs,
    const OpEntry& op,
    int op_index,
    std::vector<uint64_t>& key,
    std::vector<ArgumentSummary>& arguments) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return false;
  }
  auto local = c10::impl::tls_local_dispatch_key_set();
  if (!(local.included_ & kPythonDecides).empty()) {
    return false;
  }
  key.push_back(static_cast<uint64_t>(op_index));
  key.push_back(local.included_.raw_repr());
  key.push_back(local.excluded_.raw_repr());
  key.push_back(
      (c10::GradMode::is_enabled() ? 1 : 0) | (c10::InferenceMode::is_enabled() ? 2 : 0));
  arguments.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& value = inputs[i];
    ArgumentSummary argument;
    if (value.isTensor()) {
      const at::Tensor& tensor = value.toTensor();
      auto keys = tensor.defined() ? tensor.key_set() : c10::DispatchKeySet();
      if (!(keys & kPythonDecides).empty()) {
        return false;
      }
      key.push_back(keys.raw_repr());
      argument.kind = ArgumentSummary::kTensor;
      argument.tensors.push_back(summarise(tensor));
    } else if (value.isTensorList() || value.isOptionalTensorList() ||
               (value.isList() && !value.toListRef().empty() &&
                value.toListRef()[0].isTensor())) {
      argument.kind = ArgumentSummary::kTensorList;
      key.push_back(value.toListRef().size());
      for (const auto& item : value.toListRef()) {
        if (item.isTensor() && item.toTensor().defined()) {
          auto keys = item.toTensor().key_set();
          if (!(keys & kPythonDecides).empty()) {
            return false;
          }
          key.push_back(keys.raw_repr());
          argument.tensors.push_back(summarise(item.toTensor()));
        } else {
          key.push_back(0);
          argument.tensors.emplace_back();
        }
      }
    } else {
      argument.value = value;
      key.push_back(0);
    }
    arguments.push_back(std::move(argument));
  }
  for (size_t position : op.selectors) {  // factory ops: device, dtype, layout pick the backend
    if (position >= inputs.size()) {
      continue;
    }
    const c10::IValue& value = inputs[position];
    if (value.isNone()) {
      key.push_back(1);
    } else if (value.isDevice()) {
      key.push_back(2 + (static_cast<uint64_t>(value.toDevice().type()) << 8) +
                    (static_cast<uint64_t>(value.toDevice().index() + 1) << 24));
    } else if (value.isInt()) {
      key.push_back(3 + (static_cast<uint64_t>(value.toInt()) << 8));
    } else {
      key.push_back(4);
    }
  }
  return true;
}

// ------------------------------------------------------------------ where a call came from

// Whether `code` is the user's (asks user_code once per code object). GIL held.
bool is_user_code(Recorder& recorder, PyObject* code) {
  auto found = recorder.user_codes.find(code);
  if (found != recorder.user_codes.end()) {
    return found->second;
  }
  PyObject* answer = nullptr;
  {
    CompilerPause paused(recorder.set_eval_frame);
    answer = PyObject_CallOneArg(recorder.user_code, code);
  }
  if (answer == nullptr) {
    throw py::error_already_set();
  }
  bool user = PyObject_IsTrue(answer) == 1;
  Py_DECREF(answer);
  Py_INCREF(code);
  recorder.user_codes.emplace(code, user);
  return user;
}

// The `self` of a frame running nn.Module.__call__ (a new reference), or null.
PyObject* frame_self(PyFrameObject* frame) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* self = PyFrame_GetVarString(frame, "self");
  if (self == nullptr) {
    PyErr_Clear();
  }
  return self;
#else
  PyObject* locals = PyObject_GetAttrString(reinterpret_cast<PyObject*>(frame), "f_locals");
  if (locals == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* self = PyMapping_GetItemString(locals, "self");
  Py_DECREF(locals);
  if (self == nullptr) {
    PyErr_Clear();
  }
  return self;
#endif
}

constexpr int kMaxFrames = 256;

// (code, line, modules) of the innermost frame of the user's code on this thread's Python
// stack, modules being the nn.Modules whose __call__ runs inside the stop frame, outermost
// first; None without Python frames. GIL held.
py::object read_origin(Recorder& recorder) {
  PyThreadState* state = PyThreadState_Get();
  PyFrameObject* frame = PyThreadState_GetFrame(state);
  py::object code_found = py::none();
  int line = 0;
  py::list modules;
  bool inside = true;
  for (int depth = 0; frame != nullptr && depth < kMaxFrames; ++depth) {
    if (reinterpret_cast<PyObject*>(frame) == recorder.stop_frame) {
      inside = false;
    }
    PyObject* code = reinterpret_cast<PyObject*>(PyFrame_GetCode(frame));
    if (inside && recorder.module_calls.count(code) > 0) {
      PyObject* self = frame_self(frame);
      if (self != nullptr) {
        modules.append(py::reinterpret_steal<py::object>(self));
      }
    }
    bool found = false;
    if (code_found.is_none()) {
      try {
        found = is_user_code(recorder, code);
      } catch (...) {
        Py_DECREF(code);
        Py_DECREF(frame);
        throw;
      }
      if (found) {
        code_found = py::reinterpret_borrow<py::object>(code);
        line = PyFrame_GetLineNumber(frame);
      }
    }
    Py_DECREF(code);
    if (!code_found.is_none() && !inside) {
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  if (code_found.is_none() && modules.empty()) {
    return py::none();
  }
  if (PyList_Reverse(modules.ptr()) != 0) {
    throw py::error_already_set();
  }
  return py::make_tuple(code_found, line, py::tuple(modules));
}

// Whether a call entered now can come from other Python code than its caller's.
bool reads_origin(const Recorder& recorder, const ThreadLog& log) {
  if (recorder.user_code == nullptr) {
    return false;
  }
  return log.stack.empty() || (log.stack.back() & (kOpenPython | kOpenGroup)) != 0;
}

Py_ssize_t modules_loaded() {
  PyObject* modules = PyImport_GetModuleDict();
  return modules == nullptr ? -1 : PyDict_Size(modules);
}

// ------------------------------------------------------------------ values

ValueSummary summarise_values(const at::Tensor& tensor) {
  ValueSummary summary;
  summary.tensor = summarise(tensor);
  if (!tensor.defined() || tensor.is_nested() || tensor.layout() != at::kStrided ||
      tensor.is_meta() || !(tensor.key_set() & kPythonDecides).empty() ||
      tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || tensor.numel() == 0) {
    return summary;
  }
  try {
    // Below autograd: no node is made and no sequence number taken; the traced code never
    // runs under this guard.
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor values = tensor;
    if (values.is_complex()) {
      values = values.abs();
    } else if (values.scalar_type() == at::kBool) {
      values = values.to(at::kByte);
    }
    auto extremes = values.aminmax();
    summary.low = std::get<0>(extremes).to(at::kDouble);
    summary.high = std::get<1>(extremes).to(at::kDouble);
    auto total = values.is_floating_point() ? values.sum() : values.sum(at::kDouble);
    summary.mean = total.to(at::kDouble).div(static_cast<double>(values.numel()));
    summary.has_values = true;
  } catch (const std::exception&) {  // a dtype or device without these kernels: shape only
    summary.has_values = false;
  }
  return summary;
}

OutputSummary summarise_output(const c10::IValue& value) {
  OutputSummary output;
  if (value.isTensor()) {
    output.is_tensor = true;
    output.values.push_back(summarise_values(value.toTensor()));
  } else if (value.isTensorList()) {
    output.is_list = true;
    for (const auto& item : value.toTensorList()) {
      output.values.push_back(summarise_values(item));
    }
  }
  return output;
}

// ------------------------------------------------------------------ callbacks

bool starts_with_any(const char* name, const std::vector<std::string>& prefixes) {
  for (const auto& prefix : prefixes) {
    if (std::strncmp(name, prefix.c_str(), prefix.size()) == 0) {
      return true;
    }
  }
  return false;
}

// Time an enter event (its observer time counted up to now), log it, and hand the exit
// callback what it needs.
std::unique_ptr<at::ObserverContext> entered(
    Current& here, Event&& event, int64_t began, bool watched = false, bool summarise = false) {
  ThreadLog& log = *here.log;
  int64_t ended = now_ns();
  log.overhead += ended - began;
  event.time = ended;
  event.overhead = log.overhead;
  push(*here.recorder, log, std::move(event));
  return std::make_unique<Entered>(
      here.recorder, here.log, std::uncaught_exceptions(), watched, summarise);
}

// The log this thread's callbacks report to now; null while the observer itself runs or
// after a callback failed.
Current* observing() {
  if (t_busy) {
    return nullptr;
  }
  Current* here = current();
  return here == nullptr || here->recorder->failed.load() ? nullptr : here;
}

// Whether a hidden call is running on the log's thread (what runs under it is counted only).
bool under_hidden(const ThreadLog& log) {
  return !log.stack.empty() && (log.stack.back() & kOpenHidden) != 0;
}

// Enter a named range or autograd node: a group the calls inside belong to.
std::unique_ptr<at::ObserverContext> enter_group(
    Current& here, const at::RecordFunction& fn, int kind, int64_t began) {
  Recorder& recorder = *here.recorder;
  ThreadLog& log = *here.log;
  Event event;
  event.kind = kind;
  event.name = fn.name();
  event.sequence_nr = fn.seqNr();
  event.extra = static_cast<int64_t>(fn.forwardThreadId());
  if (kind == kRange && reads_origin(recorder, log) && PyGILState_GetThisThreadState()) {
    BusyGuard busy;
    py::gil_scoped_acquire gil;
    py::error_scope pending;
    try {
      event.origin = read_origin(recorder).release().ptr();
    } catch (py::error_already_set& error) {
      keep_error(recorder, error.value());
      return nullptr;
    }
  }
  log.stack.push_back(kOpenGroup);
  return entered(here, std::move(event), began);
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  Current* here = observing();
  if (here == nullptr) {
    return nullptr;
  }
  Recorder& recorder = *here->recorder;
  ThreadLog& log = *here->log;
  if (under_hidden(log)) {
    ++log.hidden;
    return nullptr;
  }
  int64_t began = now_ns();
  const char* name = fn.name();
  if (starts_with_any(name, recorder.ranges)) {
    return enter_group(*here, fn, kRange, began);
  }
  int op_index = -1;
  OpEntry op;
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    op_index = op_of(fn, recorder);
    if (op_index >= 0) {
      op = recorder.answers->ops[op_index];
    }
  }
  if (op_index < 0 || !checked_op(recorder, op_index, op)) {
    return nullptr;
  }
  auto inputs = call_arguments(fn, op);
  Event event;
  event.kind = op_index;
  event.sequence_nr = fn.seqNr();
  std::vector<uint64_t> key;
  bool cached = read_call(inputs, op, op_index, key, event.arguments);
  int flags = 0;
  bool found = false;
  if (cached) {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    auto& answers = *recorder.answers;
    auto it = answers.segments.find(key);
    if (it != answers.segments.end()) {
      found = true;
      event.segment = it->second;
      flags = answers.segment_flags[it->second];
    }
  }
  bool origin = reads_origin(recorder, log) && PyGILState_GetThisThreadState() != nullptr;
  bool watched = false;
  if (!found || origin) {
    BusyGuard busy;
    py::gil_scoped_acquire gil;
    py::error_scope pending;  // a Python error on its way up (a handler raised) waits meanwhile
    Py_ssize_t loaded_before = modules_loaded();
    try {
      if (!found) {
        py::tuple values(inputs.size());
        for (size_t i = 0; i < inputs.size(); ++i) {
          values[i] = to_python(inputs[i]);
        }
        py::tuple answer;
        {
          CompilerPause paused(recorder.set_eval_frame);
          answer = py::handle(recorder.describe)(op_index, op.name, op.overload, values, !cached);
        }
        event.segment = answer[0].cast<int>();
        flags = answer[2].cast<int>();
        if (!cached) {
          event.arguments.clear();
          event.described = py::object(answer[1]).release().ptr();
        } else if ((flags & kHide) == 0) {  // "hide" holds for this call, not its state
          std::lock_guard<std::mutex> lock(recorder.mutex);
          auto& answers = *recorder.answers;
          answers.segments.emplace(std::move(key), event.segment);
          if (answers.segment_flags.size() <= static_cast<size_t>(event.segment)) {
            answers.segment_flags.resize(event.segment + 1, 0);
          }
          answers.segment_flags[event.segment] = static_cast<uint8_t>(flags);
        }
        watched = (flags & kHide) == 0;
      }
      if (origin && (flags & kHide) == 0) {
        event.origin = read_origin(recorder).release().ptr();
      }
      log.observer_loaded += modules_loaded() - loaded_before;
      if (watched) {
        event.extra = modules_loaded() - log.observer_loaded;
      }
    } catch (py::error_already_set& error) {
      Py_CLEAR(event.described);
      Py_CLEAR(event.origin);
      keep_error(recorder, error.value());
      return nullptr;
    } catch (const std::exception& error) {
      Py_CLEAR(event.described);
      Py_CLEAR(event.origin);
      keep_error(recorder, py::module_::import("builtins").attr("RuntimeError")(error.what()));
      return nullptr;
    }
  }
  if (flags & kHide) {
    Event placeholder;  // the hidden call: its calls are counted under it
    placeholder.kind = kHidden;
    placeholder.segment = event.segment;
    placeholder.origin = event.origin;
    event.origin = nullptr;
    if (event.described != nullptr) {
      py::gil_scoped_acquire gil;
      Py_CLEAR(event.described);
    }
    log.stack.push_back(kOpenHidden);
    log.hidden = 0;
    return entered(*here, std::move(placeholder), began);
  }
  // values=True summarises the values the code computed: the outputs of the calls made by
  // the traced code, a group, a decomposition or a Python kernel (not a C++ kernel's own
  // helpers, which may see buffers not filled yet), views of inputs aside
  bool summarise = recorder.values && (flags & kNoValues) == 0 &&
      (log.stack.empty() ||
       (log.stack.back() & (kOpenPython | kOpenValues | kOpenGroup)) != 0);
  log.stack.push_back(
      ((flags & kRunsPython) ? kOpenPython | kOpenValues : 0) |
      ((flags & kMakesValues) ? kOpenValues : 0));
  return entered(*here, std::move(event), began, watched, summarise);
}

std::unique_ptr<at::ObserverContext> on_node_enter(const at::RecordFunction& fn) {
  Current* here = observing();
  if (here == nullptr || under_hidden(*here->log)) {
    return nullptr;
  }
  return enter_group(*here, fn, kNode, now_ns());
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (context == nullptr) {
    return;
  }
  auto* entered = static_cast<Entered*>(context);
  Recorder& recorder = *entered->recorder;
  ThreadLog& log = *entered->log;
  int64_t began = now_ns();
  Event event;
  // The guard ends while an exception leaves the kernel: the call raised.
  event.unwinding = std::uncaught_exceptions() > entered->uncaught;
  event.time = began;
  Open closing = log.stack.empty() ? 0 : log.stack.back();
  if (!log.stack.empty()) {
    log.stack.pop_back();
  }
  if ((closing & kOpenHidden) != 0) {
    event.extra = log.hidden;
    log.hidden = 0;
  } else if (entered->watched) {
    BusyGuard busy;
    py::gil_scoped_acquire gil;
    py::error_scope pending;
    event.extra = static_cast<int64_t>(modules_loaded()) - log.observer_loaded;
  }
  if (entered->summarise && !event.unwinding) {
    BusyGuard busy;
    event.has_outputs = true;
    for (const auto& output : fn.outputs()) {
      event.outputs.push_back(summarise_output(output));
    }
  }
  event.overhead = log.overhead;
  push(recorder, log, std::move(event));
  log.overhead += now_ns() - began;
}

void release_python(Recorder& recorder) {
  Py_CLEAR(recorder.describe);
  Py_CLEAR(recorder.check);
  Py_CLEAR(recorder.user_code);
  Py_CLEAR(recorder.stop_frame);
  Py_CLEAR(recorder.set_eval_frame);
  for (PyObject* code : recorder.module_calls) {
    Py_DECREF(code);
  }
  recorder.module_calls.clear();
  for (auto& entry : recorder.user_codes) {
    Py_DECREF(entry.first);
  }
  recorder.user_codes.clear();
}

bool running() {
  return t_started != nullptr;
}

void start(
    py::object describe,
    py::object check,
    const std::string& owner,
    py::object user_code,
    py::tuple module_calls,
    py::object stop_frame,
    py::tuple ranges,
    bool values,
    py::object set_eval_frame) {
  if (t_started != nullptr) {
    throw std::runtime_error("the operator observer is already running on this thread");
  }
  if (!t_answers || t_answers->owner != owner) {  // segment ids mean something to their owner
    t_answers = std::make_shared<Answers>();
    t_answers->owner = owner;
  }
  auto recorder = std::make_shared<Recorder>();
  recorder->answers = t_answers;
  recorder->checked.assign(t_answers->ops.size(), false);
  recorder->describe = describe.release().ptr();
  recorder->check = check.release().ptr();
  recorder->user_code = user_code.is_none() ? nullptr : user_code.release().ptr();
  recorder->stop_frame = stop_frame.is_none() ? nullptr : stop_frame.release().ptr();
  recorder->set_eval_frame = set_eval_frame.is_none() ? nullptr : set_eval_frame.release().ptr();
  for (const auto& code : module_calls) {
    recorder->module_calls.insert(code.inc_ref().ptr());
  }
  for (const auto& prefix : ranges) {
    recorder->ranges.push_back(prefix.cast<std::string>());
  }
  recorder->values = values;
  ThreadLog* log = nullptr;
  {
    std::lock_guard<std::mutex> lock(recorder->mutex);
    log = log_of(*recorder);
  }
  auto calls = at::RecordFunctionCallback(&on_enter, &on_exit)
                   .needsInputs(true)
                   .needsOutputs(values)
                   .scopes({at::RecordScope::FUNCTION});
  auto nodes =
      at::RecordFunctionCallback(&on_node_enter, &on_exit).scopes({at::RecordScope::BACKWARD_FUNCTION});
  recorder->handles.push_back(at::addThreadLocalCallback(calls));
  recorder->handles.push_back(at::addThreadLocalCallback(nodes));
  {
    std::lock_guard<std::mutex> lock(g_active_mutex);
    for (auto handle : recorder->handles) {
      g_active.emplace_back(handle, recorder);
    }
  }
  t_started = recorder;
  t_handle = recorder->handles[0];
  t_current = Current{recorder, log};
}

py::object dtype_object(at::ScalarType dtype) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
}

py::object tensor_tuple(const TensorSummary& tensor) {
  if (!tensor.defined) {
    return py::none();
  }
  py::object sizes = py::none();
  if (tensor.has_sizes) {
    py::tuple values(tensor.sizes.size());
    for (size_t i = 0; i < tensor.sizes.size(); ++i) {
      values[i] = py::int_(tensor.sizes[i]);
    }
    sizes = values;
  }
  return py::make_tuple(
      dtype_object(tensor.dtype),
      c10::DeviceTypeName(tensor.device, /*lower_case=*/true),
      sizes,
      tensor.requires_grad);
}

py::object arguments_tuple(const Event& event) {
  if (event.described != nullptr) {
    return py::reinterpret_borrow<py::object>(event.described);
  }
  std::string kinds;
  py::tuple values(event.arguments.size());
  for (size_t i = 0; i < event.arguments.size(); ++i) {
    const ArgumentSummary& argument = event.arguments[i];
    if (argument.kind == ArgumentSummary::kTensor) {
      kinds += 't';
      values[i] = tensor_tuple(argument.tensors[0]);
    } else if (argument.kind == ArgumentSummary::kTensorList) {
      kinds += 'l';
      py::tuple items(argument.tensors.size());
      for (size_t j = 0; j < argument.tensors.size(); ++j) {
        items[j] = tensor_tuple(argument.tensors[j]);
      }
      values[i] = items;
    } else {
      kinds += 'v';
      values[i] = torch::jit::toPyObject(argument.value);
    }
  }
  return py::make_tuple(kinds, values);
}

py::object value_tuple(const ValueSummary& value) {
  if (!value.tensor.defined) {
    return py::none();
  }
  py::object numbers = py::none();
  if (value.has_values) {
    numbers = py::make_tuple(
        value.low.item<double>(), value.high.item<double>(), value.mean.item<double>());
  }
  return py::make_tuple(tensor_tuple(value.tensor), numbers);
}

py::object outputs_tuple(const Event& event) {
  if (!event.has_outputs) {
    return py::none();
  }
  py::tuple outputs(event.outputs.size());
  for (size_t i = 0; i < event.outputs.size(); ++i) {
    const OutputSummary& output = event.outputs[i];
    if (output.is_tensor) {
      outputs[i] = value_tuple(output.values[0]);
    } else if (output.is_list) {  // a list, where a tensor's summary is a tuple
      py::list items;
      for (const auto& value : output.values) {
        items.append(value_tuple(value));
      }
      outputs[i] = items;
    } else {
      outputs[i] = py::none();
    }
  }
  return outputs;
}

py::object steal_or_none(PyObject*& object) {
  if (object == nullptr) {
    return py::none();
  }
  return py::reinterpret_steal<py::object>(std::exchange(object, nullptr));
}

// An event as Python sees it (see op_observer.py): an exit, or an enter whose detail is the
// name (a range, a node) or the segment (a call, a hidden call).
py::tuple event_tuple(Event& event) {
  if (event.kind == kExit) {
    return py::make_tuple(
        kExit, event.unwinding, event.time, event.overhead, outputs_tuple(event), event.extra);
  }
  bool named = event.kind == kRange || event.kind == kNode;
  py::object detail = named ? py::object(py::str(event.name)) : py::object(py::int_(event.segment));
  py::object arguments = event.kind >= 0 ? arguments_tuple(event) : py::none();
  Py_CLEAR(event.described);
  return py::make_tuple(
      event.kind,
      detail,
      event.time,
      event.overhead,
      arguments,
      event.sequence_nr,
      steal_or_none(event.origin),
      event.extra);
}

// Stop and hand over the log: (ops, threads, error). See op_observer.py for the events.
py::tuple stop() {
  std::shared_ptr<Recorder> recorder = std::exchange(t_started, nullptr);
  if (recorder == nullptr) {
    return py::make_tuple(py::list(), py::list(), py::none());
  }
  for (auto handle : recorder->handles) {
    at::removeCallback(handle);
  }
  {
    std::lock_guard<std::mutex> lock(g_active_mutex);
    for (auto it = g_active.begin(); it != g_active.end();) {
      it = it->second == recorder ? g_active.erase(it) : ++it;
    }
  }
  t_handle = 0;
  t_current = Current{};
  std::vector<std::unique_ptr<ThreadLog>> logs;
  PyObject* error = nullptr;
  py::list ops;
  {
    std::lock_guard<std::mutex> lock(recorder->mutex);
    recorder->stopped.store(true);
    logs = std::move(recorder->logs);
    error = std::exchange(recorder->error, nullptr);
    for (const OpEntry& op : recorder->answers->ops) {
      ops.append(py::make_tuple(op.name, op.overload));
    }
  }
  py::list threads;
  for (auto& log : logs) {
    py::list events;
    for (Event& event : log->events) {
      events.append(event_tuple(event));
    }
    threads.append(py::make_tuple(
        log->native_id, log->name, static_cast<int64_t>(log->record_function_id), events));
  }
  release_python(*recorder);
  py::object failure = error == nullptr ? py::none() : py::reinterpret_steal<py::object>(error);
  return py::make_tuple(ops, threads, failure);
}

// How many events this thread's log holds: what Python code notes while the log runs is
// placed among the calls by it (after that many enters and exits).
size_t position() {
  if (t_started == nullptr) {
    return 0;
  }
  std::lock_guard<std::mutex> lock(t_started->mutex);
  return t_started->logs.empty() ? 0 : t_started->logs[0]->events.size();
}

// Python objects of an enum, indexed by value (None where torch has no Python object for it).
template <typename Enum, typename ToPython>
py::tuple enum_objects(Enum count, ToPython to_python) {
  py::tuple objects(static_cast<size_t>(count));
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    PyObject* object = nullptr;
    try {
      object = to_python(static_cast<Enum>(i));
    } catch (const std::exception&) {
      object = nullptr;
    }
    objects[i] = object == nullptr ? py::none() : py::reinterpret_borrow<py::object>(object);
  }
  return objects;
}

// Arguments arrive as IValues, which hold dtypes, layouts and memory formats as plain ints:
// these tables turn them back into torch.dtype, torch.layout and torch.memory_format.
py::dict enum_tables() {
  py::dict tables;
  tables["ScalarType"] = enum_objects(at::ScalarType::NumOptions, [](at::ScalarType value) {
    return reinterpret_cast<PyObject*>(torch::getTHPDtype(value));
  });
  tables["Layout"] = enum_objects(at::Layout::NumOptions, [](at::Layout value) {
    return reinterpret_cast<PyObject*>(torch::getTHPLayout(value));
  });
  tables["MemoryFormat"] = enum_objects(at::MemoryFormat::NumOptions, [](at::MemoryFormat value) {
    return torch::utils::getTHPMemoryFormat(value);
  });
  return tables;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def(
      "start",
      &start,
      "Log every operator call of this thread and the threads torch hands its work to.",
      py::arg("describe"),
      py::arg("check"),
      py::arg("owner"),
      py::arg("user_code"),
      py::arg("module_calls"),
      py::arg("stop_frame"),
      py::arg("ranges"),
      py::arg("values"),
      py::arg("set_eval_frame"));
  module.def("stop", &stop, "Stop; returns (ops, threads, error).");
  module.def("running", &running, "Whether this thread is being observed.");
  module.def("position", &position, "How many events this thread's log holds so far.");
  module.def("enum_tables", &enum_tables, "torch.dtype/layout/memory_format objects by value.");
}
