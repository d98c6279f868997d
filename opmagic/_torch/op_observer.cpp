// opmagic's operator observer: records every operator call the dispatcher makes on this
// thread, through a thread-local RecordFunction callback (the hook torch.profiler uses).
//
// The dispatcher runs RecordFunction callbacks in Dispatcher::call and Dispatcher::callBoxed,
// after it computed the call's dispatch keys and before the first kernel runs, and never on
// redispatch. A callback adds no dispatch key and changes no thread-local dispatch state, so
// the calls it sees dispatch exactly as they would unobserved.
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
// Built once per torch, Python and compiler by opmagic/_torch/op_observer.py.

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

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

struct Event {
  int op = -1;  // the operator's index; -1 for an exit event
  int segment = -1;
  bool unwinding = false;
  int64_t time = 0;
  int64_t overhead = 0;  // observer time spent on this thread so far
  std::vector<ArgumentSummary> arguments;
  PyObject* described = nullptr;  // arguments as Python summarised them (owned), or null
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

struct Recorder {
  PyObject* describe = nullptr;  // describe(op, name, overload, inputs, python_decides)
  PyObject* check = nullptr;     // check(op, name, overload): are its answers still valid?
  PyObject* error = nullptr;     // the first exception a callback raised: logging stops
  at::CallbackHandle handle = 0;
  bool busy = false;
  int64_t overhead = 0;
  std::vector<Event> events;
  // Kept across logs:
  std::vector<OpEntry> ops;
  std::unordered_map<const char*, int> op_index;  // by the schema's name (stable) pointer
  std::unordered_map<std::vector<uint64_t>, int, KeyHash> segments;  // key[0]: the op
  std::vector<bool> checked;  // per op: `check` asked during this log
  std::string owner;  // whose answers the kept ones are: another owner starts afresh
};

thread_local Recorder t_recorder;

struct Entered : at::ObserverContext {
  explicit Entered(int uncaught) : uncaught(uncaught) {}
  int uncaught;  // exceptions in flight when the call began
};

struct BusyGuard {
  BusyGuard() { t_recorder.busy = true; }
  ~BusyGuard() { t_recorder.busy = false; }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;
};

void keep_error(const py::object& exception);

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

// Whether the operator's answers are still valid (asks Python once per log and operator);
// drops them when they are not. false also when `check` raised (logging stops).
bool checked_op(Recorder& recorder, int index) {
  if (recorder.checked[index]) {
    return true;
  }
  recorder.checked[index] = true;
  const OpEntry& op = recorder.ops[index];
  bool valid = false;
  {
    BusyGuard busy;
    py::gil_scoped_acquire gil;
    py::error_scope pending;
    try {
      valid = py::handle(recorder.check)(index, op.name, op.overload).cast<bool>();
    } catch (py::error_already_set& error) {
      keep_error(error.value());
      return false;
    }
  }
  if (!valid) {
    for (auto it = recorder.segments.begin(); it != recorder.segments.end();) {
      it = it->first[0] == static_cast<uint64_t>(index) ? recorder.segments.erase(it) : ++it;
    }
  }
  return true;
}

// The operator behind a RecordFunction, or -1 for a named range (RECORD_FUNCTION("...")).
int op_of(const at::RecordFunction& fn, Recorder& recorder) {
  const char* name = fn.name();
  auto found = recorder.op_index.find(name);
  if (found != recorder.op_index.end()) {
    int index = found->second;
    const OpEntry& op = recorder.ops[index];
    if (recorder.checked[index] || (op.name == name && op.overload == fn.overload_name())) {
      return index;
    }
    recorder.op_index.erase(found);  // the operator went away and another took its place
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
  recorder.ops.push_back(std::move(entry));
  recorder.checked.push_back(false);
  int index = static_cast<int>(recorder.ops.size()) - 1;
  recorder.op_index.emplace(name, index);  // the schema lives as long as the operator
  return index;
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

void keep_error(const py::object& exception) {
  if (t_recorder.error == nullptr) {
    t_recorder.error = exception.inc_ref().ptr();
  }
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  Recorder& recorder = t_recorder;
  if (recorder.describe == nullptr || recorder.busy || recorder.error != nullptr) {
    return nullptr;
  }
  int64_t began = now_ns();
  int op_index = op_of(fn, recorder);
  if (op_index < 0 || !checked_op(recorder, op_index)) {
    return nullptr;
  }
  const OpEntry& op = recorder.ops[op_index];
  auto inputs = call_arguments(fn, op);
  Event event;
  event.op = op_index;
  std::vector<uint64_t> key;
  bool cached = read_call(inputs, op, op_index, key, event.arguments);
  auto found = cached ? recorder.segments.find(key) : recorder.segments.end();
  if (found != recorder.segments.end()) {
    event.segment = found->second;
  } else {
    BusyGuard busy;
    py::gil_scoped_acquire gil;
    py::error_scope pending;  // a Python error on its way up (a handler raised) waits meanwhile
    try {
      py::tuple values(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        values[i] = to_python(inputs[i]);
      }
      py::tuple answer = py::handle(recorder.describe)(op_index, op.name, op.overload, values, !cached);
      event.segment = answer[0].cast<int>();
      if (!cached) {
        event.arguments.clear();
        event.described = py::object(answer[1]).release().ptr();
      } else {
        recorder.segments.emplace(std::move(key), event.segment);
      }
    } catch (py::error_already_set& error) {
      keep_error(error.value());
      return nullptr;
    } catch (const std::exception& error) {
      keep_error(py::module_::import("builtins").attr("RuntimeError")(error.what()));
      return nullptr;
    }
  }
  int64_t ended = now_ns();
  recorder.overhead += ended - began;
  event.time = ended;
  event.overhead = recorder.overhead;
  recorder.events.push_back(std::move(event));
  return std::make_unique<Entered>(std::uncaught_exceptions());
}

void on_exit(const at::RecordFunction& /*fn*/, at::ObserverContext* context) {
  Recorder& recorder = t_recorder;
  if (context == nullptr || recorder.describe == nullptr) {
    return;
  }
  int64_t began = now_ns();
  Event event;
  // The guard ends while an exception leaves the kernel: the call raised.
  event.unwinding = std::uncaught_exceptions() > static_cast<Entered*>(context)->uncaught;
  event.time = began;
  event.overhead = recorder.overhead;
  recorder.events.push_back(std::move(event));
  recorder.overhead += now_ns() - began;
}

void start(py::object describe, py::object check, const std::string& owner) {
  Recorder& recorder = t_recorder;
  if (recorder.handle != 0) {
    throw std::runtime_error("the operator observer is already running on this thread");
  }
  if (owner != recorder.owner) {  // segment ids mean something to their owner only
    recorder.ops.clear();
    recorder.op_index.clear();
    recorder.segments.clear();
    recorder.owner = owner;
  }
  recorder.describe = describe.release().ptr();
  recorder.check = check.release().ptr();
  recorder.overhead = 0;
  recorder.checked.assign(recorder.ops.size(), false);
  recorder.handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&on_enter, &on_exit)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
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

// Stop and hand over the log: (ops, events, error). ops: (name, overload) per index (indices
// stay valid across logs); events:
// (op, segment, time, overhead, arguments) for an enter, (-1, unwinding, time, overhead, None)
// for an exit; error: the exception `describe` raised (logging stopped there) or None.
// Arguments a Python description summarised come as Python gave them; others as (kinds,
// values): kinds a letter per argument, 't' a tensor as (dtype, device, sizes or None,
// requires_grad) (None: undefined), 'l' a tuple of those, 'v' the value itself.
py::tuple stop() {
  Recorder& recorder = t_recorder;
  if (recorder.handle != 0) {
    at::removeCallback(recorder.handle);
    recorder.handle = 0;
  }
  py::list ops;
  for (const OpEntry& op : recorder.ops) {
    ops.append(py::make_tuple(op.name, op.overload));
  }
  py::list events;
  for (const Event& event : recorder.events) {
    if (event.op < 0) {
      events.append(py::make_tuple(-1, event.unwinding, event.time, event.overhead, py::none()));
    } else {
      events.append(py::make_tuple(
          event.op, event.segment, event.time, event.overhead, arguments_tuple(event)));
    }
  }
  for (Event& event : recorder.events) {
    Py_CLEAR(event.described);
  }
  py::object error = recorder.error == nullptr
      ? py::none()
      : py::reinterpret_steal<py::object>(std::exchange(recorder.error, nullptr));
  Py_CLEAR(recorder.describe);
  Py_CLEAR(recorder.check);
  recorder.events.clear();
  return py::make_tuple(ops, events, error);
}

bool running() {
  return t_recorder.handle != 0;
}

// How many events this thread's log holds: what Python code notes while the log runs is
// placed among the calls by it (after that many enters and exits).
size_t position() {
  return t_recorder.events.size();
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
  module.def("start", &start, "Log every operator call on this thread (describe, check).");
  module.def("stop", &stop, "Stop; returns (ops, events, error).");
  module.def("running", &running, "Whether this thread is being observed.");
  module.def("position", &position, "How many events this thread's log holds so far.");
  module.def("enum_tables", &enum_tables, "torch.dtype/layout/memory_format objects by value.");
}
