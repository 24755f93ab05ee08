"""Reference code beside the explorer: the GRPO trainer, the tiny-model builder and the taskset generators."""
