"""The farm's services, no HTTP and no model code: settings, the refusals, the Farm, and by
concern the broker, the stores, observability, security, the canary, the farm on one machine
and the command line (docs/architecture.md)."""
