// replay.cpp — Level 4's host path in C++: a call's recorded launches, replayed.
//
// Where Level 4's microseconds went (reports/h100-overhead.json, tiny sizes, H100 host):
// the kernels are Triton's, but every call ran Python around them: the autograd.Function's
// apply (~16 us), the launcher's choices and allocations, one Python launch per kernel, and
// in the backward the autograd engine handing its thread to Python (GIL) to run the
// Function's backward. Forward+backward cost 300-430 us of host time more than eager
// PyTorch, and a GPT step spent 47-65 ms on the wall for 20 ms of GPU work.
//
// The idea: for one argument signature (shapes, strides, dtypes, device, requires_grad,
// 16-byte alignment), everything the Python path decides is fixed: which kernels, their
// grids, their integer and float arguments, the buffers it allocates and where each
// pointer points inside them. Only the addresses change from call to call. So the first
// call of a signature is recorded (triton_kernels/replay.py: a dry pass of the Function's
// forward and backward that runs none of the kernels), and every later call is replayed
// here, in C++: allocate the same buffers, patch the pointers, cuLaunchKernel the compiled
// cubins Triton already loaded, and let one C++ autograd node hold what the backward reads.
// The backward then runs on the autograd engine's thread without Python, as eager's does.
//
// What it costs: a plan per signature (a few KB, built once); the launches are Triton's
// compiled kernels called with their raw parameter layout (pointers, i32/i64, fp32/fp64,
// then the global and profile scratch pointers Triton 3.3+ appends), which ties this file
// to that calling convention: replay.py refuses (and says why) any kernel that needs more
// (scratch memory, clusters, cooperative or PDL launches, TMA descriptors). No CUDA headers:
// the driver's cuLaunchKernel is found with dlopen, as Triton's own launcher finds it, and
// the current stream comes from c10's device-guard interface; g++ alone builds this file.
//
// A plan is a list of int64 words (replay.py's `encode` writes them, `parse` below reads
// them):
//   plan     := program(fwd) n_saved saved[n_saved] n_grads layout[n_grads] program(bwd)
//   program  := n_bases base* n_steps step* n_outputs view*
//   base     := kind index nbytes dtype ndim sizes[ndim] strides[ndim]
//               kind 0 INPUT (the op's tensor argument `index`), 1 TEMP (a new buffer:
//               empty_strided(sizes, strides, dtype) when ndim >= 0, else nbytes of bytes),
//               2 SAVED (forward base saved[index]), 3 GRAD (the gradient of forward output
//               `index`, in layout[index])
//   step     := 0 function gx gy gz threads shared n_params param*        (a launch)
//             | 1 view value_bits                                            (a fill)
//             | 2 view(dst) view(src)                                        (a copy)
//   param    := 0 base byte_offset (a pointer) | 1 (a null pointer) | 2 value (int32)
//             | 3 value (int64) | 4 bits (fp32) | 5 bits (fp64)
//   view     := base dtype elem_offset ndim sizes[ndim] strides[ndim] | -1 (none)
//   layout   := dtype ndim sizes[ndim] strides[ndim]
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace levels_triton_replay {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;

// ------------------------------------------------------------------ the driver, by dlopen --

using CUresult = int;
using LaunchKernel = CUresult (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                  unsigned by, unsigned bz, unsigned shared, void* stream,
                                  void** params, void** extra);
using GetErrorString = CUresult (*)(CUresult, const char**);
using GetParamInfo = CUresult (*)(void* f, size_t index, size_t* offset, size_t* size);
using CtxGetCurrent = CUresult (*)(void** ctx);
using CtxSetCurrent = CUresult (*)(void* ctx);
using DeviceGet = CUresult (*)(int* device, int ordinal);
using PrimaryCtxRetain = CUresult (*)(void** ctx, int device);

struct Driver {
  LaunchKernel launch = nullptr;
  GetErrorString error_string = nullptr;
  GetParamInfo param_info = nullptr;  // CUDA 12.4+ drivers
  CtxGetCurrent ctx_get_current = nullptr;
  CtxSetCurrent ctx_set_current = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain primary_ctx_retain = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "levels (Level 4 host path): cannot dlopen libcuda.so.1: ",
                dlerror());
    out.launch = reinterpret_cast<LaunchKernel>(dlsym(lib, "cuLaunchKernel"));
    out.error_string = reinterpret_cast<GetErrorString>(dlsym(lib, "cuGetErrorString"));
    out.param_info = reinterpret_cast<GetParamInfo>(dlsym(lib, "cuFuncGetParamInfo"));
    out.ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
    out.ctx_set_current = reinterpret_cast<CtxSetCurrent>(dlsym(lib, "cuCtxSetCurrent"));
    out.device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
    out.primary_ctx_retain =
        reinterpret_cast<PrimaryCtxRetain>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    TORCH_CHECK(out.launch != nullptr && out.ctx_get_current != nullptr &&
                    out.ctx_set_current != nullptr && out.device_get != nullptr &&
                    out.primary_ctx_retain != nullptr,
                "levels (Level 4 host path): libcuda lacks cuLaunchKernel or the context calls");
    return out;
  }();
  return d;
}

