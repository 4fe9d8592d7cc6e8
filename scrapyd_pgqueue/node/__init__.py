"""A node's background machinery, under the components: its leases and heartbeat (``leases``), the cluster's events
it follows (``events``), LISTEN/NOTIFY (``notifications``), the periodic-job firer (``periodic``) and its own
counters (``metrics``)."""
