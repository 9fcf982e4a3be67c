// Safetensors files and model directories (common/safetensors): hostile headers refused naming
// the problem and the tensor; our writer's files read back; and interchange with an independent
// implementation of the published format (tests/support/safetensors_ref.py, Python's struct and
// json): it writes files and sharded directories that we read to the values it wrote, and reads
// ours (single and sharded) to the bytes we wrote, compared by SHA-256.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/safetensors/file.h"
#include "common/safetensors/format.h"
#include "common/safetensors/model_dir.h"
#include "common/safetensors/writer.h"
#include "common/util/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/python.h"
#include "tests/support/temp_dir.h"

namespace stagecoach::safetensors::safetensors_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A file of header `json` (its length written as `length`, default its own) and `data`.
std::string Bytes(const std::string& json, const std::string& data = "",
                  std::optional<uint64_t> length = std::nullopt) {
  std::string out(8, '\0');
  uint64_t n = length.value_or(json.size());
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out + json + data;
}

std::string ErrorOf(const std::string& file) {
  auto header = ParseSafetensors(file, "w.safetensors");
  EXPECT_FALSE(header.ok());
  if (header.ok()) return "";
  EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(header.status().message(), HasSubstr("w.safetensors: "));
  return std::string(header.status().message());
}

TEST(SafetensorsFormat, ReadsTensorsMetadataAndEmptyTensors) {
  const std::string file = Bytes(
      R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("e":{"dtype":"I64","shape":[0,4],"data_offsets":[12,12]},)"
      R"("__metadata__":{"format":"pt"}}  )",
      std::string(12, 'x'));
  auto header = ParseSafetensors(file, "ok.safetensors");
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[0].name, "a");  // in the order of their data
  EXPECT_EQ(header->tensors[1].name, "b");
  EXPECT_EQ(header->tensors[1].dtype, Dtype::kBF16);
  EXPECT_THAT(header->tensors[2].shape, ElementsAre(0, 4));
  EXPECT_EQ(header->tensors[2].NumElements(), 0);
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->data_size, 12u);
  EXPECT_EQ(header->data_start, file.size() - 12);
  EXPECT_EQ(header->Find("b")->begin, 8u);
  EXPECT_EQ(header->Find("c"), nullptr);
}

TEST(SafetensorsFormat, DtypesByName) {
  EXPECT_EQ(ParseDtype("F8_E4M3"), Dtype::kF8E4M3);
  EXPECT_EQ(ParseDtype("f32"), std::nullopt);
  EXPECT_EQ(ElementSize(Dtype::kBF16), 2);
  EXPECT_EQ(ElementSize(Dtype::kU64), 8);
  EXPECT_EQ(DtypeName(Dtype::kBool), "BOOL");
  EXPECT_THAT(KnownDtypes(), HasSubstr("BF16, I32"));
}

TEST(SafetensorsFormat, RefusesAFileOrHeaderLengthThatDoesNotHold) {
  EXPECT_THAT(ErrorOf("abc"), HasSubstr("3 bytes, fewer than the 8"));
  EXPECT_THAT(ErrorOf(Bytes("{}", "", 1000)),
              HasSubstr("the header's length is 1000 bytes, past the end of the file (10 bytes)"));
  EXPECT_THAT(ErrorOf(Bytes("{}", "", uint64_t{1} << 40)), HasSubstr("over the 104857600"));
  EXPECT_THAT(ErrorOf(Bytes("{}", "", ~uint64_t{0})), HasSubstr("over the"));
  EXPECT_THAT(ErrorOf(Bytes("[1]")), HasSubstr("does not start with '{'"));
  EXPECT_THAT(ErrorOf(Bytes("{\"a\xff\":1}")), HasSubstr("not UTF-8"));
  EXPECT_THAT(ErrorOf(Bytes("{\"a\":")), HasSubstr("not a JSON object"));
}

