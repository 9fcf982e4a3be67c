#include "common/spec/shard_fields.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace stagecoach::spec {
namespace shard_fields {

void ParseShard(yaml_fields::Validator& v, const yaml_fields::Fields& placement,
                PlacementSpec* out_spec) {
  PlacementSpec& out = *out_spec;
  std::string level;
  const yaml_fields::Read shard =
      placement.Enum("shard", {"none", "optimizer", "gradients", "parameters", "auto"}, &level);
  out.shard_auto = shard == yaml_fields::Read::kOk && level == "auto";
  if (shard == yaml_fields::Read::kOk) {
    for (ShardLevel l : {ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients,
                         ShardLevel::kParameters}) {
      if (level == ShardLevelName(l)) out.shard = l;
    }
  }
  bool optimizer = false;
  if (placement.Bool("shard_optimizer", &optimizer) == yaml_fields::Read::kOk) {
    if (shard == yaml_fields::Read::kAbsent) {
      out.shard = optimizer ? ShardLevel::kOptimizer : ShardLevel::kNone;
    } else if (shard == yaml_fields::Read::kOk &&
               optimizer != (out.shard == ShardLevel::kOptimizer)) {
      v.Error(placement.Path("shard_optimizer"),
              absl::StrCat(optimizer ? "true" : "false", " contradicts placement.shard: ", level,
                           " (shard_optimizer: true is another name for shard: optimizer; "
                           "give one of them)"));
    }
  }
  if (placement.Enum("unshard", {"step", "stage"}, &out.unshard) == yaml_fields::Read::kOk &&
      shard != yaml_fields::Read::kInvalid && out.shard != ShardLevel::kParameters &&
      !out.shard_auto) {
    v.Error(placement.Path("unshard"),
            absl::StrCat("only with placement.shard: parameters (the parameters of shard: ",
                         ShardLevelName(out.shard), " are never gathered for a stage's use)"));
  }
}

}  // namespace shard_fields

bool ShardsParameters(const JobSpec& spec) {
  return spec.placement.shard == ShardLevel::kParameters && spec.placement.replicas > 1;
}

const char* ShardLevelName(ShardLevel level) {
  switch (level) {
    case ShardLevel::kNone:
      return "none";
    case ShardLevel::kOptimizer:
      return "optimizer";
    case ShardLevel::kGradients:
      return "gradients";
    case ShardLevel::kParameters:
      return "parameters";
  }
  return "none";
}

}  // namespace stagecoach::spec
