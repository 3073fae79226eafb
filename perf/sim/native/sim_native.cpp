// perf's simulated device, per-op path in C++ (opt-in: PERF_SIM_NATIVE=1).
//
// Why: on `sim` every op ran a Python fallback (host views of the arguments, the CPU kernel,
// new sim tensors, the memory model's malloc and free): about 20 us an op where the CPU kernel
// takes 1-3, so loops of small ops ran 5-13x slower than on the CPU. Here the common op runs
// without Python: host views and new sim tensors are built in C++, and the memory model's
// allocations and frees go to an event log that Python replays when it reads the model.
//
// Representation: a sim storage's DataPtr has no data (as before) and, as its context, a
// HostRef holding the host (CPU) storage with the bytes. Ops this file does not take (those
// with a Python rule, several devices, sparse or mixed-device arguments, errors) go to the
// Python fallback, registered at the PrivateUse2 key and reached by redispatch.

#include <torch/extension.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace py = pybind11;

namespace {

constexpr auto kSim = c10::DeviceType::PrivateUse1;

struct HostRef {
  c10::Storage host;
};

void delete_host_ref(void* p);

// -- the memory model's event log -----------------------------------------------------------

struct Entry {
  int64_t refs;  // HostRefs holding this host storage
  int64_t id;    // the model's block id
  int64_t nbytes;
  int64_t device;
};

// The registry and the log live as long as the process: frees come from any thread, and
// some come after static destructors have run (tensors that torch's own statics hold).
std::mutex& g_mu = *new std::mutex();
std::unordered_map<c10::StorageImpl*, Entry>& g_hosts =
    *new std::unordered_map<c10::StorageImpl*, Entry>();
// (1 alloc / 0 free, id, nbytes, device)
std::vector<std::array<int64_t, 4>>& g_log = *new std::vector<std::array<int64_t, 4>>();
int64_t g_next_id = 1;
bool g_tracking = true;
bool g_eager = false;       // replay after each allocation (stacks, out-of-memory errors)
// a program that never reads the model still has it replayed now and then: the log's bound
constexpr size_t kMaxLog = 1 << 16;
py::object* g_replay = nullptr;  // Python: replays the log (leaked on purpose: exit order)

void replay_now() {
  if (g_replay == nullptr) {
    return;
  }
  py::gil_scoped_acquire gil;
  (*g_replay)();
}

// A host storage known at another size was resized in place: as CUDA does it, the new block
// is allocated, then the old one freed (g_mu held; returns whether Python must replay now).
bool log_resized(Entry& e, int64_t n) {
  const int64_t id = g_next_id++;
  g_log.push_back({1, id, n, e.device});
  g_log.push_back({0, e.id, e.nbytes, e.device});
  e.id = id;
  e.nbytes = n;
  return g_eager;
}

// A sim storage now holds `host`: an allocation unless already known (returns whether Python
// must replay now).
bool note_attach(const c10::Storage& host, int64_t device) {
  if (!g_tracking) {
    return false;
  }
  std::lock_guard<std::mutex> g(g_mu);
  auto* key = host.unsafeGetStorageImpl();
  const auto n = static_cast<int64_t>(host.nbytes());
  auto it = g_hosts.find(key);
  if (it == g_hosts.end()) {
    const int64_t id = g_next_id++;
    g_hosts.emplace(key, Entry{1, id, n, device});
    g_log.push_back({1, id, n, device});
    return g_eager || g_log.size() >= kMaxLog;
  }
  it->second.refs++;
  return it->second.nbytes != n && log_resized(it->second, n);
}

// `host` may have been resized in place (resize_, an out= that resized, storage.resize_).
bool note_resize(const c10::Storage& host) {
  if (!g_tracking) {
    return false;
  }
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_hosts.find(host.unsafeGetStorageImpl());
  const auto n = static_cast<int64_t>(host.nbytes());
  return it != g_hosts.end() && it->second.nbytes != n && log_resized(it->second, n);
}

void delete_host_ref(void* p) {
  auto* ref = static_cast<HostRef*>(p);
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_hosts.find(ref->host.unsafeGetStorageImpl());
    if (it != g_hosts.end() && --it->second.refs == 0) {
      g_log.push_back({0, it->second.id, it->second.nbytes, it->second.device});
      g_hosts.erase(it);
    }
  }
  delete ref;
}

// -- sim tensors and host views --------------------------------------------------------------

inline HostRef* ref_of_storage(const c10::Storage& st) {
  const auto& dp = st.data_ptr();
  return dp.get_deleter() == &delete_host_ref ? static_cast<HostRef*>(dp.get_context())
                                              : nullptr;
}

inline HostRef* ref_of(const at::Tensor& t) {
  auto* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage()) {
    return nullptr;
  }
  return ref_of_storage(impl->unsafe_storage());
}

c10::Storage sim_storage(const c10::Storage& host, int64_t device, bool* replay) {
  const bool r = note_attach(host, device);
  if (replay != nullptr) {
    *replay = *replay || r;
  } else if (r) {
    replay_now();
  }
  auto* ref = new HostRef{host};
  c10::DataPtr dp(nullptr, ref, &delete_host_ref,
                  c10::Device(kSim, static_cast<c10::DeviceIndex>(device)));
  return c10::Storage(c10::Storage::use_byte_size_t(), host.nbytes(), std::move(dp), nullptr,
                      false);
}

at::Tensor sim_tensor(c10::Storage st, caffe2::TypeMeta dtype, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(st), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) {
    impl->_set_conj(true);
  }
  if (like.is_neg()) {
    impl->_set_neg(true);
  }
  return at::Tensor(std::move(impl));
}

at::Tensor host_view_of(const at::Tensor& t, HostRef* ref) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(ref->host), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.storage_offset() == b.storage_offset();
}

