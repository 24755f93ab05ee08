"""The control stage on the driver: the engine fleet, weight sync, steps and commit, eval, tracking, state."""
