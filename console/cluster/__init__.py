"""Cluster: nodes and GPUs, agents registering and heartbeating, lost nodes, drains, the node API."""
