"""Named Ray actors the driver and the operators share: names and lookups, the step gate, the weight hub."""