// --------------------------------------------------------------------------- the plans --

struct Layout {
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> sizes, strides;
};

struct Base {
  int64_t kind = 0, index = 0, nbytes = 0;
  bool typed = false;  // TEMP: allocate `layout` (so an output is a tensor, not a view)
  Layout layout;
};

struct View {
  int64_t base = -1, offset = 0;
  Layout layout;
};

struct Param {
  int64_t kind = 0, base = 0, value = 0;
};

struct Step {
  int64_t kind = 0;
  // a launch
  void* function = nullptr;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0, shared = 0;
  std::vector<Param> params;
  // a fill (view, value) or a copy (view <- source)
  View view, source;
  double value = 0.0;
};

struct Program {
  std::vector<Base> bases;
  std::vector<Step> steps;
  std::vector<View> outputs;
};

struct Plan {
  Program fwd, bwd;
  std::vector<int64_t> saved;  // forward bases the backward reads
  std::vector<Layout> grads;   // each forward output's gradient, as the backward was recorded
  bool fake = false;           // tests: launches are logged, not run (below)
};

enum { INPUT = 0, TEMP = 1, SAVED = 2, GRAD = 3 };
enum { LAUNCH = 0, FILL = 1, COPY = 2 };
enum { PTR = 0, NULLPTR = 1, I32 = 2, I64 = 3, F32 = 4, F64 = 5 };

class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& words) : w_(words) {}
  int64_t next() {
    TORCH_CHECK(i_ < w_.size(), "levels replay: plan ends early at word ", i_);
    return w_[i_++];
  }
  bool done() const { return i_ == w_.size(); }

  Layout layout() {
    Layout l;
    l.dtype = static_cast<at::ScalarType>(next());
    const int64_t ndim = next();
    for (int64_t d = 0; d < ndim; ++d) l.sizes.push_back(next());
    for (int64_t d = 0; d < ndim; ++d) l.strides.push_back(next());
    return l;
  }
  View view() {
    View v;
    v.base = next();
    if (v.base < 0) return v;  // no tensor (a gradient the Function does not give)
    v.layout.dtype = static_cast<at::ScalarType>(next());
    v.offset = next();
    const int64_t ndim = next();
    for (int64_t d = 0; d < ndim; ++d) v.layout.sizes.push_back(next());
    for (int64_t d = 0; d < ndim; ++d) v.layout.strides.push_back(next());
    return v;
  }
  Program program() {
    Program p;
    for (int64_t n = next(); n > 0; --n) {
      Base b;
      b.kind = next();
      b.index = next();
      b.nbytes = next();
      b.layout.dtype = static_cast<at::ScalarType>(next());
      const int64_t ndim = next();
      b.typed = ndim >= 0;
      for (int64_t d = 0; d < ndim; ++d) b.layout.sizes.push_back(next());
      for (int64_t d = 0; d < ndim; ++d) b.layout.strides.push_back(next());
      p.bases.push_back(std::move(b));
    }
    for (int64_t n = next(); n > 0; --n) {
      Step s;
      s.kind = next();
      if (s.kind == LAUNCH) {
        s.function = reinterpret_cast<void*>(static_cast<uintptr_t>(next()));
        for (auto& g : s.grid) g = static_cast<unsigned>(next());
        s.threads = static_cast<unsigned>(next());
        s.shared = static_cast<unsigned>(next());
        for (int64_t k = next(); k > 0; --k) {
          Param q;
          q.kind = next();
          if (q.kind == PTR) {
            q.base = next();
            q.value = next();
          } else if (q.kind != NULLPTR) {
            q.value = next();
          }
          s.params.push_back(q);
        }
      } else if (s.kind == FILL) {
        s.view = view();
        const int64_t bits = next();
        std::memcpy(&s.value, &bits, sizeof(double));
      } else {
        TORCH_CHECK(s.kind == COPY, "levels replay: unknown step kind ", s.kind);
        s.view = view();
        s.source = view();
      }
      p.steps.push_back(std::move(s));
    }
    for (int64_t n = next(); n > 0; --n) p.outputs.push_back(view());
    return p;
  }

 private:
  const std::vector<int64_t>& w_;
  size_t i_ = 0;
};

