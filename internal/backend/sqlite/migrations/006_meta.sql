-- Version 6: job metadata. meta is a JSON object of string keys and
-- values given at enqueue (EnqueueOpts.Metadata), for what travels with a
-- job outside its arguments: a trace context, a tenant. NULL, the common
-- case, costs a row one header byte; no index reads it.
ALTER TABLE {p}jobs ADD COLUMN meta TEXT
