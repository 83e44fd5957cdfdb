-- Version 14: fair queues. A queue may serve the keys of its due jobs in
-- turns (key_fair 1; NULL or 0 for none), each key taking at most its
-- weight of a claim per turn. The weights are key_weights, a JSON object
-- of key to weight (NULL for none; a key not in it weighs 1), kept beside
-- the queue's limits: setting the limits leaves them, and setting them
-- leaves the limits. Fairness alone holds no job back, so it uses no
-- slot rows.
ALTER TABLE {p}queues ADD COLUMN key_fair INTEGER
-- split
ALTER TABLE {p}queues ADD COLUMN key_weights TEXT