TEST(SafetensorsFormat, RefusesBadTensorsNamingThem) {
  const std::string one_f32 = std::string(4, '\0');
  auto tensor = [](const std::string& body) { return absl::StrCat(R"({"w":)", body, "}"); };
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F128","shape":[1],"data_offsets":[0,4]})"),
                            one_f32)),
              HasSubstr("tensor 'w': unknown dtype 'F128' (known: BOOL, U8,"));
  EXPECT_THAT(
      ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[9223372036854775808],)"
                           R"("data_offsets":[0,4]})"),
                    one_f32)),
      HasSubstr("tensor 'w': dimension 0 of its shape is 9223372036854775808, not an integer"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"),
                            one_f32)),
              HasSubstr("dimension 0 of its shape is -1"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"),
                            one_f32)),
              HasSubstr("dimension 0 of its shape is 1.5"));
  // A product that overflows 64 bits is still refused by its bytes.
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[4294967296,4294967296],)"
                                   R"("data_offsets":[0,4]})"),
                            one_f32)),
              HasSubstr("needs more than 2^64 bytes, but data_offsets [0,4] hold 4"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"),
                            one_f32)),
              HasSubstr("tensor 'w': shape [2] of F32 needs 8 bytes, but data_offsets [0,4] hold 4"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,8]})"),
                            one_f32)),
              HasSubstr("tensor 'w': data_offsets [0,8] end past the data section (4 bytes)"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})"),
                            one_f32)),
              HasSubstr("are not integers begin <= end"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[1]})"), one_f32)),
              HasSubstr("tensor 'w': has no data_offsets"));
  EXPECT_THAT(ErrorOf(Bytes(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],)"
                                   R"("strides":[1]})"),
                            one_f32)),
              HasSubstr("tensor 'w': unknown field 'strides'"));
  EXPECT_THAT(ErrorOf(Bytes(R"({"__metadata__":{"n":1}})")),
              HasSubstr("__metadata__ 'n' is not a string"));
  EXPECT_THAT(ErrorOf(Bytes(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})")),
              HasSubstr("empty name"));
}

TEST(SafetensorsFormat, RefusesOverlapsGapsTailsAndDuplicates) {
  const std::string a4 = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  EXPECT_THAT(ErrorOf(Bytes(absl::StrCat(
                                "{", a4, R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})"),
                            std::string(6, '\0'))),
              HasSubstr("tensors 'a' [0, 4) and 'b' [2, 6) overlap"));
  EXPECT_THAT(ErrorOf(Bytes(absl::StrCat(
                                "{", a4, R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})"),
                            std::string(10, '\0'))),
              HasSubstr("bytes [4, 6) of the data section belong to no tensor (before 'b')"));
  EXPECT_THAT(ErrorOf(Bytes(absl::StrCat("{", a4, "}"), std::string(9, '\0'))),
              HasSubstr("bytes [4, 9) of the data section belong to no tensor (past the last)"));
  EXPECT_THAT(ErrorOf(Bytes(absl::StrCat("{", a4, ",", a4, "}"), std::string(4, '\0'))),
              HasSubstr("the header names 'a' twice"));
}

TEST(SafetensorsWriter, WritesWhatTheReaderReadsWithTheDataAligned) {
  testing::TempDir dir;
  const std::vector<float> weights = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  const std::vector<uint16_t> halves = {0x3f80, 0xc000};
  std::vector<TensorToWrite> tensors = {
      {"w", Dtype::kF32, {2, 3},
       absl::string_view(reinterpret_cast<const char*>(weights.data()), 24)},
      {"h", Dtype::kBF16, {2}, absl::string_view(reinterpret_cast<const char*>(halves.data()), 4)},
      {"none", Dtype::kI64, {0}, absl::string_view()},
  };
  const std::string path = dir.path() + "/out.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->header().data_start % 8, 0u);
  EXPECT_EQ(file->header().metadata.at("format"), "pt");
  EXPECT_EQ(*file->Data("w"), tensors[0].data);
  EXPECT_EQ(*file->Data("h"), tensors[1].data);
  EXPECT_TRUE(file->Data("none")->empty());
  EXPECT_THAT(file->Find("w")->shape, ElementsAre(2, 3));
  EXPECT_THAT(std::string(file->Data("x").status().message()),
              HasSubstr("out.safetensors: no tensor 'x'"));
  // A moved file keeps its mapping.
  SafetensorsFile moved = *std::move(file);
  EXPECT_EQ(*moved.Data("w"), tensors[0].data);
}

TEST(SafetensorsWriter, RefusesWhatItCannotWriteNamingTheTensor) {
  const float one = 1;
  const absl::string_view four(reinterpret_cast<const char*>(&one), 4);
  auto error = [](const std::vector<TensorToWrite>& tensors) {
    auto header = EncodeHeader(tensors, {}, "x.safetensors");
    EXPECT_FALSE(header.ok());
    return header.ok() ? "" : std::string(header.status().message());
  };
  EXPECT_THAT(error({{"w", Dtype::kF32, {2}, four}}),
              HasSubstr("x.safetensors: tensor 'w': shape [2] of F32 needs 8 bytes, but 4 were "
                        "given"));
  EXPECT_THAT(error({{"w", Dtype::kF32, {1}, four}, {"w", Dtype::kF32, {1}, four}}),
              HasSubstr("tensor 'w': written twice"));
  EXPECT_THAT(error({{"", Dtype::kF32, {1}, four}}), HasSubstr("an empty name"));
  EXPECT_THAT(error({{"__metadata__", Dtype::kF32, {1}, four}}), HasSubstr("reserved"));
  EXPECT_THAT(error({{"w", Dtype::kF32, {-1}, four}}), HasSubstr("negative dimension"));
  testing::TempDir dir;
  EXPECT_FALSE(WriteSafetensors(dir.path() + "/w.safetensors", {{"w", Dtype::kF32, {2}, four}})
                   .ok());
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/w.safetensors"));  // nothing half-written
}

