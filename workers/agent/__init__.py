"""The Trainyard node agent: ``python -m workers.agent --name gpu-07``.

- app.py: the process (Celery worker on ``node.<name>``, boot and shutdown, heartbeat)
- supervisor.py: the loop that starts, watches and stops rank processes (commands, fencing)
- monitor.py: observes a round's processes and status files; builds rank exit reports as data
- decide.py: pure functions from a round and an observation to the actions to carry out
- actor.py: carries those actions out (launch, signal, reap, report to the controller)
- lifecycle.py: a round on the host: the LocalState enum, its transition table, set_state
- launcher.py: a rank's command, torchrun environment, files, bundle download
- reaper.py: kills rank process groups when the agent dies, even by SIGKILL
- shipper.py: rank telemetry and logs to the Redis stream
- inventory.py, config.py, control.py: host facts, settings, messages to the controller
"""
