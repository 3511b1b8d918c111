"""The goodput simulator: the real DLRover master driven by a virtual clock through thousands of
nodes and a year of failures, beside the whole-job-restart baseline on the same failure trace.

Not a pip package: run it as `python tools/goodput_sim run|sweep|trace SCENARIO.toml` (see the
README). Modules: `scenario` (the format), `trace` (failure traces), `training` (steps between
interruptions), `restart_job` (the baseline), `dlrover_run` (the master and simulated agents),
`results` (one strategy's numbers and the table), `plots`, `cli`.
"""
