// InspectModel (inspect.h): layers of a TorchScript file or a built-in model, and per-layer
// forward/backward times measured on one microbatch of the spec's data.
#include "worker/runtime/inspect/inspect.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/spec_parser.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "worker/model/builtin_stage.h"
#include "worker/model/stage_model.h"
#include "worker/model/torchscript_model.h"
#include "worker/runtime/device/counting_allocator.h"
#include "worker/runtime/executor/fused_weight_grad.h"
#include "worker/runtime/executor/split_backward.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::model {
namespace {

// The field that names the model in errors.
std::string ModelField(const spec::JobSpec& spec) {
  return spec.model.torchscript.has_value() ? "model.torchscript" : "model.builtin";
}

// The model's layers, cut one stage per layer, with the stages' wiring. For a TorchScript
// model, `owner` keeps the module the stages share.
struct LayerStages {
  std::unique_ptr<TorchScriptModel> owner;
  std::vector<std::unique_ptr<StageModel>> stages;
  PipelineWiring wiring;
};

// Waits for the device's queued work, so that the clock measures it.
void Sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The fastest of `times` (not empty): the estimate of a layer's own cost. Work of other
// processes only ever adds time to a repeat, so the fastest repeat is the one least disturbed. (A
// median of three takes a disturbed repeat whenever two of the three are: under `ctest -j2` one
// layer's backward measured 6x its cost that way and turned the plan search's choice.)
double Fastest(const std::vector<double>& times) {
  return *std::min_element(times.begin(), times.end());
}

// The seconds one call of `fn` takes, the device's queued work included.
template <typename Fn>
double Seconds(const torch::Device& device, Fn&& fn) {
  Sync(device);
  const auto start = std::chrono::steady_clock::now();
  fn();
  Sync(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `fn` once to warm up, then `iterations` times, and returns the fastest time in seconds.
template <typename Fn>
double FastestSeconds(int iterations, const torch::Device& device, Fn&& fn) {
  std::vector<double> times;
  for (int r = 0; r <= iterations; ++r) {
    const double took = Seconds(device, fn);
    if (r > 0) times.push_back(took);
  }
  return Fastest(times);
}

// The outputs of layer `s` a backward starts from and their gradients: the last layer's first
// output with ones, every other output with the gradient its consumers computed for it.
void BackwardRoots(const std::vector<torch::Tensor>& outputs,
                   const std::vector<torch::Tensor>& output_grads, bool last,
                   std::vector<torch::Tensor>* roots, std::vector<torch::Tensor>* grads) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    const torch::Tensor& output = outputs[k];
    if (!output.requires_grad()) continue;
    if (last && k == 0) {
      roots->push_back(output);
      grads->push_back(torch::ones_like(output));
    } else if (k < output_grads.size() && output_grads[k].defined()) {
      roots->push_back(output);
      grads->push_back(output_grads[k]);
    }
  }
}

// Measures what a split backward holds between its I and its W (LayerInfo.weight_pending_bytes)
// and what its W allocates beyond that (weight_transient_bytes):
// the forward runs on fresh copies of `inputs`, so that an input W needs is counted, and only the
// graph and what I left for W hold anything when the live bytes are read.
void MeasureWeightPending(StageModel& stage, const std::vector<torch::Tensor>& inputs,
                          const std::vector<torch::Tensor>& output_grads, bool last,
                          runtime::CountingCpuAllocator& counter, v1::LayerInfo* layer) {
  runtime::PendingWeightGrad pending;
  const int64_t before = counter.live_bytes();
  {
    std::vector<torch::Tensor> copies;
    for (const torch::Tensor& input : inputs) {
      copies.push_back(input.requires_grad() ? input.detach().clone().requires_grad_(true) : input);
    }
    std::vector<torch::Tensor> roots, grads;
    BackwardRoots(stage.ForwardValues(copies), output_grads, last, &roots, &grads);
    if (roots.empty()) return;
    runtime::SplitBackward::BackwardInputs(roots, grads, copies, &pending);
  }
  layer->set_weight_pending_bytes(std::max<int64_t>(counter.live_bytes() - before, 0));
  // The W, the weight gradients already in .grad (the timed runs left them): what it computes
  // apart from .grad before accumulating (LayerInfo.weight_transient_bytes).
  const int64_t before_weight = counter.live_bytes();
  counter.ResetPeak();
  runtime::SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/true);
  layer->set_weight_transient_bytes(std::max<int64_t>(counter.peak_bytes() - before_weight, 0));
}

