"""Settings the integration tests share: small steps, two samples per task, four logical CPUs."""

BASE = ["buffer.batch_size=4", "buffer.explorer_input.taskset.repeat_times=2", "ray.num_cpus=4"]
