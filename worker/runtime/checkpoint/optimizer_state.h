// A parameter's optimizer state as named tensors, read from and written into LibTorch's SGD
// and AdamW, for the code that moves state between layouts (ZeRO-1 shards, zero_shards.h).
// Fields: SGD "momentum_buffer"; AdamW "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad
// only) and "step" (an int64 scalar). Not thread-safe with respect to the optimizer.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <map>
#include <sstream>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stagecoach::runtime {

// The key under which `optimizer.state()` keeps a parameter's state: the parameter's
// TensorImpl*, as a string in LibTorch 1.x (c10::guts::to_string of the pointer) and as the
// pointer itself in LibTorch 2.x.
template <typename StateMap>
typename StateMap::key_type OptimizerStateKey(const torch::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << param.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

using StateFields = std::map<std::string, torch::Tensor>;

// `param`'s state in `optimizer` (copies); empty when it has none. UNIMPLEMENTED for an
// optimizer other than SGD or AdamW.
absl::StatusOr<StateFields> ParamStateFields(const torch::optim::Optimizer& optimizer,
                                             const torch::Tensor& param);

// Replaces `param`'s state in `optimizer` with `fields` (moved to the parameter's device and
// dtype; "step" stays an integer); empty `fields` erases it. INVALID_ARGUMENT naming `where` for
// a missing field or one whose element count is not the parameter's; UNIMPLEMENTED for another
// optimizer.
absl::Status SetParamStateFields(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                                 const StateFields& fields, const std::string& where);

}  // namespace stagecoach::runtime