// Times the layer's backward both ways the schedules run it, paired in one loop (one warm-up,
// then `iterations` repeats) so that a burst of load from another process slows both alike and
// the ratio (I + W) / B, which decides whether splitting the backward pays, does not move with
// it. Each repeat runs
//  - B, the fused backward, on the graph `outputs` keep (the inputs' .grad cleared first; the
//    last repeat leaves the inputs' gradients there), and
//  - a fresh forward, untimed, then the split backward as the zero-bubble schedules run it
//    (runtime::SplitBackward): I, the input gradient alone, then W, the weight gradients, which
//    frees that forward's graph.
// Returns false, timing nothing, when nothing of the layer needs a gradient.
bool ProfileBackward(StageModel& stage, std::vector<torch::Tensor>& inputs,
                     const std::vector<torch::Tensor>& outputs,
                     const std::vector<torch::Tensor>& output_grads, bool last, int iterations,
                     const torch::Device& device, v1::LayerInfo* layer) {
  std::vector<torch::Tensor> roots, grads;
  BackwardRoots(outputs, output_grads, last, &roots, &grads);
  if (roots.empty()) return false;
  // As the executor runs B and W: weight gradients straight into .grad. On the retained graph
  // the fusion, once installed, serves every repeat.
  runtime::FuseWeightGradients(roots);
  std::vector<double> fused_times, input_times, weight_times;
  for (int r = 0; r <= iterations; ++r) {
    for (torch::Tensor& input : inputs) {
      if (input.requires_grad()) input.mutable_grad() = torch::Tensor();
    }
    const double fused =
        Seconds(device, [&] { torch::autograd::backward(roots, grads, /*retain_graph=*/true); });
    std::vector<torch::Tensor> fresh_roots, fresh_grads;
    BackwardRoots(stage.ForwardValues(inputs), output_grads, last, &fresh_roots, &fresh_grads);
    runtime::PendingWeightGrad pending;
    const double input = Seconds(device, [&] {
      runtime::SplitBackward::BackwardInputs(fresh_roots, fresh_grads, inputs, &pending);
    });
    const double weight = Seconds(device, [&] {
      runtime::SplitBackward::BackwardWeight(std::move(pending), /*fuse_weight_grads=*/true);
    });
    if (r == 0) continue;
    fused_times.push_back(fused);
    input_times.push_back(input);
    weight_times.push_back(weight);
  }
  layer->set_backward_seconds(Fastest(fused_times));
  layer->set_backward_input_seconds(Fastest(input_times));
  layer->set_backward_weight_seconds(Fastest(weight_times));
  return true;
}

// Runs `stage`'s forward once more, the previous run's outputs and graph freed first, and
// records the bytes it leaves allocated (saved tensors and outputs: what a pipeline keeps until
// the backward), the most it allocated beyond those while it ran, and its outputs' bytes. The
// inputs were allocated before, so they are not counted. `counter` counts the whole process: a task
// running beside the profile blurs it.
void MeasureForward(StageModel& stage, const std::vector<torch::Tensor>& inputs,
                    runtime::CountingCpuAllocator& counter, std::vector<torch::Tensor>& outputs,
                    v1::LayerInfo* layer) {
  outputs.clear();
  const int64_t before = counter.live_bytes();
  counter.ResetPeak();
  outputs = stage.ForwardValues(inputs);
  const int64_t kept = counter.live_bytes() - before;
  layer->set_forward_transient_bytes(std::max<int64_t>(counter.peak_bytes() - before - kept, 0));
  int64_t output_bytes = 0;
  for (const torch::Tensor& t : outputs) {
    if (t.defined()) output_bytes += static_cast<int64_t>(t.nbytes());
  }
  layer->set_activation_bytes(std::max<int64_t>(kept, 0));
  layer->set_output_bytes(output_bytes);
}

