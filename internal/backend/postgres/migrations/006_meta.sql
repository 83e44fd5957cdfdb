-- Version 6: job metadata. meta is a JSON object of string keys and
-- values given at enqueue (EnqueueOpts.Metadata), for what travels with a
-- job outside its arguments: a trace context, a tenant. jsonb, so that an
-- operator can query it (meta->>'tenant'). NULL, the common case, costs a
-- row one bit of its null bitmap; no index reads it. Adding a nullable
-- column without a default rewrites nothing.
ALTER TABLE {p}jobs ADD COLUMN meta jsonb
