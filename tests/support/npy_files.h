// .npy files for e2e tests that hand tensors to stagectl and read its outputs. Written and read
// here, by the format's definition, rather than with stagectl's own code (client/npy.*), so that
// the tests do not trust the code under test.
#pragma once

#include <torch/types.h>

#include <string>

namespace stagecoach::testing {

// Writes `t` as a C-order .npy file (format 1.0) whose header says `descr` ("<f4", ">f4", "<i8";
// the bytes are t's as they are in memory). With "<f4" the tensor is converted to float32 first.
void WriteNpy(const std::string& path, const torch::Tensor& t, const std::string& descr = "<f4");

// Reads a little-endian float32 C-order .npy file as numpy and stagectl write it; a test failure
// naming the file, and an undefined tensor, when it is not one.
torch::Tensor ReadNpy(const std::string& path);

}  // namespace stagecoach::testing
