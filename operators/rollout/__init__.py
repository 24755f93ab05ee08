"""The rollout stage: the Ray Data operator, the workflow runner (retry, timeout), rewards and plugins."""
