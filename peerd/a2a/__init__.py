"""The A2A 1.0 face of an environment (docs/user/a2a.md): pure mapping, the SDK's handler over
peerd's operations, durable push notifications, and a thin HTTP shell."""
