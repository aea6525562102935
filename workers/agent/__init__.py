"""The Trainyard node agent: ``python -m workers.agent --name gpu-07``.

- app.py: the process (Celery worker on ``node.<name>``, boot and shutdown, heartbeat)
- supervisor.py: the loop that starts, watches and stops rank processes; fencing
- launcher.py: a rank's command, torchrun environment, files, bundle download
- reaper.py: kills rank process groups when the agent dies, even by SIGKILL
- shipper.py: rank telemetry and logs to the Redis stream
- inventory.py, config.py, control.py: host facts, settings, messages to the controller
"""