// `outer` (a sim tensor) describes `cpu` from now on: its host storage, sizes, strides, offset.
void repoint(const at::Tensor& outer, const at::Tensor& cpu, bool* replay) {
  auto* impl = outer.unsafeGetTensorImpl();
  HostRef* ref = ref_of(outer);
  const auto& host = cpu.storage();
  if (ref == nullptr || ref->host.unsafeGetStorageImpl() != host.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(sim_storage(host, outer.device().index(), replay));
  } else {
    if (impl->unsafe_storage().nbytes() != host.nbytes()) {
      impl->unsafe_storage().set_nbytes(host.nbytes());
    }
    const bool r = note_resize(host);
    if (replay != nullptr) {
      *replay = *replay || r;
    } else if (r) {
      replay_now();
    }
  }
  if (!same_geometry(outer, cpu)) {
    impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
  }
}

// -- the fallback ----------------------------------------------------------------------------

struct OpInfo {
  bool python = false;       // this op goes to the Python fallback
  bool self_on_sim = false;  // only with a sim `self` (_to_copy: from the host is a transfer)
  int pin_memory = -1;       // index of its pin_memory argument
};

std::mutex& g_ops_mu = *new std::mutex();  // as the registry's: never destroyed
std::unordered_set<std::string>& g_python_names = *new std::unordered_set<std::string>();
std::unordered_map<const c10::FunctionSchema*, OpInfo>& g_ops =
    *new std::unordered_map<const c10::FunctionSchema*, OpInfo>();
bool g_fast = true;
std::unique_ptr<torch::Library> g_lib;
std::atomic<int64_t> g_fast_count{0};    // ops the C++ path ran (diagnostics)
std::atomic<int64_t> g_python_count{0};  // ops it left to Python

OpInfo info_of(const c10::OperatorHandle& op) {
  const auto* key = &op.schema();
  std::lock_guard<std::mutex> g(g_ops_mu);
  auto it = g_ops.find(key);
  if (it != g_ops.end()) {
    return it->second;
  }
  OpInfo info;
  const auto& name = op.operator_name();
  std::string full = name.name;
  if (!name.overload_name.empty()) {
    full += "." + name.overload_name;
  }
  info.python = g_python_names.count(full) > 0 || g_python_names.count(name.name) > 0;
  info.self_on_sim = name.name == "aten::_to_copy";
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "pin_memory") {
      info.pin_memory = static_cast<int>(i);
    }
  }
  g_ops.emplace(key, info);
  return info;
}

// diagnostics: which ops went to Python, and how often (off unless asked for)
bool g_trace = false;
std::unordered_map<std::string, int64_t>& g_traced = *new std::unordered_map<std::string, int64_t>();

inline void to_python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_python_count.fetch_add(1, std::memory_order_relaxed);
  if (g_trace) {
    std::lock_guard<std::mutex> g(g_ops_mu);
    const auto& name = op.operator_name();
    g_traced[name.name + (name.overload_name.empty() ? "" : "." + name.overload_name)]++;
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
}

// Several devices (perf.sim.ordinals): their number, and this thread's current device, which
// Python sets wherever it changes its own (a new thread starts on device 0 in both).
int64_t g_count = 1;
thread_local int64_t t_current = 0;

// Whether the C++ path takes this argument as it is (else: Python). `index` gathers the device
// index of the op's sim tensors and device arguments: -1 before the first; they must agree
// (CUDA's "Expected all tensors to be on the same device" is Python's to raise).
inline bool ok_index(int64_t i, int64_t& index) {
  if (index < 0) {
    index = i;
    return true;
  }
  return i == index;
}

inline bool ok_tensor(const at::Tensor& t, int64_t& index) {
  if (!t.defined()) {
    return true;
  }
  const auto type = t.device().type();
  if (type == kSim) {
    return t.layout() == c10::kStrided && !t.is_conj() && !t.is_neg() && ref_of(t) != nullptr &&
           ok_index(t.device().index(), index);
  }
  if (type == c10::DeviceType::CPU) {
    return t.dim() == 0;  // CUDA accepts host scalars; anything else: Python decides
  }
  return true;
}

bool ok_value(const c10::IValue& iv, int64_t& index) {
  if (iv.isTensor()) {
    return ok_tensor(iv.toTensor(), index);
  }
  if (iv.isTensorList()) {
    for (const at::Tensor& t : iv.toTensorList()) {
      if (!ok_tensor(t, index)) {
        return false;
      }
    }
    return true;
  }
  if (iv.isList()) {
    for (const c10::IValue& v : iv.toListRef()) {
      if (v.isTensor() && !ok_tensor(v.toTensor(), index)) {
        return false;
      }
    }
    return true;
  }
  if (iv.isDevice()) {  // to another device (_to_copy's device=cpu): Python's copy kernel
    const auto d = iv.toDevice();
    if (d.type() != kSim) {
      return false;
    }
    const int64_t i = d.has_index() ? d.index() : t_current;  // no index: the current one
    return i < g_count && ok_index(i, index);  // past the count: Python's "invalid ordinal"
  }
  return true;
}

using Seen = c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 8>;

inline at::Tensor unwrap_tensor(const at::Tensor& t, Seen& seen) {
  auto h = host_view_of(t, ref_of(t));
  seen.emplace_back(h.unsafeGetTensorImpl(), t);
  return h;
}

inline bool is_sim(const at::Tensor& t) {
  return t.defined() && t.device().type() == kSim;
}

