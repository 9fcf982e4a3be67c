// The sharding keys of the job spec's placement: placement.shard (none | optimizer | gradients |
// parameters | auto), its synonym placement.shard_optimizer, and placement.unshard (step |
// stage), read through yaml_fields. spec_parser.cc calls ParseShard while it reads placement;
// the rules are in docs/spec.md and docs/sharding.md. Not thread-safe: one Validator per parse.
#pragma once

#include "common/spec/job_spec.h"
#include "common/spec/yaml_fields.h"

namespace stagecoach::spec::shard_fields {

// Reports every error on `v` with its path (a contradiction between shard and shard_optimizer,
// unshard without shard: parameters) and writes only what it read validly into `out`.
void ParseShard(yaml_fields::Validator& v, const yaml_fields::Fields& placement,
                PlacementSpec* out);

}  // namespace stagecoach::spec::shard_fields
