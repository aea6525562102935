"""Core: state machines, the decision lock, the controller's transport and task base, roles, audit log."""