void unwrap_value(c10::IValue& iv, Seen& seen) {
  if (iv.isTensor()) {
    const auto& t = iv.toTensor();
    if (is_sim(t)) {
      iv = unwrap_tensor(t, seen);
    }
    return;
  }
  if (iv.isTensorList()) {
    auto list = iv.toTensorList();
    bool any = false;
    for (const at::Tensor& t : list) {
      any = any || is_sim(t);
    }
    if (!any) {
      return;
    }
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) {
      out.push_back(is_sim(t) ? unwrap_tensor(t, seen) : t);
    }
    iv = out;
    return;
  }
  if (iv.isList()) {
    auto list = iv.toList();
    bool any = false;
    for (const c10::IValue& v : list) {
      any = any || (v.isTensor() && is_sim(v.toTensor()));
    }
    if (!any) {
      return;
    }
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const c10::IValue& v : list) {
      if (v.isTensor() && is_sim(v.toTensor())) {
        out.push_back(unwrap_tensor(v.toTensor(), seen));
      } else {
        out.push_back(v);
      }
    }
    iv = out;
    return;
  }
  if (iv.isDevice() && iv.toDevice().type() == kSim) {
    iv = c10::Device(c10::DeviceType::CPU);
  }
}

// Whether an output of the CPU kernel can become a sim tensor here.
inline bool ok_output(const at::Tensor& t) {
  return !t.defined() || t.device().type() != c10::DeviceType::CPU ||
         (t.layout() == c10::kStrided && !t.is_nested());
}

at::Tensor rewrap_tensor(const at::Tensor& out, const Seen& seen, int64_t index, bool* replay) {
  if (!out.defined() || out.device().type() != c10::DeviceType::CPU) {
    return out;
  }
  auto* impl = out.unsafeGetTensorImpl();
  for (const auto& p : seen) {
    if (p.first == impl) {  // an argument came back (in place, out=): the caller's own tensor
      const at::Tensor& outer = p.second;
      HostRef* ref = ref_of(outer);
      if (ref->host.unsafeGetStorageImpl() != out.storage().unsafeGetStorageImpl() ||
          !same_geometry(outer, out) ||
          outer.unsafeGetTensorImpl()->unsafe_storage().nbytes() != out.storage().nbytes()) {
        repoint(outer, out, replay);
      }
      return outer;
    }
  }
  auto* st = out.storage().unsafeGetStorageImpl();
  for (const auto& p : seen) {  // a view of an argument: it shares the argument's sim storage
    const at::Tensor& base = p.second;
    if (ref_of(base)->host.unsafeGetStorageImpl() == st) {
      c10::Storage sst = base.unsafeGetTensorImpl()->unsafe_storage();
      if (c10::InferenceMode::is_enabled() && !base.is_inference()) {
        c10::InferenceMode normal(false);  // a view of a normal tensor is normal
        return sim_tensor(std::move(sst), out.dtype(), out);
      }
      return sim_tensor(std::move(sst), out.dtype(), out);
    }
  }
  return sim_tensor(sim_storage(out.storage(), index, replay), out.dtype(), out);
}

// The op's arguments back on the stack as they came (for a redispatch to Python).
void restore_args(torch::jit::Stack* stack, size_t base, std::vector<c10::IValue>& saved) {
  stack->resize(base);
  for (auto& v : saved) {
    stack->push_back(std::move(v));
  }
}

void sim_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const OpInfo info = info_of(op);
  if (!g_fast || info.python) {
    return to_python(op, stack);
  }
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  int64_t index = -1;
  for (size_t i = base; i < stack->size(); ++i) {
    if (!ok_value((*stack)[i], index)) {
      return to_python(op, stack);
    }
  }
  if (index < 0) {
    index = t_current;
  }
  if (info.self_on_sim && (n == 0 || !(*stack)[base].isTensor() ||
                           !is_sim((*stack)[base].toTensor()))) {
    return to_python(op, stack);
  }
  std::vector<c10::IValue> saved(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  Seen seen;
  for (size_t i = base; i < stack->size(); ++i) {
    unwrap_value((*stack)[i], seen);
  }
  if (info.pin_memory >= 0) {
    auto& pm = (*stack)[base + static_cast<size_t>(info.pin_memory)];
    if (pm.isBool() && pm.toBool()) {
      pm = false;
    }
  }
  try {
    op.callBoxed(stack);
  } catch (...) {
    // errors (and dtypes the CPU lacks) are the Python fallback's to name and handle
    restore_args(stack, base, saved);
    return to_python(op, stack);
  }
  const size_t nret = schema.returns().size();
  const size_t rbase = stack->size() - nret;
  for (size_t i = rbase; i < stack->size(); ++i) {
    const auto& iv = (*stack)[i];
    bool ok = true;
    if (iv.isTensor()) {
      ok = ok_output(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) {
        ok = ok && ok_output(t);
      }
    }
    if (!ok) {  // a sparse or nested result (a conversion, without side effects): Python
      restore_args(stack, base, saved);
      return to_python(op, stack);
    }
  }
  g_fast_count.fetch_add(1, std::memory_order_relaxed);
  bool replay = false;
  for (size_t i = rbase; i < stack->size(); ++i) {
    auto& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = rewrap_tensor(iv.toTensor(), seen, index, &replay);
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) {
        out.push_back(rewrap_tensor(t, seen, index, &replay));
      }
      iv = out;
    }
  }
  if (replay) {
    replay_now();
  }
}

// -- the Python API --------------------------------------------------------------------------

HostRef* checked_ref(const at::Tensor& t) {
  HostRef* ref = ref_of(t);
  if (ref == nullptr) {
    throw std::runtime_error(
        "perf.sim.device: this sim tensor has no host storage (it was made by an operation the "
        "simulated device does not support); please report the operation");
  }
  return ref;
}

at::Tensor py_host_view(const at::Tensor& t) {
  return host_view_of(t, checked_ref(t));
}

py::object py_host_storage(py::handle storage) {
  const c10::Storage& st = THPStorage_Unpack(storage.ptr());
  HostRef* ref = ref_of_storage(st);
  if (ref == nullptr) {
    return py::none();
  }
  return py::reinterpret_steal<py::object>(THPStorage_Wrap(ref->host));
}

at::Tensor py_wrap(const at::Tensor& cpu, int64_t index) {
  return sim_tensor(sim_storage(cpu.storage(), index, nullptr), cpu.dtype(), cpu);
}

