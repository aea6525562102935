"""Jobs: the job API, operator actions, membership planning and rounds, failures, scheduling."""
