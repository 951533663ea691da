"""The jobs that move a group's values into the stores and keep track of them: `apply` and `plan`, the backfill
and its schedule (the manifest of completed days, what is stale), the stream and its micro-batch sink, `verify`,
`status`, and the retention of what runs set aside."""
