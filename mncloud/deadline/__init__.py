"""Deadline mode: finish by a deadline at the least cost, deciding spot / on-demand / wait.

Pure code, no I/O beyond reading traces: `policy.py` (the one place the run-time market
decision is made, one place), `places.py` (the same decision across K places), `replay.py` and
`replay_places.py` (a policy over recorded traces in the exact tick model, and the offline
optima), `pricing.py` (`plan --deadline`'s estimates over the ranked plan). The controller
(`mncloud.control`) runs these policies against a live run.
"""