// a 1-d uint8 sim tensor over all of a sim storage's host bytes
at::Tensor py_bytes_of(py::handle storage) {
  const c10::Storage& st = THPStorage_Unpack(storage.ptr());
  HostRef* ref = ref_of_storage(st);
  TORCH_CHECK(ref != nullptr, "not a sim storage with a host storage");
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(st), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::Make<uint8_t>());
  const auto n = static_cast<int64_t>(ref->host.nbytes());
  const std::array<int64_t, 1> size{n};
  const std::array<int64_t, 1> stride{1};
  impl->set_sizes_and_strides(c10::IntArrayRef(size), c10::IntArrayRef(stride), 0);
  return at::Tensor(std::move(impl));
}

// set_(storage, offset, size, stride) of a sim tensor onto a sim storage
void py_set_storage(const at::Tensor& self, py::handle storage, int64_t offset,
                    std::vector<int64_t> size, std::vector<int64_t> stride) {
  const c10::Storage& st = THPStorage_Unpack(storage.ptr());
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(st);
  impl->set_sizes_and_strides(c10::IntArrayRef(size), c10::IntArrayRef(stride), offset);
}

void py_note_resized(py::handle storage) {
  const c10::Storage& st = THPStorage_Unpack(storage.ptr());
  HostRef* ref = ref_of_storage(st);
  if (ref == nullptr) {
    return;
  }
  st.set_nbytes(ref->host.nbytes());
  if (note_resize(ref->host)) {
    replay_now();
  }
}

bool py_same_view(const at::Tensor& sim, const at::Tensor& host) {
  HostRef* ref = ref_of(sim);
  return ref != nullptr &&
         ref->host.unsafeGetStorageImpl() == host.storage().unsafeGetStorageImpl() &&
         same_geometry(sim, host);
}

py::list py_drain() {
  std::vector<std::array<int64_t, 4>> log;
  {
    std::lock_guard<std::mutex> g(g_mu);
    log.swap(g_log);
  }
  py::list out;
  for (const auto& e : log) {
    out.append(py::make_tuple(e[0], e[1], e[2], e[3]));
  }
  return out;
}

void py_set_python_ops(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> g(g_ops_mu);
  g_python_names.clear();
  g_python_names.insert(names.begin(), names.end());
  g_ops.clear();
}

void py_install() {
  if (g_lib) {
    return;
  }
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1,
                                           __FILE__, __LINE__);
  g_lib->fallback(torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
}

// _copy_from(Tensor self, Tensor dst, bool non_blocking) between two sim tensors: the CPU's
// copy_ on their host views (no sync, no transfer: device to device). Copies that cross host
// and device, or that see conjugate or negative bits, are Python's (perf.sim.kernels).
void sim_copy_from(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = stack->size();
  const at::Tensor& src = (*stack)[n - 3].toTensor();
  const at::Tensor& dst = (*stack)[n - 2].toTensor();
  int64_t si = -1;
  int64_t di = -1;  // a copy between two sim devices is a device-to-device copy: no sync
  if (!g_fast || !is_sim(src) || !is_sim(dst) || !ok_tensor(src, si) || !ok_tensor(dst, di)) {
    return to_python(op, stack);
  }
  at::Tensor s = host_view_of(src, ref_of(src));
  at::Tensor d = host_view_of(dst, ref_of(dst));
  try {
    d.copy_(s);
  } catch (...) {
    return to_python(op, stack);  // Python names the error
  }
  g_fast_count.fetch_add(1, std::memory_order_relaxed);
  at::Tensor out = dst;
  stack->resize(n - 3);
  stack->emplace_back(std::move(out));
}

// Views that run their Meta kernel on the sim tensor itself (perf.sim.kernels.META_VIEWS): the
// result shares the base's sim storage. An error goes to the Python kernel, which names it.
void sim_view(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (!g_fast) {
    return to_python(op, stack);
  }
  const size_t n = op.schema().arguments().size();
  const size_t base = stack->size() - n;
  std::vector<c10::IValue> saved(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), stack);
  } catch (...) {
    restore_args(stack, base, saved);
    return to_python(op, stack);
  }
  g_fast_count.fetch_add(1, std::memory_order_relaxed);
}

// The device guard of PrivateUse1: what torch's Python backend registers
// (torch/csrc/acc/Module.cpp PythonDeviceGuard: device 0, one default stream, no-op events),
// with its type() in C++. That one asks Python for type() on every guard (the autograd engine
// and every kernel wrapper make one per op): about 6,000 Python calls per step of a small loop.
struct SimGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kSim; }
  c10::Device exchangeDevice(c10::Device) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(kSim, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream getNewStream(c10::Device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
};

// the C++ kernel for these aten ops at PrivateUse1 (structured ops, whose composite kernel for
// other backends would otherwise allocate the output and call the out= form: two ops)
std::unique_ptr<torch::Library> g_aten;

void py_register_ops(const std::vector<std::string>& names) {
  if (!g_aten) {
    g_aten = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  }
  for (const auto& n : names) {
    if (n.rfind("view:", 0) == 0) {
      g_aten->impl(n.substr(5).c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_view>());
    } else if (n == "_copy_from") {
      g_aten->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_copy_from>());
    } else {
      g_aten->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
    }
  }
}


// -- the GPU time model's op recorder (perf.instruments.gpu_model) ----------------------------
//
// Why: the model read the op stream with a Python TorchDispatchMode, whose floor (the call
// into Python and back, per op) cost more than this file's whole simulated op. The recorder
// is a boxed fallback at the Fake key, just below Python's: included in this thread's TLS
// while recording, it sees each op where a dispatch mode would (after autograd), runs it
// below with the Fake key excluded (so the ops a kernel calls are not seen, as a mode does
// not see them), and logs a row per op on the device. Rows become the model's events in
// Python when read. An op that needs more than a row (copies, reads, decompositions, a FLOPs
// formula not yet seen with these arguments) goes to Python, to the dispatch mode's code.

