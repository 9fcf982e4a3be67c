#include "worker/runtime/checkpoint/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace stagecoach::runtime {

std::vector<char> TorchSaveBytes(const c10::IValue& value) {
  std::vector<char> pickle_bytes;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t n) {
        pickle_bytes.insert(pickle_bytes.end(), bytes, bytes + n);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace stagecoach::runtime
