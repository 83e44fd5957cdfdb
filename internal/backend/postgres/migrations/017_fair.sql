-- Version 17: fair queues (driver.QueueLimits.Fair) and key weights
-- (Driver.SetKeyWeights). A queue's key_fair (true: its claims serve the
-- keys of its due jobs in turns; NULL: not fair) and key_weights (the
-- weights of its keys as driver.EncodeKeyWeights writes them, a JSON
-- object of key to weight; NULL: none). SetQueueLimits writes key_fair
-- and leaves key_weights alone; SetKeyWeights writes key_weights alone.
-- Adding nullable columns without a default rewrites nothing.
ALTER TABLE {p}queues
    ADD COLUMN key_fair    boolean,
    ADD COLUMN key_weights text
