package sqlite

import (
	"strings"

	"github.com/conveyorq/conveyor/internal/sqlq"
)

// queries holds the statements of queries.sql, prefixed and with {now},
// {cols} and {in_use} expanded. The tags are the files' query names: sqlq.Load fails,
// and so does opening the driver, on a name missing from the file or a
// query with no field here.
type queries struct {
	// Fragments expanded into the others: the database's clock in unix
	// microseconds ({now}), the column list scanJob reads ({cols}) and
	// the count of a queue's concurrency slots in use ({in_use}).
	Now        string `sql:"now"`
	JobColumns string `sql:"job_columns"`
	SlotsInUse string `sql:"slots_in_use"`

	// The hot path: inserts, claims and the lease path.
	Insert       string `sql:"insert"`
	InsertClaim  string `sql:"insert_claim"`
	BulkInsert   string `sql:"bulk_insert"`
	InsertUnique string `sql:"insert_unique"`
	UniqueHolder string `sql:"unique_holder"`
	Claim        string `sql:"claim"`
	ClaimJob     string `sql:"claim_job"`
	Complete     string `sql:"complete"`
	Heartbeat    string `sql:"heartbeat"`
	Release      string `sql:"release"`

	// Maintenance.
	Rescue  string `sql:"rescue"`
	Promote string `sql:"promote"`
	Prune   string `sql:"prune"`
	// Results (migration 10).
	StoreResults string `sql:"store_results"`
	GetResult    string `sql:"get_result"`
	PruneResults string `sql:"prune_results"`
	DropResults  string `sql:"drop_results"`
	// Batches (migration 11).
	InsertBatch     string `sql:"insert_batch"`
	InsertBatchJobs string `sql:"insert_batch_jobs"`
	ReadyBatches    string `sql:"ready_batches"`
	BatchReady      string `sql:"batch_ready"`
	FireBatch       string `sql:"fire_batch"`
	GetBatch        string `sql:"get_batch"`
	JobBatch        string `sql:"job_batch"`
	BatchMembers    string `sql:"batch_members"`
	PruneBatchJobs  string `sql:"prune_batch_jobs"`
	PruneBatches    string `sql:"prune_batches"`
	DropBatches     string `sql:"drop_batches"`
	InsertBatchDeps string `sql:"insert_batch_deps"`
	PruneBatchDeps  string `sql:"prune_batch_deps"`
	DropBatchDeps   string `sql:"drop_batch_deps"`
	DropBatchJobs   string `sql:"drop_batch_jobs"`
	TryLead         string `sql:"try_lead"`

	// Reads and changes of one job, the job lists (list_jobs is a
	// template: {where} takes the list_jobs_* conditions, {n} their
	// argument numbers) and the per-queue counts.
	GetJob         string `sql:"get_job"`
	JobState       string `sql:"job_state"`
	JobUniqueKey   string `sql:"job_unique_key"`
	ListJobs       string `sql:"list_jobs"`
	ListJobsDesc   string `sql:"list_jobs_desc"`
	ListJobsBefore string `sql:"list_jobs_before"`
	ListJobsState  string `sql:"list_jobs_state"`
	ListJobsStates string `sql:"list_jobs_states"`
	ListJobsQueue  string `sql:"list_jobs_queue"`
	ListJobsKind   string `sql:"list_jobs_kind"`
	RetryJob       string `sql:"retry_job"`
	FinishJob      string `sql:"finish_job"`
	Stats          string `sql:"stats"`
	Overview       string `sql:"overview"`
	// AwaitingDeps counts the open batches' callbacks by queue.
	AwaitingDeps string `sql:"awaiting_dependencies"`

	// The schema: migrations and DropAll.
	CreateMigrationsTable string `sql:"create_migrations_table"`
	MigrationsTableExists string `sql:"migrations_table_exists"`
	SchemaVersion         string `sql:"schema_version"`
	RecordMigration       string `sql:"record_migration"`
	DropJobs              string `sql:"drop_jobs"`
	DropLeader            string `sql:"drop_leader"`
	DropQueues            string `sql:"drop_queues"`
	DropSchedules         string `sql:"drop_schedules"`
	DropProcesses         string `sql:"drop_processes"`
	DropLimitSlotsTable   string `sql:"drop_limit_slots_table"`
	DropMigrations        string `sql:"drop_migrations"`

	// The file and its settings.
	ServerInfo              string `sql:"server_info"`
	PragmaJournalMode       string `sql:"pragma_journal_mode"`
	PragmaSynchronous       string `sql:"pragma_synchronous"`
	PragmaJournalSizeLimit  string `sql:"pragma_journal_size_limit"`
	PragmaBusyTimeout       string `sql:"pragma_busy_timeout"`
	PragmaWALAutocheckpoint string `sql:"pragma_wal_autocheckpoint"`
	CheckpointPassive       string `sql:"checkpoint_passive"`
	CheckpointRestart       string `sql:"checkpoint_restart"`
	MainFile                string `sql:"main_file"`

	// Queue limits: their rows, the claim of a limited queue (which
	// counts the queue's running jobs for its concurrency limit, and
	// takes rate slots for its rate) and the usage.
	SetQueueLimits string `sql:"set_queue_limits"`
	AddLimitSlots  string `sql:"add_limit_slots"`
	DropLimitSlots string `sql:"drop_limit_slots"`
	QueueLimits    string `sql:"queue_limits"`
	LimitsOf       string `sql:"limits_of"`
	FreeRateSlots  string `sql:"free_rate_slots"`
	TakeRateSlot   string `sql:"take_rate_slot"`
	DueJobWaits    string `sql:"due_job_waits"`
	RateRetryIn    string `sql:"rate_retry_in"`
	LimitUsage     string `sql:"limit_usage"`
	// Blocks of a queue's concurrency slots (migration 18): LeaseSlots'
	// statements and Rescue's sweep of the expired ones.
	BlockGiveBack string `sql:"block_give_back"`
	BlockRenew    string `sql:"block_renew"`
	BlockRoom     string `sql:"block_room"`
	BlockTake     string `sql:"block_take"`
	SweepBlocks   string `sql:"sweep_blocks"`
	// Key weights of fair queues (migration 14).
	SetKeyWeights string `sql:"set_key_weights"`
	KeyWeights    string `sql:"key_weights"`

	// Key limits (migration 12): the keyed claim, the freeing of key
	// slots by the statements that end attempts, Rescue's sweep and the
	// usage.
	NextKeys          string `sql:"next_keys"`
	NextKeysHeads     string `sql:"next_keys_heads"`
	NextKeysHeadsOrd  string `sql:"next_keys_heads_ordered"`
	OpenKeySlots      string `sql:"open_key_slots"`
	KeptJobDue        string `sql:"kept_job_due"`
	KeyJobs           string `sql:"key_jobs"`
	KeyJobsOrdered    string `sql:"key_jobs_ordered"`
	ClaimIDs          string `sql:"claim_ids"`
	ClaimUnkeyed      string `sql:"claim_unkeyed"`
	TakeKeySlots      string `sql:"take_key_slots"`
	InsertClaimLimits string `sql:"insert_claim_limits"`
	KeyWaits          string `sql:"key_waits"`
	FreeKeySlots      string `sql:"free_key_slots"`
	SweepKeySlots     string `sql:"sweep_key_slots"`
	SweepIdleKeySlots string `sql:"sweep_idle_key_slots"`
	KeyHeld           string `sql:"key_held"`
	DropKeySlotsTable string `sql:"drop_key_slots_table"`

	// Rates per key (migration 13): the rate slots of the keyed claim and
	// Rescue's sweep of them.
	AddKeyRateSlots   string `sql:"add_key_rate_slots"`
	KeyRateSlots      string `sql:"key_rate_slots"`
	TakeKeyRateSlot   string `sql:"take_key_rate_slot"`
	SweepKeyRateSlots string `sql:"sweep_key_rate_slots"`

	// Paused queues, schedules and the process registry.
	PauseQueue      string `sql:"pause_queue"`
	PausedQueues    string `sql:"paused_queues"`
	RecordSchedule  string `sql:"record_schedule"`
	Schedules       string `sql:"schedules"`
	TouchSchedule   string `sql:"touch_schedule"`
	PruneSchedules  string `sql:"prune_schedules"`
	RegisterProcess string `sql:"register_process"`
	RemoveProcess   string `sql:"remove_process"`
	Processes       string `sql:"processes"`
	PruneProcesses  string `sql:"prune_processes"`
}

// loadQueries reads queries.sql for prefix and expands the {now}, {cols}
// and {in_use} tokens.
func loadQueries(prefix string) (queries, error) {
	var q queries
	if err := sqlq.Load(&q, sqlFS, prefix, "queries.sql"); err != nil {
		return q, err
	}
	sqlq.Rewrite(&q, strings.NewReplacer("{now}", "("+q.Now+")", "{cols}", q.JobColumns, "{in_use}", q.SlotsInUse).Replace)
	return q, nil
}
