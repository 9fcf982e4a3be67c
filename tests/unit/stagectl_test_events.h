// Events and jobs the stagectl tests render and serve (a fake coordinator's canned answers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/rpc/time_conversion.h"
#include "stagecoach/v1/types.pb.h"

namespace stagecoach::client {

inline v1::JobEvent StateEvent(int64_t sequence, v1::JobState state, const std::string& reason,
                               absl::Time time = absl::FromUnixSeconds(1'700'000'000)) {
  v1::JobEvent e;
  e.set_job_id("job-1");
  e.set_sequence(sequence);
  *e.mutable_time() = rpc::ToProtoTimestamp(time);
  v1::JobTransition* t = e.mutable_state_change();
  t->set_state(state);
  t->set_reason(reason);
  *t->mutable_time() = rpc::ToProtoTimestamp(time);
  return e;
}

inline v1::JobEvent StepEvent(int64_t sequence, int64_t step, int64_t total, double loss,
                              absl::Duration step_time, std::vector<double> bubbles = {0.25, 0.5}) {
  v1::JobEvent e;
  e.set_job_id("job-1");
  e.set_sequence(sequence);
  *e.mutable_time() = rpc::ToProtoTimestamp(absl::FromUnixSeconds(1'700'000'100));
  v1::StepCompleted* s = e.mutable_step_completed();
  s->set_step(step);
  s->set_global_step(step);
  s->set_steps_total(total);
  s->set_loss(loss);
  *s->mutable_step_time() = rpc::ToProtoDuration(step_time);
  s->set_samples_per_second(800);
  for (double b : bubbles) s->add_bubble_ratios(b);
  return e;
}

inline v1::Job RestartedPausedJob() {
  v1::Job job;
  job.set_id("job-7");
  job.set_name("mlp");
  job.set_state(v1::JOB_STATE_PAUSED);
  job.set_steps_done(30);
  job.set_steps_total(50);
  job.set_global_steps_done(40);
  job.set_pause_at_global_step(40);
  job.set_attempt(2);
  job.set_restarts(1);
  job.set_max_restarts(3);
  v1::JobFailure* failure = job.mutable_failure();
  failure->set_rank(1);
  failure->set_worker_id("w-2");
  failure->set_action("1RECV_F3");
  failure->set_error("lost: missed heartbeats for 3s");
  return job;
}

}  // namespace stagecoach::client