// Times every layer's forward, then every layer's backward (see inspect.h), into `out`'s
// layers, which are in the stages' order. `running` says what runs ("the forward of layer
// blocks.2"), for an error LibTorch throws.
void ProfileLayers(LayerStages& layers, const torch::Tensor& microbatch, int iterations,
                   const torch::Device& device, v1::InspectModelResponse* out,
                   std::string* running) {
  runtime::CountingCpuAllocator* counter =
      device.is_cpu() ? &runtime::CountingCpuAllocator::Install() : nullptr;
  torch::AutoGradMode grad_mode(true);
  const int n = static_cast<int>(layers.stages.size());
  std::vector<std::vector<torch::Tensor>> inputs(n), outputs(n), output_grads(n);
  for (int s = 0; s < n; ++s) {
    for (const ValueSource& src : layers.wiring[s].inputs) {
      if (src.stage < 0) {
        inputs[s].push_back(microbatch);  // data: no gradient, as on stage 0 of a pipeline
        continue;
      }
      torch::Tensor value = outputs[src.stage].at(src.index).detach();
      if (value.is_floating_point()) value.requires_grad_(true);
      inputs[s].push_back(value);
    }
    StageModel* stage = layers.stages[s].get();
    *running = absl::StrCat("the forward of layer ", out->layers(s).name());
    const double seconds =
        FastestSeconds(iterations, device, [&] { outputs[s] = stage->ForwardValues(inputs[s]); });
    out->mutable_layers(s)->set_forward_seconds(seconds);
    if (counter != nullptr)
      MeasureForward(*stage, inputs[s], *counter, outputs[s], out->mutable_layers(s));
    output_grads[s].resize(outputs[s].size());
  }
  for (int s = n - 1; s >= 0; --s) {
    *running = absl::StrCat("the backward of layer ", out->layers(s).name());
    if (!ProfileBackward(*layers.stages[s], inputs[s], outputs[s], output_grads[s], s == n - 1,
                         iterations, device, out->mutable_layers(s))) {
      continue;  // nothing of this layer needs a gradient: backward is free
    }
    if (counter != nullptr) {
      // Once more, to measure the most its backward allocates (weight gradients are computed
      // straight into the .grad the timed runs left, as in a step after its first microbatch).
      std::vector<torch::Tensor> roots, grads;
      BackwardRoots(outputs[s], output_grads[s], s == n - 1, &roots, &grads);
      for (torch::Tensor& input : inputs[s]) {
        if (input.requires_grad()) input.mutable_grad() = torch::Tensor();
      }
      const int64_t before = counter->live_bytes();
      counter->ResetPeak();
      torch::autograd::backward(roots, grads, /*retain_graph=*/true);
      out->mutable_layers(s)->set_backward_transient_bytes(
          std::max<int64_t>(counter->peak_bytes() - before, 0));
    }
    // Hand each input's gradient to the output it came from (summed over its consumers).
    for (size_t i = 0; i < inputs[s].size(); ++i) {
      const ValueSource& src = layers.wiring[s].inputs[i];
      if (src.stage < 0 || !inputs[s][i].requires_grad() || !inputs[s][i].grad().defined()) {
        continue;
      }
      torch::Tensor& g = output_grads[src.stage][src.index];
      const torch::Tensor grad = inputs[s][i].grad().detach();
      g = g.defined() ? g + grad : grad.clone();
    }
    if (counter != nullptr) {
      MeasureWeightPending(*layers.stages[s], inputs[s], output_grads[s], s == n - 1, *counter,
                           out->mutable_layers(s));
    }
  }
}

// One stage per layer of a TorchScript model. INVALID_ARGUMENT when the model cannot be cut
// at every layer (a layer called inside control flow, a submodule called twice).
absl::StatusOr<LayerStages> CutTorchScript(std::unique_ptr<TorchScriptModel> model) {
  LayerStages out;
  const int n = static_cast<int>(model->layers().size());
  std::vector<int> firsts(n);
  for (int i = 0; i < n; ++i) firsts[i] = i;
  auto wiring = model->Split(firsts);
  if (!wiring.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split.policy: 'profiled' times every layer apart, but the model cannot be cut at every "
        "layer: ",
        wiring.status().message(), " (use split.points or another split.policy)"));
  }
  out.wiring = *std::move(wiring);
  for (int s = 0; s < n; ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<StageModel> stage, model->Stage(s));
    out.stages.push_back(std::move(stage));
  }
  out.owner = std::move(model);
  return out;
}

// One stage per layer of a built-in model.
absl::StatusOr<LayerStages> CutBuiltin(const spec::BuiltinModel& model) {
  LayerStages out;
  const int n = static_cast<int>(spec::BuiltinLayerCount(model));
  for (int s = 0; s < n; ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<StageModel> stage, BuildBuiltinStage(model, s, s + 1));
    out.stages.push_back(std::move(stage));
  }
  out.wiring = ChainWiring(n);
  return out;
}

// A built-in model's layers and parameter counts, from one build of the whole model (a
// parameter belongs to the layer its name starts with).
absl::Status DescribeBuiltin(const spec::BuiltinModel& model, v1::InspectModelResponse* out) {
  const std::vector<std::string> names = spec::BuiltinLayerNames(model);
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.builtin: the ", model.family, " model has no layers"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StageModel> whole,
                   BuildBuiltinStage(model, 0, static_cast<int>(names.size())));
  std::map<std::string, int64_t> counts;
  for (auto& [name, p] : whole->NamedParameters()) {
    for (const std::string& layer : names) {
      if (absl::StartsWith(name, absl::StrCat(layer, "."))) {
        counts[layer] += p.numel();
        break;
      }
    }
  }
  for (const std::string& name : names) {
    v1::LayerInfo* layer = out->add_layers();
    layer->set_name(name);
    layer->set_parameters(counts[name]);
  }
  out->set_sequential(true);
  return absl::OkStatus();
}

