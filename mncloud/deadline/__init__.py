"""Deadline mode: finish by a deadline at the least cost, deciding spot / on-demand / wait.

Pure code, no I/O beyond reading traces: `policy` (the one place the run-time market decision
is made, one place), `places` (the same decision across K places), `replay` and
`replay_places` (a policy over recorded traces in the exact tick model, and the offline
optima), `pricing` (`plan --deadline`'s estimates over the ranked plan). The controller
(`mncloud.control`) runs these policies against a live run.
"""