enum RecRoute : int8_t { kRecFast = 0, kRecEvent = 1, kRecRun = 2 };

struct RecInfo {
  int8_t route = kRecEvent;
  bool computes = false;  // launches a kernel (else a host-only event)
  bool formula = false;   // has a FLOPs formula: cached by its arguments
  int32_t name = -1;      // index of the op's facts in Python
  int32_t func = -1;      // the OpOverload's index in g_rec_funcs
};

enum RecKind : int8_t { kRowPy = 0, kRowKernel = 1, kRowHost = 2 };

struct Row {
  int8_t kind;
  int32_t op;      // RecInfo::name, or the index in g_rec_py for kRowPy
  int32_t site;
  int16_t dtype;   // ScalarType of the first floating tensor, -1: none
  int64_t flops;
  int64_t nbytes;
};

std::mutex& g_rec_mu = *new std::mutex();
std::atomic<bool> g_rec_on{false};
thread_local bool t_rec_paused = false;  // this thread's ops pass unrecorded (Dynamo compiling)
bool g_rec_pending = false;  // a buffer an async copy fills exists: every op to Python
std::atomic<int64_t> g_rec_depth{0};  // ops running (syncs inside one come after its event)
std::atomic<int64_t> g_rec_generation{0};  // a new recording: each thread's op cache is stale
std::vector<Row>& g_rows = *new std::vector<Row>();
std::vector<Row>& g_held = *new std::vector<Row>();
py::list* g_rec_py = nullptr;      // Python events, by index
py::list* g_rec_funcs = nullptr;   // the OpOverloads seen, by index
py::object* g_rec_cb = nullptr;    // Python: (classify, event, run, site)
std::unordered_map<const c10::FunctionSchema*, RecInfo>& g_rec_ops =
    *new std::unordered_map<const c10::FunctionSchema*, RecInfo>();
std::unordered_map<PyObject*, bool>& g_rec_users = *new std::unordered_map<PyObject*, bool>();
std::unordered_map<uint64_t, int32_t>& g_rec_sites = *new std::unordered_map<uint64_t, int32_t>();
std::unordered_map<std::string, int64_t>& g_rec_flops = *new std::unordered_map<std::string, int64_t>();
std::unique_ptr<torch::Library> g_rec_lib;
std::atomic<int64_t> g_rec_fast{0};
std::atomic<int64_t> g_rec_slow{0};

py::object rec_callback(int i) { return (*g_rec_cb)[py::int_(i)]; }

// the recorder's own Python (classify, event, site) runs unseen, as a mode's does: off the
// mode stack while it runs
struct Unseen {
  c10::impl::ExcludeDispatchKeyGuard off{c10::DispatchKey::Fake};
};

// the first user frame's site id (Python's frame_site, cached by code object and line);
// -1 where no user frame is on this thread's stack. Holds the GIL.
int32_t rec_site() {
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  if (f == nullptr) {
    return -1;
  }
  Py_INCREF(f);
  int32_t site = -1;
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    auto it = g_rec_users.find(reinterpret_cast<PyObject*>(code));
    bool mine;
    if (it == g_rec_users.end()) {
      Unseen unseen;
      py::object r = rec_callback(4)(py::reinterpret_borrow<py::object>(code->co_filename));
      mine = r.cast<bool>();
      Py_INCREF(code);  // held while cached: its address stays its own
      g_rec_users.emplace(reinterpret_cast<PyObject*>(code), mine);
    } else {
      mine = it->second;
    }
    if (mine) {
      const int line = PyFrame_GetLineNumber(f);
      const uint64_t key = (reinterpret_cast<uint64_t>(code) << 20) ^ static_cast<uint64_t>(line);
      auto s = g_rec_sites.find(key);
      if (s != g_rec_sites.end()) {
        site = s->second;
      } else {
        Unseen unseen;
        py::object r = rec_callback(3)(py::reinterpret_borrow<py::object>(code->co_filename),
                                       line, py::reinterpret_borrow<py::object>(code->co_name));
        site = r.cast<int32_t>();
        g_rec_sites.emplace(key, site);
      }
      Py_DECREF(code);
      Py_DECREF(f);
      return site;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  return -1;
}

RecInfo rec_info_of_locked(const c10::OperatorHandle& op);

// per thread, so that the common op takes no lock
RecInfo rec_info_of(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, RecInfo> cache;
  thread_local int64_t generation = -1;
  const int64_t now = g_rec_generation.load(std::memory_order_relaxed);
  if (generation != now) {
    cache.clear();
    generation = now;
  }
  const auto* key = &op.schema();
  auto it = cache.find(key);
  if (it != cache.end()) {
    return it->second;
  }
  RecInfo info = rec_info_of_locked(op);
  cache.emplace(key, info);
  return info;
}

RecInfo rec_info_of_locked(const c10::OperatorHandle& op) {
  const auto* key = &op.schema();
  {
    std::lock_guard<std::mutex> g(g_rec_mu);
    auto it = g_rec_ops.find(key);
    if (it != g_rec_ops.end()) {
      return it->second;
    }
  }
  py::gil_scoped_acquire gil;
  const auto& name = op.operator_name();
  Unseen unseen;
  py::tuple r = rec_callback(0)(name.name, name.overload_name);
  RecInfo info;
  info.route = static_cast<int8_t>(r[0].cast<int>());
  info.computes = r[1].cast<bool>();
  info.formula = r[2].cast<bool>();
  info.name = r[3].cast<int32_t>();
  info.func = static_cast<int32_t>(g_rec_funcs->size());
  g_rec_funcs->append(r[4]);
  std::lock_guard<std::mutex> g(g_rec_mu);
  g_rec_ops.emplace(key, info);
  return info;
}

py::object rec_arg(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) {
    return py::none();
  }
  auto kind = arg.real_type()->kind();
  if (auto opt = arg.real_type()->cast<c10::OptionalType>()) {
    kind = opt->getElementType()->kind();
  }
  if (kind == c10::ScalarTypeType::Kind) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
  }
  if (kind == c10::LayoutType::Kind) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(v.toInt()))));
  }
  if (kind == c10::MemoryFormatType::Kind) {
    return py::reinterpret_steal<py::object>(
        torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(v.toInt())));
  }
  return torch::jit::toPyObject(v);
}

