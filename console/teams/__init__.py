"""Workspaces (teams), their members and roles, node pools, quotas and fair share."""
