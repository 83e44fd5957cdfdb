-- Version 20: a queue's concurrency slots leased to a process in blocks
-- (driver.SlotLeaser). A concurrency slot ('c') is now free, held by an
-- attempt (job_id, fence), or leased to an owner (a process's worker id,
-- the attempted_by of the jobs it claims) until owner_until, by the
-- database's clock. The owner renews its block with LeaseSlots; Rescue
-- gives a block back once its lease expired and its owner has no job of
-- the queue running. No index on either column: as with job_id, a block
-- taken, renewed or given back is a HOT update on the table's few pages,
-- and nothing on a job's path reads them.
ALTER TABLE {p}limit_slots
    ADD COLUMN owner       text,
    ADD COLUMN owner_until timestamptz