bool rec_is_default(const c10::Argument& arg, const c10::IValue& v) {
  return arg.default_value().has_value() && *arg.default_value() == v;
}

// the op's arguments as a dispatch mode gets them: positional ones without trailing defaults,
// keyword-only ones that differ from their default (as torch's parseIValuesToPyArgsKwargs)
std::pair<py::tuple, py::dict> rec_args(const c10::OperatorHandle& op,
                                        const std::vector<c10::IValue>& values) {
  const auto& args = op.schema().arguments();
  size_t kw = values.size();
  while (kw > 0 && args[kw - 1].kwarg_only()) {
    --kw;
  }
  size_t npos = kw;
  while (npos > 0 && rec_is_default(args[npos - 1], values[npos - 1])) {
    --npos;
  }
  py::tuple pos(npos);
  for (size_t i = 0; i < npos; ++i) {
    pos[i] = rec_arg(args[i], values[i]);
  }
  py::dict kwargs;
  for (size_t i = kw; i < values.size(); ++i) {
    if (!rec_is_default(args[i], values[i])) {
      kwargs[py::str(args[i].name())] = rec_arg(args[i], values[i]);
    }
  }
  return {pos, kwargs};
}

py::object rec_outs(const torch::jit::Stack& stack, size_t rbase) {
  torch::jit::Stack outs(stack.begin() + static_cast<std::ptrdiff_t>(rbase), stack.end());
  return torch::jit::createPyObjectForStack(std::move(outs));
}

// an op's rows in the mode's order: its own, the syncs held while it ran, what comes after
void rec_append(const std::vector<Row>& own, const std::vector<Row>& after = {}) {
  std::lock_guard<std::mutex> g(g_rec_mu);
  g_rows.insert(g_rows.end(), own.begin(), own.end());
  g_rows.insert(g_rows.end(), g_held.begin(), g_held.end());
  g_held.clear();
  g_rows.insert(g_rows.end(), after.begin(), after.end());
}

void rec_flush_held() { rec_append({}); }

// the row of a Python event, kept in g_rec_py (the GIL held)
Row py_row(py::handle ev) {
  Row row{kRowPy, static_cast<int32_t>(g_rec_py->size()), -1, -1, 0, 0};
  g_rec_py->append(ev);
  return row;
}

struct DepthGuard {
  DepthGuard() { g_rec_depth.fetch_add(1, std::memory_order_relaxed); }
  ~DepthGuard() { g_rec_depth.fetch_sub(1, std::memory_order_relaxed); }
};

// the tensors a mode gets among an op's arguments or results: a wrapped number (`x + 1`'s 1)
// reaches Python as the number
inline void rec_tensors(const c10::IValue& iv, std::vector<at::Tensor>& out) {
  if (iv.isTensor()) {
    if (!iv.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
      out.push_back(iv.toTensor());
    }
  } else if (iv.isList()) {
    for (const c10::IValue& v : iv.toListRef()) {
      if (v.isTensor()) {
        out.push_back(v.toTensor());
      }
    }
  }
}