std::mutex plans_mutex;
std::vector<std::shared_ptr<const Plan>>& plans() {
  static std::vector<std::shared_ptr<const Plan>> all;
  return all;
}

std::shared_ptr<const Plan> plan_of(int64_t id) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(plans().size()), "levels replay: no plan ", id);
  return plans()[id];
}

// The tests' launcher: a fake plan's launches append (function, grid, threads, shared, each
// parameter's 8 bytes) here instead of running, so a CPU can check what a GPU would be given.
std::vector<int64_t>& fake_log() {
  static std::vector<int64_t> log;
  return log;
}

// ---------------------------------------------------------------------------- running --

Tensor view_of(const std::vector<Tensor>& bases, const View& v) {
  const Tensor& b = bases.at(v.base);
  const Tensor typed = b.scalar_type() == v.layout.dtype ? b : b.view(v.layout.dtype);
  return typed.as_strided(v.layout.sizes, v.layout.strides,
                          typed.storage_offset() + v.offset);
}

// The driver API launches into the context current on the calling thread, and a thread
// has none until something binds one. The CUDA runtime (torch's kernels, Triton's own
// launcher) binds the device's primary context at a thread's first CUDA call; cuLaunchKernel
// does not. The autograd engine runs a backward on a thread of its own, so a replayed
// backward that is the first CUDA work of that thread (a call whose output goes straight to
// autograd.grad, or through a view such as sum()'s backward) had no context: the launch
// failed with CUDA_ERROR_INVALID_CONTEXT. Bound here as the runtime would bind it; torch's
// device guard has made `ordinal` the thread's device already.
void bind_primary_context(int ordinal) {
  const Driver& d = driver();
  void* ctx = nullptr;
  if (d.ctx_get_current(&ctx) == 0 && ctx != nullptr) return;
  int device = 0;
  TORCH_CHECK(d.device_get(&device, ordinal) == 0 && d.primary_ctx_retain(&ctx, device) == 0 &&
                  d.ctx_set_current(ctx) == 0,
              "levels (Level 4 host path): cannot bind device " + std::to_string(ordinal) +
                  "'s CUDA context to this thread");
}

void launch(const Step& s, const std::vector<Tensor>& bases, void* stream, bool fake) {
  // every parameter in its own 8-byte slot: cuLaunchKernel reads each through its pointer,
  // as many bytes as the kernel's parameter has
  std::vector<int64_t> slots(s.params.size() + 2, 0);  // + global and profile scratch (null)
  std::vector<void*> params(slots.size());
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Param& q = s.params[i];
    if (q.kind == PTR) {
      const char* base = static_cast<const char*>(bases.at(q.base).data_ptr());
      const uintptr_t p = reinterpret_cast<uintptr_t>(base) + q.value;
      std::memcpy(&slots[i], &p, sizeof(p));
    } else if (q.kind == I32 || q.kind == F32) {
      const int32_t v = static_cast<int32_t>(q.value);  // fp32: its bits, as replay.py wrote them
      std::memcpy(&slots[i], &v, sizeof(v));
    } else if (q.kind != NULLPTR) {
      slots[i] = q.value;  // int64, or fp64's bits
    }
    params[i] = &slots[i];
  }
  for (size_t i = s.params.size(); i < slots.size(); ++i) params[i] = &slots[i];
  if (fake) {
    auto& log = fake_log();
    log.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(s.function)));
    for (unsigned g : s.grid) log.push_back(g);
    log.push_back(s.threads);
    log.push_back(s.shared);
    log.push_back(static_cast<int64_t>(s.params.size()));
    for (size_t i = 0; i < s.params.size(); ++i) log.push_back(slots[i]);
    return;
  }
  if (static_cast<uint64_t>(s.grid[0]) * s.grid[1] * s.grid[2] == 0) return;
  const CUresult r = driver().launch(s.function, s.grid[0], s.grid[1], s.grid[2], s.threads, 1, 1,
                                     s.shared, stream, params.data(), nullptr);
  if (r != 0) {
    const char* what = "unknown error";
    if (driver().error_string != nullptr) driver().error_string(r, &what);
    // one string, built without streams: c10::str of a single std::string is that string
    TORCH_CHECK(false, std::string("levels (Level 4 host path): cuLaunchKernel failed: ") + what +
                           " (" + std::to_string(r) +
                           "); LEVELS_TRITON_REPLAY=0 runs the same kernels through Triton's "
                           "own launcher");
  }
}

