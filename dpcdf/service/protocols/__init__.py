"""The server-to-server protocols: one `channel.Channel` per task that every message goes through
(its key, its named message kinds, the one-shot journal), and each protocol's two sides as objects,
`reconciliation` (its arithmetic in `maths`; ReconcileLeader on server 0, ReconcileHelper on server 1 in
`exchange`) and the report check, `check` (round one and outcome; CheckLeader, CheckHelper in `exchange`;
its arithmetic is the layer below, `dpcdf.service.verification`). Every step takes the task's `context.StepContext` (config, party, store, pair key,
channel) whole. The HTTP routers only parse and call the server's state, which calls them."""