// the FLOPs cache key of a call: the op, then each argument (sizes of a tensor, a plain
// scalar's value) and each result's sizes; empty where an argument is of another kind
std::string rec_flops_key(const c10::FunctionSchema* schema,
                          const std::vector<c10::IValue>& values, const std::vector<at::Tensor>& outs) {
  std::string key(reinterpret_cast<const char*>(&schema), sizeof(schema));
  auto put = [&key](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  auto sizes = [&put](const at::Tensor& t) {
    put(-1000 - t.dim());
    for (int64_t d : t.sizes()) {
      put(d);
    }
  };
  for (const c10::IValue& v : values) {
    if (v.isTensor()) {
      if (v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
        return std::string();  // a number to the formula
      }
      sizes(v.toTensor());
    } else if (v.isNone()) {
      put(-2);
    } else if (v.isInt()) {
      put(-3);
      put(v.toInt());
    } else if (v.isBool()) {
      put(-4);
      put(v.toBool() ? 1 : 0);
    } else if (v.isDouble()) {
      put(-5);
      const double d = v.toDouble();
      int64_t bits = 0;
      std::memcpy(&bits, &d, sizeof(bits));
      put(bits);
    } else if (v.isIntList()) {
      put(-6);
      auto l = v.toIntList();
      put(static_cast<int64_t>(l.size()));
      for (int64_t x : l) {
        put(x);
      }
    } else {
      return std::string();
    }
  }
  put(-7);  // arguments end, results begin
  for (const at::Tensor& t : outs) {
    if (!t.defined()) {
      return std::string();
    }
    sizes(t);
  }
  return key;
}

void rec_to_python(const c10::OperatorHandle& op, const RecInfo& info,
                   const std::vector<c10::IValue>& values, const torch::jit::Stack& stack,
                   size_t rbase, const std::string& fkey) {
  g_rec_slow.fetch_add(1, std::memory_order_relaxed);
  py::gil_scoped_acquire gil;
  Unseen unseen;
  auto [args, kwargs] = rec_args(op, values);
  py::object out = rec_outs(stack, rbase);
  // (the op's event or None, the events after the syncs it held): the mode's order
  py::tuple r = rec_callback(1)((*g_rec_funcs)[static_cast<size_t>(info.func)], args, kwargs, out);
  py::object ev = r[0];
  py::list after = r[1];
  std::vector<Row> own;
  if (!ev.is_none()) {
    if (!fkey.empty()) {
      std::lock_guard<std::mutex> g(g_rec_mu);
      g_rec_flops.emplace(fkey, ev.attr("flops").cast<int64_t>());
    }
    own.push_back(py_row(ev));
  }
  std::vector<Row> rest;
  for (py::handle e : after) {
    rest.push_back(py_row(e));
  }
  rec_append(own, rest);
}

void rec_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake);
  if (!g_rec_on.load(std::memory_order_relaxed) || t_rec_paused) {
    c10::impl::ExcludeDispatchKeyGuard off(c10::DispatchKey::Fake);
    return op.redispatchBoxed(below, stack);
  }
  const RecInfo info = rec_info_of(op);
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  std::vector<c10::IValue> values(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  if (info.route == kRecRun) {
    // decomposed as the dispatch mode decomposes it, with the recorder on for its parts
    stack->resize(base);
    py::gil_scoped_acquire gil;
    auto [args, kwargs] = rec_args(op, values);
    values.clear();
    py::object out = rec_callback(2)((*g_rec_funcs)[static_cast<size_t>(info.func)], args, kwargs);
    const auto& rets = schema.returns();
    if (rets.size() == 1) {
      stack->push_back(torch::jit::toIValue(out, rets[0].real_type()));
    } else if (rets.size() > 1) {
      py::tuple t = out.cast<py::tuple>();
      for (size_t i = 0; i < rets.size(); ++i) {
        stack->push_back(torch::jit::toIValue(t[i], rets[i].real_type()));
      }
    }
    return;
  }
  {
    DepthGuard depth;
    c10::impl::ExcludeDispatchKeyGuard off(c10::DispatchKey::Fake);
    op.redispatchBoxed(below, stack);
  }
  const size_t rbase = stack->size() - schema.returns().size();
  std::vector<at::Tensor> ins;
  std::vector<at::Tensor> outs;
  for (const c10::IValue& v : values) {
    rec_tensors(v, ins);
  }
  for (size_t i = rbase; i < stack->size(); ++i) {
    rec_tensors((*stack)[i], outs);
  }
  bool on = false;
  bool plain = true;
  for (const auto* list : {&ins, &outs}) {
    for (const at::Tensor& t : *list) {
      if (!t.defined()) {
        continue;
      }
      plain = plain && t.layout() == c10::kStrided;  // sparse: its indices' and values' bytes
      on = on || t.device().type() == kSim;
    }
  }
  if (!on) {
    // the mode's last test: a `device=` keyword argument on the device
    const auto& args = schema.arguments();
    for (size_t i = 0; i < n && !on; ++i) {
      on = args[i].kwarg_only() && args[i].name() == "device" && values[i].isDevice() &&
           values[i].toDevice().type() == kSim;
    }
    if (!on) {  // the mode's event is None off the device, whatever the op
      return rec_flush_held();
    }
  }
  if (info.route == kRecEvent || g_rec_pending || !plain) {
    return rec_to_python(op, info, values, *stack, rbase, std::string());
  }
  Row row{info.computes ? kRowKernel : kRowHost, info.name, -1, -1, 0, 0};
  if (info.computes && info.formula) {
    const std::string fkey = rec_flops_key(&schema, values, outs);
    bool hit = false;
    if (!fkey.empty()) {
      std::lock_guard<std::mutex> g(g_rec_mu);
      auto it = g_rec_flops.find(fkey);
      if (it != g_rec_flops.end()) {
        row.flops = it->second;
        hit = true;
      }
    }
    if (!hit) {  // the formula's first run with these arguments: Python's, then cached
      return rec_to_python(op, info, values, *stack, rbase, fkey);
    }
  }
  g_rec_fast.fetch_add(1, std::memory_order_relaxed);
  if (info.computes) {
    std::vector<const c10::TensorImpl*> seen;
    for (const auto* list : {&ins, &outs}) {
      for (const at::Tensor& t : *list) {
        if (!t.defined()) {
          continue;
        }
        const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
        bool dup = false;
        for (const auto* s : seen) {
          dup = dup || s == impl;
        }
        if (dup) {
          continue;
        }
        seen.push_back(impl);
        row.nbytes += t.numel() * static_cast<int64_t>(t.element_size());
        if (row.dtype < 0 && c10::isFloatingType(t.scalar_type())) {
          row.dtype = static_cast<int16_t>(t.scalar_type());
        }
      }
    }
  }
  {
    py::gil_scoped_acquire gil;
    row.site = rec_site();
  }
  rec_append({row});
}

// the recorder's fallback at the Fake key, once; an error where another one holds the key
// (torch's C++ fake tensors would: none in torch 2.13)
void py_rec_register() {
  if (g_rec_lib) {
    return;
  }
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::Fake)) {
    throw std::runtime_error(
        "another fallback is registered at the Fake dispatch key, which the recorder uses");
  }
  g_rec_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::Fake,
                                               __FILE__, __LINE__);
  g_rec_lib->fallback(torch::CppFunction::makeFromBoxedFunction<&rec_fallback>());
}

// Python's side: start and stop recording on this thread, read the rows, add a Python event
void py_rec_start(py::object callbacks, bool keep) {
  py_rec_register();
  if (g_rec_cb == nullptr) {
    g_rec_cb = new py::object();
    g_rec_py = new py::list();
    g_rec_funcs = new py::list();
  }
  *g_rec_cb = std::move(callbacks);
  *g_rec_py = py::list();
  // the caches refer to Python's tables by index: kept while those are (a loop of blocks
  // pays its set-up once), else cleared with them; the code objects held, to a bound
  keep = keep && g_rec_users.size() < 100000;
  {
    std::lock_guard<std::mutex> g(g_rec_mu);
    g_rows.clear();
    g_held.clear();
    g_rec_depth = 0;
    g_rec_pending = false;
    if (!keep) {
      g_rec_generation.fetch_add(1);
      g_rec_ops.clear();
      g_rec_flops.clear();
    }
  }
  if (!keep) {
    *g_rec_funcs = py::list();
    for (auto& kv : g_rec_users) {
      Py_DECREF(kv.first);
    }
    g_rec_users.clear();
    g_rec_sites.clear();
  }
  g_rec_fast = 0;
  g_rec_slow = 0;
  g_rec_on = true;
}