TEST(SafetensorsModelDir, ShardsAsSavePretrainedDoes) {
  EXPECT_THAT(PlanShards({}, 10), ElementsAre(ElementsAre()));
  EXPECT_THAT(PlanShards({4, 4, 4}, 10), ElementsAre(ElementsAre(0, 1), ElementsAre(2)));
  EXPECT_THAT(PlanShards({20, 4, 4}, 10), ElementsAre(ElementsAre(0), ElementsAre(1, 2)));
  EXPECT_THAT(PlanShards({4, 20, 4}, 10),
              ElementsAre(ElementsAre(0), ElementsAre(1), ElementsAre(2)));
}

TEST(SafetensorsModelDir, WritesShardsAndAnIndexThenOneFileRemovingTheOtherLayout) {
  testing::TempDir dir;
  std::vector<std::vector<float>> values;
  for (int t = 0; t < 5; ++t) values.push_back(std::vector<float>(4, static_cast<float>(t)));
  std::vector<TensorToWrite> tensors;
  for (int t = 0; t < 5; ++t) {
    tensors.push_back({absl::StrCat("layers.", t, ".weight"), Dtype::kF32, {4},
                       absl::string_view(reinterpret_cast<const char*>(values[t].data()), 16)});
  }
  ASSERT_TRUE(WriteModelDir(dir.path(), tensors, 32, {{"format", "pt"}}).ok());
  for (const char* name :
       {"model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors",
        "model.safetensors.index.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/" + name)) << name;
  }
  auto model = ModelDir::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->files().size(), 3u);
  EXPECT_EQ(model->Names().size(), 5u);
  EXPECT_EQ(*model->Data("layers.4.weight"), tensors[4].data);
  EXPECT_EQ(model->Metadata().at("format"), "pt");
  EXPECT_THAT(std::string(model->Data("lm_head.weight").status().message()),
              HasSubstr("no tensor 'lm_head.weight'"));
  ASSERT_TRUE(WriteModelDir(dir.path(), tensors, 1 << 20).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/model-00001-of-00003.safetensors"));
  model = ModelDir::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->files().size(), 1u);
  EXPECT_EQ(*model->Data("layers.2.weight"), tensors[2].data);
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(SafetensorsModelDir, RefusesAnIndexThatDisagreesWithItsShards) {
  testing::TempDir dir;
  const float one = 1;
  const absl::string_view four(reinterpret_cast<const char*>(&one), 4);
  ASSERT_TRUE(WriteSafetensors(dir.path() + "/a.safetensors",
                               {{"x", Dtype::kF32, {1}, four}, {"y", Dtype::kF32, {1}, four}})
                  .ok());
  const std::string index = dir.path() + "/model.safetensors.index.json";
  auto error = [&](const std::string& text) {
    WriteText(index, text);
    auto model = ModelDir::Open(dir.path());
    EXPECT_FALSE(model.ok());
    return model.ok() ? absl::Status() : model.status();
  };
  EXPECT_THAT(std::string(error(R"({"weight_map":{"x":"a.safetensors"}})").message()),
              HasSubstr("a.safetensors: tensor 'y' is not listed for this shard"));
  EXPECT_THAT(
      std::string(error(R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors",)"
                        R"("z":"a.safetensors"}})")
                      .message()),
      HasSubstr("tensor 'z' is listed in a.safetensors, which does not hold it"));
  EXPECT_THAT(std::string(error(R"({"metadata":{"total_size":12},)"
                                R"("weight_map":{"x":"a.safetensors","y":"a.safetensors"}})")
                              .message()),
              HasSubstr("metadata.total_size is 12 bytes, but the shards' tensors hold 8"));
  const absl::Status missing = error(R"({"weight_map":{"x":"b.safetensors"}})");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("b.safetensors: cannot open"));
  EXPECT_THAT(std::string(error(R"({"weight_map":{"x":"../a.safetensors"}})").message()),
              HasSubstr("tensor 'x': shard \"../a.safetensors\" is not a .safetensors file name"));
  EXPECT_THAT(std::string(error(R"({"weight_map":[]})").message()),
              HasSubstr("has no \"weight_map\" object"));
  // Neither layout: NOT_FOUND.
  testing::TempDir empty;
  EXPECT_EQ(ModelDir::Open(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

// --- Interchange with tests/support/safetensors_ref.py ---------------------------------------

std::string RefScript() { return testing::TestDataDir() + "/../support/safetensors_ref.py"; }

// Runs the reference script with `args`; its stdout.
std::string RunRef(const std::string& args) {
  const std::string command = absl::StrCat(testing::kPython, " ", RefScript(), " ", args);
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return out;
}

bool HavePython() { return std::filesystem::exists(testing::kPython); }

// The fixture's element i (safetensors_ref.py).
int Value(int i) { return (i * 37 % 101) - 50; }

template <typename T>
std::vector<T> As(absl::string_view bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

void ExpectTheFixture(const ModelDir& model) {
  ASSERT_EQ(model.Names().size(), 10u);
  const TensorInfo* embed = model.Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_THAT(embed->shape, ElementsAre(5, 4));
  const std::vector<float> f32 = As<float>(*model.Data("model.embed_tokens.weight"));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(f32[i], static_cast<float>(Value(i))) << i;
  const std::vector<uint16_t> bf16 = As<uint16_t>(*model.Data("model.layers.0.self_attn.q_proj.weight"));
  for (int i = 0; i < 16; ++i) {
    uint32_t bits = static_cast<uint32_t>(bf16[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    EXPECT_EQ(v, static_cast<float>(Value(i))) << i;
  }
  const std::vector<double> f64 = As<double>(*model.Data("model.norm.weight"));
  EXPECT_THAT(f64, ElementsAre(Value(0), Value(1), Value(2), Value(3)));
  const std::vector<int64_t> i64 = As<int64_t>(*model.Data("position_ids"));
  EXPECT_EQ(i64[5], Value(5));
  EXPECT_EQ(model.Find("model.layers.0.mlp.down_proj.weight")->dtype, Dtype::kF16);
  EXPECT_EQ(model.Find("mask")->dtype, Dtype::kBool);
  EXPECT_EQ(model.Find("empty")->NumElements(), 0);
  EXPECT_TRUE(model.Find("scalar")->shape.empty());
  EXPECT_EQ(model.Find("scalar")->NumElements(), 1);
  EXPECT_EQ(model.Metadata().at("format"), "pt");
}

TEST(SafetensorsInterchange, ReadsFilesAnIndependentWriterWrote) {
  if (!HavePython()) GTEST_SKIP() << testing::kPython << " is missing";
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/one");
  RunRef(absl::StrCat("write ", dir.path(), "/one/model.safetensors"));
  auto one = ModelDir::Open(dir.path() + "/one");
  ASSERT_TRUE(one.ok()) << one.status();
  ExpectTheFixture(*one);
  RunRef(absl::StrCat("write ", dir.path(), "/sharded --shards 3"));
  auto sharded = ModelDir::Open(dir.path() + "/sharded");
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(sharded->files().size(), 3u);
  ExpectTheFixture(*sharded);
}

TEST(SafetensorsInterchange, AnIndependentReaderReadsOursToTheByte) {
  if (!HavePython()) GTEST_SKIP() << testing::kPython << " is missing";
  testing::TempDir dir;
  // Our writer rewrites the fixture the reference wrote; the reference reads ours back.
  std::filesystem::create_directories(dir.path() + "/theirs");
  RunRef(absl::StrCat("write ", dir.path(), "/theirs/model.safetensors"));
  auto theirs = ModelDir::Open(dir.path() + "/theirs");
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> sha;
  for (const std::string& name : theirs->Names()) {
    const TensorInfo* t = theirs->Find(name);
    tensors.push_back({name, t->dtype, t->shape, *theirs->Data(name)});
    sha[name] = Sha256Hex(*theirs->Data(name));
  }
  for (uint64_t limit : {uint64_t{1} << 30, uint64_t{40}}) {
    SCOPED_TRACE(limit);
    const std::string ours = absl::StrCat(dir.path(), "/ours-", limit);
    std::filesystem::create_directories(ours);
    ASSERT_TRUE(WriteModelDir(ours, tensors, limit, {{"format", "pt"}}).ok());
    const nlohmann::json read = nlohmann::json::parse(RunRef("read " + ours));
    ASSERT_EQ(read.size(), tensors.size());
    for (const TensorToWrite& t : tensors) {
      ASSERT_TRUE(read.contains(t.name)) << t.name;
      EXPECT_EQ(read[t.name]["dtype"], std::string(DtypeName(t.dtype))) << t.name;
      EXPECT_EQ(read[t.name]["shape"].get<std::vector<int64_t>>(), t.shape) << t.name;
      EXPECT_EQ(read[t.name]["sha256"], sha[t.name]) << t.name;
    }
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ours-40/model.safetensors.index.json"));
  // Values, not only hashes: the reference decodes our F32 tensor.
  const std::vector<std::string> lines = absl::StrSplit(
      RunRef(absl::StrCat("f32 ", dir.path(), "/ours-40 model.embed_tokens.weight")), '\n',
      absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(std::stod(lines[i]), Value(i)) << i;
}

}  // namespace
}  // namespace stagecoach::safetensors::safetensors_test
