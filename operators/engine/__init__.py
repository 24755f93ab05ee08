"""The vLLM engine actor, the client workflows call it through, its worker extension and weight transfer."""
