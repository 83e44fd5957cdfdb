export { Client } from "./client.js";
export type {
  Acknowledged,
  AttemptError,
  Batch,
  BatchEnqueued,
  BatchJob,
  ClaimedJob,
  ClaimOptions,
  ClientOptions,
  EnqueueItem,
  EnqueueOptions,
  EnqueueResult,
  FailOptions,
  Held,
  Job,
  JobPage,
  JobState,
  LimitUse,
  ListJobsOptions,
  QueueInfo,
  QueueLimits,
  QueueLimitsInput,
  UniqueOptions,
  WorkflowEnqueued,
  WorkflowJob,
  WorkflowOptions,
} from "./client.js";
export { LeaseDeadlineError, Worker, WorkerStopping } from "./worker.js";
export type { Handler, StopOptions, StopResult, WorkerOptions } from "./worker.js";
export { CancelJob, ConveyorError, Snooze, StaleFenceError, snooze } from "./errors.js";