absl::StatusOr<v1::InspectModelResponse> Inspect(const spec::JobSpec& spec, bool profile,
                                                 int iterations, const std::string& model_path,
                                                 const std::string& device_name) {
  if (iterations <= 0) iterations = kDefaultProfileIterations;
  const std::string field = ModelField(spec);
  v1::InspectModelResponse out;
  std::unique_ptr<TorchScriptModel> torchscript;
  if (spec.model.torchscript.has_value()) {
    // Split points inside a layer open it (torchscript_model.h, "Nested layers").
    std::vector<std::string> points;
    for (const auto& [name, where] : spec.split.points) points.push_back(name);
    ASSIGN_OR_RETURN(torchscript, TorchScriptModel::Load(model_path, "model.torchscript", points));
    for (const ModelLayer& layer : torchscript->layers()) {
      v1::LayerInfo* info = out.add_layers();
      info->set_name(layer.name);
      info->set_parameters(layer.parameters);
    }
    out.set_sequential(torchscript->sequential());
    for (const SplitCandidate& c : torchscript->SplitCandidates()) {
      v1::SplitCandidate* info = out.add_split_candidates();
      info->set_name(c.name);
      info->set_parameters(c.parameters);
      info->set_depth(c.depth);
      info->set_layer(c.layer);
    }
    auto digest = Sha256OfFile(model_path);
    if (!digest.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.torchscript: cannot read '", model_path,
                                                     "': ", digest.status().message()));
    }
    out.set_model_sha256(*digest);
  } else if (spec.model.builtin.has_value()) {
    RETURN_IF_ERROR(DescribeBuiltin(*spec.model.builtin, &out));
  } else {
    return absl::InvalidArgumentError(
        "model: exactly one of 'torchscript' or 'builtin' is required");
  }
  if (out.split_candidates().empty()) {
    for (const v1::LayerInfo& layer : out.layers()) {
      v1::SplitCandidate* c = out.add_split_candidates();
      c->set_name(layer.name());
      c->set_parameters(layer.parameters());
      c->set_layer(true);
    }
  }
  if (!profile) return out;

  // One microbatch of step 0's batch: what a pipeline's first stage runs.
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::BatchSource> source,
                   runtime::BatchSource::Open(spec, /*want_inputs=*/true, /*want_targets=*/false));
  ASSIGN_OR_RETURN(runtime::Batch batch, source->Make(0));
  if (!batch.inputs.defined() || batch.inputs.dim() < 1 ||
      batch.inputs.size(0) < spec.schedule.microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data: step 0's batch has fewer rows than schedule.microbatches (",
        spec.schedule.microbatches, "), so there is no microbatch to profile the layers on"));
  }
  LayerStages layers;
  if (torchscript != nullptr) {
    ASSIGN_OR_RETURN(layers, CutTorchScript(std::move(torchscript)));
  } else {
    ASSIGN_OR_RETURN(layers, CutBuiltin(*spec.model.builtin));
  }
  if (layers.stages.size() != static_cast<size_t>(out.layers_size())) {
    return absl::InternalError(absl::StrCat(field, ": cut into ", layers.stages.size(),
                                            " stages for ", out.layers_size(), " layers"));
  }
  std::string running = absl::StrCat("moving the model to ", device_name);
  try {
    const torch::Device device(device_name);
    for (auto& stage : layers.stages) stage->To(device);
    const torch::Tensor microbatch =
        runtime::SplitMicrobatches(batch.inputs, spec.schedule.microbatches)[0].to(device);
    ProfileLayers(layers, microbatch, iterations, device, &out, &running);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(field,
                                                   ": profiling on one microbatch of the "
                                                   "spec's data, ",
                                                   running,
                                                   " failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": profiling on one microbatch of the spec's data, ", running,
                     " failed: ", e.what()));
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::InspectModelResponse> InspectModel(const spec::JobSpec& spec, bool profile,
                                                      int iterations, const std::string& model_path,
                                                      const std::string& device) {
  // LibTorch errors outside the profiled runs (loading, building, cutting) become Status too.
  try {
    return Inspect(spec, profile, iterations, model_path, device);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        ModelField(spec), ": inspecting the model failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(ModelField(spec), ": inspecting the model failed: ", e.what()));
  }
}

}  // namespace stagecoach::model