// Runs `p`: its bases (inputs, saved tensors and gradients as given; new buffers allocated
// like `like`'s), then its steps in order; returns its outputs.
std::vector<Tensor> run(const Program& p, bool fake, const at::TensorList inputs,
                        const std::vector<Tensor>& saved, const std::vector<Tensor>& grads,
                        const at::TensorOptions& options, std::vector<Tensor>& bases) {
  bases.clear();
  bases.reserve(p.bases.size());
  for (const Base& b : p.bases) {
    switch (b.kind) {
      case INPUT: bases.push_back(inputs[b.index]); break;
      case SAVED: bases.push_back(saved.at(b.index)); break;
      case GRAD: bases.push_back(grads.at(b.index)); break;
      default:
        bases.push_back(b.typed ? at::empty_strided(b.layout.sizes, b.layout.strides,
                                                    options.dtype(b.layout.dtype))
                                : at::empty({b.nbytes}, options.dtype(at::kByte)));
    }
  }
  void* stream = nullptr;
  if (!fake) {
    bind_primary_context(options.device().index());
    const auto* impl = c10::impl::getDeviceGuardImpl(options.device().type());
    stream = impl->getStream(options.device()).native_handle();
  }
  for (const Step& s : p.steps) {
    if (s.kind == LAUNCH) {
      launch(s, bases, stream, fake);
    } else if (s.kind == FILL) {
      view_of(bases, s.view).fill_(s.value);
    } else {
      view_of(bases, s.view).copy_(view_of(bases, s.source));
    }
  }
  std::vector<Tensor> out;
  out.reserve(p.outputs.size());
  for (const View& v : p.outputs) {
    if (v.base < 0) {
      out.emplace_back();
    } else if (p.bases[v.base].kind == TEMP && p.bases[v.base].typed && v.offset == 0 &&
               v.layout.sizes == p.bases[v.base].layout.sizes &&
               v.layout.strides == p.bases[v.base].layout.strides &&
               v.layout.dtype == p.bases[v.base].layout.dtype) {
      out.push_back(bases[v.base]);  // a whole buffer: the tensor itself, no view
    } else {
      out.push_back(view_of(bases, v));
    }
  }
  return out;
}

// A gradient in the layout the backward was recorded with (its kernels were specialized on
// it): as it is when it has it, else copied into it, once. An undefined one (an output
// nobody used) is zeros, as autograd.Function materializes it.
Tensor conform(const Tensor& g, const Layout& l, const at::TensorOptions& options) {
  if (g.defined() && g.scalar_type() == l.dtype && g.sizes().equals(l.sizes) &&
      g.strides().equals(l.strides) && reinterpret_cast<uintptr_t>(g.data_ptr()) % 16 == 0) {
    return g;
  }
  Tensor out = at::empty_strided(l.sizes, l.strides, options.dtype(l.dtype));
  if (g.defined()) {
    out.copy_(g);
  } else {
    out.zero_();
  }
  return out;
}

using BelowAutograd = at::AutoDispatchBelowADInplaceOrView;

at::TensorOptions options_of(const at::TensorList inputs) {
  TORCH_CHECK(!inputs.empty(), "levels replay: a call with no tensor");
  return inputs[0].options();
}

struct Replay : public torch::autograd::Function<Replay> {
  static variable_list forward(AutogradContext* ctx, int64_t id, at::TensorList inputs) {
    const auto plan = plan_of(id);
    BelowAutograd guard;
    const auto options = options_of(inputs);
    c10::OptionalDeviceGuard device(plan->fake ? std::nullopt
                                               : std::optional<c10::Device>(options.device()));
    std::vector<Tensor> bases;
    auto out = run(plan->fwd, plan->fake, inputs, {}, {}, options, bases);
    std::vector<Tensor> keep;
    keep.reserve(plan->saved.size());
    for (int64_t b : plan->saved) keep.push_back(bases[b]);
    ctx->save_for_backward(keep);
    ctx->saved_data["id"] = id;
    ctx->saved_data["device"] = options.device();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto plan = plan_of(ctx->saved_data["id"].toInt());
    BelowAutograd guard;
    const auto saved = ctx->get_saved_variables();
    const auto options = at::TensorOptions().device(ctx->saved_data["device"].toDevice());
    c10::OptionalDeviceGuard device(plan->fake ? std::nullopt
                                               : std::optional<c10::Device>(options.device()));
    std::vector<Tensor> conformed;
    conformed.reserve(plan->grads.size());
    for (size_t i = 0; i < plan->grads.size(); ++i) {
      conformed.push_back(conform(i < grads.size() ? grads[i] : Tensor(), plan->grads[i], options));
    }
    std::vector<Tensor> bases;
    auto out = run(plan->bwd, plan->fake, {}, saved, conformed, options, bases);
    variable_list result;
    result.reserve(out.size() + 1);
    result.emplace_back();  // the plan id
    for (auto& t : out) result.push_back(std::move(t));
    return result;
  }
};

