// torch.save's file format for checkpoint and export files, readable by every PyTorch that
// users load them with: the zip archive LibTorch's torch::pickle_save writes, without the type
// tags it wraps around typed dicts and lists (torch.jit._pickle.restore_type_tag). PyTorch 2.6's
// torch.load defaults to weights_only=True, which refuses that global; untagged, a file of
// dicts, strings, numbers and tensors loads under weights_only, and torch::pickle_load reads it
// back as generic dicts.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace stagecoach::runtime {

// The bytes of `value` as torch.save writes them (zip archive: data.pkl and data/<n>).
std::vector<char> TorchSaveBytes(const c10::IValue& value);

}  // namespace stagecoach::runtime