void py_rec_stop() { g_rec_on = false; }

// the rows so far, taken: a list of tuples (kind, op, site, dtype, flops, nbytes), where a
// Python event's row is the event itself
py::list py_rec_take() {
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> g(g_rec_mu);
    rows.swap(g_rows);
  }
  py::list out;
  py::list pyev = *g_rec_py;
  for (const Row& r : rows) {
    if (r.kind == kRowPy) {
      out.append(pyev[static_cast<size_t>(r.op)]);
    } else {
      py::object dtype = py::none();
      if (r.dtype >= 0) {
        dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
            torch::getTHPDtype(static_cast<at::ScalarType>(r.dtype))));
      }
      out.append(py::make_tuple(r.kind, r.op, r.site, dtype, r.flops, r.nbytes));
    }
  }
  if (!g_rec_on) {
    std::lock_guard<std::mutex> g(g_rec_mu);
    if (g_held.empty()) {
      *g_rec_py = py::list();
    }
  }
  return out;
}

// a higher-order operator's events (perf.instruments.gpu_model), with the syncs held while
// it ran after them
void py_rec_done(py::list evs) {
  std::vector<Row> own;
  for (py::handle ev : evs) {
    own.push_back(py_row(ev));
  }
  rec_append(own);
}

void py_rec_event(py::object ev) {
  const Row row = py_row(ev);
  std::lock_guard<std::mutex> g(g_rec_mu);
  if (g_rec_depth > 0) {
    g_held.push_back(row);
  } else {
    g_rows.push_back(row);
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "perf's simulated device: the per-op path in C++";
  m.def("install", []() {
    py_install();
    static auto* guard = new SimGuard();  // never destroyed: the registry holds it to the end
    c10::impl::registerDeviceGuard(kSim, guard);
  }, "register the C++ fallback and device guard for PrivateUse1");
  m.def("register_ops", &py_register_ops);
  m.def("host_view", &py_host_view);
  m.def("host_storage", &py_host_storage);
  m.def("wrap", &py_wrap);
  m.def("repoint", [](const at::Tensor& outer, const at::Tensor& cpu) {
    repoint(outer, cpu, nullptr);
  });
  m.def("same_view", &py_same_view);
  m.def("bytes_of", &py_bytes_of);
  m.def("set_storage", &py_set_storage);
  m.def("note_resized", &py_note_resized);
  m.def("drain", &py_drain);
  m.def("set_python_ops", &py_set_python_ops);
  m.def("set_devices", [](int64_t count) { g_count = count; }, "the number of sim devices");
  m.def("set_current", [](int64_t index) { t_current = index; }, "this thread's device");
  m.def("set_fast", [](bool on) {
    const bool prev = g_fast;
    g_fast = on;
    return prev;
  });
  m.def("set_tracking", [](bool on) { g_tracking = on; });
  m.def("set_eager", [](bool on) { g_eager = on; });
  m.def("set_replay", [](py::object fn) {
    if (g_replay == nullptr) {
      g_replay = new py::object();
    }
    *g_replay = std::move(fn);
  });
  m.def("is_sim_storage", [](py::handle storage) {
    return ref_of_storage(THPStorage_Unpack(storage.ptr())) != nullptr;
  });
  m.def("trace_python", [](bool on) {
    std::lock_guard<std::mutex> g(g_ops_mu);
    g_trace = on;
    auto out = g_traced;
    g_traced.clear();
    return out;
  }, "count the ops that go to Python by name while on; returns (and clears) the counts");
  m.def("counts", []() { return py::make_tuple(g_fast_count.load(), g_python_count.load()); });
  m.def("log_size", []() {
    std::lock_guard<std::mutex> g(g_mu);
    return g_log.size();
  }, "events logged and not yet replayed");
  m.def("max_log", []() { return kMaxLog; });
  m.def("rec_register", &py_rec_register);
  m.def("rec_start", &py_rec_start, "record the GPU model's op stream on this thread");
  m.def("rec_stop", &py_rec_stop);
  m.def("rec_take", &py_rec_take);
  m.def("rec_event", &py_rec_event);
  m.def("rec_done", &py_rec_done);
  m.def("rec_depth", [](int64_t delta) { g_rec_depth.fetch_add(delta); });
  m.def("rec_unseen", [](py::object fn, py::tuple args, py::dict kwargs) {
    Unseen unseen;
    return fn(*args, **kwargs);
  }, "fn(*args, **kwargs) with the recorder's key excluded: its ops are not seen");
  m.def("rec_pending", [](bool on) { g_rec_pending = on; });
  m.def("rec_counts", []() { return py::make_tuple(g_rec_fast.load(), g_rec_slow.load()); });
  m.def("rec_pause", [](bool on) {
    const bool prev = t_rec_paused;
    t_rec_paused = on;
    return prev;
  }, "this thread's ops pass unrecorded while on, the dispatch keys unchanged (returns the "
     "previous setting)");
  m.def("rec_included", []() {
    return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake);
  }, "whether the recorder's key is in this thread's dispatch keys");
  m.def("rec_include", [](bool on) {
    const bool prev = c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake);
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, on);
    return prev;
  }, "include the recorder's key in this thread's dispatch (returns the previous setting)");
  m.def("live_hosts", []() {
    std::lock_guard<std::mutex> g(g_mu);
    return g_hosts.size();
  });
}