// A plan's parameters must be the kernel's, one for one: cuLaunchKernel reads as many
// parameter pointers as the kernel declares, so a plan one short would make the driver read
// past our array. The driver says what the kernel declares (cuFuncGetParamInfo); a plan
// that does not match it is refused here, before it can ever run (replay.py then keeps the
// signature on the Python path, with this message as the reason).
void check_parameters(const Program& p) {
  const auto get = driver().param_info;
  TORCH_CHECK(get != nullptr, "levels replay: this driver has no cuFuncGetParamInfo (CUDA "
              "12.4+), so a plan's parameters cannot be checked against the kernel's");
  for (const Step& s : p.steps) {
    if (s.kind != LAUNCH) continue;
    std::vector<size_t> declared;
    for (size_t i = 0;; ++i) {
      size_t offset = 0, size = 0;
      if (get(s.function, i, &offset, &size) != 0) break;
      declared.push_back(size);
    }
    std::string mine, theirs;
    bool ok = declared.size() >= s.params.size() && declared.size() <= s.params.size() + 2;
    for (size_t i = 0; i < declared.size(); ++i) {
      const size_t want = i < s.params.size()
                              ? ((s.params[i].kind == I32 || s.params[i].kind == F32) ? 4 : 8)
                              : 8;  // the scratch pointers after the arguments
      ok = ok && declared[i] == want;
      theirs += std::to_string(declared[i]) + " ";
    }
    for (const Param& q : s.params) mine += (q.kind == I32 || q.kind == F32) ? "4 " : "8 ";
    TORCH_CHECK(ok, "levels replay: the kernel's parameters (bytes: ", theirs,
                ") are not the plan's (", mine, "+ two 8-byte scratch pointers)");
  }
}

// ------------------------------------------------------------------------------- ops --

int64_t add_plan(std::vector<int64_t> words, bool fake) {
  Reader r(words);
  auto plan = std::make_shared<Plan>();
  plan->fake = fake;
  plan->fwd = r.program();
  for (int64_t n = r.next(); n > 0; --n) plan->saved.push_back(r.next());
  for (int64_t n = r.next(); n > 0; --n) plan->grads.push_back(r.layout());
  plan->bwd = r.program();
  TORCH_CHECK(r.done(), "levels replay: words left after the plan");
  if (!fake) {
    check_parameters(plan->fwd);
    check_parameters(plan->bwd);
  }
  std::lock_guard<std::mutex> lock(plans_mutex);
  plans().push_back(std::move(plan));
  return static_cast<int64_t>(plans().size()) - 1;
}

// With autograd: the forward, and a node whose backward is the recorded one.
std::vector<Tensor> replay(int64_t id, at::TensorList inputs) {
  return Replay::apply(id, inputs);
}

// Without autograd (a call that computes no gradient: inference, no_grad): the forward
// program alone, no node.
std::vector<Tensor> replay_forward(int64_t id, at::TensorList inputs) {
  const auto plan = plan_of(id);
  const auto options = options_of(inputs);
  c10::OptionalDeviceGuard device(plan->fake ? std::nullopt
                                             : std::optional<c10::Device>(options.device()));
  std::vector<Tensor> bases;
  return run(plan->fwd, plan->fake, inputs, {}, {}, options, bases);
}

std::vector<int64_t> take_fake_log() {
  std::vector<int64_t> out;
  out.swap(fake_log());
  return out;
}

}  // namespace levels_triton_replay

TORCH_LIBRARY(levels_triton, m) {
  m.def("add_plan(int[] words, bool fake) -> int", &levels_triton_replay::add_plan);
  m.def("replay(int plan, Tensor[] inputs) -> Tensor[]", &levels_triton_replay::replay);
  m.def("replay_forward(int plan, Tensor[] inputs) -> Tensor[]",
        &levels_triton_replay::replay_forward);
  m.def("take_fake_log() -> int[]", &levels_triton_replay::take_fake_log);
}
