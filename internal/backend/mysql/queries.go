package mysql

import (
	"strings"

	"github.com/conveyorq/conveyor/internal/sqlq"
)

// queries holds the statements of queries.sql, prefixed, without their
// comment lines and with {cols} and {fence_floor} expanded; Open expands
// {skip}, {iso} and {server} once it knows the server. The tags are the file's query names:
// sqlq.Load fails, and so does opening the driver, on a name missing from
// the file or a query with no field here. {ids}, {source} and {where} are
// filled per call.
type queries struct {
	// The column list scanJob reads ({cols}).
	JobColumns string `sql:"job_columns"`

	// Inserts: a statement head and one row, repeated per job.
	InsertHead string `sql:"insert_head"`
	InsertRow  string `sql:"insert_row"`
	// Claims at insert (InsertClaiming).
	InsertClaimState    string `sql:"insert_claim_state"`
	InsertClaimHead     string `sql:"insert_claim_head"`
	InsertClaimPlainRow string `sql:"insert_claim_plain_row"`
	InsertClaimRow      string `sql:"insert_claim_row"`
	InsertUniqueHead    string `sql:"insert_unique_head"`
	InsertUniqueRow     string `sql:"insert_unique_row"`
	UniqueHolder        string `sql:"unique_holder"`

	// Claims: SKIP LOCKED (select, then mark), by id, and optimistic.
	ClaimSelect      string `sql:"claim_select"`
	ClaimSelectAfter string `sql:"claim_select_after"`
	ClaimProbe       string `sql:"claim_probe"`
	ClaimSelectIDs   string `sql:"claim_select_ids"`
	ClaimMark        string `sql:"claim_mark"`
	ClaimMarkQueued  string `sql:"claim_mark_queued"`
	ClaimJobSelect   string `sql:"claim_job_select"`
	ClaimWindow      string `sql:"claim_window"`
	ClaimOptimistic  string `sql:"claim_optimistic"`
	ClaimByToken     string `sql:"claim_by_token"`

	// Fence epochs (see fence_floor in queries.sql).
	FenceFloor       string `sql:"fence_floor"`
	FenceEpochState  string `sql:"fence_epoch_state"`
	FenceEpochInsert string `sql:"fence_epoch_insert"`

	// The lease path: the batch sources ({source}) and the fenced
	// updates joined to them.
	OutcomeSourceJSON  string `sql:"outcome_source_json"`
	OutcomeSourceRow   string `sql:"outcome_source_row"`
	LeaseSourceJSON    string `sql:"lease_source_json"`
	LeaseSourceRow     string `sql:"lease_source_row"`
	Complete           string `sql:"complete"`
	CompleteWithErrors string `sql:"complete_with_errors"`
	// The attempts of a batch that hold slots of limited queues, and the
	// freeing of those slots after complete in the same transaction.
	SlotHolders string `sql:"slot_holders"`
	FreeSlots   string `sql:"free_slots"`
	Heartbeat   string `sql:"heartbeat"`
	Release     string `sql:"release"`
	FenceCheck  string `sql:"fence_check"`

	// Maintenance.
	RescueSelect    string `sql:"rescue_select"`
	RescueFreeSlots string `sql:"rescue_free_slots"`
	RescueUpdate    string `sql:"rescue_update"`
	PromoteSelect   string `sql:"promote_select"`
	PromoteUpdate   string `sql:"promote_update"`
	PruneCompleted  string `sql:"prune_completed"`
	// Results (migration 11).
	CompleteOne  string `sql:"complete_one"`
	StoreResult  string `sql:"store_result"`
	GetResult    string `sql:"get_result"`
	PruneResults string `sql:"prune_results"`
	// Batches (migration 12).
	InsertBatch      string `sql:"insert_batch"`
	InsertBatchJobs  string `sql:"insert_batch_jobs"`
	ReadyBatches     string `sql:"ready_batches"`
	FireBatch        string `sql:"fire_batch"`
	LockBatchMembers string `sql:"lock_batch_members"`
	LockBatchDeps    string `sql:"lock_batch_deps"`
	GetBatch         string `sql:"get_batch"`
	JobBatch         string `sql:"job_batch"`
	AwaitingDeps     string `sql:"awaiting_dependencies"`
	BatchMembers     string `sql:"batch_members"`
	PrunableBatches  string `sql:"prunable_batches"`
	PruneBatchJobs   string `sql:"prune_batch_jobs"`
	PruneBatches     string `sql:"prune_batches"`
	InsertBatchDeps  string `sql:"insert_batch_deps"`
	PruneBatchDeps   string `sql:"prune_batch_deps"`
	PruneDiscarded   string `sql:"prune_discarded"`
	TryLead          string `sql:"try_lead"`
	Leader           string `sql:"leader"`

	// Reads and changes of one job, the job lists (list_jobs is a
	// template: {where} takes the list_jobs_* conditions) and the
	// per-queue counts.
	GetJob         string `sql:"get_job"`
	JobUniqueKey   string `sql:"job_unique_key"`
	ListJobs       string `sql:"list_jobs"`
	ListJobsDesc   string `sql:"list_jobs_desc"`
	ListJobsBefore string `sql:"list_jobs_before"`
	ListJobsStates string `sql:"list_jobs_states"`
	ListJobsQueue  string `sql:"list_jobs_queue"`
	ListJobsKind   string `sql:"list_jobs_kind"`
	Retry          string `sql:"retry"`
	Finalize       string `sql:"finalize"`
	Stats          string `sql:"stats"`
	Overview       string `sql:"overview"`

	// The server, the schema's migrations and DropAll.
	ServerInfo      string `sql:"server_info"`
	Probe           string `sql:"probe"`
	ProbeIsolation  string `sql:"probe_isolation"`
	ProbeWsrep      string `sql:"probe_wsrep"`
	CausalRead      string `sql:"causal_read"`
	CausalAck       string `sql:"causal_ack"`
	TxOpen          string `sql:"tx_open"`
	InsertReturning string `sql:"insert_returning"`
	GetLock         string `sql:"get_lock"`
	ReleaseLock     string `sql:"release_lock"`

	// The migration lock row on Galera.
	MigrationLockTable   string `sql:"migration_lock_table"`
	MigrationLockTake    string `sql:"migration_lock_take"`
	MigrationLockHolder  string `sql:"migration_lock_holder"`
	MigrationLockRelease string `sql:"migration_lock_release"`
	MigrationsTable      string `sql:"migrations_table"`
	MigrationsMax        string `sql:"migrations_max"`
	MigrationsRecord     string `sql:"migrations_record"`
	DropAll              string `sql:"drop_all"`

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

	// Queue limits: their settings, the claim's slots and the sweep of
	// stale slots (see limits.go).
	SetQueueLimits string `sql:"set_queue_limits"`
	SlotCount      string `sql:"slot_count"`
	SlotInsertHead string `sql:"slot_insert_head"`
	SlotInsertRow  string `sql:"slot_insert_row"`
	SlotInsertTail string `sql:"slot_insert_tail"`
	SlotTrimC      string `sql:"slot_trim_c"`
	SlotLockAbove  string `sql:"slot_lock_above"`
	SlotTrimR      string `sql:"slot_trim_r"`
	QueueLimits    string `sql:"queue_limits"`
	LimitUsage     string `sql:"limit_usage"`
	LimitsRead     string `sql:"limits_read"`
	SlotLockC      string `sql:"slot_lock_c"`
	SlotLockR      string `sql:"slot_lock_r"`
	SlotReserveC   string `sql:"slot_reserve_c"`
	SlotReserveR   string `sql:"slot_reserve_r"`
	SlotReserved   string `sql:"slot_reserved"`
	SlotUnreserve  string `sql:"slot_unreserve"`
	SlotTake       string `sql:"slot_take"`
	SlotRetryIn    string `sql:"slot_retry_in"`
	DueExists      string `sql:"due_exists"`
	SlotStale      string `sql:"slot_stale"`
	SlotFree       string `sql:"slot_free"`
	SlotMaxC       string `sql:"slot_max_c"`
	SlotLockQueue  string `sql:"slot_lock_queue"`

	// Slot blocks: LeaseSlots' statements and the rescue's giving back
	// of expired blocks (see blocks.go).
	LeaseLimit    string `sql:"lease_limit"`
	LeaseRead     string `sql:"lease_read"`
	LeaseGiveBack string `sql:"lease_give_back"`
	LeaseRenew    string `sql:"lease_renew"`
	LeaseTake     string `sql:"lease_take"`
	LeaseTakeFree string `sql:"lease_take_free"`
	LeaseOthers   string `sql:"lease_others"`
	BlockExpired  string `sql:"block_expired"`
	BlockFree     string `sql:"block_free"`

	// Key limits: the claim's walk of keys, its key slots and jobs, the
	// usage and the sweep (see keys.go).
	KeyWalk            string `sql:"key_walk"`
	KeyWalkUpto        string `sql:"key_walk_upto"`
	KeyWalkGrouped     string `sql:"key_walk_grouped"`
	KeyWalkGroupedUpto string `sql:"key_walk_grouped_upto"`
	KeyWalkAt          string `sql:"key_walk_at"`
	KeySlotStats       string `sql:"key_slot_stats"`
	KeySlotInsert      string `sql:"key_slot_insert"`
	KeySlotInsertRow   string `sql:"key_slot_insert_row"`
	KeySlotLockPart    string `sql:"key_slot_lock_part"`
	KeySlotLockIn      string `sql:"key_slot_lock_in"`
	KeyHeadPart        string `sql:"key_head_part"`
	KeyJobsIn          string `sql:"key_jobs_in"`
	KeyNextPart        string `sql:"key_next_part"`
	KeyClaimSelect     string `sql:"key_claim_select"`
	ClaimSelectNoKey   string `sql:"claim_select_nokey"`
	KeySlotTake        string `sql:"key_slot_take"`
	KeysRunning        string `sql:"keys_running"`
	KeyUsage           string `sql:"key_usage"`
	KeyKeptStale       string `sql:"key_kept_stale"`
	KeyKeptFree        string `sql:"key_kept_free"`
	KeySlotTrim        string `sql:"key_slot_trim"`

	// Rates per key: the walk's read of rate slots, their making, locking
	// and stamping by the claim, the claim's wait, the usage and the sweep
	// (see keys.go).
	KeyRateStats     string `sql:"key_rate_stats"`
	KeyRateInsert    string `sql:"key_rate_insert"`
	KeyRateInsertRow string `sql:"key_rate_insert_row"`
	KeyRateLockPart  string `sql:"key_rate_lock_part"`
	KeyRateTake      string `sql:"key_rate_take"`
	KeyRateRetryIn   string `sql:"key_rate_retry_in"`
	KeysRated        string `sql:"keys_rated"`
	KeyRateTrim      string `sql:"key_rate_trim"`

	// Fair queues: the key weights kept beside the limits (see
	// weights.go).
	SetKeyWeights string `sql:"set_key_weights"`
	KeyWeights    string `sql:"key_weights"`
}

// loadQueries reads queries.sql for prefix, drops its comment lines and
// expands {cols} and {fence_floor}.
func loadQueries(prefix string) (queries, error) {
	var q queries
	if err := sqlq.Load(&q, sqlFiles, prefix, "queries.sql"); err != nil {
		return q, err
	}
	sqlq.Rewrite(&q, dropComments)
	sqlq.Rewrite(&q, strings.NewReplacer("{cols}", q.JobColumns, "{fence_floor}", q.FenceFloor).Replace)
	return q, nil
}

// dropComments returns query without its comment lines.
func dropComments(query string) string {
	var b strings.Builder
	for _, line := range strings.Split(query, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(line)
	}
	return strings.TrimSpace(b.String())
}
