// ApplySpecOverrides: set and remove fields of a spec's YAML, creating mappings on the way, and
// ParseJobSpec's own errors for documents it would reject whole.
#include "common/spec/spec_overrides.h"

#include "common/spec/spec_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagecoach::spec::spec_overrides_test {
namespace {

using ::testing::HasSubstr;

TEST(SpecOverridesTest, SetsNestedFieldsCreatingMappingsAndRemovesOthers) {
  SpecOverrides o;
  o.set = {
      {"schedule.kind", "ForwardOnly"}, {"training.batch_size", "10"}, {"training.steps", "1"}};
  o.remove = {"training.checkpoint", "data", "schedule.csv", "absent.key"};
  auto yaml = ApplySpecOverrides(
      "name: t  # comment\nmodel: {builtin: {family: mlp, sizes: [4, 2]}}\n"
      "schedule: {kind: 1F1B, microbatches: 2}\ndata: {kind: synthetic, seed: 3}\n"
      "training:\n  checkpoint: {dir: /c}\n  steps: 50\n",
      "t.yaml", o);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto spec = ParseJobSpec(*yaml);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << *yaml;
  EXPECT_EQ(spec->schedule.kind, "ForwardOnly");
  EXPECT_EQ(spec->schedule.microbatches, 2);
  EXPECT_EQ(spec->training.batch_size, 10);
  EXPECT_EQ(spec->training.steps, 1);
  EXPECT_EQ(spec->training.checkpoint.dir, "");
  EXPECT_EQ(spec->data.seed, 0u);
  EXPECT_EQ(spec->model.builtin->sizes, (std::vector<int64_t>{4, 2}));
}

TEST(SpecOverridesTest, DocumentErrorsAreParseJobSpecs) {
  SpecOverrides o;
  o.set = {{"training.steps", "1"}};
  auto syntax = ApplySpecOverrides("name: [", "t.yaml", o);
  EXPECT_THAT(syntax.status().message(), HasSubstr("t.yaml:1:"));
  auto list = ApplySpecOverrides("- a\n- b\n", "t.yaml", o);
  EXPECT_FALSE(list.ok());
  EXPECT_EQ(list.status().message(), ParseJobSpec("- a\n- b\n", "t.yaml").status().message());
  auto two = ApplySpecOverrides("name: a\n---\nname: b\n", "t.yaml", o);
  EXPECT_FALSE(two.ok());
}

TEST(SpecOverridesTest, APathThroughAScalarIsAnError) {
  SpecOverrides o;
  o.set = {{"training.steps", "1"}};
  auto r = ApplySpecOverrides("name: t\ntraining: 5\n", "t.yaml", o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_EQ(r.status().message(), "training: must be a mapping");
}

}  // namespace
}  // namespace stagecoach::spec::spec_overrides_test
