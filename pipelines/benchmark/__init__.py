"""The checkpoint benchmark: choosing checkpoints, the evaluation loop, its state, statistics and report."""
