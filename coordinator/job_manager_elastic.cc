// JobManager's part for elastic jobs (restart.elastic, coordinator/elastic/): re-plans run on the
// executor, off the job table's lock, and are installed under it; a checkpoint that lets a
// shrunk job grow back restarts it through the lifecycle.
#include "common/util/logging.h"
#include "coordinator/elastic/elastic_resize.h"
#include "coordinator/job_manager.h"

namespace stagecoach::coordinator {

void JobManager::QueueResizesLocked() {
  for (ResizeOrder& order : PlanResizesLocked(table_, registry_, deps_.clock->Now())) {
    deps_.executor->Run(scope_.Wrap([this, order = std::move(order)] {
      ResizeResult result = PrepareResize(order);
      absl::MutexLock lock(&table_.mu());
      Job* job = table_.FindLocked(order.job_id);
      if (job == nullptr) return;
      ApplyResizeLocked(*job, order, std::move(result));
      table_.PersistLocked(*job);
      ScheduleLocked();
    }));
  }
}

void JobManager::MaybeGrowLocked(Job& job, const PendingManifest& pending) {
  std::optional<std::string> why =
      GrowAtCheckpointLocked(job, registry_, pending.manifest, pending.step_dir);
  if (why.has_value()) lifecycle_.RestartLocked(job, *why);
}

}  // namespace stagecoach::coordinator
